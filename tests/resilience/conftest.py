"""Fixtures for the fault, bad-input and fuzz suites: real `ninfer-serve` processes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ninfer_proc import Server, serve


@pytest.fixture(scope="session")
def bad_input_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two lanes, prefix reuse on, a 1 MiB body limit and a 512-token context; shared by the bad-input, error
    shape and schema fuzz modules."""
    root = tmp_path_factory.mktemp("bad_input")
    with serve(root, "--max-concurrency", "2", "--max-request-mib", "1", max_context=512) as server:
        yield server
