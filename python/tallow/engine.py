"""The engine: a model, its paged KV pool and the continuous batcher, advanced one step at a
time. Synchronous and single-threaded; :class:`tallow.AsyncLLM` runs it in a thread of its own.

One step is: the scheduler picks the tokens (``Scheduler.schedule``), the model runs them as one
ragged batch (``Model.forward``, GIL released), every request that needs a token samples it with
its own sampler (``sample_batch``, parallel, per-request seeds), the scheduler appends the
tokens, checks the stop conditions of token ids and frees the pages of finished requests
(``Scheduler.update``), and each request's output state turns its tokens into text, stop
strings and tool calls included (:mod:`tallow.output`).

Everything a request carries lives on its :class:`EngineRequest`: what the scheduler tracks,
its sampler, its speculation and its output state.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from tallow import _core, _nvrtc, checks
from tallow._progress import format_bytes
from tallow.catalog import resolve_model, tallow_home
from tallow.draft_budget import Acceptance, Draft, StepTimes, plan
from tallow.errors import InvalidArgumentError, TallowError
from tallow.output import OutputState, RequestOutput, SampledRow
from tallow.pooling import Pooler
from tallow.reasoning import Block, Channels
from tallow.scheduler import Pooling, Request, ScheduledChunk, Scheduler, SchedulerOutput, Step
from tallow.speculative import (
    DraftModelProposer,
    DraftRequest,
    NgramProposer,
    Proposal,
    Proposer,
    SpeculativeConfig,
    speculative_config,
    tree_path,
)
from tallow.structured import STRUCTURED_OPTIONS, Structured, structured_output
from tallow.tools import ToolUse

__all__ = ["Engine", "EngineConfig", "EngineRequest", "SamplingParams", "sampling_params"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request generates: sampling (see :class:`tallow._core.Sampler`) and when it
    stops (the fields the scheduler reads)."""

    max_tokens: int | None = 128
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    """Report each generated token's log probability (raw model distribution)."""
    top_logprobs: int = 0
    """With ``logprobs``, also the log probabilities of this many most likely tokens."""
    speculative: object = None
    """Speculative decoding for this request: None follows the engine's setting; False or 0
    turns it off; otherwise what :func:`tallow.speculative.speculative_config` takes (a token
    count, a method name, a dict or a :class:`~tallow.speculative.SpeculativeConfig`)."""
    structured: Structured | None = None
    """What the output must match (a JSON schema, a regular expression, a choice, a
    grammar); see :mod:`tallow.structured`."""
    tools: ToolUse | None = None
    """The tools a chat reply may call (set by :meth:`tallow.prompt.Prompts.chat`): their
    calls are held back from the text and parsed (see :mod:`tallow.tools`)."""
    continuations: tuple[tuple[int, ...], ...] | None = None
    """Score these token sequences as continuations of the prompt instead of generating:
    the prompt and every continuation are computed in one step (each continuation in a branch
    of the prompt's KV), and the request's last output carries each one's log-likelihood in
    :attr:`~tallow.output.RequestOutput.scores` (see :mod:`tallow.classify`)."""
    relative_scores: bool = False
    """With ``continuations``: take each one's first token's probability among the
    continuations' first tokens only, instead of among the whole vocabulary. The scores then
    differ from the log-likelihoods by one constant shared by all continuations, so that their
    probabilities among themselves are the same; where every continuation is one token, the LM
    head computes only those tokens' logits."""
    chat_template_kwargs: Mapping[str, object] | None = None
    """Chat: more variables for the chat template (``enable_thinking``, ...)."""
    reasoning_budget: int | None = None
    """Chat with a model that reasons: the most tokens its reasoning block may hold before
    it is closed (see :mod:`tallow.reasoning`); None: no limit."""
    parallel_tool_calls: bool = True
    """Chat with tools: whether a reply may make several calls (else it makes one: see
    :mod:`tallow.tools`)."""
    reasoning: Block | Channels | None = None
    """The reasoning block the reply may have, or its channels (set by
    :meth:`tallow.prompt.Prompts.chat`)."""
    pooling: Pooling | None = None
    """Embed the prompt instead of generating: its final hidden states pooled this way, in
    the request's last output's :attr:`~tallow.output.RequestOutput.embedding` (see
    :mod:`tallow.embed`)."""

    def check_constraint(self) -> None:
        """Raises :class:`InvalidArgumentError` where the constraint on the output cannot
        hold: with ``ignore_eos``, a complete output could only go on with the end-of-generation
        token, again and again."""
        if self.structured is not None and self.ignore_eos:
            raise InvalidArgumentError(
                "ignore_eos cannot be combined with a constraint on the output (which ends "
                "at the end-of-generation token once complete)"
            )

    def new_sampler(self, model: _core.Model) -> _core.Sampler:
        """A sampler with these settings for ``model``, its constraint (if any) compiled
        against the model's vocabulary; raises :class:`InvalidArgumentError` for a token id
        (``logit_bias``, ``stop_token_ids``) outside the vocabulary and
        :class:`~tallow.GrammarError` for a constraint that cannot be compiled."""
        n_vocab = model.n_vocab
        self.check_constraint()
        checks.token_ids("logit_bias", list(self.logit_bias), n_vocab)
        checks.token_ids("stop_token_ids", self.stop_token_ids, n_vocab)
        constraint = None if self.structured is None else self.structured.compile(model)
        return _core.Sampler(
            self.temperature,
            min(self.top_k, n_vocab),
            self.top_p,
            self.seed,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            logit_bias=dict(self.logit_bias),
            top_logprobs=self.top_logprobs,
            logprobs=self.logprobs,
            constraint=constraint,
            reasoning=None if self.reasoning is None else self.reasoning.sampler_args(),
        )


