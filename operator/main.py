"""Entry point of the NInfer operator: `kopf run --standalone -A operator/main.py`.

`operator/` is not a package (`operator` is a standard-library module), so this file puts its own
folder on sys.path and imports the handlers from the `ninfer_operator` package next to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ninfer_operator import handlers  # noqa: E402,F401  (registers the kopf handlers)
