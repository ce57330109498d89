"""Throughput measurements in llama.cpp's shapes (``tallow bench``).

- :func:`prefill`: one forward pass over ``n`` prompt tokens (llama-bench ``pp``).
- :func:`decode`: ``n`` tokens generated one by one, the next token the argmax of the last
  (llama-bench ``tg``).

Both start from an empty cache, or with ``depth`` tokens of context already in it (computed
untimed), as llama-bench's ``-d``.
- :func:`batched`: ``npl`` requests of ``npp`` prompt tokens each generating ``ntg`` tokens
  through the engine, as ``llama-batched-bench -npp -ntg -npl`` runs them.
- :func:`served`: the same requests sent concurrently to :class:`tallow.AsyncLLM`, all tokens
  over the wall time.
- :func:`memory`: the process's peak and current resident memory, and what a model holds in
  its device's memory.
- :func:`decode_reads`: the weights a decode step reads and the rate that makes, beside the
  rate at which this machine's compute threads read as many bytes (on the CPU).

Before :func:`prefill` and :func:`decode` time anything, an untimed prefill writes every page
of their KV cache once, as llama-bench's cache is allocated, cleared and warmed up before it
times anything. Prompt tokens are random ids from the vocabulary, as in llama-bench;
generation ignores end-of-generation tokens.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import anyio
import numpy as np

from tallow import _core
from tallow.async_llm import AsyncLLM
from tallow.engine import Engine, EngineConfig, SamplingParams

__all__ = [
    "Batched",
    "DecodeReads",
    "Memory",
    "batched",
    "decode",
    "decode_reads",
    "decode_seconds",
    "memory",
    "prefill",
    "served",
]


def _random_tokens(model: _core.Model, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(100, model.n_vocab - 100, size=n)]


def _warm_cache(
    model: _core.Model, n_tokens: int, seed: int, kv_dtype: str
) -> tuple[_core.KvCache, int]:
    """A KV cache of ``n_tokens`` positions in ``kv_dtype`` whose pages have all been written
    once (by an untimed prefill), and an empty sequence in it. llama-bench likewise allocates
    and clears its KV buffer and runs a warm-up before it times anything; a fresh pool's pages
    are only mapped by the OS when first written."""
    kv = model.new_kv_cache(
        dtype=kv_dtype, max_pages=model.kv_pages_to_hold(n_tokens, chunk=n_tokens)
    )
    warm = kv.create()
    kv.reserve(warm, n_tokens)
    model.forward(kv, [(warm, _random_tokens(model, n_tokens, seed + 1), "last")])
    kv.free(warm)
    return kv, kv.create()


def _context(model: _core.Model, kv: _core.KvCache, seq: int, depth: int, seed: int) -> None:
    """Fill the first ``depth`` positions of ``seq`` with the KV of random tokens (untimed)."""
    if depth:
        kv.reserve(seq, depth)
        model.forward(kv, [(seq, _random_tokens(model, depth, seed + 2), "last")])


def prefill(
    model: _core.Model, n_tokens: int, seed: int = 0, depth: int = 0, kv_dtype: str = "f16"
) -> float:
    """Prompt tokens per second of one forward pass over ``n_tokens`` tokens after ``depth``
    tokens of context, the KV cache in ``kv_dtype``."""
    kv, seq = _warm_cache(model, depth + n_tokens, seed, kv_dtype)
    _context(model, kv, seq, depth, seed)
    kv.reserve(seq, n_tokens)
    tokens = _random_tokens(model, n_tokens, seed)
    start = time.perf_counter()
    model.forward(kv, [(seq, tokens, "last")])
    return n_tokens / (time.perf_counter() - start)


def decode(
    model: _core.Model, n_tokens: int, seed: int = 0, depth: int = 0, kv_dtype: str = "f16"
) -> float:
    """Tokens per second of generating ``n_tokens`` tokens one at a time, greedily, after
    ``depth`` tokens of context, the KV cache in ``kv_dtype``."""
    return n_tokens / decode_seconds(model, n_tokens, seed, depth, kv_dtype)


def decode_seconds(
    model: _core.Model,
    n_tokens: int,
    seed: int = 0,
    depth: int = 0,
    kv_dtype: str = "f16",
    before_step: Callable[[], object] | None = None,
) -> float:
    """Seconds of generating ``n_tokens`` tokens one at a time, as :func:`decode` does, with
    ``before_step`` called (untimed) before each step: a probe to take turns with the steps."""
    kv, seq = _warm_cache(model, depth + n_tokens, seed, kv_dtype)
    _context(model, kv, seq, depth, seed)
    token = _random_tokens(model, 1, seed)[0]
    seconds = 0.0
    for _ in range(n_tokens):
        if before_step is not None:
            before_step()
        start = time.perf_counter()
        kv.reserve(seq, 1)
        token = int(model.forward(kv, [(seq, [token], "last")], "argmax")[0])
        seconds += time.perf_counter() - start
    return seconds


@dataclass(frozen=True)
class Batched:
    """One batched run, in llama-batched-bench's columns."""

    prompt_tps: float
    """Prompt tokens of all requests over the time until the first tokens come out (S_PP)."""
    generate_tps: float
    """Generated tokens after the first over the rest of the run (S_TG)."""
    total_tps: float
    """All prompt and generated tokens over the whole run (S)."""


