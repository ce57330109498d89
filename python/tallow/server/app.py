"""The ASGI app: OpenAI's completions and chat endpoints over an :class:`~tallow.AsyncLLM`.

Every request becomes one engine request per choice; their outputs are turned into OpenAI's
response objects, or into server-sent events when ``stream`` is set. A client that goes away
(mid-stream or while waiting for a whole answer) has its requests aborted, which frees their
KV pages at the engine's next step.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from base64 import b64encode
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio
import numpy as np
import numpy.typing as npt
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from tallow import _core, pooling
from tallow.async_llm import AsyncLLM
from tallow.checks import argument_of
from tallow.classify import ClassifyTask
from tallow.embed import EmbedTask
from tallow.engine import SamplingParams
from tallow.errors import InvalidArgumentError, ModelError, TallowError
from tallow.output import RequestOutput, TokenLogprob
from tallow.prompt import ChatPrompt
from tallow.rerank import Reranked, RerankTask, has_rerank_prompt, ranked
from tallow.server.messages import MessagesRequest, Reply, parse_messages
from tallow.server.messages import error_body as messages_error_body
from tallow.server.metrics import CONTENT_TYPE, Metrics
from tallow.server.protocol import (
    APIError,
    ClassifyRequest,
    EmbeddingRequest,
    GenerationRequest,
    RerankRequest,
    check_model,
    choice_params,
    invalid,
    parse_chat,
    parse_classify,
    parse_completion,
    parse_embeddings,
    parse_json,
    parse_rerank,
    usage,
)
from tallow.server.responses import Response as ResponseObject
from tallow.server.responses import ResponsesRequest, ResponseStore, parse_responses
from tallow.server.security import security_middleware
from tallow.tools import ToolCall

__all__ = ["JSON_ROUTES", "ServerOptions", "create_app", "read_json_body"]

Emit = Callable[[dict[str, Any]], Awaitable[None]]
P = TypeVar("P")
R = TypeVar("R")


STATIC = Path(__file__).parent / "static"
"""The chat page's files."""

# The page runs its own script alone, and talks to this server alone: whatever a model writes
# cannot load or run anything.
PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}

DEFAULT_MAX_REQUEST_BYTES = 8 * 2**20
DEFAULT_READ_TIMEOUT = 30.0


def error_response(error: APIError) -> Response:
    # After a body that was not read whole (not JSON, too large, too slow), the connection
    # cannot serve another request.
    headers = {"connection": "close"} if error.status in (408, 413, 415) else None
    return Response(
        error.json_bytes(), status_code=error.status, headers=headers, media_type="application/json"
    )


@dataclass
class _Choice:
    """One engine request of an API request, and what it produced so far."""

    index: int
    prompt_ids: list[int]
    params: SamplingParams
    text: list[str] = field(default_factory=list)
    reasoning: list[str] | None = None
    """Chat with a model that reasons: what it wrote in its reasoning block."""
    tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    tool_calls: list[ToolCall] | None = None
    cached_tokens: int = 0
    offset: int = 0
    """Characters of the token texts reported so far (``text_offset`` of completions)."""


class ChatReply(Protocol):
    """How one API tells a chat reply (a Responses response, a Messages message) as the
    request's outputs come: whole (:meth:`add`, then :meth:`body`) or as events."""

    def add(self, out: RequestOutput) -> None: ...
    def body(self) -> dict[str, Any]: ...
    def error_body(self, error: APIError) -> dict[str, Any]: ...
    async def start(self, emit: Emit) -> None: ...
    async def stream(self, out: RequestOutput, emit: Emit) -> None: ...
    async def fail(self, emit: Emit, error: APIError) -> None: ...


class _EventStream(Response):
    """A ``text/event-stream`` response whose events a producer writes while it runs, cancelled
    (and so its engine requests aborted) when the client disconnects."""

    def __init__(self, produce: Callable[[Emit], Awaitable[None]], *, named: bool = False) -> None:
        """``named``: each event goes with an ``event:`` line of its ``type`` and the stream
        ends without ``data: [DONE]`` (Anthropic's events); otherwise OpenAI's."""
        # No Content-Length: the body is written as the events come.
        self.status_code = 200
        self.background = None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        self._produce = produce
        self._named = named

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        lock = anyio.Lock()
        async with anyio.create_task_group() as tg:

            async def emit(event: dict[str, Any]) -> None:
                data = b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"
                if self._named:
                    data = f"event: {event['type']}\n".encode() + data
                async with lock:
                    try:
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                    except OSError:  # the connection broke: stop producing
                        tg.cancel_scope.cancel()

            async def watch_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(watch_disconnect)
            await self._produce(emit)
            last = b"" if self._named else b"data: [DONE]\n\n"
            end = {"type": "http.response.body", "body": last, "more_body": False}
            with contextlib.suppress(OSError):
                await send(end)
            tg.cancel_scope.cancel()


