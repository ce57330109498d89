"""``AsyncLLM``: many concurrent requests on one model, from anyio (asyncio or trio) code.

The engine runs in a worker thread of its own (``anyio.to_thread``), stepping while there is
work; the model releases the GIL while it computes, so the event loop stays responsive. Callers
put requests and aborts on a thread-safe queue; after each step the engine thread hands the
outputs to the event loop, which routes them into each request's memory stream.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import queue
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from tallow import _core
from tallow.catalog import DEFAULT_MODEL, resolve_model
from tallow.engine import Engine, EngineConfig, SamplingParams, check_token_ids, sampling_params
from tallow.errors import InvalidArgumentError, ModelError, TallowError
from tallow.scheduler import RequestOutput, TokenLogprob

__all__ = ["AsyncLLM", "Completion"]


@dataclass(frozen=True)
class Completion:
    """The outcome of :meth:`AsyncLLM.generate`."""

    text: str
    token_ids: list[int]
    finish_reason: str
    """``"stop"``, ``"length"`` or ``"abort"``."""
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None
    """Per generated token, when asked for with ``logprobs=True`` (and ``top_logprobs=k``)."""


@dataclass(frozen=True)
class _Add:
    """A request on its way to the engine thread, its sampler already made (and so its
    parameters already checked) on the caller's side."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    sampler: _core.Sampler