def batched(
    model: _core.Model, npp: int, ntg: int, npl: int, seed: int = 0, kv_dtype: str = "f16"
) -> Batched:
    """``npl`` requests of ``npp`` prompt tokens each generating ``ntg`` tokens (greedy),
    through the engine that :class:`tallow.AsyncLLM` runs."""
    engine = Engine(
        model,
        EngineConfig(
            max_num_seqs=npl,
            max_tokens_per_step=max(512, npp * npl),
            n_ctx=npp + ntg,
            kv_dtype=kv_dtype,
        ),
    )
    params = SamplingParams(max_tokens=ntg, temperature=0.0, ignore_eos=True)
    for i in range(npl):
        engine.add(f"seq-{i}", _random_tokens(model, npp, seed + i), params)
    start = time.perf_counter()
    prefill_done = None
    while engine.has_work():
        outputs = engine.step()
        if prefill_done is None and outputs:
            # The first tokens come out of the step that finishes the prompts.
            prefill_done = time.perf_counter()
    end = time.perf_counter()
    assert prefill_done is not None
    t_pp, t_tg = prefill_done - start, end - prefill_done
    generated = (ntg - 1) * npl
    return Batched(
        npp * npl / t_pp,
        generated / t_tg if t_tg > 0 else 0.0,
        (npp + ntg) * npl / (end - start),
    )


def served(model: str | os.PathLike[str], npp: int, ntg: int, npl: int, seed: int = 0) -> float:
    """``npl`` concurrent requests of ``npp`` prompt tokens each generating ``ntg`` tokens
    (greedy, end-of-generation ignored) through :class:`tallow.AsyncLLM`: all prompt and
    generated tokens over the wall time from the first request to the last answer."""

    async def run() -> float:
        async with AsyncLLM(
            model,
            max_num_seqs=npl,
            max_tokens_per_step=max(512, npp * npl),
            n_ctx=npp + ntg,
        ) as llm:
            prompts = [_random_tokens(llm.model, npp, seed + i) for i in range(npl)]
            generated: list[int] = []

            async def one(prompt: list[int]) -> None:
                answer = await llm.generate(
                    prompt, max_tokens=ntg, temperature=0.0, ignore_eos=True
                )
                generated.append(answer.completion_tokens)

            start = time.perf_counter()
            async with anyio.create_task_group() as group:
                for prompt in prompts:
                    group.start_soon(partial(one, prompt))
            seconds = time.perf_counter() - start
        assert generated == [ntg] * npl, generated
        return (npp + ntg) * npl / seconds

    return anyio.run(run)


@dataclass(frozen=True)
class Memory:
    """Bytes of memory, None where the platform does not say."""

    host_peak: int | None
    """The most this process has held resident (its peak RSS)."""
    host_now: int | None
    """What it holds resident now."""
    device_in_use: int | None
    """What the model's backend holds in device memory now (None on the CPU)."""
    device_peak: int | None
    """The most it has held since the device was opened."""

    def __str__(self) -> str:
        def mib(n: int | None) -> str:
            return "?" if n is None else f"{n / 2**20:.1f} MiB"

        text = f"host {mib(self.host_peak)} peak RSS ({mib(self.host_now)} now)"
        if self.device_in_use is not None:
            text += f", device {mib(self.device_in_use)} in use ({mib(self.device_peak)} peak)"
        return text


def memory(model: _core.Model) -> Memory:
    """This process's resident memory, peak and now, and ``model``'s device memory."""
    peak = now = None
    try:
        import resource

        # ru_maxrss is in KiB on Linux, in bytes on macOS.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak *= 1 if sys.platform == "darwin" else 1024
    except ImportError:  # Windows
        pass
    try:
        with open("/proc/self/statm") as statm:
            now = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux
        pass
    device = model.device_memory
    return Memory(peak, now, *(device if device is not None else (None, None)))


@dataclass(frozen=True)
class DecodeReads:
    """What a decode step reads, and how close to the machine's limit it reads it."""

    bytes_per_token: int
    """Bytes of weights each decode step reads (:attr:`tallow._core.Model.decode_weight_bytes`)."""
    achieved: float
    """Bytes per second of weights at the measured decode rate."""
    limit: float
    """Bytes per second at which the model's device reads as many bytes
    (:meth:`tallow._core.Model.read_rate`): on the CPU the compute threads sum a buffer, on a
    GPU it copies one buffer to another, counting the bytes read and written."""
    device: str
    """The model's device (``"cpu"``, ``"cuda:0"``)."""

    def __str__(self) -> str:
        where = "this machine" if self.device == "cpu" else self.device
        return (
            f"{self.bytes_per_token / 2**20:.1f} MiB of weights a token, "
            f"{self.achieved / 1e9:.2f} GB/s; {where} reads {self.limit / 1e9:.2f} GB/s "
            f"({self.achieved / self.limit:.0%} of it)"
        )


def decode_reads(model: _core.Model, tokens_per_second: float) -> DecodeReads:
    """The weights ``model`` reads a decode step at ``tokens_per_second``, beside the rate at
    which its device reads as many bytes: a decode step's limit there (a model that fits the
    last-level cache in part reads that part from the cache, and so does the probe)."""
    per_token = model.decode_weight_bytes
    limit = model.read_rate(per_token)
    return DecodeReads(per_token, per_token * tokens_per_second, limit, model.device)
