"""Who may call the server: an API key on the ``/v1`` routes, and which web pages may call it
from a browser (CORS, off unless origins are given).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from tallow.server.protocol import APIError

__all__ = ["ApiKeyMiddleware", "has_api_key", "security_middleware"]


class ApiKeyMiddleware:
    """Answers every ``/v1`` request that does not carry ``Authorization: Bearer <key>`` (or
    ``x-api-key: <key>``, as Anthropic's clients send it) with OpenAI's 401 error body; other
    routes (``/health``, ``/metrics``) stay open."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/v1" or path.startswith("/v1/")):
            await self.app(scope, receive, send)
            return
        given = self._given(scope)
        if given is not None and hmac.compare_digest(given, self._key):
            await self.app(scope, receive, send)
            return
        if given is None:
            message = (
                "no API key given: send it in an Authorization header with Bearer auth "
                "(Authorization: Bearer YOUR_KEY)"
            )
        else:
            message = "incorrect API key provided"
        error = APIError(401, message, code="invalid_api_key")
        body = error.json_bytes()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _given(scope: Scope) -> bytes | None:
        """The key a request carries: its bearer token, else its ``x-api-key`` (``b""`` for
        an Authorization header of another kind), or None."""
        key = None
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and token.strip():
                    return bytes(token.strip())
                return b""
            if name == b"x-api-key":
                key = bytes(value.strip())
        return key


def has_api_key(scope: Scope, api_key: str) -> bool:
    """Whether the request of ``scope`` carries ``Authorization: Bearer <api_key>``."""
    given = ApiKeyMiddleware._given(scope)
    return given is not None and hmac.compare_digest(given, api_key.encode())


def security_middleware(api_key: str | None, allowed_origins: Sequence[str]) -> list[Middleware]:
    """The middleware of a server with ``api_key`` (None: none) whose API the web pages of
    ``allowed_origins`` may call (``"*"``: any page). CORS is outermost, so that a browser's
    preflight request (which carries no key) is answered."""
    middleware = []
    if allowed_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(allowed_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type", "x-api-key", "anthropic-version"],
                max_age=600,
            )
        )
    if api_key is not None:
        middleware.append(Middleware(ApiKeyMiddleware, api_key=api_key))
    return middleware
