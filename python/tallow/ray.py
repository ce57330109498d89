"""Replicas of ``tallow serve`` on Ray Serve (``pip install tallow[ray]``; ``tallow serve
--replicas N``).

Each replica is a process of its own (Ray's actor) running the whole server app of
:func:`tallow.server.build_app` (the OpenAI-compatible routes, the chat page, metrics) over its
own :class:`~tallow.AsyncLLM`, with ``threads`` compute threads. One ingress (:class:`Ingress`)
takes the HTTP requests and checks them as ``tallow serve`` does (CORS, the API key before any
body is read, then the body's type, size and time), reads each body once for its routing key (a
completion's prompt, a chat's messages) and passes the request to a replica, whose response it
streams back as it comes. :func:`run` serves the ingress from its own process with the HTTP
server of ``tallow serve`` (and its deadline for request headers, which Ray Serve's proxy
lacks); :func:`build` makes it a deployment behind Ray Serve's proxy, for those who run their
own Serve applications.

**Routing** is prefix-aware (:class:`PrefixAwareRouter`): a request goes to the replica that
last served the longest prefix of its routing key, whose prefix cache most likely holds that
prefix's KV, unless that replica's queue is longer than the shortest by more than
``imbalance`` requests; a new prefix goes to the least loaded replica. ``routing="random"``
(:class:`RandomRouter`) is there to measure what that gains.

**Failures.** A replica that dies fails its own requests only: a request that had no answer yet
is a 503 in OpenAI's error shape, a stream that had begun ends with an error event and
``data: [DONE]``; Ray Serve starts a new replica in its place. What failed (Ray's actor, process
and node) goes to the log, not to the client. On one machine this spreads
requests over processes and cores; on a cluster, where the replicas run is Ray's own
scheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import ipaddress
import json
import logging
import os
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import ray
from ray import serve
from ray.exceptions import RayError
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tallow.errors import InvalidArgumentError, TallowError
from tallow.server.app import JSON_ROUTES, ServerOptions, error_response, read_json_body
from tallow.server.http import bind, protocol_with_header_timeout
from tallow.server.protocol import APIError
from tallow.server.security import has_api_key, security_middleware

__all__ = [
    "PrefixAwareRouter",
    "ProxiedRequest",
    "RandomRouter",
    "build",
    "routing_key",
    "run",
]

Routing = Literal["prefix", "random"]

REPLICA_HEADER = "x-tallow-replica"
"""The response header naming the replica that answered (Ray's actor name of it), on the
responses to requests that carry the API key (to all, without a key)."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProxiedRequest:
    """An HTTP request on its way from the ingress to a replica."""

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    routing_key: str = ""
    """The text whose prefix picks the replica (see :func:`routing_key`)."""


def routing_key(path: str, body: bytes) -> str:
    """The text whose prefix picks a request's replica: a completion's prompt or a chat's
    messages, as the replica's prefix cache sees them (in order, from the start). Other
    requests, and bodies that are not what they should be (the replica answers those), have
    none."""
    if not path.startswith("/v1/") or not body:
        return ""
    try:
        request = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(request, dict):
        return ""
    messages = request.get("messages")
    if isinstance(messages, list):
        return "".join(
            f"{m.get('role')}\n{m.get('content')}\n" for m in messages if isinstance(m, dict)
        )
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # several prompts: the first
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


# -- routing --------------------------------------------------------------------------------------


def _key_of(request: PendingRequest | None) -> str:
    args = () if request is None else request.args
    return args[0].routing_key if args and isinstance(args[0], ProxiedRequest) else ""


class PrefixAwareRouter(RequestRouter):
    """Sends a request to the replica that last served the longest prefix of its routing key
    (in blocks of ``block_chars`` characters), unless that replica's queue is longer than the
    shortest by more than ``imbalance``; otherwise to the least loaded replica. Remembers the
    owners of the last ``max_prefixes`` blocks."""

    def initialize_state(
        self, block_chars: int = 64, imbalance: int = 4, max_prefixes: int = 65536, **_: Any
    ) -> None:
        self._block_chars = block_chars
        self._imbalance = imbalance
        self._max_prefixes = max_prefixes
        self._owners: OrderedDict[bytes, ReplicaID] = OrderedDict()

    def _blocks(self, key: str) -> list[bytes]:
        """Digests of the key's leading whole blocks: of its first block, its first two, ..."""
        digest = hashlib.blake2b(digest_size=16)
        out = []
        data = key.encode()
        for end in range(self._block_chars, len(data) + 1, self._block_chars):
            digest.update(data[end - self._block_chars : end])
            out.append(digest.digest())
        return out

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        owner = self._owner(_key_of(pending_request), candidate_replicas)
        if owner is None:
            # The least loaded of them all (the router probes their queues).
            return [candidate_replicas]
        rest = [r for r in candidate_replicas if r is not owner]
        return [[owner], rest] if rest else [[owner]]

    def _owner(self, key: str, candidates: list[RunningReplica]) -> RunningReplica | None:
        by_id = {r.replica_id: r for r in candidates}
        owner = None
        for block in reversed(self._blocks(key)):
            owner = by_id.get(self._owners.get(block))  # type: ignore[arg-type]
            if owner is not None:
                break
        if owner is None:
            return None
        queues = [self._replica_queue_len_cache.get(r.replica_id) for r in candidates]
        known = [q for q in queues if q is not None]
        mine = self._replica_queue_len_cache.get(owner.replica_id)
        if mine is not None and known and mine - min(known) > self._imbalance:
            return None
        return owner

    def on_request_routed(
        self,
        pending_request: PendingRequest,
        replica_id: ReplicaID,
        result: Any,
    ) -> None:
        for block in self._blocks(_key_of(pending_request)):
            self._owners[block] = replica_id
            self._owners.move_to_end(block)
        while len(self._owners) > self._max_prefixes:
            self._owners.popitem(last=False)


class RandomRouter(RequestRouter):
    """Sends each request to a replica chosen at random (to measure what prefix-aware routing
    gains)."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        return [[random.choice(candidate_replicas)]] if candidate_replicas else []


# -- the replicas ---------------------------------------------------------------------------------


class _Lifespan:
    """Runs an ASGI app's lifespan (its startup, and its shutdown on :meth:`stop`) in a task
    of its own, as a server does."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._started = asyncio.Event()
        self._failure: str | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())
            await self._inbox.put({"type": "lifespan.startup"})
        await self._started.wait()
        if self._failure is not None:
            raise TallowError(f"the server app did not start: {self._failure}")

    async def _run(self) -> None:
        async def send(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                self._failure = message.get("message", "")
            if message["type"].startswith("lifespan.startup"):
                self._started.set()

        await self._app({"type": "lifespan", "asgi": {"version": "3.0"}}, self._inbox.get, send)

    async def stop(self) -> None:
        if self._task is not None:
            await self._inbox.put({"type": "lifespan.shutdown"})
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 30)


