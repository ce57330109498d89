"""The HTTP side of ``tallow serve``: the listening socket, and uvicorn's h11 protocol with a
deadline for request headers.

uvicorn closes a connection that stays idle between requests, but a client that sends the
first bytes of a request and then trickles the rest (or nothing) keeps its connection, and a
worker's memory, forever. Here every request's headers must be complete within a timeout of
the connection opening or of the previous response; the body has its own timeout in the app.
"""

from __future__ import annotations

import asyncio
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tallow.errors import TallowError

__all__ = ["bind", "protocol_with_header_timeout"]


def protocol_with_header_timeout(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing connections whose request headers take longer than
    ``seconds``."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE:
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol


def bind(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port``; :class:`TallowError` when it cannot be had (the
    port in use, an address not of this machine)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:
        raise TallowError(f"cannot listen on {host}:{port}: {e}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        reason = e.strerror or str(e)
        raise TallowError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.set_inheritable(True)
    return sock
