"""`ArtifactError`: what every part of the artifact package raises for a file it cannot use (a leaf module, so
container.py and registry.py both import it without importing each other's way round)."""

from __future__ import annotations


class ArtifactError(ValueError):
    """A `.ninfer` file that is malformed, unregistered or otherwise unusable; the message says why."""
