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
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

import anyio
import anyio.from_thread
import anyio.to_thread
import numpy as np
import numpy.typing as npt
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from tallow import _core, checks
from tallow.catalog import DEFAULT_MODEL, resolve_model
from tallow.classify import Classification, ClassifyTask, ClassifyTasks
from tallow.embed import EmbedTask
from tallow.embed import inputs as embed_inputs
from tallow.engine import Engine, EngineConfig, SamplingParams, load_model, sampling_params
from tallow.errors import InvalidArgumentError, ModelError, TallowError
from tallow.output import GenerationResult, RequestOutput, ResultBuilder
from tallow.prompt import ChatPrompt, Prompts
from tallow.rerank import Reranked, RerankTask, ranked

__all__ = ["AsyncLLM"]


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

    ``model`` is a path (a GGUF file or a checkpoint folder, its matrices rounded to
    ``quantize``), a catalog name or a Hub name, as for :class:`tallow.LLM`.
    ``max_num_seqs`` requests run at once (more wait); the KV pool holds ``kv_pages`` pages of
    ``page_size`` tokens, or ``kv_bytes`` of memory; ``n_ctx`` bounds each request's context
    (and, as for :class:`tallow.LLM`, picks a Phi-3 128k model's long or short RoPE factors).
    ``prefix_caching`` reuses the KV of prompt prefixes already computed; ``speculative`` turns
    on speculative decoding (``True`` or ``"ngram"`` for prompt lookup, or
    ``{"method": "draft", "draft_model": "...", "num_tokens": 4}``; see
    :mod:`tallow.speculative`), which a request may override with its ``speculative`` option.
    ``device`` is where the model runs, as for :class:`tallow.LLM`. ``chat_template`` (Jinja
    source) replaces the model's own chat template. ``kv_dtype`` is what the KV pages hold keys
    and values in: ``"f16"``, ``"q8_0"``, ``"q4_0"`` or ``"bf16"`` (see
    :class:`tallow.engine.EngineConfig`).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = DEFAULT_MODEL,
        *,
        max_num_seqs: int = 64,
        max_tokens_per_step: int = 512,
        kv_pages: int | None = None,
        kv_bytes: int | None = None,
        page_size: int = 16,
        n_ctx: int | None = None,
        prefix_caching: bool = True,
        speculative: object = None,
        device: str | None = None,
        chat_template: str | None = None,
        kv_dtype: str = "f16",
        quantize: str | None = None,
    ) -> None:
        self._model = load_model(resolve_model(model), n_ctx, device, quantize)
        self._engine = Engine(
            self._model,
            EngineConfig(
                max_num_seqs=max_num_seqs,
                max_tokens_per_step=max_tokens_per_step,
                page_size=page_size,
                kv_pages=kv_pages,
                kv_bytes=kv_bytes,
                n_ctx=n_ctx,
                prefix_caching=prefix_caching,
                speculative=speculative,
                kv_dtype=kv_dtype,
            ),
        )
        self._inbox: queue.SimpleQueue[_Add | str | None] = queue.SimpleQueue()
        self._streams: dict[str, MemoryObjectSendStream[RequestOutput]] = {}
        self._ids = itertools.count()
        self._task_group: TaskGroup | None = None
        self._closed = False
        self._failure: BaseException | None = None
        self._prompts = Prompts(self._model, self._engine.n_ctx, chat_template)
        self._classify_tasks = ClassifyTasks(self._prompts)
        self.chat_template = self._prompts.chat_template
        """The model's chat template, used by :meth:`chat` (see :mod:`tallow.chat_template`)."""

    async def __aenter__(self) -> AsyncLLM:
        if self._closed or self._task_group is not None:
            raise InvalidArgumentError("an AsyncLLM can be entered (`async with`) only once")
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._run_engine)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._inbox.put(None)
        assert self._task_group is not None
        # The engine thread stops at once; an exception of the block goes on as it is (not
        # wrapped in the task group's ExceptionGroup).
        await self._task_group.__aexit__(None, None, None)

    # -- the engine thread ----------------------------------------------------------------------

    async def _run_engine(self) -> None:
        try:
            await anyio.to_thread.run_sync(self._engine_loop)
        finally:
            # Requests still waiting (from tasks outside the `async with` block) end now;
            # their callers raise.
            self._closed = True
            self._close_all()

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
                        rejected = RequestOutput(message.request_id, [], "", True, "abort", error=e)
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
        """In the event loop, after the engine stopped: end every stream (their callers
        raise)."""
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()

    # -- requests -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._failure is not None:
            raise ModelError(f"the engine stopped: {self._failure}")
        if self._closed:
            raise InvalidArgumentError("this AsyncLLM is closed (its `async with` block ended)")
        if self._task_group is None:
            raise InvalidArgumentError("use AsyncLLM inside `async with`")

    @property
    def n_ctx(self) -> int:
        """Positions of one request's context (prompt plus completion)."""
        return self._engine.n_ctx

    @property
    def model(self) -> _core.Model:
        """The loaded model (its tokenizer and metadata)."""
        return self._model

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text`` (as :meth:`tallow.LLM.tokenize`): BOS (and EOS) where the
        model's metadata asks for them with ``add_special``; control-token text as those
        tokens with ``parse_special``."""
        return self._prompts.tokenize(text, add_special, parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids (the inverse of :meth:`tokenize` without special tokens)."""
        return self._prompts.detokenize(ids)

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """The token ids ``prompt`` runs as (see :meth:`tallow.prompt.Prompts.ids`): text is
        tokenized with control-token text parsed and BOS added where the model asks for it; ids
        are checked against the vocabulary. Raises :class:`InvalidArgumentError` for an invalid
        prompt and :class:`ModelError` for one that leaves no room in the context."""
        return self._prompts.ids(prompt)

    def chat_prompt(
        self,
        messages: Sequence[Mapping[str, object]],
        params: SamplingParams,
        *,
        parse_special: bool = False,
        tools: object = None,
        tool_choice: object = None,
    ) -> ChatPrompt:
        """A chat request for :meth:`outputs`: its prompt with ``tools`` described to the
        model, and ``params`` constrained where ``tool_choice`` requires a call (see
        :meth:`tallow.prompt.Prompts.chat`)."""
        return self._prompts.chat(
            messages, params, parse_special=parse_special, tools=tools, tool_choice=tool_choice
        )

    def chat_ids(
        self, messages: Sequence[Mapping[str, object]], *, parse_special: bool = False
    ) -> list[int]:
        """The token ids of a conversation rendered with :attr:`chat_template`, ending with the
        opening of the assistant's turn (checked as :meth:`prompt_ids` does). Control-token
        text in the messages stays text unless ``parse_special``."""
        return self._prompts.chat_ids(
            messages, parse_special=checks.boolean("parse_special", parse_special)
        )

    async def outputs(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one request (from :meth:`prompt_ids` or :meth:`chat_ids`),
        as its steps produce them; the last has ``finished`` set. Leaving the loop early, or
        being cancelled, aborts the request. Raises the request's error if it fails
        (:class:`~tallow.GrammarError` where its constraint cannot go on, :class:`ModelError`
        where the model cannot run it)."""
        self._check_open()
        ids = checks.token_ids("prompt", prompt_ids, self._model.n_vocab)
        if params.structured is None:
            sampler = self._engine.sampler(params)
        else:
            # Compiling a constraint may take a while (large schemas): not on the event loop.
            sampler = await anyio.to_thread.run_sync(self._engine.sampler, params)
        request_id = f"req-{next(self._ids)}"
        send, receive = anyio.create_memory_object_stream[RequestOutput](math.inf)
        self._streams[request_id] = send
        self._inbox.put(_Add(request_id, ids, params, sampler))
        finished = False
        try:
            async with receive:
                async for out in receive:
                    finished = out.finished
                    if out.error is not None:
                        raise out.error
                    yield out
            if not finished:
                self._check_open()
                raise ModelError("the request ended without a result")
        finally:
            if not finished:
                self._streams.pop(request_id, None)
                self._inbox.put(request_id)

    async def _text(
        self, ids: list[int], params: SamplingParams, result: ResultBuilder | None = None
    ) -> AsyncIterator[str]:
        """The text pieces of a request, its outputs gathered into ``result``."""
        result = result or ResultBuilder(len(ids), params.logprobs)
        async for out in self.outputs(ids, params):
            text = result.add(out)
            if text:
                yield text

    async def _complete(self, ids: list[int], params: SamplingParams) -> GenerationResult:
        result = ResultBuilder(len(ids), params.logprobs)
        async for _ in self._text(ids, params, result):
            pass
        return result.result()

    async def stream(
        self,
        prompt: str | Sequence[int],
        max_tokens: int | None = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        *,
        parse_special: bool = True,
        **options: object,
    ) -> AsyncIterator[str]:
        """Yield the generated text piece by piece (whole characters; a stop string is never
        emitted). The arguments are those of :meth:`tallow.LLM.generate`, with the same
        defaults: ``options`` are ``min_p``, penalties, ``logit_bias``, ``stop_token_ids``,
        ``ignore_eos``, ``logprobs``, ``top_logprobs``, ``speculative`` and one constraint on
        the output: ``json_schema``, ``json_object``, ``regex``, ``choice`` or ``grammar``
        (see :mod:`tallow.structured`)."""
        self._check_open()
        params = sampling_params(max_tokens, temperature, top_k, top_p, seed, stop, **options)
        ids = self._prompts.ids(prompt, parse_special=parse_special)
        async for piece in self._text(ids, params):
            yield piece

    async def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int | None = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        *,
        parse_special: bool = True,
        **options: object,
    ) -> GenerationResult:
        """Generate a whole completion (see :meth:`stream` for the arguments)."""
        self._check_open()
        params = sampling_params(max_tokens, temperature, top_k, top_p, seed, stop, **options)
        ids = self._prompts.ids(prompt, parse_special=parse_special)
        return await self._complete(ids, params)

    async def chat_stream(
        self,
        messages: Sequence[Mapping[str, object]],
        max_tokens: int | None = None,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        *,
        parse_special: bool = False,
        tools: Sequence[Mapping[str, object]] | None = None,
        tool_choice: object = None,
        **options: object,
    ) -> AsyncIterator[str]:
        """Like :meth:`chat`, yielding the reply piece by piece; the text of tool calls is
        not among the pieces."""
        self._check_open()
        params = sampling_params(max_tokens, temperature, top_k, top_p, seed, stop, **options)
        chat = self.chat_prompt(
            messages, params, parse_special=parse_special, tools=tools, tool_choice=tool_choice
        )
        async for piece in self._text(chat.ids, chat.params):
            yield piece

    async def chat(
        self,
        messages: Sequence[Mapping[str, object]],
        max_tokens: int | None = None,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        *,
        parse_special: bool = False,
        tools: Sequence[Mapping[str, object]] | None = None,
        tool_choice: object = None,
        **options: object,
    ) -> GenerationResult:
        """The assistant's reply to ``messages``, as :meth:`tallow.LLM.chat` (the same
        arguments and defaults): rendered with the model's chat template, ending at its
        end-of-turn token; the calls of ``tools`` come back in ``tool_calls``."""
        self._check_open()
        params = sampling_params(max_tokens, temperature, top_k, top_p, seed, stop, **options)
        chat = self.chat_prompt(
            messages, params, parse_special=parse_special, tools=tools, tool_choice=tool_choice
        )
        return await self._complete(chat.ids, chat.params)

    async def classify(
        self, texts: str | Sequence[str], labels: Sequence[str], prompt: str | None = None
    ) -> list[Classification]:
        """Zero-shot classification, as :meth:`tallow.LLM.classify` (the same arguments): for
        each text, the probability of each label as the model's answer. The texts run as
        concurrent requests."""
        self._check_open()
        task = self.classify_task(labels, prompt)
        return await self.run_classification(
            task, [task.prompt_ids(text) for text in task.texts(texts)]
        )

    def classify_task(self, labels: Sequence[str], prompt: str | None = None) -> ClassifyTask:
        """The labels and prompt of a classification, checked (see
        :class:`tallow.classify.ClassifyTask`), for :meth:`run_classification`."""
        steps = self._engine.scheduler.max_tokens_per_step
        return self._classify_tasks.get(labels, prompt, steps)

    async def run_classification(
        self, task: ClassifyTask, prompts: Sequence[list[int]]
    ) -> list[Classification]:
        """The classification of each prompt of ``task`` (from ``task.prompt_ids``), run as
        concurrent requests; the first error raised."""
        outputs = await self._last_outputs(prompts, task.params)
        return [task.result(out, len(ids)) for out, ids in zip(outputs, prompts, strict=True)]

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        prompt: str | None = None,
        instruction: str | None = None,
    ) -> list[Reranked]:
        """The documents ranked by their relevance to ``query``, as :meth:`tallow.LLM.rerank`
        (the same arguments). The documents run as concurrent requests."""
        self._check_open()
        task = self.rerank_task(query, prompt, instruction)
        docs = task.documents(documents)
        top_n = None if top_n is None else checks.integer("top_n", top_n, 1)
        prompts = [task.prompt_ids(d) for d in docs]
        return ranked(await self.run_reranking(task, docs, prompts), top_n)

    def rerank_task(
        self, query: object, prompt: object = None, instruction: object = None
    ) -> RerankTask:
        """The prompt and answers of a reranking for ``query``, checked (see
        :class:`tallow.rerank.RerankTask`), for :meth:`run_reranking`."""
        steps = self._engine.scheduler.max_tokens_per_step
        return RerankTask(self._prompts, query, prompt, instruction, step_tokens=steps)

    async def run_reranking(
        self, task: RerankTask, documents: Sequence[str], prompts: Sequence[list[int]]
    ) -> list[Reranked]:
        """The relevance of each of ``documents`` (checked by ``task.documents``), whose
        prompts are ``prompts`` (from ``task.prompt_ids``), in their order, run as concurrent
        requests; the first error raised."""
        return task.results(documents, prompts, await self._last_outputs(prompts, task.params))

    async def embed(
        self,
        texts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
        *,
        normalize: bool = True,
        pooling: str | None = None,
        dimensions: int | None = None,
    ) -> npt.NDArray[np.float32]:
        """The embedding of each text, as :meth:`tallow.LLM.embed` (the same arguments): a
        1-D array for one text, else a 2-D array with a row per input. The inputs run as
        concurrent requests, batched with everything else the engine runs."""
        self._check_open()
        task = self.embed_task(pooling, normalize, dimensions)
        vectors = await self.run_embeddings(task, [task.prompt_ids(i) for i in embed_inputs(texts)])
        return vectors[0] if isinstance(texts, str) else np.stack(vectors)

    def embed_task(
        self, pooling: object = None, normalize: object = True, dimensions: object = None
    ) -> EmbedTask:
        """The embeddings of one kind for this model, checked (see
        :class:`tallow.embed.EmbedTask`), for :meth:`run_embeddings`."""
        return EmbedTask(self._prompts, pooling, normalize, dimensions)

    async def run_embeddings(
        self, task: EmbedTask, prompts: Sequence[list[int]]
    ) -> list[npt.NDArray[np.float32]]:
        """The embedding of each prompt of ``task`` (from ``task.prompt_ids``), run as
        concurrent requests; the first error raised."""
        return [task.result(out) for out in await self._last_outputs(prompts, task.params)]

    async def _last_outputs(
        self, prompts: Sequence[list[int]], params: SamplingParams
    ) -> list[RequestOutput]:
        """The last output of each of ``prompts`` run as concurrent requests with ``params``
        (which produce no text: scoring, embedding); the first error raised, the other
        requests then cancelled."""
        results: list[RequestOutput | None] = [None] * len(prompts)
        errors: list[TallowError] = []

        async def one(i: int, ids: list[int]) -> None:
            try:
                async for out in self.outputs(ids, params):
                    results[i] = out
            except TallowError as e:
                errors.append(e)
                group.cancel_scope.cancel()  # the others are of no use now

        async with anyio.create_task_group() as group:
            for i, ids in enumerate(prompts):
                group.start_soon(one, i, ids)
        if errors:
            # One input's error is the call's, as the other front ends raise it.
            raise errors[0]
        done = [r for r in results if r is not None]
        assert len(done) == len(prompts), "outputs() ends with a finished output or raises"
        return done

    def stats(self) -> dict[str, float]:
        """KV pages total / used / free, tokens cached, slot utilization, running and waiting
        requests, preemptions and recent tokens per second."""
        return self._engine.stats()
