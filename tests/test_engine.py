"""The engine loop driven directly: KV slot utilization in steady decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tallow
from tallow import _core
from tallow.engine import Engine, EngineConfig, SamplingParams
from tallow.errors import InvalidArgumentError, ModelError


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


class FailingForward:
    """The real model, except that the forward passes numbered in ``fail_at`` (from 1) raise:
    the engine's failure path, which a correct model never takes on valid input."""

    def __init__(self, model: _core.Model, fail_at: set[int]) -> None:
        self._model = model
        self._fail_at = fail_at
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def forward(self, kv: Any, batch: Any, output: Any = "logits", **options: Any) -> Any:
        self.calls += 1
        if self.calls in self._fail_at:
            raise ModelError("injected failure")
        return self._model.forward(kv, batch, output, **options)


def run_to_end(engine: Engine) -> dict[str, tuple[list[int], str | None, str | None]]:
    """Tokens, finish reason and error of every request, stepping until the engine is idle."""
    out: dict[str, tuple[list[int], str | None, str | None]] = {}
    while engine.has_work():
        for o in engine.step():
            tokens, _, _ = out.get(o.request_id, ([], None, None))
            error = None if o.error is None else str(o.error)
            out[o.request_id] = (tokens + o.new_token_ids, o.finish_reason, error)
    return out


def test_a_failed_step_ends_only_its_requests(smollm2_path: Path) -> None:
    """When a forward pass fails, the requests of that step end with the error and give back
    every page (the positions reserved for the step included); the engine goes on serving."""
    model = _core.Model(str(smollm2_path))
    config = EngineConfig(max_num_seqs=4, n_ctx=128, kv_pages=32)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompts = {p: model.tokenize(p, False, True) for p in ("The sky is", "One, two,", "Hello")}

    clean = Engine(model, config)
    for p, ids in prompts.items():
        clean.add(p, ids, params)
    expected = run_to_end(clean)

    failing = FailingForward(model, fail_at={2})
    engine = Engine(failing, config)  # type: ignore[arg-type]
    engine.add("The sky is", prompts["The sky is"], params)
    engine.add("One, two,", prompts["One, two,"], params)
    first = engine.step()  # both prompts
    assert [o.request_id for o in first] == ["The sky is", "One, two,"]
    failed = engine.step()  # their first decode step fails
    assert [(o.request_id, o.finish_reason, str(o.error)) for o in failed] == [
        ("The sky is", "abort", "injected failure"),
        ("One, two,", "abort", "injected failure"),
    ]
    stats = engine.stats()
    assert (stats["pages_used"], stats["running"], stats["waiting"]) == (0, 0, 0)
    # A request added after the failure is served as if nothing had happened.
    engine.add("Hello", prompts["Hello"], params)
    assert run_to_end(engine) == {"Hello": expected["Hello"]}
    assert expected["Hello"][1] == "length" and len(expected["Hello"][0]) == 6
    assert engine.stats()["pages_used"] == 0


def test_prompt_token_ids_are_checked_against_the_vocabulary(smollm2_path: Path) -> None:
    model = _core.Model(str(smollm2_path))
    engine = Engine(model, EngineConfig(n_ctx=64, kv_pages=8))
    params = SamplingParams(max_tokens=2)
    with pytest.raises(InvalidArgumentError, match="49152 is out of range"):
        engine.add("r", [1, model.n_vocab], params)
    with pytest.raises(InvalidArgumentError, match="-3 is out of range"):
        engine.add("r", [-3], params)
    assert not engine.has_work()


def test_prefix_cache_gives_the_same_tokens_and_skips_the_shared_prefix(
    smollm2_path: Path,
) -> None:
    """Requests sharing a long system prompt: with the prefix cache, later ones compute only
    what follows the cached pages, and every output equals the one computed from scratch."""
    model = _core.Model(str(smollm2_path))
    system = model.tokenize(
        "You are a careful assistant. Answer in one short sentence, and never use lists. " * 6,
        False,
        True,
    )
    questions = ["What is the sun?", "Name a river.", "Why is the sky blue?", "Count to three."]
    prompts = [system + model.tokenize(q, False, True) for q in questions]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def run(prefix_caching: bool) -> tuple[list[list[int]], dict[str, float]]:
        engine = Engine(model, EngineConfig(n_ctx=256, kv_pages=64, prefix_caching=prefix_caching))
        # The first request alone, then the others together.
        engine.add("q0", prompts[0], params)
        out = run_to_end(engine)
        for i, p in enumerate(prompts[1:], start=1):
            engine.add(f"q{i}", p, params)
        out.update(run_to_end(engine))
        return [out[f"q{i}"][0] for i in range(len(prompts))], engine.stats()

    cached, stats = run(True)
    plain, plain_stats = run(False)
    assert cached == plain
    cached_pages = len(system) // 16
    assert cached_pages >= 5
    # Each later request found the whole system prompt (and q0 found nothing): its full pages
    # and the part of the next page that q0 filled (the questions' first tokens differ).
    assert stats["prefix_hit_tokens"] == 3 * len(system)
    assert stats["prefix_queried_tokens"] == sum(len(p) for p in prompts)
    assert plain_stats["prefix_hit_tokens"] == 0 and plain_stats["cached_pages"] == 0
    assert stats["pages_used"] == 0 and stats["cached_pages"] > cached_pages
