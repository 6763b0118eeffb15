"""Running an app under uvicorn with the server's limits: connection timeouts and a bounded shutdown.

:func:`uvicorn_config` turns :class:`~studio.http.limits.ServerLimits` into uvicorn's knobs: the
keep-alive timeout, ``limit_concurrency`` (more open connections and requests than that get 503), the
graceful-shutdown timeout, and an HTTP/1.1 protocol that closes a connection which has not sent its
request headers within ``header_timeout_s`` (uvicorn itself waits forever). The body read timeout is the
guard's. :class:`DrainingServer` starts draining the app on SIGTERM/SIGINT before uvicorn stops: new
synthesis requests and queued ones get 503 + Retry-After, ``/health`` says "draining", running requests
get ``shutdown_grace_s`` and are then cancelled. :func:`wait_for_workers` bounds the wait for a worker
thread still inside one step of synthesis.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from studio.http.limits import ServerLimits

log = logging.getLogger("studio.http")

CUT_MARGIN_S = 1.0  # uvicorn's own graceful-shutdown timeout falls this long after the app's cut


CLOSE_GRACE_S = 5.0  # a connection closed with unsent bytes (a client that stopped reading) is aborted after this
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
         b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


class _AbortingTransport:
    """A transport whose ``close()`` turns into ``abort()`` when the peer has not taken the rest of the answer
    within ``grace`` seconds: a client that stopped reading cannot keep a closed connection open."""

    def __init__(self, transport, loop, grace: float) -> None:
        self._transport, self._loop, self._grace = transport, loop, grace
        self._timer = None

    def close(self) -> None:
        self._transport.close()
        if self._timer is None:
            self._timer = self._loop.call_later(self._grace, self._abort)

    def lost(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _abort(self) -> None:
        self._transport.abort()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class HeaderTimeoutProtocol(H11Protocol):
    """h11 with the connection rules of :class:`ServerLimits`:

    - a connection that is silent, or sends half a request line, is closed after ``header_timeout`` seconds
      (also between keep-alive requests);
    - when the open connections reach ``max_connections``, the idle ones (waiting for a request, nothing
      received) are closed oldest first, so idle connections cannot lock everyone out;
    - one client address keeps at most ``per_client`` connections; the others are answered 503 at their
      first bytes and closed;
    - a closed connection whose client does not read the rest is aborted after :data:`CLOSE_GRACE_S`.
    """

    header_timeout = ServerLimits.header_timeout_s
    per_client = ServerLimits.max_connections_per_client
    clients: dict[str, int] = {}  # open connections per client address; uvicorn_config makes one per server

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = _AbortingTransport(transport, self.loop, CLOSE_GRACE_S)
        self._header_timer = None
        self._idle, self._since = True, self.loop.time()
        self._peer = (transport.get_extra_info("peername") or ("?",))[0]
        self.clients[self._peer] = self.clients.get(self._peer, 0) + 1
        self._over = self.clients[self._peer] > self.per_client
        self._arm()
        self._evict_idle()

    def _evict_idle(self) -> None:
        limit = self.limit_concurrency
        if limit is None or len(self.connections) < limit:
            return
        idle = sorted((c for c in self.connections if c is not self and getattr(c, "_idle", False)),
                      key=lambda c: c._since)
        for conn in idle[:len(self.connections) - limit + 1]:
            conn._idle = False
            conn.transport.close()
            self.connections.discard(conn)  # gone now for uvicorn's count (its connection_lost discards again)

    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        self._idle = False
        if self._over:
            if not self.transport.is_closing():
                body = (b'{"message": "too many connections from one client (max_connections_per_client)"}')
                self.transport.write(_BUSY % (len(body), body))
                self.transport.close()
            return
        super().data_received(data)
        if self._waiting_for_headers():
            self._arm()
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._idle, self._since = True, self.loop.time()
        self._disarm()  # idle now: uvicorn's keep-alive timer applies; new bytes arm the header deadline

    def connection_lost(self, exc) -> None:
        self._disarm()
        self._idle = False
        self.transport.lost()
        left = self.clients.get(self._peer, 1) - 1
        if left > 0:
            self.clients[self._peer] = left
        else:
            self.clients.pop(self._peer, None)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown; a connection in the middle of sending a request head gets a 503 instead
        of a bare close (one that sent nothing has nothing to answer; a request under way finishes)."""
        if self._waiting_for_headers() and not self._idle and not self.transport.is_closing():
            body = b'{"message": "the server is shutting down; retry on another server or later"}'
            self.transport.write(_BUSY % (len(body), body))
            self.transport.close()
            return
        super().shutdown()

    def _expired(self) -> None:
        self._header_timer = None
        if self._waiting_for_headers() and not self.transport.is_closing():
            self.transport.close()


