"""Sampling through the extension module: per-request parameters, batched sampling and
log probabilities."""

from __future__ import annotations

import numpy as np
import pytest

import tallow
from tallow import _core


def rows(n: int, vocab: int = 64) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, vocab)).astype(np.float32)


def test_batched_sampling_is_independent_of_the_batch() -> None:
    logits = rows(6)
    make = lambda seed: _core.Sampler(0.8, 20, 0.9, seed, min_p=0.01)  # noqa: E731
    alone = make(7)
    solo = [alone.sample(logits[0]) for _ in range(20)]
    batched_sampler = make(7)
    others = [make(s) for s in range(5)]
    batched = [_core.sample_batch([batched_sampler, *others], logits)[0][0] for _ in range(20)]
    assert solo == batched


def test_logprobs_and_top_logprobs() -> None:
    logits = rows(2)
    out = _core.sample_batch([_core.Sampler(0.0, 0, 1.0, top_logprobs=3) for _ in range(2)], logits)
    for row, (token, logprob, top) in zip(logits, out, strict=True):
        log_softmax = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
        assert token == int(np.argmax(row))
        assert logprob == pytest.approx(log_softmax[token], abs=1e-5)
        assert [t for t, _ in top] == list(np.argsort(-row)[:3])
        assert [lp for _, lp in top] == pytest.approx(sorted(log_softmax)[::-1][:3], abs=1e-5)


def test_penalties_and_bias() -> None:
    logits = np.array([2.0, 1.5, -1.0], dtype=np.float32)
    s = _core.Sampler(0.0, 0, 1.0, presence_penalty=1.0)
    assert [s.sample(logits) for _ in range(3)] == [0, 1, 0]
    s = _core.Sampler(0.0, 0, 1.0, repetition_penalty=2.0)
    s.accept([0])
    assert s.sample(logits) == 1
    s = _core.Sampler(0.0, 0, 1.0, logit_bias={0: float("-inf"), 2: 5.0})
    assert s.sample(logits) == 2


def test_bad_parameters() -> None:
    for kwargs in ({"min_p": 1.5}, {"repetition_penalty": 0.0}, {"logit_bias": {1: float("nan")}}):
        with pytest.raises(tallow.InvalidArgumentError):
            _core.Sampler(1.0, 0, 1.0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(tallow.InvalidArgumentError):
        _core.sample_batch([_core.Sampler(1.0, 0, 1.0)], rows(2))


def test_logprobs_only_when_asked() -> None:
    logits = rows(1)
    ((token, logprob, top),) = _core.sample_batch([_core.Sampler(0.0, 0, 1.0)], logits)
    assert np.isnan(logprob) and top == []
    ((token2, logprob2, top2),) = _core.sample_batch(
        [_core.Sampler(0.0, 0, 1.0, logprobs=True)], logits
    )
    assert token2 == token and logprob2 <= 0 and top2 == []
