"""The engine: a model, its paged KV pool and the continuous batcher, advanced one step at a
time. Synchronous and single-threaded; :class:`tallow.AsyncLLM` runs it in a thread of its own.

One step is: the scheduler picks the tokens (``Scheduler.schedule``), the model runs them as one
ragged batch (``Model.forward``, GIL released), every request that needs a token samples it with
its own sampler (``sample_batch``, parallel, per-request seeds), and the scheduler appends the
tokens, checks stop conditions and frees the pages of finished requests (``Scheduler.update``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from tallow import _core
from tallow.catalog import resolve_model
from tallow.errors import InvalidArgumentError, TallowError
from tallow.scheduler import Request, RequestOutput, Scheduler, Step, TokenLogprob
from tallow.speculative import (
    DraftModelProposer,
    DraftRequest,
    NgramProposer,
    Proposal,
    Proposer,
    speculative_config,
)

__all__ = ["Engine", "EngineConfig", "SamplingParams", "sampling_params"]


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

    def new_sampler(self) -> _core.Sampler:
        """A sampler with these settings (raises InvalidArgumentError when one is invalid)."""
        return _core.Sampler(
            self.temperature,
            self.top_k,
            self.top_p,
            self.seed,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            logit_bias=dict(self.logit_bias),
            top_logprobs=self.top_logprobs,
            logprobs=self.logprobs,
        )


def sampling_params(
    max_tokens: int | None,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    stop: str | Sequence[str] | None,
    **options: object,
) -> SamplingParams:
    """The engine's parameters of a generation, after checking each argument. ``options``
    are further :class:`SamplingParams` fields (checked by the sampler when it is made)."""
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0
    ):
        raise InvalidArgumentError(
            f"max_tokens must be a non-negative integer or None, got {max_tokens!r}"
        )
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise InvalidArgumentError(
            f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise InvalidArgumentError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
        raise InvalidArgumentError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not (0 <= seed < 2**64)
    ):
        raise InvalidArgumentError(f"seed must be an integer in [0, 2**64) or None, got {seed!r}")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    else:
        stops = tuple(stop)
    for s in stops:
        if not isinstance(s, str) or not s:
            raise InvalidArgumentError(f"stop strings must be non-empty strings, got {s!r}")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=float(temperature),
            top_k=top_k,
            top_p=float(top_p),
            seed=seed,
            stop=stops,
            **options,  # type: ignore[arg-type]
        )
    except TypeError as e:
        raise InvalidArgumentError(str(e)) from None


@dataclass(frozen=True)
class EngineConfig:
    """Sizes of an engine.

    ``kv_pages`` pages of ``page_size`` tokens hold the KV of every running request; or give
    ``kv_bytes``, the memory of that pool (``None`` for both: enough for ``max_num_seqs`` full
    contexts, capped at 8192 pages). ``n_ctx`` is the most positions per request (``None``: the
    model's training context, capped at 4096), and never more than the pool holds.
    ``prefix_caching`` reuses the KV of prompt prefixes already computed (see
    :mod:`tallow.scheduler`). ``speculative`` turns on speculative decoding for every request
    that does not say otherwise (see :mod:`tallow.speculative`).
    """

    max_num_seqs: int = 64
    max_tokens_per_step: int = 512
    page_size: int = 16
    kv_pages: int | None = None
    kv_bytes: int | None = None
    n_ctx: int | None = None
    prefix_caching: bool = True
    speculative: object = None


def check_token_ids(token_ids: Sequence[int], n_vocab: int) -> None:
    """Raise :class:`InvalidArgumentError` unless every id is a token of the vocabulary."""
    bad = next((t for t in token_ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise InvalidArgumentError(f"token id {bad} is out of range (vocabulary size {n_vocab})")


class Engine:
    """A model with its KV pool and scheduler. Not thread-safe: one thread drives it."""

    def __init__(self, model: _core.Model, config: EngineConfig | None = None) -> None:
        config = config or EngineConfig()
        n_ctx = config.n_ctx or min(model.n_ctx_train, 4096)
        if config.kv_pages is not None and config.kv_bytes is not None:
            raise InvalidArgumentError("give kv_pages or kv_bytes, not both")
        if config.kv_bytes is not None:
            self.kv = model.new_kv_cache(page_size=config.page_size, max_bytes=config.kv_bytes)
        else:
            pages = config.kv_pages
            if pages is None:
                per_request = -(-n_ctx // config.page_size)
                pages = min(per_request * config.max_num_seqs, 8192)
            self.kv = model.new_kv_cache(page_size=config.page_size, max_pages=pages)
        self.model = model
        self.n_ctx = min(n_ctx, self.kv.n_pages * config.page_size)
        self.scheduler = Scheduler(
            self.kv,
            max_num_seqs=config.max_num_seqs,
            max_tokens_per_step=config.max_tokens_per_step,
            eog_ids=model.eog_ids,
            max_model_len=self.n_ctx,
            decoder_factory=model.stream_decoder,
            prefix_caching=config.prefix_caching,
        )
        self.speculative = speculative_config(config.speculative)
        self._proposers: dict[str, Proposer] = {}
        spec = self.speculative
        if spec is not None:
            self._proposers["ngram"] = NgramProposer.from_config(spec)
            if spec.draft_model is not None:
                draft = _core.Model(str(resolve_model(spec.draft_model)))
                self._proposers["draft"] = DraftModelProposer(
                    draft,
                    n_vocab=model.n_vocab,
                    kv_pages=self.kv.n_pages,
                    page_size=config.page_size,
                )
        self._speculate: dict[str, tuple[str, int]] = {}
        """(method, tokens) of the requests that speculate."""
        self._samplers: dict[str, _core.Sampler] = {}
        self._logprobs: set[str] = set()
        # (time, tokens computed) of recent steps, for the throughput in stats().
        self._recent: deque[tuple[float, int]] = deque(maxlen=64)
        self.tokens_computed = 0
        # stats() may come from another thread while a step holds the KV pool.
        self._lock = threading.Lock()

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sampler: _core.Sampler | None = None,
    ) -> None:
        """Queue a request, with ``sampler`` or a new one from ``params`` (so bad parameters
        raise here)."""
        if request_id in self._samplers:
            raise InvalidArgumentError(f"request {request_id!r} is already in the engine")
        check_token_ids(prompt_token_ids, self.model.n_vocab)
        sampler = sampler or params.new_sampler()
        speculate = self._speculation(params)
        self.scheduler.add(Request(request_id, list(prompt_token_ids), params))
        self._samplers[request_id] = sampler
        if params.logprobs:
            self._logprobs.add(request_id)
        if speculate is not None:
            self._speculate[request_id] = speculate

    def _speculation(self, params: SamplingParams) -> tuple[str, int] | None:
        """(method, tokens) of a request's speculation, or None. What the request leaves out
        comes from the engine's setting."""
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
        return spec.method, spec.num_tokens

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
        step = self.scheduler.schedule({r: p.tokens for r, p in proposals.items()})
        sampled: dict[str, list[tuple[int, float, list[tuple[int, float]]]]] = {}
        if step:
            try:
                logits = self.model.forward(self.kv, step.batch())
                sampled = self._sample(step, logits, proposals)
            except TallowError as e:
                return self._forget(self.scheduler.fail(step, str(e)))
            self.tokens_computed += step.num_tokens
            self._recent.append((time.perf_counter(), step.num_tokens))
        outputs = self.scheduler.update(
            step, {r: [t[0] for t in rows] for r, rows in sampled.items()}
        )
        for i, out in enumerate(outputs):
            if out.new_token_ids and out.request_id in self._logprobs:
                rows = sampled[out.request_id][: len(out.new_token_ids)]
                outputs[i] = replace(out, logprobs=[TokenLogprob(*row) for row in rows])
        return self._forget(outputs)

    def _propose(self) -> dict[str, Proposal]:
        """Draft tokens for the decoding requests that speculate, by method."""
        if not self._speculate:
            return {}
        wanted: dict[str, list[DraftRequest]] = {}
        for req in self.scheduler.decoding():
            speculate = self._speculate.get(req.request_id)
            if speculate is None or req.abort_pending:
                continue
            method, k = speculate
            p = req.params
            assert isinstance(p, SamplingParams)
            wanted.setdefault(method, []).append(
                DraftRequest(
                    req.request_id,
                    req.token_slice(0, req.num_tokens),
                    k,
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
        return {r: p for r, p in proposals.items() if p.tokens}

    def _sample(
        self, step: Step, logits: npt.NDArray[np.float32], proposals: dict[str, Proposal]
    ) -> dict[str, list[tuple[int, float, list[tuple[int, float]]]]]:
        """The tokens of every request in ``step``: verification for chunks with a draft, one
        batched draw for the others."""
        sampled = {}
        plain_ids: list[str] = []
        plain_rows: list[int] = []
        row = 0
        for chunk in step.chunks:
            if not chunk.logits:
                continue
            if chunk.draft:
                probs = proposals[chunk.request_id].probs
                q = None if probs is None else np.ascontiguousarray(probs[: len(chunk.draft)])
                block = logits[row : row + chunk.n_rows]
                sampled[chunk.request_id] = self._samplers[chunk.request_id].verify(
                    block, chunk.draft, q
                )
            else:
                plain_ids.append(chunk.request_id)
                plain_rows.append(row)
            row += chunk.n_rows
        if plain_ids:
            rows = logits if len(plain_rows) == row else logits[plain_rows]
            drawn = _core.sample_batch([self._samplers[r] for r in plain_ids], rows)
            sampled.update({r: [one] for r, one in zip(plain_ids, drawn, strict=True)})
        return sampled

    def _forget(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Drop the samplers of the requests that finished in ``outputs``."""
        for out in outputs:
            if out.finished:
                self._samplers.pop(out.request_id, None)
                self._logprobs.discard(out.request_id)
                speculate = self._speculate.pop(out.request_id, None)
                if speculate is not None:
                    self._proposers[speculate[0]].finish(out.request_id)
        return outputs

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