@dataclass(frozen=True)
class ServerOptions:
    """What a server accepts beyond the model: see :func:`create_app`."""

    api_key: str | None = None
    """Every ``/v1`` request must carry ``Authorization: Bearer <api_key>``; None: no key."""
    allowed_origins: tuple[str, ...] = ()
    """Web origins whose pages may call the API from a browser (CORS); ``"*"`` for any."""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """Largest request body; a larger one is answered with 413."""
    read_timeout: float = DEFAULT_READ_TIMEOUT
    """Seconds a client has to send a request's headers, and again its body (408)."""
    parse_special_in_messages: bool = False
    """Parse control-token text written in chat messages as control tokens (unsafe: a user
    can then write a turn of another role)."""


JSON_ROUTES = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/classify",
        "/v1/embeddings",
        "/v1/rerank",
        "/rerank",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
    }
)
"""The routes (all POST) whose request body the app reads, with :func:`read_json_body`."""


async def read_json_body(request: Request, options: ServerOptions) -> bytes:
    """The body of a JSON request, within the size and time limits of ``options``: 415 when it
    is not sent as JSON, 413 when larger than ``max_request_bytes`` (its Content-Length is
    checked first), 408 when it does not arrive within ``read_timeout``."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise APIError(
            415,
            "the request body must be JSON, sent with 'Content-Type: application/json'",
            code="unsupported_media_type",
        )
    limit = options.max_request_bytes
    too_large = APIError(
        413,
        f"the request body is larger than this server's limit of {limit} bytes",
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    timeout = options.read_timeout
    with anyio.move_on_after(timeout) as scope:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
        except ClientDisconnect:
            raise APIError(400, "the client disconnected", code="client_disconnected") from None
    if scope.cancelled_caught:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s", code="timeout")
    return b"".join(chunks)


class _Server:
    def __init__(
        self, llm: AsyncLLM, model_name: str, aliases: Sequence[str], options: ServerOptions
    ) -> None:
        self.llm = llm
        self.options = options
        self.names = [model_name, *aliases]
        self.created = int(time.time())
        self.metrics = Metrics(llm.stats)
        self._ids = itertools.count()
        self._token_text: dict[int, str] = {}
        self.responses_store = ResponseStore()

    # -- plain endpoints ----------------------------------------------------------------------

    async def chat_page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            check_model(name, self.names)
        except APIError as e:
            return error_response(e)
        return JSONResponse(self._model_card())

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.names[0],
            "object": "model",
            "created": self.created,
            "owned_by": "tallow",
            "max_model_len": self.llm.n_ctx,
            "capabilities": _capabilities(self.llm.model),
        }

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    async def _counted(self, endpoint: str, answer: Awaitable[Response]) -> Response:
        """The response of ``answer``, counted in the metrics by the status it is sent with (a
        stream's is 200, sent before it is generated; an unexpected failure's is 500)."""
        try:
            response = await answer
        except Exception:
            self.metrics.requests.labels(endpoint, "500").inc()
            raise
        self.metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    # -- classification -----------------------------------------------------------------------

    async def classify(self, request: Request) -> Response:
        return await self._counted("/v1/classify", self._classify(request))

    async def _batch(
        self,
        request: Request,
        prepare: Callable[[bytes], P],
        run: Callable[[P], Awaitable[R]],
        failed: Callable[[TallowError], APIError] | None = None,
    ) -> tuple[P, R] | Response:
        """What a route that runs one batch of requests (classification, embeddings,
        reranking) has to answer with: its body read and ``prepare``d in a worker thread (its
        problems a 4xx), then ``run`` (aborted when the client goes away: 499), whose failure
        ``failed`` maps (by default a 500)."""
        try:
            raw = await read_json_body(request, self.options)
            prepared = await anyio.to_thread.run_sync(prepare, raw)
        except APIError as e:
            return error_response(e)
        results: list[R] = []
        failure: list[TallowError] = []

        async def work() -> None:
            try:
                results.append(await run(prepared))
            except TallowError as e:
                failure.append(e)

        if not await _unless_disconnected(request, work):
            return Response(status_code=499)
        if failure:
            if failed is not None:
                return error_response(failed(failure[0]))
            return error_response(APIError(500, str(failure[0]), type="server_error"))
        return prepared, results[0]

    async def _classify(self, request: Request) -> Response:
        def failed(error: TallowError) -> APIError:
            if isinstance(error, InvalidArgumentError):
                # Labels that no step or KV pool of this server could score.
                return invalid("labels", str(error))
            return APIError(500, str(error), type="server_error")

        done = await self._batch(
            request,
            self._prepare_classify,
            lambda p: self.llm.run_classification(p[1], p[2]),
            failed,
        )
        if isinstance(done, Response):
            return done
        (req, _, prompts), results = done
        prompt_tokens = sum(len(ids) for ids in prompts)
        self.metrics.prompt_tokens.inc(prompt_tokens)
        return JSONResponse(
            {
                "id": f"classify-{next(self._ids)}",
                "object": "list",
                "created": int(time.time()),
                "model": req.model,
                "data": [
                    {
                        "index": i,
                        "label": c.label,
                        "probs": c.probs,
                        "num_classes": len(c.labels),
                    }
                    for i, c in enumerate(results)
                ],
                "usage": usage(prompt_tokens, 0, sum(c.cached_tokens for c in results)),
            }
        )

    def _prepare_classify(
        self, raw: bytes
    ) -> tuple[ClassifyRequest, ClassifyTask, list[list[int]]]:
        """In a worker thread: the parsed request, its task and the token ids of its texts
        (each problem a 400 naming its field)."""
        req = parse_classify(parse_json(raw))
        check_model(req.model, self.names)
        try:
            task = self.llm.classify_task(req.labels, req.prompt)
        except InvalidArgumentError as e:
            raise invalid(argument_of(e, ("prompt", "labels"), "labels"), str(e)) from None
        try:
            prompts = [task.prompt_ids(text) for text in req.texts]
        except InvalidArgumentError as e:
            raise invalid("input", str(e)) from None
        except ModelError as e:
            raise invalid("input", str(e), "context_length_exceeded") from None
        return req, task, prompts

    # -- embeddings ---------------------------------------------------------------------------

    async def embeddings(self, request: Request) -> Response:
        return await self._counted("/v1/embeddings", self._embeddings(request))

    async def _embeddings(self, request: Request) -> Response:
        done = await self._batch(
            request, self._prepare_embeddings, lambda p: self.llm.run_embeddings(p[1], p[2])
        )
        if isinstance(done, Response):
            return done
        (req, _, prompts), vectors = done
        prompt_tokens = sum(len(ids) for ids in prompts)
        self.metrics.prompt_tokens.inc(prompt_tokens)
        return JSONResponse(
            {
                "object": "list",
                "model": req.model,
                "data": [
                    {"object": "embedding", "index": i, "embedding": _encoded(v, req.base64)}
                    for i, v in enumerate(vectors)
                ],
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            }
        )

    def _prepare_embeddings(
        self, raw: bytes
    ) -> tuple[EmbeddingRequest, EmbedTask, list[list[int]]]:
        """In a worker thread: the parsed request, its task and the token ids of its inputs
        (each problem a 400 naming its field)."""
        req = parse_embeddings(parse_json(raw), self.llm.model.n_vocab)
        check_model(req.model, self.names)
        try:
            task = self.llm.embed_task(req.pooling, req.normalize, req.dimensions)
        except InvalidArgumentError as e:
            raise invalid(argument_of(e, ("dimensions", "pooling"), "pooling"), str(e)) from None
        try:
            prompts = [task.prompt_ids(item) for item in req.inputs]
        except InvalidArgumentError as e:
            raise invalid("input", str(e)) from None
        except ModelError as e:
            raise invalid("input", str(e), "context_length_exceeded") from None
        return req, task, prompts

    # -- reranking ----------------------------------------------------------------------------

    async def rerank(self, request: Request) -> Response:
        return await self._counted("/v1/rerank", self._rerank(request))

    async def _rerank(self, request: Request) -> Response:
        done = await self._batch(
            request,
            self._prepare_rerank,
            lambda p: self.llm.run_reranking(p[1], p[0].documents, p[2]),
        )
        if isinstance(done, Response):
            return done
        (req, _, _), results = done
        prompt_tokens = sum(r.prompt_tokens for r in results)
        self.metrics.prompt_tokens.inc(prompt_tokens)

        def entry(r: Reranked) -> dict[str, Any]:
            out: dict[str, Any] = {"index": r.index, "relevance_score": r.relevance_score}
            if req.return_documents:
                out["document"] = {"text": r.document}
            return out

        return JSONResponse(
            {
                "id": f"rerank-{next(self._ids)}",
                "object": "list",
                "model": req.model,
                "results": [entry(r) for r in ranked(results, req.top_n)],
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            }
        )

    def _prepare_rerank(self, raw: bytes) -> tuple[RerankRequest, RerankTask, list[list[int]]]:
        """In a worker thread: the parsed request, its task and its documents' prompts
        (each problem a 400 naming its field)."""
        req = parse_rerank(parse_json(raw))
        check_model(req.model, self.names)
        try:
            task = self.llm.rerank_task(req.query, instruction=req.instruction)
        except InvalidArgumentError as e:
            raise invalid("query", str(e)) from None
        try:
            prompts = [task.prompt_ids(document) for document in req.documents]
        except InvalidArgumentError as e:
            raise invalid("documents", str(e)) from None
        except ModelError as e:
            raise invalid("documents", str(e), "context_length_exceeded") from None
        return req, task, prompts

    # -- OpenAI's Responses API --------------------------------------------------------------

    async def responses(self, request: Request) -> Response:
        return await self._counted("/v1/responses", self._responses(request))

    async def _responses(self, request: Request) -> Response:
        try:
            raw = await read_json_body(request, self.options)
            req, chat = await anyio.to_thread.run_sync(self._prepare_responses, raw)
        except APIError as e:
            return error_response(e)
        answer = ResponseObject(req, len(chat.ids))

        def keep() -> None:
            if req.store and answer.status != "failed":
                self.responses_store.put(answer.body(), answer.conversation())

        constraint = "text" if req.params.structured is not None else "tool_choice"
        return await self._reply(request, chat, answer, req.stream, constraint, keep)

    async def stored_response(self, request: Request) -> Response:
        found = self.responses_store.response(request.path_params["response_id"])
        if found is None:
            error = APIError(
                404, "no stored response with this id", type="not_found", code="not_found"
            )
            return error_response(error)
        return JSONResponse(found)

    def _prepare_responses(self, raw: bytes) -> tuple[ResponsesRequest, ChatPrompt]:
        """In a worker thread: the parsed request and its chat prompt, checked (each problem a
        400 naming its field)."""
        req = parse_responses(
            parse_json(raw), self.llm.model.n_vocab, self.llm.n_ctx, self.responses_store
        )
        check_model(req.model, self.names)
        return req, self._checked_chat(req, "input", "text")

    # -- Anthropic's Messages API ------------------------------------------------------------

    async def messages(self, request: Request) -> Response:
        return await self._counted("/v1/messages", self._messages(request))

    async def _messages(self, request: Request) -> Response:
        try:
            raw = await read_json_body(request, self.options)
            req, chat = await anyio.to_thread.run_sync(self._prepare_messages, raw, False)
        except APIError as e:
            return _anthropic_error(e)
        constraint = "output_config" if req.params.structured is not None else "tool_choice"
        reply = Reply(req.model, len(chat.ids))
        return await self._reply(request, chat, reply, req.stream, constraint)

    async def _reply(
        self,
        request: Request,
        chat: ChatPrompt,
        reply: ChatReply,
        stream: bool,
        constraint: str,
        done: Callable[[], None] = lambda: None,
    ) -> Response:
        """One chat request run to its end and told as ``reply`` tells it (a Responses
        response, a Messages message): whole, or as its events. A failure is a 400 naming
        ``constraint`` where the constraint could not go on, a 500 otherwise; ``done`` runs
        once the reply is whole."""
        arrival = time.perf_counter()
        self.metrics.prompt_tokens.inc(len(chat.ids))
        choice = _Choice(0, chat.ids, chat.params)

        def failure(error: TallowError) -> APIError:
            if isinstance(error, InvalidArgumentError):
                return invalid(constraint, str(error))
            return APIError(500, str(error), type="server_error")

        if stream:

            async def produce(emit: Emit) -> None:
                await reply.start(emit)

                async def on_output(c: _Choice, out: RequestOutput) -> None:
                    await reply.stream(out, emit)

                error = await self._run([choice], arrival, on_output)
                if error is not None:
                    await reply.fail(emit, failure(error))
                done()

            return _EventStream(produce, named=True)
        errors: list[TallowError] = []

        async def run() -> None:
            async def on_output(c: _Choice, out: RequestOutput) -> None:
                reply.add(out)

            error = await self._run([choice], arrival, on_output)
            if error is not None:
                errors.append(error)

        if not await _unless_disconnected(request, run):
            return Response(status_code=499)
        if errors:
            error = failure(errors[0])
            return JSONResponse(reply.error_body(error), status_code=error.status)
        done()
        return JSONResponse(reply.body())

    async def count_tokens(self, request: Request) -> Response:
        return await self._counted("/v1/messages/count_tokens", self._count_tokens(request))

    async def _count_tokens(self, request: Request) -> Response:
        try:
            raw = await read_json_body(request, self.options)
            _, chat = await anyio.to_thread.run_sync(self._prepare_messages, raw, True)
        except APIError as e:
            return _anthropic_error(e)
        return JSONResponse({"input_tokens": len(chat.ids)})

    def _prepare_messages(self, raw: bytes, counting: bool) -> tuple[MessagesRequest, ChatPrompt]:
        """In a worker thread: the parsed request and its chat prompt, checked (each problem a
        400 naming its field)."""
        req = parse_messages(
            parse_json(raw), self.llm.model.n_vocab, self.llm.n_ctx, counting=counting
        )
        check_model(req.model, self.names)
        return req, self._checked_chat(req, "messages", "output_config", generates=not counting)

    def _checked_chat(
        self,
        req: MessagesRequest | ResponsesRequest,
        field: str,
        format_field: str,
        *,
        generates: bool = True,
    ) -> ChatPrompt:
        """The chat prompt of a Messages or Responses request, checked: a problem with the
        conversation is a 400 naming ``field``; for a request that generates, ``max_tokens``
        past the context, and a format that does not compile (named ``format_field``)."""
        try:
            chat = self._chat(req.messages, req.params, req.tools, req.tool_choice)
        except InvalidArgumentError as e:
            raise invalid(field, str(e)) from None
        except ModelError as e:
            raise invalid(field, str(e), "context_length_exceeded") from None
        if generates:
            self._check_room(chat.ids, req.params.max_tokens)
            if req.params.structured is not None:
                # Checked here so that a bad schema is a 400 (and kept compiled).
                try:
                    req.params.structured.check(self.llm.model)
                except InvalidArgumentError as e:  # GrammarError
                    raise invalid(format_field, str(e)) from None
        return chat

    # -- generation ---------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        return await self._counted("/v1/completions", self._generate(request, "completions"))

    async def chat_completions(self, request: Request) -> Response:
        return await self._counted("/v1/chat/completions", self._generate(request, "chat"))

    async def _generate(self, request: Request, kind: str) -> Response:
        arrival = time.perf_counter()
        try:
            raw = await read_json_body(request, self.options)
            # Parsing and tokenizing may take a while for a large body: off the event loop.
            req, prompts = await anyio.to_thread.run_sync(self._prepare, raw, kind)
        except APIError as e:
            return error_response(e)
        choices = [
            _Choice(p * req.n + j, ids, choice_params(req.params, j))
            for p, ids in enumerate(prompts)
            for j in range(req.n)
        ]
        prompt_tokens = sum(len(ids) for ids in prompts)
        self.metrics.prompt_tokens.inc(prompt_tokens)
        response_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{next(self._ids)}"
        if req.stream:
            return _EventStream(
                lambda emit: self._stream(emit, kind, req, response_id, choices, prompts, arrival)
            )
        failure: list[TallowError | None] = []

        async def run() -> None:
            failure.append(await self._run(choices, arrival, None))

        if not await _unless_disconnected(request, run):
            return Response(status_code=499)
        if failure[0] is not None:
            return error_response(self._failure(req, failure[0]))
        completion_tokens = sum(c.tokens for c in choices)
        return JSONResponse(
            {
                "id": response_id,
                "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": int(time.time()),
                "model": req.model,
                "choices": [self._final_choice(kind, req, c, prompts) for c in choices],
                "usage": usage(prompt_tokens, completion_tokens, _cached(choices, req.n)),
            }
        )

    def _prepare(self, raw: bytes, kind: str) -> tuple[GenerationRequest, list[list[int]]]:
        """In a worker thread: the parsed request and the token ids of its prompts."""
        body = parse_json(raw)
        parse = parse_chat if kind == "chat" else parse_completion
        req = parse(body, self.llm.model.n_vocab, self.llm.n_ctx)
        check_model(req.model, self.names)
        prompts = self._prompt_ids(req)
        structured = req.params.structured
        try:
            req.params.check_constraint()
        except InvalidArgumentError as e:
            raise invalid("ignore_eos", str(e)) from None
        if structured is not None:
            # Checked here so that a bad one is a 400 (and kept compiled for the requests).
            try:
                structured.check(self.llm.model)
            except InvalidArgumentError as e:  # GrammarError
                raise invalid(_constraint_field(req), str(e)) from None
        return req, prompts

    @staticmethod
    def _failure(req: GenerationRequest, error: TallowError) -> APIError:
        """The answer to a request whose generation failed: a 400 where its constraint could
        not go on (a grammar beyond the limits on its work), a 500 where the model failed."""
        if isinstance(error, InvalidArgumentError):
            return invalid(_constraint_field(req), str(error))
        return APIError(500, str(error), type="server_error")

    def _chat_prompt(self, req: GenerationRequest) -> ChatPrompt:
        """The chat request's prompt and parameters (see :meth:`_chat`)."""
        assert req.messages is not None
        return self._chat(req.messages, req.params, req.tools, req.tool_choice)

    def _chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams,
        tools: object,
        tool_choice: object,
    ) -> ChatPrompt:
        """A chat's prompt and parameters, its tools checked (each problem a 400 naming
        ``tools``, ``tool_choice`` or ``chat_template_kwargs``; other problems are raised)."""
        try:
            return self.llm.chat_prompt(
                messages,
                params,
                parse_special=self.options.parse_special_in_messages,
                tools=tools,
                tool_choice=tool_choice,
            )
        except InvalidArgumentError as e:
            fields = ("tool_choice", "tools", "chat_template_kwargs")
            argument = argument_of(e, fields, "")
            if argument:
                raise invalid(argument, str(e)) from None
            raise

    def _prompt_ids(self, req: GenerationRequest) -> list[list[int]]:
        """Token ids of every prompt, each checked to leave room for ``max_tokens``."""
        param = "messages" if req.messages is not None else "prompt"
        try:
            if req.messages is not None:
                chat = self._chat_prompt(req)
                prompts = [chat.ids]
                req.params = chat.params
            else:
                prompts = [self.llm.prompt_ids(p) for p in req.prompts]
        except InvalidArgumentError as e:
            raise invalid(param, str(e)) from None
        except ModelError as e:
            raise invalid(param, str(e), "context_length_exceeded") from None
        for ids in prompts:
            self._check_room(ids, req.params.max_tokens)
        return prompts

    def _check_room(self, ids: list[int], max_tokens: int | None) -> None:
        """A 400 where ``max_tokens`` after the prompt ``ids`` go beyond the context."""
        n_ctx = self.llm.n_ctx
        wanted = max_tokens or 0
        if len(ids) + wanted > n_ctx:
            raise invalid(
                "max_tokens",
                f"this model's context holds {n_ctx} tokens, but {len(ids) + wanted} were "
                f"asked for ({len(ids)} in the prompt, {wanted} to generate)",
                "context_length_exceeded",
            )

    async def _run(
        self,
        choices: list[_Choice],
        arrival: float,
        on_output: Callable[[_Choice, RequestOutput], Awaitable[None]] | None,
    ) -> TallowError | None:
        """Run every choice to its end, concurrently, recording what each produced; return
        the error of the first that failed, if one did."""
        failures: list[TallowError] = []

        async def one(choice: _Choice) -> None:
            last: float | None = None
            try:
                async for out in self.llm.outputs(choice.prompt_ids, choice.params):
                    now = time.perf_counter()
                    if out.new_token_ids:
                        n = len(out.new_token_ids)
                        if last is None:
                            self.metrics.time_to_first_token.observe(now - arrival)
                        else:
                            for _ in range(n):
                                self.metrics.inter_token_latency.observe((now - last) / n)
                        last = now
                        choice.tokens += n
                        self.metrics.generation_tokens.inc(n)
                    choice.text.append(out.text)
                    if out.reasoning:
                        choice.reasoning = [*(choice.reasoning or []), out.reasoning]
                    if out.logprobs:
                        choice.logprobs.extend(out.logprobs)
                    if out.finished:
                        choice.finish_reason = out.finish_reason
                        choice.tool_calls = out.tool_calls
                        choice.cached_tokens = out.cached_tokens
                        self.metrics.request_duration.observe(now - arrival)
                    if on_output is not None:
                        await on_output(choice, out)
            except TallowError as e:
                failures.append(e)

        async with anyio.create_task_group() as tg:
            for choice in choices:
                tg.start_soon(one, choice)
        return failures[0] if failures else None

    async def _stream(
        self,
        emit: Emit,
        kind: str,
        req: GenerationRequest,
        response_id: str,
        choices: list[_Choice],
        prompts: list[list[int]],
        arrival: float,
    ) -> None:
        created = int(time.time())
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def chunk(choice_objects: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "id": response_id,
                "object": obj,
                "created": created,
                "model": req.model,
                "choices": choice_objects,
            }

        if kind == "chat":
            for c in choices:
                role = {"role": "assistant", "content": ""}
                await emit(
                    chunk(
                        [{"index": c.index, "delta": role, "logprobs": None, "finish_reason": None}]
                    )
                )
        elif req.echo:
            for c in choices:
                text = self.llm.model.detokenize(prompts[c.index // req.n])
                c.offset = len(text)
                await emit(
                    chunk(
                        [{"index": c.index, "text": text, "logprobs": None, "finish_reason": None}]
                    )
                )

        async def on_output(c: _Choice, out: RequestOutput) -> None:
            # With tools, the text of a call is held back and comes parsed at the end.
            text, finish, calls = out.text, out.finish_reason, out.tool_calls
            if not text and not out.reasoning and not out.logprobs and finish is None:
                return
            logprobs = (
                self._logprobs(kind, c, out.logprobs or []) if req.logprobs is not None else None
            )
            if kind == "chat":
                delta: dict[str, Any] = {"content": text} if text else {}
                if out.reasoning:
                    # vLLM's and llama.cpp's field for a reasoning model's thinking.
                    delta["reasoning_content"] = out.reasoning
                if calls:
                    delta["tool_calls"] = [
                        {"index": i, **call.to_openai()} for i, call in enumerate(calls)
                    ]
                body = {
                    "index": c.index,
                    "delta": delta,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }
            else:
                body = {
                    "index": c.index,
                    "text": out.text,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }
            await emit(chunk([body]))

        failure = await self._run(choices, arrival, on_output)
        if failure is not None:
            await emit(self._failure(req, failure).body())
            return
        if req.include_usage:
            tokens = sum(c.tokens for c in choices)
            final = chunk([])
            prompt_tokens = sum(len(ids) for ids in prompts)
            final["usage"] = usage(prompt_tokens, tokens, _cached(choices, req.n))
            await emit(final)

    def _final_choice(
        self, kind: str, req: GenerationRequest, c: _Choice, prompts: list[list[int]]
    ) -> dict[str, Any]:
        text = "".join(c.text)
        echoed = self.llm.model.detokenize(prompts[c.index // req.n]) if req.echo else ""
        c.offset = len(echoed)
        logprobs = self._logprobs(kind, c, c.logprobs) if req.logprobs is not None else None
        if kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if c.tool_calls:
                message = {
                    "role": "assistant",
                    "content": text or None,
                    "tool_calls": [call.to_openai() for call in c.tool_calls],
                }
            if c.reasoning is not None:
                message["reasoning_content"] = "".join(c.reasoning)
            return {
                "index": c.index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": c.finish_reason,
            }
        return {
            "index": c.index,
            "text": echoed + text,
            "logprobs": logprobs,
            "finish_reason": c.finish_reason,
        }

    def _text_of(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.llm.model.detokenize([token_id])
            self._token_text[token_id] = text
        return text

    def _logprobs(self, kind: str, c: _Choice, entries: list[TokenLogprob]) -> dict[str, Any]:
        """OpenAI's log probability object: per token for chat, columns for completions."""
        if kind == "chat":
            return {
                "content": [
                    {
                        "token": self._text_of(e.token_id),
                        "logprob": e.logprob,
                        "bytes": list(self._text_of(e.token_id).encode()),
                        "top_logprobs": [
                            {
                                "token": self._text_of(t),
                                "logprob": lp,
                                "bytes": list(self._text_of(t).encode()),
                            }
                            for t, lp in e.top
                        ],
                    }
                    for e in entries
                ]
            }
        tokens = [self._text_of(e.token_id) for e in entries]
        offsets = []
        for t in tokens:
            offsets.append(c.offset)
            c.offset += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{self._text_of(t): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets,
        }


def _capabilities(model: _core.Model) -> list[str]:
    """What ``model`` is for, as its metadata says: a reranker (``pooling_type`` rank, or a
    reranking prompt) ranks; an embedding model (it names another pooling) embeds; any other
    model generates and embeds (its last token's hidden state)."""
    if pooling.is_rank_model(model) or has_rerank_prompt(model):
        return ["rerank"]
    if pooling.is_embedding_model(model):
        return ["embed"]
    return ["generate", "embed"]


def _anthropic_error(error: APIError) -> Response:
    """``error`` as Anthropic's API answers it."""
    return JSONResponse(messages_error_body(error), status_code=error.status)


def _encoded(vector: npt.NDArray[np.float32], base64: bool) -> list[float] | str:
    """An embedding as the response carries it: floats, or the base64 of its little-endian
    float32 bytes."""
    if base64:
        return b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(v) for v in vector]


def _cached(choices: list[_Choice], n: int) -> int:
    """Prompt tokens served from the prefix cache, counted once per prompt as the prompt tokens
    are (by the first choice of each)."""
    return sum(c.cached_tokens for c in choices if c.index % n == 0)


def _constraint_field(req: GenerationRequest) -> str:
    """The request's field that constrains its output, for errors that name it."""
    return req.structured_field or ("tools" if req.params.tools else "response_format")


async def _unless_disconnected(request: Request, work: Callable[[], Awaitable[None]]) -> bool:
    """Run ``work``; cancel it if the client disconnects first. Whether it completed."""
    completed = False
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        async def run() -> None:
            nonlocal completed
            await work()
            completed = True
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        tg.start_soon(run)
    return completed


def create_app(
    llm: AsyncLLM,
    model_name: str,
    aliases: Sequence[str] = (),
    options: ServerOptions | None = None,
) -> Starlette:
    """The OpenAI-compatible app serving ``llm`` as ``model_name`` (requests may also name the
    model by one of ``aliases``), with the key, CORS origins and limits of ``options``. The
    app opens and closes ``llm`` with its lifespan."""
    options = options or ServerOptions()
    server = _Server(llm, model_name, aliases, options)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with llm:
            yield

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return error_response(APIError(exc.status_code, str(exc.detail), type=kind))

    async def internal_error(request: Request, exc: Exception) -> Response:
        return error_response(APIError(500, f"internal error: {exc}", type="server_error"))

    return Starlette(
        routes=[
            Route("/", server.chat_page, methods=["GET"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            Route("/health", server.health, methods=["GET"]),
            Route("/metrics", server.metrics_endpoint, methods=["GET"]),
            Route("/v1/models", server.models, methods=["GET"]),
            Route("/v1/models/{name:path}", server.model, methods=["GET"]),
            Route("/v1/completions", server.completions, methods=["POST"]),
            Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
            Route("/v1/classify", server.classify, methods=["POST"]),
            Route("/v1/embeddings", server.embeddings, methods=["POST"]),
            Route("/v1/rerank", server.rerank, methods=["POST"]),
            Route("/rerank", server.rerank, methods=["POST"]),
            Route("/v1/responses", server.responses, methods=["POST"]),
            Route("/v1/responses/{response_id}", server.stored_response, methods=["GET"]),
            Route("/v1/messages", server.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", server.count_tokens, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: internal_error},
        middleware=security_middleware(options.api_key, options.allowed_origins),
        lifespan=lifespan,
    )