async def _call(app: ASGIApp, request: ProxiedRequest) -> AsyncIterator[dict[str, Any]]:
    """``request`` through ``app``: ``{"status", "headers"}``, then ``{"body"}`` pieces as the
    app sends them. Closing the iterator early is the client going away: the app sees a
    disconnect (and aborts what it generates)."""
    sent: asyncio.Queue[Message] = asyncio.Queue()
    gone = asyncio.Event()
    body = [{"type": "http.request", "body": request.body, "more_body": False}]

    async def receive() -> Message:
        if body:
            return body.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": request.query,
        "root_path": "",
        "headers": request.headers,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }

    async def run_app() -> None:
        await app(scope, receive, sent.put)

    task = asyncio.create_task(run_app())
    try:
        while True:
            get = asyncio.ensure_future(sent.get())
            await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                task.result()  # the app's exception, if it raised one
                if sent.empty():
                    return
                continue
            message = get.result()
            if message["type"] == "http.response.start":
                yield {"status": message["status"], "headers": list(message.get("headers", []))}
            elif message["type"] == "http.response.body":
                yield {"body": message.get("body", b"")}
                if not message.get("more_body", False):
                    return
    finally:
        gone.set()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class ServerReplica:
    """One replica: the app of :func:`tallow.server.build_app`, its model loaded."""

    def __init__(self, model: str, settings: Mapping[str, Any]) -> None:
        from tallow.server import build_app

        self._app = build_app(model, **settings)
        self._lifespan = _Lifespan(self._app)
        self._name = serve.get_replica_context().replica_id.to_full_id_str()

    async def handle(self, request: ProxiedRequest) -> AsyncIterator[dict[str, Any]]:
        """The app's answer to ``request``, as :func:`_call` gives it, with the replica's name
        beside the status (``"replica"``)."""
        await self._lifespan.start()
        async for message in _call(self._app, request):
            if "status" in message:
                message["replica"] = self._name
            yield message

    async def __del__(self) -> None:
        await self._lifespan.stop()


# -- the ingress ----------------------------------------------------------------------------------


def _replica_failed(error: Exception) -> APIError:
    """The answer to a request whose replica failed. Ray's error names the actor, its process
    and its node: the log has it, the client does not."""
    logger.warning("the replica serving a request failed: %s", error)
    return APIError(
        503, "the replica serving this request failed", type="server_error", code="replica_failed"
    )


