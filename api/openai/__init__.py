"""OpenAI-compatible routes: models, Chat Completions, Responses Core."""
