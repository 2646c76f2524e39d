"""Anthropic Messages-compatible routes."""