MAX_TOP_LOGPROBS = 20
"""Most alternatives a request may ask log probabilities for (OpenAI's limit)."""


def sampling_params(
    max_tokens: object = 128,
    temperature: object = 0.8,
    top_k: object = 40,
    top_p: object = 0.95,
    seed: object = None,
    stop: object = None,
    **options: object,
) -> SamplingParams:
    """The engine's parameters of a generation, after checking every argument (raises
    :class:`InvalidArgumentError`). ``options`` are further :class:`SamplingParams` fields.
    Token ids are checked against the vocabulary when the request reaches a model
    (:meth:`SamplingParams.new_sampler`)."""
    unknown = sorted(set(options) - _OPTIONS - set(STRUCTURED_OPTIONS))
    if unknown:
        known = sorted(_OPTIONS | set(STRUCTURED_OPTIONS))
        raise InvalidArgumentError(
            f"unknown generation option {unknown[0]!r} (known: {', '.join(known)})"
        )
    constraint = structured_output(
        **{name: options.pop(name) for name in STRUCTURED_OPTIONS if name in options}
    )
    _fold_template_options(options)
    fields: dict[str, object] = {
        "max_tokens": None if max_tokens is None else checks.integer("max_tokens", max_tokens, 0),
        "temperature": checks.number("temperature", temperature, 0.0),
        "top_k": checks.integer("top_k", top_k, 0),
        "top_p": checks.number("top_p", top_p, 0.0, 1.0, low_open=True),
        "seed": None if seed is None else checks.integer("seed", seed, 0, 2**64 - 1),
        "stop": checks.strings("stop", stop),
    }
    for name, value in options.items():
        fields[name] = _check_option(name, value)
    fields["structured"] = constraint
    params = SamplingParams(**fields)  # type: ignore[arg-type]
    params.check_constraint()
    return params


_OPTIONS = frozenset(
    {
        "min_p",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "stop_token_ids",
        "ignore_eos",
        "logprobs",
        "top_logprobs",
        "speculative",
        "chat_template_kwargs",
        "reasoning_budget",
        "enable_thinking",
        "reasoning_effort",
        "parallel_tool_calls",
    }
)

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
"""The values of ``reasoning_effort`` (OpenAI's)."""


def _fold_template_options(options: dict[str, object]) -> None:
    """``enable_thinking`` and ``reasoning_effort`` moved into ``chat_template_kwargs`` (see
    :func:`template_kwargs`)."""
    if "enable_thinking" in options or "reasoning_effort" in options:
        options["chat_template_kwargs"] = template_kwargs(
            options.get("chat_template_kwargs"),
            enable_thinking=options.pop("enable_thinking", None),
            reasoning_effort=options.pop("reasoning_effort", None),
        )


def template_kwargs(
    kwargs: object, *, enable_thinking: object = None, reasoning_effort: object = None
) -> Mapping[str, object] | None:
    """Variables for a chat template: ``kwargs`` (a mapping), with ``enable_thinking`` and
    ``reasoning_effort`` over it where given, as templates read them: Qwen 3's
    ``enable_thinking``, gpt-oss's ``reasoning_effort`` (its system message's ``Reasoning:
    high``). An effort of ``"none"`` also turns thinking off, unless ``kwargs`` or
    ``enable_thinking`` say otherwise. Raises :class:`InvalidArgumentError`."""
    checked = _template_kwargs(kwargs)
    implied: dict[str, object] = {}
    given: dict[str, object] = {}
    if reasoning_effort is not None:
        if reasoning_effort not in REASONING_EFFORTS:
            raise checks.invalid(
                "reasoning_effort",
                f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, "
                f"got {checks.describe(reasoning_effort)}",
            )
        given["reasoning_effort"] = reasoning_effort
        if reasoning_effort == "none":
            implied["enable_thinking"] = False
    if enable_thinking is not None:
        given["enable_thinking"] = checks.boolean("enable_thinking", enable_thinking)
    if not (implied or given):
        return checked
    return {**implied, **(checked or {}), **given}


def _check_option(name: str, value: object) -> object:
    if name == "min_p":
        return checks.number(name, value, 0.0, 1.0)
    if name == "repetition_penalty":
        return checks.number(name, value, 0.0, low_open=True)
    if name in ("frequency_penalty", "presence_penalty"):
        return checks.number(name, value)
    if name == "logit_bias":
        if not isinstance(value, Mapping):
            raise InvalidArgumentError("logit_bias must map token ids to numbers")
        return {
            checks.integer("a logit_bias token id", k, 0): _bias(k, v) for k, v in value.items()
        }
    if name == "stop_token_ids":
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            raise InvalidArgumentError("stop_token_ids must be a list of token ids")
        return tuple(checks.integer("stop_token_ids", t, 0) for t in value)
    if name in ("ignore_eos", "logprobs", "parallel_tool_calls"):
        return checks.boolean(name, value)
    if name == "top_logprobs":
        return checks.integer(name, value, 0, MAX_TOP_LOGPROBS)
    if name == "chat_template_kwargs":
        return _template_kwargs(value)
    if name == "reasoning_budget":
        return None if value is None else checks.integer(name, value, 0)
    # speculative: checked now, resolved against the engine's setting when the request
    # reaches an engine.
    speculative_config(value)
    return value


