"""The engine loop driven directly: KV slot utilization in steady decode."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tallow
from tallow import _core
from tallow.engine import Engine, EngineConfig, SamplingParams


def test_slot_utilization_in_steady_decode(smollm2_path: Path) -> None:
    """16 sequences of mixed lengths decoding together waste less than 4% of their slots:
    only the last page of each sequence is partly filled."""
    model = _core.Model(str(smollm2_path))
    engine = Engine(
        model, EngineConfig(max_num_seqs=16, max_tokens_per_step=8192, page_size=16, n_ctx=512)
    )
    rng = np.random.default_rng(1)
    lengths = rng.integers(240, 400, size=16)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for i, n in enumerate(lengths):
        engine.add(f"r{i}", [int(t) for t in rng.integers(100, 40000, size=n)], params)
    engine.step()  # every prompt in one step
    samples = []
    while engine.has_work():
        stats = engine.stats()
        if stats["running"] == 16:
            samples.append(stats["utilization"])
            assert stats["tokens_cached"] == stats["tokens_stored"] > 0
        engine.step()
    assert len(samples) >= 20
    assert min(samples) > 0.96, samples
    assert engine.stats()["pages_used"] == 0


def test_interleaved_llm_streams_share_the_engine(smollm2: tallow.LLM) -> None:
    """Two open streams of one LLM advance in the same engine steps and give what each gives
    alone; closing one early aborts it and frees its pages."""
    alone = [
        smollm2.generate(p, max_tokens=10, temperature=0).text
        for p in ("The largest planet", "Paris is a city in")
    ]
    a = smollm2.stream("The largest planet", max_tokens=10, temperature=0)
    b = smollm2.stream("Paris is a city in", max_tokens=10, temperature=0)
    first = next(a) + next(b)
    assert first
    rest_a, rest_b = "".join(a), "".join(b)
    assert a.result is not None and b.result is not None
    assert [a.result.text, b.result.text] == alone
    c = smollm2.stream("Hello, my name is", max_tokens=50, temperature=0)
    next(c)
    c.close()
    assert smollm2.stats()["pages_used"] == 0
    assert rest_a and rest_b
