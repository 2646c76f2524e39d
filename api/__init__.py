"""The HTTP layer: OpenAI Chat Completions, OpenAI Responses Core and Anthropic Messages over one engine.

`api.app.create_app` builds the FastAPI app around an engine object (see `api.engine_client`);
`api.serve.main` is the `ninfer-serve` console script.
"""