class _AppResponse(Response):
    """The response of an ASGI app to the request at hand (Ray Serve sends an ingress's
    response by calling it with the request's scope, receive and send)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


class Ingress:
    """Takes every HTTP request, checks it as ``tallow serve`` does (``options``' CORS origins,
    API key and limits on the body) and passes it to a replica (chosen by the replicas'
    router)."""

    def __init__(
        self, replicas: DeploymentHandle[Any], options: ServerOptions | None = None
    ) -> None:
        self._replicas = replicas.options(stream=True)
        self._options = options or ServerOptions()
        app: ASGIApp = self._forward
        for cls, args, kwargs in reversed(
            security_middleware(self._options.api_key, self._options.allowed_origins)
        ):
            app = cls(app, *args, **kwargs)
        self.app = app
        """The ingress as an ASGI app, for an HTTP server of one's own."""

    async def __call__(self, request: Request) -> Response:
        """The answer to ``request`` (as Ray Serve's ingress deployment): the checks', or the
        replica's."""
        return _AppResponse(self.app)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Past the CORS and key checks: the replica's answer, or the body's error."""
        request = Request(scope, receive)
        body = b""
        if request.method == "POST" and request.url.path in JSON_ROUTES:
            try:
                body = await read_json_body(request, self._options)
            except APIError as e:
                await error_response(e)(scope, receive, send)
                return
        response = await self._answer(request, body)
        await response(scope, receive, send)

    def _names_replica(self, scope: Scope) -> bool:
        """Whether the response to this request may name its replica."""
        key = self._options.api_key
        return key is None or has_api_key(scope, key)

    async def _answer(self, request: Request, body: bytes) -> Response:
        """The answer of a replica to ``request`` with ``body``, streamed."""
        path = request.url.path
        proxied = ProxiedRequest(
            request.method,
            path,
            request.url.query.encode(),
            list(request.headers.raw),
            body,
            routing_key(path, body),
        )
        answer = cast(DeploymentResponseGenerator[Any], self._replicas.handle.remote(proxied))
        try:
            head = await answer.__anext__()
        except (RayError, StopAsyncIteration) as e:
            return error_response(_replica_failed(e))
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in head["headers"]
            if k.lower() not in (b"content-length", b"transfer-encoding", b"connection")
        }
        if self._names_replica(request.scope):
            headers[REPLICA_HEADER] = head["replica"]
        events = headers.get("content-type", "").startswith("text/event-stream")
        return StreamingResponse(_rest(answer, events), status_code=head["status"], headers=headers)


async def _rest(answer: DeploymentResponseGenerator[Any], events: bool) -> AsyncIterator[bytes]:
    """The body of a replica's answer; if the replica fails in the middle of an event stream,
    an error event and the stream's end."""
    try:
        async for message in answer:
            yield message["body"]
    except RayError as e:
        if not events:
            raise
        yield b"data: " + _replica_failed(e).json_bytes() + b"\n\n"
        yield b"data: [DONE]\n\n"


# -- the application ------------------------------------------------------------------------------