def _template_kwargs(value: object) -> Mapping[str, object] | None:
    """Variables for a chat template: a mapping of names to JSON-like values."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise checks.invalid(
            "chat_template_kwargs", "chat_template_kwargs must map names to values"
        )
    if checks.nests_deeper(value):
        raise checks.invalid("chat_template_kwargs", "chat_template_kwargs nests too deeply")
    return dict(value)


def _bias(token: object, value: object) -> float:
    if isinstance(value, float) and value == -math.inf:
        return value  # -inf bans the token
    return checks.number("a logit_bias value", value)


def _pool_context(kv: _core.KvCache, n_ctx: int) -> int:
    """The most positions, up to ``n_ctx``, that one sequence can hold in ``kv``'s pool
    (sliding-window layers keep only their window)."""
    lo, hi = 0, n_ctx
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv.pages_to_hold(mid) <= kv.n_pages:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class EngineConfig:
    """Sizes of an engine, checked when it is made (:class:`InvalidArgumentError`).

    ``kv_pages`` pages of ``page_size`` tokens hold the KV of every running request; or give
    ``kv_bytes``, the memory of that pool (``None`` for both: enough for ``max_num_seqs`` full
    contexts, capped at 8192 pages). The pool must fit in the machine's memory. ``n_ctx`` is
    the most positions per request, prompt plus completion (``None``: the model's training
    context, capped at 4096); never more than the model was trained with, nor than the pool
    holds. ``max_tokens_per_step`` bounds the tokens of one forward (at most
    :data:`MAX_TOKENS_PER_STEP`). ``prefix_caching`` reuses the KV of prompt prefixes already
    computed (see :mod:`tallow.scheduler`). ``speculative`` turns on speculative decoding for
    every request that does not say otherwise (see :mod:`tallow.speculative`). ``kv_dtype`` is
    what the pages hold keys and values in: ``"f16"``, ``"q8_0"`` (GGML's 8-bit blocks, about
    half the memory) or ``"q4_0"`` (4-bit blocks, about a quarter), ``"bf16"`` (f32's range
    with 8 bits of precision, for a model whose keys or values outgrow f16's 65504; CPU only),
    or ``"f32"``.
    """

    max_num_seqs: int = 64
    max_tokens_per_step: int = 512
    page_size: int = 16
    kv_pages: int | None = None
    kv_bytes: int | None = None
    n_ctx: int | None = None
    prefix_caching: bool = True
    speculative: object = None
    kv_dtype: str = "f16"

    def __post_init__(self) -> None:
        checks.integer("max_num_seqs", self.max_num_seqs, 1, MAX_NUM_SEQS)
        checks.integer("max_tokens_per_step", self.max_tokens_per_step, 1, MAX_TOKENS_PER_STEP)
        checks.integer("page_size", self.page_size, 1, MAX_PAGE_SIZE)
        for name in ("kv_pages", "kv_bytes", "n_ctx"):
            value = getattr(self, name)
            if value is not None:
                checks.integer(name, value, 1)
        if self.kv_pages is not None and self.kv_bytes is not None:
            raise InvalidArgumentError("give kv_pages or kv_bytes, not both")
        checks.boolean("prefix_caching", self.prefix_caching)
        speculative_config(self.speculative)
        if self.kv_dtype not in KV_DTYPES:
            raise InvalidArgumentError(
                f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}"
            )


KV_DTYPES = ("f16", "q8_0", "q4_0", "bf16", "f32")
"""What KV pages may hold keys and values in."""
MAX_NUM_SEQS = 65536
MAX_TOKENS_PER_STEP = 16384
"""Most tokens of one forward: its scratch memory grows with them."""
MAX_PAGE_SIZE = 4096
DEFAULT_N_CTX = 4096
"""Context of a request when none is given, capped by the model's training context
(llama.cpp's default is 4096 too)."""


def device_name(device: object) -> str:
    """The device to run on: ``device`` if given, else ``TALLOW_DEVICE``, else ``"cpu"``."""
    if device is None:
        device = os.environ.get("TALLOW_DEVICE") or "cpu"
    if not isinstance(device, str):
        raise InvalidArgumentError(
            f"device must be a string such as 'cpu' or 'gpu', not {device!r}"
        )
    return device


def load_model(
    path: str | os.PathLike[str],
    n_ctx: object = None,
    device: object = None,
    quantize: object = None,
) -> _core.Model:
    """The model at ``path`` on ``device`` (see :func:`device_name`), prepared for requests of
    up to ``n_ctx`` positions (a positive integer, or ``None`` for the default): a model with
    long-context RoPE factors uses them only when ``n_ctx`` asks for more than its original
    training context. ``path`` is a GGUF file, or a Hugging Face checkpoint folder
    (``config.json``, ``*.safetensors``, ``tokenizer.model``) converted as it loads (into a
    file without a name under the cache directory, gone with the model), its matrices rounded
    to ``quantize`` (``"q8_0"``, ``"q4_0"``, ``"f16"``, ...; ``None`` keeps
    the checkpoint's precision; a GGUF file's tensors are used as they are, and ``quantize``
    with one is an :class:`InvalidArgumentError`)."""
    if n_ctx is not None:
        n_ctx = checks.integer("n_ctx", n_ctx, 1)
        if n_ctx > 2**32:
            # Beyond any model: context_size refuses it, in the model's terms.
            n_ctx = None
    # A CUDA device compiles its kernels with NVRTC when it opens.
    _nvrtc.point_to_the_wheel()
    if quantize is not None:
        quantize = checks.text("quantize", quantize)
    return _core.Model(
        os.fspath(path),
        n_ctx=n_ctx,
        device=device_name(device),
        quantize=quantize,
        scratch_dir=tallow_home() / "converted",
    )


def context_size(model: _core.Model, n_ctx: object) -> int:
    """The context of requests on ``model``: ``n_ctx`` checked (a positive integer, at most
    what the model was loaded for), or the default."""
    most = model.n_ctx_max
    if n_ctx is None:
        return min(most, DEFAULT_N_CTX)
    n_ctx = checks.integer("n_ctx", n_ctx, 1)
    if n_ctx > most:
        shown = checks.describe(n_ctx)
        if most < model.n_ctx_train:
            raise InvalidArgumentError(
                f"n_ctx={shown} is beyond the {most} positions this model was loaded for: "
                f"load it with n_ctx={shown} to use its long-context RoPE factors"
            )
        raise InvalidArgumentError(
            f"n_ctx={shown} is beyond the {most} positions this model was trained with"
        )
    return n_ctx


def physical_memory() -> int | None:
    """Bytes of memory of this machine, where the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_pool_fits(pages: int, page_bytes: int, asked: str) -> None:
    memory = physical_memory()
    size = pages * page_bytes
    if memory is not None and size > memory:
        # An int may be beyond floats: format only sizes a machine could have.
        shown = format_bytes(size) if size < 2**70 else f"{checks.describe(size)} bytes"
        raise InvalidArgumentError(
            f"{asked} needs a KV cache of {shown}, more than this machine's "
            f"{format_bytes(memory)} of memory"
        )


def _log_likelihood(rows: npt.NDArray[np.float32], tokens: Sequence[int]) -> float:
    """The summed log probability of ``tokens[i]`` under logits ``rows[i]``."""
    top = rows.max(axis=1, keepdims=True)
    log_sum = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1, dtype=np.float64))
    return float((rows[np.arange(len(tokens)), list(tokens)] - log_sum).sum())


# The draw of a greedy row (``Sampler.next_draw``'s form): temperature 0.
_GREEDY_DRAW = (0.0, 0, 1.0, 0.0, 0)


def _rows_of(step: Step) -> list[int]:
    """The first row of logits of each chunk of ``step``."""
    firsts, row = [], 0
    for chunk in step.chunks:
        firsts.append(row)
        row += chunk.n_rows
    return firsts


def _guesses(step: Step, rows_of: list[int]) -> dict[str, list[tuple[ScheduledChunk, int]]]:
    """The guesses of each request of ``step`` that has some, with their first rows."""
    out: dict[str, list[tuple[ScheduledChunk, int]]] = {}
    for chunk, row in zip(step.chunks, rows_of, strict=True):
        if chunk.guess_depth is not None:
            out.setdefault(chunk.request_id, []).append((chunk, row))
    return out


def _greedy(rows: npt.NDArray[np.float32]) -> list[int]:
    """Each row's greedy token: the first largest logit, NaN never (as the device's)."""
    greedy: list[int] = np.argmax(np.where(np.isnan(rows), -np.inf, rows), axis=1).tolist()
    return greedy


def _tree(
    chunk: ScheduledChunk, greedy: list[int], guesses: list[tuple[ScheduledChunk, list[int]]]
) -> tuple[int | None, list[int]]:
    """The longest path of ``chunk``'s tree that the greedy choices agree with (see
    :func:`tallow.speculative.tree_path`): the guess it goes into (its index in ``guesses``,
    each with the greedy choices after its tokens; None: the draft) and the path's proposed
    tokens, which its verification takes as its draft."""
    branches = [(g.guess_depth or 0, g.token_ids, rows) for g, rows in guesses]
    which, taken = tree_path(chunk.draft, greedy, branches)
    if which is None:
        return None, chunk.draft
    guess = guesses[which][0]
    return which, chunk.draft[: guess.guess_depth] + guess.token_ids[:taken]


@dataclass(eq=False, kw_only=True)
class EngineRequest(Request):
    """A request as the engine holds it: the scheduler's part (:class:`Request`, whose
    ``params`` are the request's :class:`SamplingParams`), its sampler, its speculation and
    its output state."""

    sampler: _core.Sampler = field(repr=False)
    speculation: SpeculativeConfig | None = None
    """How the request speculates, where it does."""
    output: OutputState = field(repr=False)
    pooler: Pooler | None = field(default=None, repr=False)
    """An embedding request's pooling of its hidden states."""


