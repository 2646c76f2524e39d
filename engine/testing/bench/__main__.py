"""`python -m engine.testing.bench`: `ninfer-bench`."""

import sys

from engine.testing.bench.cli import main

sys.exit(main())
