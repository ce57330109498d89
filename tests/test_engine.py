"""The engine loop driven directly: KV slot utilization in steady decode."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tallow import _core
from tallow.engine import Engine, EngineConfig, SamplingParams


def test_slot_utilization_in_steady_decode(smollm2_path: Path) -> None:
    """16 sequences of mixed lengths decoding together waste less than 4% of their slots:
    only the last page of each sequence is partly filled."""
    model = _core.Model(str(smollm2_path))
    engine = Engine(
        model, EngineConfig(max_num_seqs=16, max_tokens_per_step=4096, page_size=8, n_ctx=512)
    )
    rng = np.random.default_rng(1)
    lengths = rng.integers(120, 200, size=16)
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
