"""The uvicorn server around the app: connection limits, header timeouts, draining and a bounded shutdown.

- `guarded_protocol()`: uvicorn's HTTP protocol with two guards. A connection whose request headers have not
  all arrived `header_timeout` seconds after its first byte (or after it opened) gets a 408 and is closed,
  so stalled clients cannot hold sockets forever. Past `max_connections` open connections, a new one is
  answered 503 (`too_many_connections`, in the protocol's error shape, with `Retry-After`) and closed.
  Body reads are timed by the app's gate (api.app, `--body-timeout-s`).
- `DrainingServer`: on SIGTERM/SIGINT the app is marked draining (new requests get 503, `/ready` says
  `draining`) while it keeps listening; admitted requests may finish for up to `shutdown_timeout` seconds,
  then what is left is cancelled. A drain that ended cleanly exits with status 0.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send

from api.errors import ApiError, error_response

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _BaseProtocol
except ImportError:  # pragma: no cover - uvicorn without httptools
    from uvicorn.protocols.http.h11_impl import H11Protocol as _BaseProtocol  # type: ignore[assignment]

logger = logging.getLogger("ninfer.serve")

REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


async def _refuse_connection(scope: Scope, receive: Receive, send: Send) -> None:
    """The app of a connection past the limit: a 503 in the path's protocol shape, then close."""
    if scope["type"] != "http":
        return
    error = ApiError(503, "too_many_connections", "the server has too many open connections; retry later")
    response = error_response(error, scope["path"], headers={"Connection": "close"})
    await response(scope, receive, send)


class GuardedProtocol(_BaseProtocol):
    header_timeout: float = 30.0
    max_connections: int | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            logger.warning("refusing a connection: %d open (--max-connections)", len(self.connections))
            self.app = _refuse_connection  # answers its request 503 and closes
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm_header_timer()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        waiting_since = self.cycle  # headers complete = uvicorn has started a new request cycle
        self._header_timer = asyncio.get_running_loop().call_later(
            self.header_timeout, self._header_deadline, waiting_since
        )

    def _header_deadline(self, waiting_since: Any) -> None:
        self._header_timer = None
        if self.cycle is waiting_since and not self.transport.is_closing():
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()


def guarded_protocol(*, header_timeout: float, max_connections: int | None) -> type[GuardedProtocol]:
    """A `GuardedProtocol` class with these limits (uvicorn builds one instance per connection)."""
    attrs = {"header_timeout": header_timeout, "max_connections": max_connections}
    return type("ConfiguredGuardedProtocol", (GuardedProtocol,), attrs)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain described in the module docstring."""

    def __init__(self, config: uvicorn.Config, app: Any, *, shutdown_timeout: float) -> None:
        super().__init__(config)
        self._app = app
        self.shutdown_timeout = shutdown_timeout
        self.drained_cleanly = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._app.state.draining = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Keep listening while admitted requests finish, so a new request gets a 503
        (`server_shutting_down`) rather than a refused connection; then uvicorn's graceful shutdown, within
        what is left of `shutdown_timeout`."""
        state = self._app.state.server
        deadline = time.monotonic() + self.shutdown_timeout
        while not self.force_exit and _busy(state) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        timed_out = _busy(state)
        if timed_out:
            logger.warning(
                "drain: requests still running after %.0f s; cancelling them", self.shutdown_timeout
            )
        self.config.timeout_graceful_shutdown = max(1, int(deadline - time.monotonic()))
        await super().shutdown(sockets)
        self.drained_cleanly = not (timed_out or self.force_exit)
        if self.drained_cleanly:  # uvicorn would re-raise the signal (exit 143); a clean drain exits 0
            self._captured_signals.clear()


def _busy(state: Any) -> bool:
    stats = state.engine.stats()
    return bool(state.in_flight or getattr(stats, "num_running", 0) or getattr(stats, "num_waiting", 0))