def _scaling(replicas: int, max_replicas: int | None, max_batch: int) -> dict[str, Any]:
    """The deployment options of a fixed number of replicas, or of autoscaling bounds."""
    if max_replicas is None:
        return {"num_replicas": replicas}
    return {
        "autoscaling_config": {
            "min_replicas": replicas,
            "max_replicas": max_replicas,
            # A replica is busy when its batch is half full.
            "target_ongoing_requests": max(max_batch // 2, 1),
        }
    }


def _replicas(
    model: str | os.PathLike[str],
    replicas: int,
    max_replicas: int | None,
    threads: int,
    routing: Routing,
    settings: Mapping[str, Any] | None,
) -> tuple[Any, ServerOptions]:
    """The replicas' deployment of :func:`build`, bound to its arguments, and the options the
    ingress checks requests against."""
    if replicas < 1 or (max_replicas is not None and max_replicas < replicas):
        raise InvalidArgumentError(
            f"replicas must be >= 1 and max_replicas >= replicas, got {replicas} and {max_replicas}"
        )
    if threads < 1:
        raise InvalidArgumentError(f"threads must be >= 1, got {threads}")
    routers = {"prefix": PrefixAwareRouter, "random": RandomRouter}
    if routing not in routers:
        raise InvalidArgumentError(f"routing must be 'prefix' or 'random', got {routing!r}")
    settings = dict(settings or {})
    max_batch = int(settings.get("max_batch", 64))
    options = settings.get("options") or ServerOptions()
    # CORS is the ingress's (which answers preflight requests): from the replicas too, a
    # response would carry its headers twice.
    settings["options"] = dataclasses.replace(options, allowed_origins=())
    replica = serve.deployment(
        name="tallow-replica",
        ray_actor_options={
            "num_cpus": threads,
            "runtime_env": {"env_vars": {"TALLOW_NUM_THREADS": str(threads)}},
        },
        # Beyond its batch, a replica queues some more (so that the router sees the load).
        max_ongoing_requests=2 * max_batch,
        # (pydantic's field types confuse mypy: a class path is what the field takes.)
        request_router_config=RequestRouterConfig(
            request_router_class=f"{__name__}.{routers[routing].__name__}"  # type: ignore[arg-type]
        ),
        **_scaling(replicas, max_replicas, max_batch),
    )(ServerReplica)
    return replica.bind(os.fspath(model), settings), options


def build(
    model: str | os.PathLike[str],
    *,
    replicas: int = 2,
    max_replicas: int | None = None,
    threads: int = 1,
    routing: Routing = "prefix",
    settings: Mapping[str, Any] | None = None,
) -> Any:
    """The Ray Serve application of ``model``: ``replicas`` replicas (or between ``replicas``
    and ``max_replicas``, scaled by their load) of ``threads`` threads each, behind one
    ingress deployment. ``settings`` are :func:`tallow.server.build_app`'s (``max_batch``,
    ``kv_memory``, ``kv_dtype``, ``n_ctx``, ``device``, ``chat_template``, ``options``) for
    every replica; the ingress checks requests against ``options``' key, CORS origins and
    limits, as ``tallow serve`` does, but for the deadline of request headers, which Ray
    Serve's HTTP proxy does not have (:func:`run` has it).
    ``routing`` is ``"prefix"`` or ``"random"`` (see the module's docstring)."""
    replica, options = _replicas(model, replicas, max_replicas, threads, routing, settings)
    ingress = serve.deployment(
        name="tallow-ingress", max_ongoing_requests=100_000, ray_actor_options={"num_cpus": 0}
    )(Ingress)
    return ingress.bind(replica, options)


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray reads this variable when it is imported: set to ``0``, a local cluster takes 127.0.0.1 for
its node's address, and its services (GCS, raylet, workers, agents, the Serve controller and
proxy) listen on loopback alone, but for the gRPC server that Ray Serve opens on ``[::]`` in
each replica (guarded by Ray's token). ``tallow serve`` sets it."""


def _warn_unless_loopback() -> None:
    """Log a warning when the local cluster's services listen beyond loopback."""
    address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    if not ipaddress.ip_address(address).is_loopback:
        logger.warning(
            "Ray's services listen on %s, beyond this machine: import Ray with %s=0 in the "
            "environment to keep a local cluster on loopback",
            address,
            LOOPBACK_ENV,
        )


def run(
    model: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    replicas: int = 2,
    max_replicas: int | None = None,
    threads: int = 1,
    routing: Routing = "prefix",
    settings: Mapping[str, Any] | None = None,
    log_level: str = "info",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``model`` on ``host:port`` with :func:`build`'s replicas until interrupted (or
    terminated), on a local Ray cluster that this starts (or the one ``RAY_ADDRESS`` names).
    The ingress runs in this process, with the HTTP server of ``tallow serve``; Ray Serve's
    proxy is not started. The local cluster's own services listen on loopback when Ray was
    imported with :data:`LOOPBACK_ENV` set to ``0`` (otherwise a warning says where they
    listen). Raises :class:`~tallow.TallowError` when the port cannot be had or the server
    cannot start."""
    import uvicorn

    replica, options = _replicas(model, replicas, max_replicas, threads, routing, settings)
    # The port is taken first, so that a busy port fails before any replica starts.
    sock = bind(host, port)
    try:
        if not ray.is_initialized():
            local = "RAY_ADDRESS" not in os.environ
            cpus = threads * (max_replicas or replicas)
            ray.init(num_cpus=cpus if local else None, include_dashboard=False, log_to_driver=False)
            if local:
                _warn_unless_loopback()
        serve.start(proxy_location="Disabled")
        try:
            ingress = Ingress(serve.run(replica, name="tallow", route_prefix=None), options)
            config = uvicorn.Config(
                ingress.app,
                log_level=log_level,
                lifespan="off",
                interface="asgi3",
                http=protocol_with_header_timeout(options.read_timeout),
            )
            if on_ready is not None:
                on_ready(f"http://{host}:{sock.getsockname()[1]}/v1")
            try:
                uvicorn.Server(config).run(sockets=[sock])
            except SystemExit:  # uvicorn's way of saying that the server did not start
                raise TallowError("the server did not start (see the log above)") from None
        finally:
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
    finally:
        sock.close()
