"""Start and stop a real server process on 127.0.0.1 and wait for its /health: tests/api (api_helpers.py) and the
resilience and load tests (ninfer_proc.py) import these by this module's unique name (tests/support is on pytest's
`pythonpath`, pyproject.toml); the implementation is engine/testing/process.py, which `ninfer-bench --server`
uses too.
"""

from __future__ import annotations

from engine.testing.process import free_port, start_process, stop_process

__all__ = ["free_port", "start_process", "stop_process"]
