"""An OpenAI-compatible HTTP server over :class:`~tallow.AsyncLLM` (``tallow serve``).

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming with
server-sent events, or whole), ``GET /v1/models``, ``GET /health`` and ``GET /metrics``
(Prometheus text). Errors come in OpenAI's shape, ``{"error": {"message", "type", "param",
"code"}}``, with a 4xx status for every problem with a request.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from starlette.applications import Starlette

from tallow.errors import TallowError
from tallow.server.app import ServerOptions, create_app
from tallow.server.http import bind, protocol_with_header_timeout
from tallow.server.protocol import APIError

__all__ = ["APIError", "ServerOptions", "build_app", "create_app", "parse_size", "serve"]


def parse_size(text: str) -> int:
    """Bytes in a size such as ``512MiB``, ``2G``, ``1.5GB`` or ``1000000``: ``KiB``/``MiB``/...
    are powers of 1024, ``K``/``KB``/``M``/``MB``/... powers of 1000."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?\s*", text, re.IGNORECASE)
    if m is None:
        raise ValueError(f"not a size: {text!r} (try 512MiB or 2GB)")
    number, unit, binary = m.groups()
    scale = 1 if unit is None else (1024 if binary else 1000) ** ("kmgt".index(unit.lower()) + 1)
    size = float(number) * scale
    if not size < 2**63:
        raise ValueError(f"size too large: {text!r}")
    return int(size)


def build_app(
    model: str | os.PathLike[str],
    *,
    max_batch: int = 64,
    kv_memory: int | None = None,
    kv_dtype: str = "f16",
    n_ctx: int | None = None,
    device: str | None = None,
    quantize: str | None = None,
    chat_template: str | None = None,
    options: ServerOptions | None = None,
) -> Starlette:
    """The server app of ``model`` (a path, catalog name or Hub name), its model loaded (see
    :func:`serve` for the arguments): what ``tallow serve`` runs, and each of its replicas on
    Ray Serve (:mod:`tallow.ray`)."""
    from tallow.async_llm import AsyncLLM

    llm = AsyncLLM(
        model,
        max_num_seqs=max_batch,
        kv_bytes=kv_memory,
        kv_dtype=kv_dtype,
        n_ctx=n_ctx,
        device=device,
        quantize=quantize,
        chat_template=chat_template,
    )
    name = os.fspath(model)
    aliases = [os.path.basename(llm.model.path), llm.model.path]
    return create_app(llm, name, [a for a in aliases if a != name], options or ServerOptions())


def serve(
    model: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch: int = 64,
    kv_memory: int | None = None,
    kv_dtype: str = "f16",
    n_ctx: int | None = None,
    device: str | None = None,
    quantize: str | None = None,
    chat_template: str | None = None,
    log_level: str = "info",
    options: ServerOptions | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``model`` (a path, catalog name or Hub name) on ``host:port`` until interrupted.

    ``max_batch`` is the most requests generated at once (more wait in a queue); ``kv_memory``
    the bytes of the KV cache pool (by default enough for ``max_batch`` full contexts, up to
    8192 pages); ``kv_dtype`` what its pages hold keys and values in (``"f16"``, ``"q8_0"``,
    ``"q4_0"``, ``"bf16"``, see :class:`tallow.engine.EngineConfig`); ``n_ctx`` the context of each
    request (default: the model's, up to 4096); ``device`` where the model runs (as for
    :class:`tallow.AsyncLLM`); ``quantize`` what a checkpoint folder's matrices are rounded to
    as it loads (as for :class:`tallow.LLM`); ``chat_template`` a Jinja chat template that
    replaces the
    model's own; ``options`` the API key, CORS origins and request limits (see
    :class:`ServerOptions`).
    The port is taken before the model loads, so that a busy port fails at once; then
    ``on_ready`` gets the URL. Raises :class:`~tallow.TallowError` when the port cannot be
    had, the model cannot be loaded, or the server cannot start.
    """
    import uvicorn

    options = options or ServerOptions()
    sock = bind(host, port)
    try:
        app = build_app(
            model,
            max_batch=max_batch,
            kv_memory=kv_memory,
            kv_dtype=kv_dtype,
            n_ctx=n_ctx,
            device=device,
            quantize=quantize,
            chat_template=chat_template,
            options=options,
        )
        config = uvicorn.Config(
            app,
            log_level=log_level,
            lifespan="on",
            http=protocol_with_header_timeout(options.read_timeout),
        )
        server = uvicorn.Server(config)
        if on_ready is not None:
            on_ready(f"http://{host}:{sock.getsockname()[1]}/v1")
        try:
            server.run(sockets=[sock])
        except SystemExit:  # uvicorn's way of saying that the app did not start
            raise TallowError("the server did not start (see the log above)") from None
    finally:
        sock.close()
