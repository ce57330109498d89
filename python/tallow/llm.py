"""The high-level API: :class:`LLM`."""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tallow import _core, checks
from tallow._signals import held_signals
from tallow.catalog import DEFAULT_MODEL, resolve_model
from tallow.chat_template import ChatTemplate
from tallow.classify import Classification, ClassifyTask, ClassifyTasks
from tallow.embed import EmbedTask
from tallow.embed import inputs as embed_inputs
from tallow.engine import (
    Engine,
    EngineConfig,
    SamplingParams,
    context_size,
    load_model,
    sampling_params,
)
from tallow.errors import InvalidArgumentError
from tallow.output import GenerationResult, RequestOutput, ResultBuilder
from tallow.prompt import Prompts
from tallow.rerank import Reranked, RerankTask, ranked

__all__ = ["LLM", "GenerationResult", "TextStream"]

# Streams of one LLM that may be open at once (interleaved generators share engine steps).
_MAX_STREAMS = 4
_PAGE_SIZE = 16

# Rows of logits converted to float64 at a time by perplexity(), to bound memory for large
# vocabularies.
_PPL_ROWS = 32


class TextStream(Iterator[str]):
    """An iterator over the pieces of text of one generation (from :meth:`LLM.stream`).

    Iterating yields non-empty strings; once it is exhausted, :attr:`result` holds the
    :class:`GenerationResult`. ``close()`` (or leaving a ``with`` block) stops early.
    """

    def __init__(self, gen: Generator[str, None, GenerationResult]) -> None:
        self._gen = gen
        self._result: GenerationResult | None = None

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        try:
            return next(self._gen)
        except StopIteration as stop:
            self._result = stop.value
            raise

    @property
    def result(self) -> GenerationResult | None:
        """The result, once the stream is exhausted (``None`` before, or if closed early)."""
        return self._result

    def close(self) -> None:
        """Stop the generation and release its context."""
        self._gen.close()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LLM:
    """A language model ready to generate text.

    ``model`` is a path to a ``.gguf`` file, the name of a catalog model (pulled into the
    cache on first use; see :mod:`tallow.catalog`), a Hugging Face Hub name such as
    ``"user/repo:Q4_K_M"`` (see :mod:`tallow.hub`), or a Hugging Face checkpoint folder
    (``config.json``, ``*.safetensors``, ``tokenizer.model``, ``tokenizer_config.json``) as
    transformers saves it, converted as it loads, its matrices rounded as ``llama-quantize``
    rounds them to the file type ``quantize`` (``"q4_k_m"``, ``"q8_0"``, ``"q6_k"``,
    ``"q5_k_m"``, ``"q4_0"``, ``"f16"``, ... any case; ``None`` keeps the checkpoint's
    precision). ``n_ctx`` is the number of
    positions of the context used by :meth:`generate` and :meth:`stream` (prompt plus
    generated tokens); by
    default the model's training context, capped at 4096. A model with long-context RoPE factors
    (Phi-3 128k) uses its long factors only when ``n_ctx`` exceeds its original training
    context, as transformers and llama.cpp do. ``speculative`` turns on speculative
    decoding (see :mod:`tallow.speculative`): the same tokens (greedy) or the same distribution
    (sampling), in fewer steps. ``device`` is where the model runs: ``"cpu"``, ``"gpu"`` (the
    first GPU), ``"wgpu:N"``, ``"cuda:N"`` or ``"metal"`` (see ``tallow info --devices``); by
    default ``TALLOW_DEVICE``, else the CPU. ``kv_dtype`` is what the KV cache holds keys and values
    in: ``"f16"``, ``"q8_0"`` (about half the memory), ``"q4_0"`` (about a quarter) or
    ``"bf16"``; see :class:`tallow.engine.EngineConfig`.

    Generations run on the engine :class:`AsyncLLM` uses (continuous batching over a paged KV
    pool). An ``LLM`` is not meant to be shared between threads; nested or interleaved streams
    are fine: they advance together in the engine's steps.

    >>> llm = tallow.LLM()  # doctest: +SKIP
    >>> llm.generate("The capital of France is", max_tokens=8, temperature=0).text  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = DEFAULT_MODEL,
        n_ctx: int | None = None,
        *,
        progress: bool = True,
        speculative: object = None,
        device: str | None = None,
        chat_template: str | None = None,
        kv_dtype: str = "f16",
        quantize: str | None = None,
    ) -> None:
        path = resolve_model(model, progress=progress)
        self.model_name = os.fspath(model)
        """The name or path given."""
        self._model = load_model(path, n_ctx, device, quantize)
        n_ctx = context_size(self._model, n_ctx)
        self.n_ctx = n_ctx
        """Context size of generations (prompt plus completion)."""
        # Generations run on the same engine as AsyncLLM: the scheduler and the batched
        # forward over a paged KV pool. Interleaved streams share its steps.
        self._engine: Engine | None = Engine(
            self._model,
            EngineConfig(
                max_num_seqs=_MAX_STREAMS,
                n_ctx=n_ctx,
                kv_pages=_MAX_STREAMS
                * self._model.kv_pages_to_hold(
                    n_ctx, page_size=_PAGE_SIZE, chunk=EngineConfig.max_tokens_per_step
                ),
                page_size=_PAGE_SIZE,
                speculative=speculative,
                kv_dtype=kv_dtype,
            ),
        )
        self._prompts = Prompts(self._model, n_ctx, chat_template)
        self._classify_tasks = ClassifyTasks(self._prompts)
        self._kv_dtype = kv_dtype
        self._outputs: dict[str, deque[RequestOutput]] = {}
        self._ids = itertools.count()
        # Threads may share an LLM: one engine step at a time, each thread's outputs kept for
        # it by whichever thread stepped.
        self._lock = threading.RLock()

    def close(self) -> None:
        """Release the KV cache and end every open stream; later generations raise
        :class:`InvalidArgumentError`. Tokenization still works. Also done by leaving a
        ``with`` block."""
        with self._lock:
            if self._engine is not None:
                for request_id in self._outputs:
                    self._engine.abort(request_id)
            self._engine = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_engine(self) -> Engine:
        if self._engine is None:
            raise InvalidArgumentError("this LLM is closed")
        return self._engine

    # -- model properties -------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The GGUF file (the first part, for a model split into several files)."""
        return Path(self._model.path)

    @property
    def file_size(self) -> int:
        """Bytes of the GGUF file (of all its parts, for a model split into several)."""
        return self._model.file_size

    @property
    def device(self) -> str:
        """The device the model runs on: ``"cpu"``, ``"wgpu:N"``, ``"cuda:N"`` or ``"metal:0"``."""
        return self._model.device

    @property
    def device_name(self) -> str:
        """The name of the device as its driver gives it."""
        return self._model.device_info[0]

    @property
    def architecture(self) -> str:
        """The model architecture (``general.architecture``)."""
        return self._model.architecture

    @property
    def architecture_features(self) -> list[str]:
        """What the architecture does differently from the plain Llama shape, in words."""
        return list(self._model.architecture_features)

    @property
    def n_vocab(self) -> int:
        """Vocabulary size."""
        return self._model.n_vocab

    @property
    def n_ctx_train(self) -> int:
        """Context length the model was trained with."""
        return self._model.n_ctx_train

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence token id."""
        return self._model.bos_id

    @property
    def eos_id(self) -> int | None:
        """End-of-sequence token id."""
        return self._model.eos_id

    @property
    def add_bos(self) -> bool:
        """Whether prompts start with BOS."""
        return self._model.add_bos

    @property
    def eog_ids(self) -> list[int]:
        """Token ids that end a generation."""
        return list(self._model.eog_ids)

    def metadata(self) -> dict[str, object]:
        """Every GGUF metadata key and its value."""
        return self._model.metadata()

    def tensors(self) -> list[tuple[str, str, list[int]]]:
        """The tensor table: ``(name, type name, dims)``."""
        return self._model.tensors()

    def stats(self) -> dict[str, float]:
        """The engine's KV pages total / used / free, tokens cached, running and waiting
        requests, preemptions and recent tokens per second."""
        return self._open_engine().stats()

    def __repr__(self) -> str:
        return f"LLM({self.model_name!r}, n_ctx={self.n_ctx})"

    # -- tokenizer ------------------------------------------------------------------------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text``.

        ``add_special`` adds BOS (and EOS) where the model's metadata asks for them;
        ``parse_special`` turns control-token text such as ``<|im_start|>`` into those tokens
        instead of tokenizing it as plain text.
        """
        return self._prompts.tokenize(text, add_special, parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids (the inverse of :meth:`tokenize` without special tokens)."""
        return self._prompts.detokenize(ids)

    # -- generation -----------------------------------------------------------------------------

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's chat template (see :mod:`tallow.chat_template`)."""
        return self._prompts.chat_template

    def _completion(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> Generator[str, None, GenerationResult]:
        """A generator that yields the text pieces of the generation of ``prompt_ids`` (checked
        already) and returns its result. The parameters are checked now; the request is queued
        when the generator starts."""
        sampler = self._open_engine().sampler(params)
        return self._run(prompt_ids, params, sampler)

    def _next_output(self, request_id: str) -> RequestOutput:
        """Step the engine until ``request_id`` has an output; keep the others' outputs for
        their own streams (in this thread or others). A signal handler that raises meanwhile
        (Ctrl-C) runs once the step is complete, which leaves the engine whole."""
        waiting = self._outputs[request_id]
        while True:
            with self._lock:
                if waiting:
                    return waiting.popleft()
                with held_signals():
                    for out in self._open_engine().step():
                        if out.request_id in self._outputs:
                            self._outputs[out.request_id].append(out)

    def _run(
        self, prompt_ids: list[int], params: SamplingParams, sampler: _core.Sampler
    ) -> Generator[str, None, GenerationResult]:
        request_id = f"llm-{next(self._ids)}"
        result = ResultBuilder(len(prompt_ids), params.logprobs)
        finished = False
        try:
            with self._lock, held_signals():
                self._outputs[request_id] = deque()
                self._open_engine().add(request_id, prompt_ids, params, sampler)
            while not finished:
                out = self._next_output(request_id)
                finished = out.finished
                text = result.add(out)
                if text:
                    yield text
        finally:
            with self._lock, held_signals():
                # Unfinished (an error, an interrupt, a stream closed early): nothing of it
                # stays in the engine.
                unfinished = self._outputs.pop(request_id, None) is not None and not finished
                if unfinished and self._engine is not None:
                    self._engine.abort(request_id)
        return result.result()

    def stream(
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
    ) -> TextStream:
        """Like :meth:`generate`, but returns an iterator over pieces of text as they are
        generated. Pieces are whole UTF-8 characters; text that could be the start of a stop
        string is held back until it is known not to be one, and a stop string is never
        emitted. The arguments are checked before this returns.
        """
        params = sampling_params(max_tokens, temperature, top_k, top_p, seed, stop, **options)
        ids = self._prompts.ids(prompt, parse_special=parse_special)
        return TextStream(self._completion(ids, params))

    def generate(
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
        """Continue ``prompt`` (text, or token ids used as they are) and return the generated
        text with its token ids.

        The defaults are llama.cpp's: ``temperature`` 0.8 (0 means greedy: always the most
        likely token), ``top_k`` 40 (0 = off), ``top_p`` 0.95 (1.0 = off). Generation ends at
        an end-of-generation token or a stop string (``finish_reason="stop"``), or after
        ``max_tokens`` tokens (``None``: no limit) or when the context of ``n_ctx`` positions is
        full (``finish_reason="length"``). ``seed`` makes sampling reproducible (``None``:
        random). ``stop`` is one string or several; the text ends just before the first match.
        A text prompt starts with BOS when the model's metadata asks for it (an empty one is
        BOS alone);
        ``parse_special`` treats control-token text in the prompt (``<|im_start|>``) as those
        tokens, as llama.cpp does.

        ``options`` are the further generation options :class:`AsyncLLM` and the server take:
        ``min_p``, ``repetition_penalty``, ``frequency_penalty``, ``presence_penalty``,
        ``logit_bias``, ``stop_token_ids``, ``ignore_eos``, ``logprobs``, ``top_logprobs``,
        ``speculative``, and one constraint on the output: ``json_schema``, ``json_object``,
        ``regex``, ``choice`` or ``grammar`` (see :mod:`tallow.structured`).

        Raises :class:`InvalidArgumentError` for arguments out of range or of the wrong type,
        :class:`~tallow.GrammarError` for a constraint that cannot be compiled and
        :class:`ModelError` when the prompt leaves no room in the context.
        """
        stream = self.stream(
            prompt,
            max_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            stop,
            parse_special=parse_special,
            **options,
        )
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def chat_stream(
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
    ) -> TextStream:
        """Like :meth:`chat`, but returns an iterator over pieces of the reply as they are
        generated (see :meth:`stream`). With ``tools``, the text of a call is not among the
        pieces: the calls are in the result's ``tool_calls``."""
        params = sampling_params(max_tokens, temperature, top_k, top_p, seed, stop, **options)
        chat = self._prompts.chat(
            messages, params, parse_special=parse_special, tools=tools, tool_choice=tool_choice
        )
        return TextStream(self._completion(chat.ids, chat.params))

    def chat(
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
        """The assistant's reply to a conversation: ``messages`` is a list of
        ``{"role": "system" | "user" | "assistant" | "tool", "content": text}``, rendered with
        the model's chat template (:attr:`chat_template`). Control tokens come only from the
        template: text in a message that spells one (``<|im_end|>``) is tokenized as plain
        text, unless ``parse_special``. The reply ends at the model's end-of-turn token;
        ``max_tokens`` ``None`` lets it run to the end of the context. The other arguments are
        those of :meth:`generate`.

        ``tools`` (OpenAI's ``[{"type": "function", "function": {...}}]``) are described to
        the model by its template; the calls it makes come back parsed in ``tool_calls``
        (``finish_reason="tool_calls"``). ``tool_choice`` is ``"auto"`` (the default),
        ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``; a
        required or named call is constrained to the model's call syntax and to the function's
        parameters (see :mod:`tallow.tools`); ``parallel_tool_calls=False`` keeps the reply to
        one call. An assistant message may carry its ``tool_calls`` and a ``"tool"`` message
        the result, as in OpenAI's API.

        A model that reasons (see :mod:`tallow.reasoning`) takes ``reasoning_budget`` (tokens),
        ``enable_thinking``, ``reasoning_effort`` and ``chat_template_kwargs`` (variables for
        its template) among the ``options``; its reasoning comes back in ``reasoning``.
        """
        stream = self.chat_stream(
            messages,
            max_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            stop,
            parse_special=parse_special,
            tools=tools,
            tool_choice=tool_choice,
            **options,
        )
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    # -- evaluation -----------------------------------------------------------------------------

    def classify(
        self, texts: str | Sequence[str], labels: Sequence[str], prompt: str | None = None
    ) -> list[Classification]:
        """Zero-shot classification: for each text, the probability of each of ``labels`` as
        the model's answer (see :mod:`tallow.classify`). ``prompt`` is ``None`` (the chat
        template around an instruction to pick a label) or a prompt holding ``{text}`` (and
        optionally ``{labels}``). The texts run as concurrent requests; the prompt's part
        before the text comes from the prefix cache after the first."""
        task = self.classify_task(labels, prompt)
        prompts = [task.prompt_ids(text) for text in task.texts(texts)]
        outputs = self._run_all(prompts, task.params)
        return [task.result(out, len(ids)) for out, ids in zip(outputs, prompts, strict=True)]

    def _run_all(self, prompts: Sequence[list[int]], params: SamplingParams) -> list[RequestOutput]:
        """The last output of each of ``prompts`` run as concurrent requests with ``params``
        (which produce no text: scoring, embedding)."""
        engine = self._open_engine()
        ids = [f"llm-{next(self._ids)}" for _ in prompts]
        results = []
        try:
            with self._lock, held_signals():
                for request_id, prompt_ids in zip(ids, prompts, strict=True):
                    self._outputs[request_id] = deque()
                    engine.add(request_id, prompt_ids, params)
            for request_id in ids:
                out = self._next_output(request_id)
                while not out.finished:
                    out = self._next_output(request_id)
                results.append(out)
        finally:
            with self._lock, held_signals():
                for request_id in ids:
                    # Unfinished (an error, an interrupt): nothing is left in the engine.
                    if self._outputs.pop(request_id, None) is not None:
                        engine.abort(request_id)
        return results

    def classify_task(self, labels: Sequence[str], prompt: str | None = None) -> ClassifyTask:
        """The labels and prompt of a classification, checked: the prompt's token ids for a
        text (``prompt_ids``) and the scoring parameters (see
        :class:`tallow.classify.ClassifyTask`)."""
        steps = self._open_engine().scheduler.max_tokens_per_step
        return self._classify_tasks.get(labels, prompt, steps)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        prompt: str | None = None,
        instruction: str | None = None,
    ) -> list[Reranked]:
        """The documents ranked by their relevance to ``query`` as the model judges it (a
        reranker such as Qwen3-Reranker: see :mod:`tallow.rerank`), most relevant first, the
        first ``top_n`` of them (``None``: all). ``prompt`` (holding ``{query}`` and
        ``{document}``) or ``instruction`` (the task in Qwen3-Reranker's prompt) replace the
        model's prompt. The documents run as concurrent requests; the part of the prompt
        before the document comes from the prefix cache after the first."""
        task = self.rerank_task(query, prompt, instruction)
        docs = task.documents(documents)
        top_n = None if top_n is None else checks.integer("top_n", top_n, 1)
        prompts = [task.prompt_ids(d) for d in docs]
        return ranked(task.results(docs, prompts, self._run_all(prompts, task.params)), top_n)

    def rerank_task(
        self, query: object, prompt: object = None, instruction: object = None
    ) -> RerankTask:
        """The prompt and answers of a reranking for ``query``, checked (see
        :class:`tallow.rerank.RerankTask`)."""
        steps = self._open_engine().scheduler.max_tokens_per_step
        return RerankTask(self._prompts, query, prompt, instruction, step_tokens=steps)

    def embed(
        self,
        texts: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]],
        *,
        normalize: bool = True,
        pooling: str | None = None,
        dimensions: int | None = None,
    ) -> npt.NDArray[np.float32]:
        """The embedding of each text: the model's final hidden states (after its output norm)
        pooled into one vector, ``"mean"`` of every token's, the ``"last"`` token's or the
        first (``"cls"``) token's; ``pooling=None`` takes the model's (its GGUF
        ``pooling_type``, else the last token's). ``normalize`` scales each vector to unit
        length; ``dimensions`` keeps only the first so many values, before normalizing, for
        a model trained for it (a Matryoshka model such as Qwen3-Embedding, told by its name:
        :func:`tallow.pooling.truncatable`; others raise :class:`InvalidArgumentError`).
        ``texts`` is a text (a 1-D array comes back), a list of texts, or token ids (a list,
        or a list of lists); texts get the special tokens the model's metadata adds (see
        :mod:`tallow.embed`). The inputs run as concurrent requests; a 2-D array comes back,
        one row per input. An input longer than the context raises :class:`ModelError`."""
        task = self.embed_task(pooling, normalize, dimensions)
        items = embed_inputs(texts)
        prompts = [task.prompt_ids(item) for item in items]
        vectors = [task.result(out) for out in self._run_all(prompts, task.params)]
        if isinstance(texts, str):
            return vectors[0]
        return np.stack(vectors)

    def embed_task(
        self, pooling: object = None, normalize: object = True, dimensions: object = None
    ) -> EmbedTask:
        """The embeddings of one kind for this model, checked (see
        :class:`tallow.embed.EmbedTask`)."""
        return EmbedTask(self._prompts, pooling, normalize, dimensions)

    def perplexity(
        self,
        text: str,
        ctx: int = 512,
        *,
        progress: Callable[[int, int, float], None] | None = None,
    ) -> float:
        """Perplexity of the model on ``text``, with llama.cpp's ``llama-perplexity`` protocol.

        The text is tokenized whole (BOS first when the model adds one) and cut into
        ``n_tokens // ctx`` chunks of ``ctx`` tokens (at least two chunks are needed, as in
        llama.cpp). Each chunk starts with BOS (when the model adds one) and is evaluated from
        an empty KV cache; only its second half is scored: the logits at positions
        ``ctx/2 .. ctx-2`` predict the tokens at ``ctx/2+1 .. ctx-1``. The result is
        ``exp(mean negative log-likelihood)`` over every scored token; log-softmax is computed
        in float64.

        The KV cache holds keys and values in the ``kv_dtype`` this ``LLM`` was made with.
        ``progress(chunk_index, n_chunks, ppl_so_far)`` is called after each chunk.
        """
        ctx = checks.integer("ctx", ctx, 4)
        context_size(self._model, ctx)
        ids = self._model.tokenize(checks.text("text", text), True, False)
        if len(ids) < 2 * ctx:
            raise InvalidArgumentError(
                f"the text is {len(ids)} tokens long: perplexity with a context of {ctx} needs "
                f"at least {2 * ctx} tokens"
            )
        n_chunks = len(ids) // ctx
        first = ctx // 2
        bos = self._model.bos_id if self._model.add_bos else None
        model = self._model
        kv = model.new_kv_cache(
            dtype=self._kv_dtype, max_pages=model.kv_pages_to_hold(ctx, chunk=ctx)
        )
        nll = 0.0
        count = 0
        for i in range(n_chunks):
            chunk = ids[i * ctx : (i + 1) * ctx]
            if bos is not None:
                chunk[0] = bos
            seq = kv.create()
            # The first half in one forward whose logits are not needed (the LM head of a
            # large vocabulary costs as much as the layers), the scored half in another.
            kv.reserve(seq, first)
            model.forward(kv, [(seq, chunk[:first], "none")])
            kv.reserve(seq, ctx - first)
            logits = model.forward(kv, [(seq, chunk[first:], "all")])
            kv.free(seq)
            targets = np.asarray(chunk[first + 1 :], dtype=np.int64)
            nll += _nll_sum(logits[:-1], targets)
            count += len(targets)
            if progress is not None:
                progress(i + 1, n_chunks, math.exp(nll / count))
        return math.exp(nll / count)


def _nll_sum(logits: npt.NDArray[np.float32], targets: npt.NDArray[np.int64]) -> float:
    """Sum over rows of -log softmax(logits[row])[targets[row]], in float64."""
    total = 0.0
    for start in range(0, len(targets), _PPL_ROWS):
        rows = np.asarray(logits[start : start + _PPL_ROWS], dtype=np.float64)
        tgt = targets[start : start + _PPL_ROWS]
        peak = rows.max(axis=1)
        lse = peak + np.log(np.exp(rows - peak[:, None]).sum(axis=1))
        total += float((lse - rows[np.arange(len(tgt)), tgt]).sum())
    return total