FD_MARGIN = 256  # open files the process keeps beside its connections (models, logs, uploads, libraries)


def fit_open_files(connections: int) -> int:
    """Raise this process's open-files limit so ``connections`` sockets fit beside its other files (up to the
    hard limit, or beyond it where the process may raise that too); returns the number of connections that
    fit (``connections``, or fewer with a warning)."""
    from engine.platform_env import raise_open_files

    soft, hard = raise_open_files(connections + FD_MARGIN)
    if 0 <= soft < connections + FD_MARGIN:  # RLIM_INFINITY is -1 on Linux
        fit = max(1, soft - FD_MARGIN)
        log.warning("this process may open %d files (hard limit %s): serving at most %d connections, not %d "
                    "(raise `ulimit -n`)", soft, hard, fit, connections)
        return fit
    return connections


def uvicorn_config(app: Any, host: str, port: int, limits: ServerLimits, **extra: Any) -> uvicorn.Config:
    """A uvicorn config that applies ``limits`` (see the module docstring); raises the open-files limit so
    ``max_connections`` sockets fit."""
    protocol = type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,),
                    {"header_timeout": limits.header_timeout_s, "per_client": limits.max_connections_per_client,
                     "clients": {}})  # this server's count of connections per client address
    # h11 buffers an incomplete request head up to this size: room for every header the guard accepts (it
    # answers 414/431 above its limits); a head larger still is refused by uvicorn (400) and never buffered
    head = limits.max_header_bytes + 2 * limits.max_header_line_bytes
    return uvicorn.Config(app, host=host, port=port, http=protocol,
                          limit_concurrency=fit_open_files(limits.max_connections),
                          h11_max_incomplete_event_size=head, timeout_keep_alive=max(1, round(limits.keep_alive_s)),
                          timeout_graceful_shutdown=max(1, round(limits.shutdown_grace_s + CUT_MARGIN_S)), **extra)


class DrainingServer(uvicorn.Server):
    """uvicorn's server that drains the app's synthesis admission as soon as an exit is asked for
    (signal or :meth:`request_exit`), before uvicorn stops accepting connections."""

    def __init__(self, config: uvicorn.Config, context: Any) -> None:
        super().__init__(config)
        self.context = context

    def handle_exit(self, sig, frame) -> None:  # type: ignore[override]
        self._drain()
        super().handle_exit(sig, frame)

    def request_exit(self) -> None:
        """Exit as a SIGTERM would (from any thread)."""
        self._drain()
        self.should_exit = True

    def _drain(self) -> None:
        """Drain now; when the grace is over, answer what still runs 503 "shutting down" (uvicorn, which
        cancels what is left CUT_MARGIN_S later, would answer 500)."""
        self.context.drain()
        if getattr(self, "_cutter", None) is None:
            grace = self.context.limits.shutdown_grace_s
            self._cutter = threading.Timer(grace, self.context.admission.cut)
            self._cutter.daemon = True
            self._cutter.start()


def wait_for_workers(context: Any, grace_s: float) -> bool:
    """True once no synthesis runs (a stopped request's worker ends at its next check); False after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while context.admission.active or _running(context):
        if time.monotonic() > deadline:
            names = [t.name for t in threading.enumerate() if t.name.startswith("synthesis")]
            log.error("exiting with %d synthesis thread(s) still running (%s)", len(names), ", ".join(names))
            return False
        time.sleep(0.05)
    return True


def _running(context: Any) -> int:
    return int(getattr(context.runner, "running", 0) or 0)