class Engine:
    """A model with its KV pool and scheduler. Not thread-safe: one thread drives it."""

    def __init__(self, model: _core.Model, config: EngineConfig | None = None) -> None:
        config = config or EngineConfig()
        n_ctx = context_size(model, config.n_ctx)
        page_bytes = model.kv_page_bytes(config.page_size, config.kv_dtype)
        if config.kv_bytes is not None:
            _check_pool_fits(
                config.kv_bytes // page_bytes,
                page_bytes,
                f"kv_bytes={checks.describe(config.kv_bytes)}",
            )
            self.kv = model.new_kv_cache(
                page_size=config.page_size, dtype=config.kv_dtype, max_bytes=config.kv_bytes
            )
        else:
            if config.kv_pages is not None:
                pages, asked = config.kv_pages, f"kv_pages={checks.describe(config.kv_pages)}"
            else:
                per_request = model.kv_pages_to_hold(
                    n_ctx, page_size=config.page_size, chunk=config.max_tokens_per_step
                )
                pages = min(per_request * config.max_num_seqs, 8192)
                asked = f"a context of {n_ctx} for {config.max_num_seqs} requests"
            _check_pool_fits(pages, page_bytes, asked)
            self.kv = model.new_kv_cache(
                page_size=config.page_size, dtype=config.kv_dtype, max_pages=pages
            )
        self.model = model
        self.n_ctx = _pool_context(self.kv, n_ctx)
        self.scheduler = Scheduler(
            self.kv,
            max_num_seqs=config.max_num_seqs,
            max_tokens_per_step=config.max_tokens_per_step,
            eog_ids=model.eog_ids,
            max_model_len=self.n_ctx,
            prefix_caching=config.prefix_caching,
        )
        self.speculative = speculative_config(config.speculative)
        self._proposers: dict[str, Proposer] = {}
        spec = self.speculative
        if spec is not None:
            self._proposers["ngram"] = NgramProposer.from_config(spec)
            if spec.draft_model is not None:
                # On the model's device: the draft runs beside it, step after step.
                draft = load_model(resolve_model(spec.draft_model), device=model.device)
                self._proposers["draft"] = DraftModelProposer(
                    draft,
                    n_vocab=model.n_vocab,
                    # As many positions as the model's pool holds.
                    kv_pages=draft.kv_pages_to_hold(
                        positions := self.kv.n_pages // self.kv.n_groups * config.page_size,
                        page_size=config.page_size,
                        chunk=positions,
                    ),
                    page_size=config.page_size,
                )
        self._requests: dict[str, EngineRequest] = {}
        # (time, tokens computed) of recent steps, for the throughput in stats().
        self._recent: deque[tuple[float, int]] = deque(maxlen=64)
        self._step_times = StepTimes()
        self._acceptance = Acceptance()
        self.tokens_computed = 0
        # stats() may come from another thread while a step holds the KV pool.
        self._lock = threading.Lock()

    def sampler(self, params: SamplingParams) -> _core.Sampler:
        """A sampler for a request with ``params``, after checking them against this engine
        (token ids against the vocabulary, the speculation asked for); raises
        :class:`InvalidArgumentError`. May be called from any thread."""
        self._speculation(params)
        return params.new_sampler(self.model)

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sampler: _core.Sampler | None = None,
    ) -> None:
        """Queue a request, with ``sampler`` or a new one from ``params`` (so bad parameters
        raise here)."""
        if request_id in self._requests:
            raise InvalidArgumentError(f"request {request_id!r} is already in the engine")
        checks.token_ids("prompt", prompt_token_ids, self.model.n_vocab)
        branches = None
        if params.continuations is not None:
            if not params.continuations or not all(params.continuations):
                raise InvalidArgumentError("continuations to score must be non-empty token lists")
            for c in params.continuations:
                checks.token_ids("continuation", c, self.model.n_vocab)
            # The last token of a continuation is scored, never fed.
            branches = [list(c[:-1]) for c in params.continuations]
        embedding = params.pooling is not None
        if embedding and (branches is not None or params.max_tokens == 0):
            raise InvalidArgumentError(
                "an embedding request neither scores continuations nor takes max_tokens=0"
            )
        request = EngineRequest(
            request_id,
            list(prompt_token_ids),
            params,
            sampler=sampler or params.new_sampler(self.model),
            speculation=None if branches is not None or embedding else self._speculation(params),
            output=OutputState(
                self.model.stream_decoder(),
                params.stop,
                logprobs=params.logprobs,
                tools=params.tools,
                reasoning=None
                if params.reasoning is None
                else (params.reasoning, self.model.stream_decoder(), self.model.detokenize),
            ),
            branches=branches,
            pooling=params.pooling,
            pooler=None if params.pooling is None else Pooler(params.pooling, self.model.n_embd),
        )
        self.scheduler.add(request)
        self._requests[request_id] = request

    def _speculation(self, params: SamplingParams) -> SpeculativeConfig | None:
        """How a request speculates, or None. What the request leaves out comes from the
        engine's setting."""
        if params.speculative is None:
            spec = self.speculative
        else:
            spec = speculative_config(params.speculative, base=self.speculative)
        if spec is None or spec.num_tokens == 0:
            return None
        if spec.method == "draft" and "draft" not in self._proposers:
            raise InvalidArgumentError(
                "speculative method 'draft' needs an engine with a draft model "
                "(speculative={'method': 'draft', 'draft_model': ...})"
            )
        if spec.method == "ngram" and "ngram" not in self._proposers:
            self._proposers["ngram"] = NgramProposer.from_config(spec)
        return spec

    def abort(self, request_id: str) -> bool:
        """Abort a request; its pages are freed at the latest by the next step."""
        return self.scheduler.abort(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        """Run one step; return what each request produced in it. If the step cannot be
        computed, its requests end with ``finish_reason="abort"`` and the error in
        ``RequestOutput.error``; the others go on."""
        with self._lock:
            return self._step()

    def _step(self) -> list[RequestOutput]:
        proposals = self._propose()
        step = self.scheduler.schedule(
            {r: p.tokens for r, p in proposals.items()},
            {r: p.branches for r, p in proposals.items() if p.branches},
        )
        sampled: dict[str, list[SampledRow]] = {}
        adopted: dict[str, int] = {}
        failed: dict[str, TallowError] = {}
        scores: dict[str, list[float]] = {}
        embeddings: dict[str, npt.NDArray[np.float32]] = {}
        if step:
            started = time.perf_counter()
            try:
                if self._drawn_on_device(step):
                    tokens = self._forward(step, "draw", embeddings, draws=self._draws(step))
                    sampled, adopted = self._take_drawn(step, tokens)
                elif (vocab := self._scored_vocab(step)) is not None:
                    logits = self._forward(step, "logits", embeddings, vocab)
                    scores = self._score(step, logits, vocab)
                else:
                    logits = self._forward(step, "logits", embeddings)
                    sampled, failed, adopted = self._sample(step, logits, proposals)
                    scores = self._score(step, logits)
            except TallowError as e:
                return self._process(self.scheduler.fail(step, e), {})
            self.tokens_computed += step.num_tokens
            self._recent.append((time.perf_counter(), step.num_tokens))
            if not step.has_scoring and all(len(c.token_ids) == c.n_rows for c in step.chunks):
                # Decoding and verification alone: what the draft budget's costs are.
                self._step_times.observe(step.num_tokens, time.perf_counter() - started)
            self._count_acceptance(step, proposals, sampled, adopted)
        outputs = self.scheduler.update(
            step, {r: [t[0] for t in rows] for r, rows in sampled.items()}, failed, adopted
        )
        return self._process(outputs, sampled, scores, embeddings)

    def _process(
        self,
        outputs: list[SchedulerOutput],
        sampled: Mapping[str, list[SampledRow]],
        scores: Mapping[str, list[float]] | None = None,
        embeddings: Mapping[str, npt.NDArray[np.float32]] | None = None,
    ) -> list[RequestOutput]:
        """Each request's output state turns its tokens into text; a request whose stop string
        matched ends now, and finished requests are forgotten."""
        results = []
        for out in outputs:
            req = self._requests[out.request_id]
            result = req.output.process(out, sampled.get(out.request_id, ()))
            if result.finished:
                result = replace(
                    result,
                    cached_tokens=req.num_cached_tokens or 0,
                    scores=(scores or {}).get(out.request_id),
                    embedding=(embeddings or {}).get(out.request_id),
                )
                if not out.finished:
                    self.scheduler.stop(out.request_id)
                del self._requests[out.request_id]
                if req.speculation is not None:
                    self._proposers[req.speculation.method].finish(out.request_id)
                    self._acceptance.finish(out.request_id)
            results.append(result)
        return results

    def _propose(self) -> dict[str, Proposal]:
        """Draft tokens for the decoding requests that speculate, by method."""
        if not self._proposers:
            return {}
        wanted: dict[str, list[DraftRequest]] = {}
        decoding = 0
        for req in self.scheduler.decoding():
            decoding += 1
            assert isinstance(req, EngineRequest)
            if req.speculation is None or req.abort_pending:
                continue
            spec = req.speculation
            p = req.params
            assert isinstance(p, SamplingParams)
            wanted.setdefault(spec.method, []).append(
                DraftRequest(
                    req.request_id,
                    req.token_slice(0, req.num_tokens),
                    spec.num_tokens,
                    max_tokens=spec.max_num_tokens,
                    # A tree of guesses is verified by the greedy choices alone.
                    num_branches=spec.num_branches if req.sampler.is_plain_greedy else 0,
                    temperature=p.temperature,
                    top_k=p.top_k,
                    top_p=p.top_p,
                    min_p=p.min_p,
                    seed=p.seed,
                )
            )
        proposals: dict[str, Proposal] = {}
        for method, requests in wanted.items():
            proposals.update(self._proposers[method].propose(requests))
        return self._budget({r: p for r, p in proposals.items() if p.tokens}, decoding)

    def _budget(self, proposals: dict[str, Proposal], n_decoding: int) -> dict[str, Proposal]:
        """``proposals`` cut to the tokens that pay for themselves (see
        :mod:`tallow.draft_budget`), for the requests whose speculation adapts: those whose
        output does not depend on which tokens are verified (greedy, or sampled without a
        seed)."""
        adaptive: list[tuple[str, SpeculativeConfig]] = []
        for r in proposals:
            params, spec = self._requests[r].params, self._requests[r].speculation
            assert spec is not None and isinstance(params, SamplingParams)
            if spec.adaptive and (params.temperature == 0 or params.seed is None):
                adaptive.append((r, spec))
        drafts = [
            Draft(
                alpha=self._acceptance.rate(r, proposals[r].kind),
                length=len(proposals[r].tokens),
                guesses=[(depth, len(tokens)) for depth, tokens in proposals[r].branches],
                beta=self._acceptance.rate(r, "guess"),
            )
            for r, _ in adaptive
        ]
        out = dict(proposals)
        planned = plan(drafts, n_decoding, self._step_times)
        for (r, spec), (k, lengths) in zip(adaptive, planned, strict=True):
            p = proposals[r]
            if self._acceptance.probe(r, cut=k == 0):
                k = 1  # measured again: see ``PROBE_EVERY``
            self._proposers[spec.method].cut(r, k)
            if k == 0:
                del out[r]
                continue
            branches = [
                (depth, tokens[:n])
                for (depth, tokens), n in zip(p.branches, lengths, strict=True)
                if n > 0 and depth < k
            ]
            probs = None if p.probs is None else p.probs[:k]
            out[r] = replace(p, tokens=p.tokens[:k], probs=probs, branches=branches)
        return out

    def _count_acceptance(
        self,
        step: Step,
        proposals: Mapping[str, Proposal],
        sampled: Mapping[str, list[SampledRow]],
        adopted: Mapping[str, int],
    ) -> None:
        """Counts what the verifications of ``step`` kept, by kind of proposal: a draft's
        tokens up to where the path left it, and the tokens of each guess that was needed
        (where the draft was rejected at its depth)."""
        if not proposals:
            return  # nothing was proposed, so no chunk has a draft
        guesses: dict[str, list[ScheduledChunk]] = {}
        for chunk in step.chunks:
            if chunk.guess_depth is not None:
                guesses.setdefault(chunk.request_id, []).append(chunk)
        for chunk in step.chunks:
            r = chunk.request_id
            if not chunk.draft or chunk.guess_depth is not None or r not in sampled:
                continue
            kept = len(sampled[r]) - 1
            own = guesses.get(r, [])
            taken = next((g for g in own if g.seq == adopted.get(r)), None)
            depth = kept if taken is None else taken.guess_depth or 0
            self._acceptance.observe(r, proposals[r].kind, len(chunk.draft), depth)
            for g in own:
                if g.guess_depth == depth < len(chunk.draft):
                    got = kept - depth if g is taken else 0
                    self._acceptance.observe(r, "guess", len(g.token_ids), got)

    def _drawn_on_device(self, step: Step) -> bool:
        """Whether every request that takes tokens in ``step`` draws them from the raw logits
        and nothing more, and those that sample (not greedy) take one token, with no draft to
        verify: then the device draws them and only one token per row comes back."""
        ids = step.sample_ids
        if not ids or step.has_scoring:
            return False
        samplers = [self._requests[r].sampler for r in ids]
        if not all(s.draws_on_device for s in samplers):
            return False
        return all(
            chunk.n_rows == 1 and not chunk.draft and chunk.guess_depth is None
            for chunk in step.chunks
            if chunk.n_rows and not self._requests[chunk.request_id].sampler.is_plain_greedy
        )

    def _draws(self, step: Step) -> list[tuple[float, int, float, float, int]]:
        """How each row of logits of ``step`` draws its token (see :meth:`_drawn_on_device`):
        greedy for a greedy request's rows, the next draw of a sampling request's one row."""
        draws = []
        for chunk in step.chunks:
            sampler = self._requests[chunk.request_id].sampler
            if chunk.n_rows and not sampler.is_plain_greedy:
                draws.append(sampler.next_draw())
            else:
                draws.extend([_GREEDY_DRAW] * chunk.n_rows)
        return draws

    def _take_drawn(
        self, step: Step, drawn: npt.NDArray[np.uint32]
    ) -> tuple[dict[str, list[SampledRow]], dict[str, int]]:
        """The tokens of every request in ``step`` from the token the device drew from each
        row: a greedy request's drafts kept while they agree, as ``_sample`` verifies them;
        and the requests whose tokens follow one of their guesses, with that guess's
        sequence."""
        sampled = {}
        adopted = {}
        rows_of = _rows_of(step)
        guesses = _guesses(step, rows_of)
        for chunk, first in zip(step.chunks, rows_of, strict=True):
            if not chunk.logits or chunk.guess_depth is not None:
                continue
            rows = drawn[first : first + chunk.n_rows].tolist()
            draft = chunk.draft
            if chunk.request_id in guesses:
                along = [
                    (g, drawn[r : r + g.n_rows].tolist()) for g, r in guesses[chunk.request_id]
                ]
                which, draft = _tree(chunk, rows, along)
                if which is not None:
                    guess, guess_rows = along[which]
                    depth = guess.guess_depth or 0
                    rows = rows[: depth + 1] + guess_rows[: len(draft) - depth]
                    adopted[chunk.request_id] = guess.seq
            sampled[chunk.request_id] = self._requests[chunk.request_id].sampler.take_drawn(
                rows, draft
            )
        return sampled, adopted

    def _sample(
        self, step: Step, logits: npt.NDArray[np.float32], proposals: dict[str, Proposal]
    ) -> tuple[dict[str, list[SampledRow]], dict[str, TallowError], dict[str, int]]:
        """The tokens of every request in ``step``: verification for chunks with a draft (along
        the path of their guesses the greedy choices agree with, where they have some), one
        batched draw for the others; the error of each request that could not take one (its
        constraint failed); and the requests whose tokens follow one of their guesses, with
        that guess's sequence."""
        sampled = {}
        failed = {}
        adopted = {}
        plain_ids: list[str] = []
        plain_rows: list[int] = []
        rows_of = _rows_of(step)
        guesses = _guesses(step, rows_of)
        for chunk, row in zip(step.chunks, rows_of, strict=True):
            if chunk.scoring or not chunk.logits or chunk.guess_depth is not None:
                continue
            if chunk.draft:
                probs = proposals[chunk.request_id].probs
                q = None if probs is None else np.ascontiguousarray(probs[: len(chunk.draft)])
                block = logits[row : row + chunk.n_rows]
                draft, seq, depth = chunk.draft, None, 0
                if chunk.request_id in guesses:
                    along = [(g, logits[r : r + g.n_rows]) for g, r in guesses[chunk.request_id]]
                    greedy = [(g, _greedy(rows)) for g, rows in along]
                    which, draft = _tree(chunk, _greedy(block), greedy)
                    if which is not None:
                        guess, guess_rows = along[which]
                        depth = guess.guess_depth or 0
                        taken = len(draft) - depth
                        block = np.concatenate([block[: depth + 1], guess_rows[:taken]])
                        seq = guess.seq
                try:
                    got = self._requests[chunk.request_id].sampler.verify(block, draft, q)
                    sampled[chunk.request_id] = got
                    # The path goes into the guess where the verification kept one of its
                    # tokens (it keeps them all, but for rows of NaN, which it reads alike).
                    if seq is not None and len(got) - 1 > depth:
                        adopted[chunk.request_id] = seq
                except TallowError as e:
                    failed[chunk.request_id] = e
            else:
                plain_ids.append(chunk.request_id)
                plain_rows.append(row)
        if plain_ids:
            rows = logits if len(plain_rows) == len(logits) else logits[plain_rows]
            drawn = _core.sample_batch([self._requests[r].sampler for r in plain_ids], rows)
            for r, one in zip(plain_ids, drawn, strict=True):
                if isinstance(one, TallowError):
                    failed[r] = one
                else:
                    sampled[r] = [one]
        return sampled, failed, adopted

    def _scored_vocab(self, step: Step) -> list[int] | None:
        """The tokens whose logits are all that ``step`` reads, where each of its rows of
        logits is the prompt's last row of a scoring request with relative scores and
        continuations of one token: their tokens. Otherwise None (every logit is read)."""
        if not step.has_scoring or step.sample_ids:
            return None
        vocab: set[int] = set()
        for chunk in step.chunks:
            if not chunk.n_rows:
                continue
            params = self._requests[chunk.request_id].params
            assert isinstance(params, SamplingParams) and params.continuations is not None
            if not params.relative_scores or any(len(c) > 1 for c in params.continuations):
                return None
            vocab.update(c[0] for c in params.continuations)
        return sorted(vocab)

    def _score(
        self, step: Step, logits: npt.NDArray[np.float32], vocab: list[int] | None = None
    ) -> dict[str, list[float]]:
        """The score of each continuation of every scoring request in ``step`` (see
        :attr:`SamplingParams.relative_scores`): its first token from the prompt's last row,
        the others from its branch's rows. ``logits`` holds the tokens ``vocab`` only, where
        given (:meth:`_scored_vocab`)."""
        if not step.has_scoring:
            return {}
        column = None if vocab is None else {token: i for i, token in enumerate(vocab)}
        rows: dict[str, list[npt.NDArray[np.float32]]] = {}
        row = 0
        for chunk in step.chunks:
            if chunk.scoring:
                rows.setdefault(chunk.request_id, []).append(logits[row : row + chunk.n_rows])
            row += chunk.n_rows
        scores = {}
        for request_id, (last, *branches) in rows.items():
            params = self._requests[request_id].params
            assert isinstance(params, SamplingParams) and params.continuations is not None
            fed = iter(branches)
            totals = []
            for c in params.continuations:
                if len(c) == 1:
                    totals.append(0.0)
                    continue
                # The tokens after the first, each from the branch's row before it.
                totals.append(_log_likelihood(next(fed), c[1:]))
            # The first token, from the prompt's last row: among the vocabulary, or among the
            # continuations' first tokens (the row's columns of those tokens).
            first, index = last[-1:], None
            if column is not None or params.relative_scores:
                firsts = sorted({c[0] for c in params.continuations})
                first = first[:, [t if column is None else column[t] for t in firsts]]
                index = {t: i for i, t in enumerate(firsts)}
            for i, c in enumerate(params.continuations):
                totals[i] += _log_likelihood(first, [c[0] if index is None else index[c[0]]])
            scores[request_id] = totals
        return scores

    def _forward(
        self,
        step: Step,
        output: Literal["logits", "draw"],
        embeddings: dict[str, npt.NDArray[np.float32]],
        vocab: list[int] | None = None,
        draws: list[tuple[float, int, float, float, int]] | None = None,
    ) -> npt.NDArray[Any]:
        """The step's logits (of the tokens ``vocab`` only, where given) or the tokens drawn
        as ``draws`` says; the hidden states of its embedding requests go to their poolers,
        and the vectors of those it completes into ``embeddings``."""
        batch = step.batch()
        if not step.has_embeddings:
            return self.model.forward(self.kv, batch, output, vocab=vocab, draws=draws)
        head, hidden = self.model.forward(
            self.kv, batch, output, hidden=True, vocab=vocab, draws=draws
        )
        embeddings.update(self._pool(step, hidden))
        return head

    def _pool(
        self, step: Step, hidden: npt.NDArray[np.float32]
    ) -> dict[str, npt.NDArray[np.float32]]:
        """Each embedding request's rows of ``step`` taken by its pooler; the vectors of those
        whose last chunk was in it."""
        done = {}
        row = 0
        for chunk in step.chunks:
            if not chunk.n_hidden and not chunk.pooled:
                continue
            pooler = self._requests[chunk.request_id].pooler
            assert pooler is not None
            pooler.add(hidden[row : row + chunk.n_hidden], chunk.start_pos)
            row += chunk.n_hidden
            if chunk.pooled:
                done[chunk.request_id] = pooler.result()
        return done

    def stats(self) -> dict[str, float]:
        """KV pages total / used / free, tokens cached, slot utilization, running and waiting
        requests, preemptions, tokens computed per second over the last steps, and the prefix
        cache's ``cached_pages``, ``prefix_queried_tokens``, ``prefix_hit_tokens`` and
        ``evicted_pages``."""
        with self._lock:
            out = self.scheduler.stats()
        out["tokens_cached"] = out["tokens_stored"]
        rate = 0.0
        if len(self._recent) >= 2:
            elapsed = self._recent[-1][0] - self._recent[0][0]
            tokens = sum(n for _, n in list(self._recent)[1:])
            rate = tokens / elapsed if elapsed > 0 else 0.0
        out["tokens_per_second"] = rate
        return out
