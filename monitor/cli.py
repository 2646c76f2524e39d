"""`ninfer-monitor`: the monitoring sidecar. Its work is the observability issue; until then it says so."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print(
        "ninfer-monitor: not yet available in this build (the monitoring sidecar lands with the observability"
        " work); the server's own GET /stats and GET /metrics are available now",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
