"""Media for the vision tower: decoded images (and video frames) -> ``pixel_values`` + grids, and a prompt's media.

``image.py`` runs in the API process, before a request is admitted: what comes out is plain tensors and ints plus
each medium's SHA-256 (its identity in prefix hashing). ``prompt.py`` ties prepared media to a prompt's placeholder
tokens (positions, prefix identity); it reads only the pure position functions of ``engine.media.positions``.
"""

from __future__ import annotations

from engine.media.image import ImageProcessorConfig, MediaError, PreparedImage, prepare_image, smart_resize
from engine.media.prompt import MediaItem, MediaTokens, PromptMedia, media_sha256, prompt_media

__all__ = [
    "ImageProcessorConfig",
    "MediaError",
    "MediaItem",
    "MediaTokens",
    "PreparedImage",
    "PromptMedia",
    "media_sha256",
    "prepare_image",
    "prompt_media",
    "smart_resize",
]
