"""Media preprocessing for the vision tower: decoded images (and, later, video) -> ``pixel_values`` + grids.

Runs in the API process, before a request is admitted: what comes out is plain tensors and ints plus each
medium's SHA-256 (its identity in prefix hashing). Imports nothing from the engine.
"""

from __future__ import annotations

from engine.media.image import ImageProcessorConfig, MediaError, PreparedImage, prepare_image, smart_resize

__all__ = ["ImageProcessorConfig", "MediaError", "PreparedImage", "prepare_image", "smart_resize"]