class AsyncLLM:
    """A model serving any number of concurrent requests with continuous batching.

    ::

        async with AsyncLLM("smollm2-135m") as llm:
            text = (await llm.generate("Hello", max_tokens=16)).text
            async for piece in llm.stream("Once upon a time", max_tokens=64):
                print(piece, end="")

    Every task may call :meth:`generate` and :meth:`stream` at once. Cancelling a caller (a
    cancel scope, a cancelled task, a stream closed early) aborts its request, and its KV pages
    are freed at the next step.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = DEFAULT_MODEL,
        *,
        max_num_seqs: int = 64,
        max_tokens_per_step: int = 512,
        kv_pages: int | None = None,
        page_size: int = 16,
        n_ctx: int | None = None,
    ) -> None:
        self._model = _core.Model(str(resolve_model(model)))
        self._engine = Engine(
            self._model,
            EngineConfig(
                max_num_seqs=max_num_seqs,
                max_tokens_per_step=max_tokens_per_step,
                page_size=page_size,
                kv_pages=kv_pages,
                n_ctx=n_ctx,
            ),
        )
        self._inbox: queue.SimpleQueue[_Add | str | None] = queue.SimpleQueue()
        self._streams: dict[str, MemoryObjectSendStream[RequestOutput]] = {}
        self._ids = itertools.count()
        self._task_group: TaskGroup | None = None
        self._failure: BaseException | None = None

    async def __aenter__(self) -> AsyncLLM:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._run_engine)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._inbox.put(None)
        assert self._task_group is not None
        return await self._task_group.__aexit__(exc_type, exc, tb)

    # -- the engine thread ----------------------------------------------------------------------

    async def _run_engine(self) -> None:
        await anyio.to_thread.run_sync(self._engine_loop)

    def _engine_loop(self) -> None:
        engine = self._engine
        while True:
            block = not engine.has_work()
            try:
                while True:
                    message = self._inbox.get(block=block)
                    block = False
                    if message is None:
                        return
                    if isinstance(message, str):
                        engine.abort(message)
                        continue
                    try:
                        engine.add(
                            message.request_id, message.prompt, message.params, message.sampler
                        )
                    except TallowError as e:
                        rejected = RequestOutput(
                            message.request_id, [], "", True, "abort", error=str(e)
                        )
                        anyio.from_thread.run_sync(self._deliver, [rejected])
            except queue.Empty:
                pass
            if not engine.has_work():
                continue
            try:
                outputs = engine.step()
            except TallowError as e:
                self._failure = e
                anyio.from_thread.run_sync(self._close_all)
                return
            if outputs:
                anyio.from_thread.run_sync(self._deliver, outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """In the event loop: route each output to its request's stream."""
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            # The caller may have gone (its receiving end closed): drop the output.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                stream.send_nowait(out)
            if out.finished:
                stream.close()
                del self._streams[out.request_id]

    def _close_all(self) -> None:
        """In the event loop, after the engine failed: end every stream (their callers raise
        ModelError with the failure)."""
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()

    # -- requests -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._task_group is None:
            raise InvalidArgumentError("use AsyncLLM inside `async with`")
        if self._failure is not None:
            raise ModelError(f"the engine stopped: {self._failure}")

    def _submit(
        self, prompt: str | Sequence[int], params: SamplingParams
    ) -> tuple[str, int, MemoryObjectReceiveStream[RequestOutput]]:
        self._check_open()
        if isinstance(prompt, str):
            ids = self._model.tokenize(prompt, False, True)
            if self._model.add_bos and self._model.bos_id is not None:
                ids = [self._model.bos_id, *ids]
        else:
            ids = [int(t) for t in prompt]
            check_token_ids(ids, self._model.n_vocab)
        if not ids:
            raise InvalidArgumentError("the prompt has no tokens")
        if len(ids) > self._engine.n_ctx:
            raise ModelError(
                f"the prompt is {len(ids)} tokens long but the context holds {self._engine.n_ctx}"
            )
        sampler = params.new_sampler()
        request_id = f"req-{next(self._ids)}"
        send, receive = anyio.create_memory_object_stream[RequestOutput](math.inf)
        self._streams[request_id] = send
        self._inbox.put(_Add(request_id, ids, params, sampler))
        return request_id, len(ids), receive

    async def _outputs(
        self, prompt: str | Sequence[int], params: SamplingParams
    ) -> AsyncIterator[tuple[RequestOutput, int]]:
        request_id, n_prompt, receive = self._submit(prompt, params)
        finished = False
        try:
            async with receive:
                async for out in receive:
                    finished = out.finished
                    if (
                        out.error is not None
                        and not out.new_token_ids
                        and out.finish_reason == "abort"
                    ):
                        raise ModelError(out.error)
                    yield out, n_prompt
            if not finished and self._failure is not None:
                raise ModelError(f"the engine stopped: {self._failure}")
        finally:
            if not finished:
                self._streams.pop(request_id, None)
                self._inbox.put(request_id)

    async def stream(
        self,
        prompt: str | Sequence[int],
        max_tokens: int | None = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        **options: object,
    ) -> AsyncIterator[str]:
        """Yield the generated text piece by piece (whole characters; a stop string is never
        emitted). ``options`` are further :class:`~tallow.engine.SamplingParams` fields
        (``min_p``, penalties, ``logit_bias``, ``stop_token_ids``, ``ignore_eos``,
        ``logprobs``, ``top_logprobs``)."""
        params = sampling_params(max_tokens, temperature, top_k, top_p, seed, stop, **options)
        async for out, _ in self._outputs(prompt, params):
            if out.text:
                yield out.text

    async def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int | None = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        **options: object,
    ) -> Completion:
        """Generate a whole completion (see :meth:`stream` for the arguments)."""
        params = sampling_params(max_tokens, temperature, top_k, top_p, seed, stop, **options)
        text: list[str] = []
        tokens: list[int] = []
        logprobs: list[TokenLogprob] | None = [] if params.logprobs else None
        reason, n_prompt = "abort", 0
        async for out, count in self._outputs(prompt, params):
            n_prompt = count
            text.append(out.text)
            tokens.extend(out.new_token_ids)
            if logprobs is not None and out.logprobs:
                logprobs.extend(out.logprobs)
            if out.finished:
                reason = out.finish_reason or "stop"
        return Completion("".join(text), tokens, reason, n_prompt, len(tokens), logprobs)

    def stats(self) -> dict[str, float]:
        """KV pages total / used / free, tokens cached, slot utilization, running and waiting
        requests, preemptions and recent tokens per second."""
        return self._engine.stats()
