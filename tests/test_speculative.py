"""Speculative decoding: the same greedy tokens as plain decoding with both proposers, the
target distribution kept when sampling, and the proposers and options on their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import tallow
from tallow import _core
from tallow.engine import Engine, EngineConfig, SamplingParams
from tallow.scheduler import Scheduler, SchedulerOutput
from tallow.speculative import (
    DraftModelProposer,
    DraftRequest,
    NgramProposer,
    SpeculativeConfig,
    speculative_config,
    tree_path,
)

CODE = '''def area(width, height):
    """The area of a rectangle."""
    return width * height


def perimeter(width, height):
    """The perimeter of a rectangle."""
    return 2 * (width + height)
'''

PROMPTS = [
    "Copy this text exactly: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5,",
    "<|im_start|>user\nRewrite this code with width renamed to w.\n\n"
    + CODE
    + "<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is",
    "Once upon a time, there was a little robot who",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return",
]


def greedy_tokens(
    model: _core.Model,
    speculative: object,
    plain: frozenset[int] = frozenset(),
    kv_dtype: str = "f16",
    logprobs: frozenset[int] = frozenset(),
) -> tuple[dict[str, list[int]], dict[str, float]]:
    """Every prompt's greedy continuation, all requests in one engine with KV pages of
    ``kv_dtype``; the requests numbered in ``plain`` opt out of speculation, those in
    ``logprobs`` ask for log probabilities (so that their steps' logits come back whole)."""
    config = EngineConfig(n_ctx=512, kv_pages=256, speculative=speculative, kv_dtype=kv_dtype)
    engine = Engine(model, config)
    for i, prompt in enumerate(PROMPTS):
        params = SamplingParams(
            max_tokens=40,
            temperature=0.0,
            speculative=0 if i in plain else None,
            logprobs=i in logprobs,
        )
        engine.add(f"r{i}", model.tokenize(prompt, False, True), params)
    out: dict[str, list[int]] = {}
    while engine.has_work():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    stats = engine.stats()
    assert stats["pages_used"] == 0
    return out, stats


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> _core.Model:
    return _core.Model(str(smollm2_path))


@pytest.fixture(scope="module")
def plain_tokens(model: _core.Model) -> dict[str, list[int]]:
    return greedy_tokens(model, None)[0]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_prompt_lookup_gives_the_greedy_tokens(
    model: _core.Model, plain_tokens: dict[str, list[int]], k: int
) -> None:
    got, stats = greedy_tokens(model, {"method": "ngram", "num_tokens": k}, plain=frozenset({3}))
    assert got == plain_tokens
    assert stats["spec_drafted_tokens"] > 0
    assert 0 < stats["spec_acceptance_rate"] <= 1
    assert stats["spec_tokens_per_step"] > 1


@pytest.mark.parametrize(("branches", "logprobs"), [(1, False), (3, False), (3, True)])
def test_a_tree_of_guesses_gives_the_greedy_tokens(
    model: _core.Model,
    plain_tokens: dict[str, list[int]],
    branches: int,
    logprobs: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Alternative guesses verified beside the draft: the same tokens as plain decoding, with
    steps whose tokens followed a guess (its branch adopted as the request's sequence), and
    every page given back; greedy choices made on the device, or (beside a request that asks
    for log probabilities) from the logits on the host."""
    adoptions = []
    update = Scheduler.update

    def counting(self: Scheduler, *args: Any) -> list[SchedulerOutput]:
        adoptions.append(len(args[3] or {}) if len(args) > 3 else 0)
        return update(self, *args)

    monkeypatch.setattr(Scheduler, "update", counting)
    spec = {"method": "ngram", "num_tokens": 4, "num_branches": branches, "adaptive": False}
    beside = frozenset({4}) if logprobs else frozenset()
    got, stats = greedy_tokens(model, spec, plain=frozenset({3}), logprobs=beside)
    assert got == plain_tokens
    assert sum(adoptions) > 0
    assert stats["spec_tokens_per_step"] > 1


@pytest.mark.parametrize("kv_dtype", ["q8_0", "q4_0", "bf16"])
def test_speculation_over_rounded_pages_gives_their_greedy_tokens(
    model: _core.Model, kv_dtype: str
) -> None:
    # A verified draft writes its positions' keys and values (quantized, or rounded to bf16)
    # and reads them back in one forward, as decoding does one token at a time: the same
    # tokens.
    plain, _ = greedy_tokens(model, None, kv_dtype=kv_dtype)
    spec = {"method": "ngram", "num_tokens": 3}
    got, stats = greedy_tokens(model, spec, plain=frozenset({3}), kv_dtype=kv_dtype)
    assert got == plain
    assert stats["spec_drafted_tokens"] > 0 and stats["spec_tokens_per_step"] > 1


def test_a_draft_model_gives_the_greedy_tokens(
    model: _core.Model, plain_tokens: dict[str, list[int]], smollm2_path: Path
) -> None:
    # The model drafting for itself: every greedy guess is right, so every step of a
    # speculating request gains num_tokens + 1 tokens until max_tokens cuts the draft.
    spec = {"method": "draft", "draft_model": str(smollm2_path), "num_tokens": 3, "adaptive": False}
    got, stats = greedy_tokens(model, spec, plain=frozenset({1, 4}))
    assert got == plain_tokens
    assert stats["spec_acceptance_rate"] == 1.0
    assert stats["spec_tokens_per_step"] > 3


def test_seeded_speculative_sampling_is_reproducible_and_follows_the_model(
    smollm2_path: Path,
) -> None:
    async def sample(speculative: object, seed: int) -> list[int]:
        async with tallow.AsyncLLM(smollm2_path, n_ctx=256, speculative=speculative) as llm:
            done = await llm.generate(PROMPTS[1], max_tokens=24, temperature=0.7, seed=seed)
            assert llm.stats()["spec_drafted_tokens"] > 0 or speculative is None
            return done.token_ids

    first = anyio.run(sample, "ngram", 5)
    assert first == anyio.run(sample, "ngram", 5)
    assert len(first) == 24


def test_speculative_sampling_matches_the_target_distribution() -> None:
    """Small vocabulary: the first two tokens drawn by propose-and-verify, repeated over many
    seeds, follow the target's two distributions (chi-square over the 25 pairs)."""
    rng = np.random.default_rng(0)
    target = rng.normal(size=(3, 5)).astype(np.float32)
    draft_logits = rng.normal(size=(2, 5)).astype(np.float32)
    p = np.exp(target) / np.exp(target).sum(axis=1, keepdims=True)
    trials = 6000
    seen = np.zeros((5, 5))
    for seed in range(trials):
        sampler = _core.Sampler(1.0, 0, 1.0, seed)
        drafter = _core.Sampler(1.0, 0, 1.0, seed + 10**6)
        out: list[int] = []
        while len(out) < 2:
            pos = len(out)
            proposed, probs = [], []
            for row in draft_logits[pos:2]:
                token, q = drafter.draft(row)
                proposed.append(token)
                probs.append(q)
            kept = sampler.verify(np.ascontiguousarray(target[pos:3]), proposed, np.stack(probs))
            out += [t for t, _, _ in kept]
        seen[out[0], out[1]] += 1
    expected = trials * np.outer(p[0], p[1])
    chi2 = ((seen - expected) ** 2 / expected).sum()
    # 24 degrees of freedom: 51.2 is the 0.1% critical value.
    assert chi2 < 51.2, (chi2, seen)


def test_ngram_lookup_proposes_what_followed_the_latest_match() -> None:
    proposer = NgramProposer(ngram_max=3, ngram_min=1)
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 8, 2, 3]
    got = proposer.propose([DraftRequest("r", tokens, 3)])
    # "2 3" last occurred at index 6 (followed by 4, 6, 7); no "8 2 3" occurs earlier.
    assert got["r"].tokens == [4, 6, 7]
    assert got["r"].probs is None
    # New tokens extend the same index.
    tokens += [4, 6]
    assert proposer.propose([DraftRequest("r", tokens, 2)])["r"].tokens == [7, 8]
    assert proposer.propose([DraftRequest("q", [1, 2, 3], 4)]) == {}
    proposer.finish("r")
    proposer.finish("unknown")


def test_ngram_lookup_proposes_what_followed_other_matches_as_guesses() -> None:
    proposer = NgramProposer(ngram_max=2, ngram_min=1)
    # "2 3" occurs three times before the end: followed by 4 5 6 (the latest), 4 7 8 and 9 9 9.
    tokens = [2, 3, 9, 9, 9, 0, 2, 3, 4, 7, 8, 0, 2, 3, 4, 5, 6, 0, 2, 3]
    got = proposer.propose([DraftRequest("r", tokens, 3, num_branches=3)])["r"]
    assert got.tokens == [4, 5, 6]
    # After "4", the other occurrence went on with 7 8; the oldest with 9 9 9; then the
    # matches of "3" alone add nothing new.
    assert got.branches == [(1, [7, 8]), (0, [9, 9, 9])]
    assert proposer.propose([DraftRequest("r", tokens, 3, num_branches=1)])["r"].branches == [
        (1, [7, 8])
    ]
    assert proposer.propose([DraftRequest("q", tokens, 3)])["q"].branches == []


def test_the_tree_path_is_the_longest_the_greedy_choices_agree_with() -> None:
    draft = [4, 5, 6]
    # The model agrees with "4", then picks 7: the guess at depth 1 starting with 7 is taken,
    # as far as the model agrees with it (7 8, then 2 instead of 9).
    guesses = [(0, [9, 9], [0, 0]), (1, [7, 8, 9], [8, 2, 0])]
    assert tree_path(draft, [4, 7, 0, 0], guesses) == (1, 2)
    # The draft agreed with all the way: no guess.
    assert tree_path(draft, [4, 5, 6, 1], guesses) == (None, 3)
    # No guess starts with the model's choice where the draft leaves it.
    assert tree_path(draft, [4, 3, 0, 0], guesses) == (None, 1)
    assert tree_path(draft, [9, 0, 0, 0], guesses) == (0, 1)


def test_ngram_lookup_keeps_copying_from_the_same_passage() -> None:
    proposer = NgramProposer(ngram_max=3, ngram_min=1)
    tokens = [7, 1, 2, 3, 4, 5, 6, 8, 2, 3, 4, 9, 0, 7, 1]
    assert proposer.propose([DraftRequest("r", tokens, 4)])["r"].tokens == [2, 3, 4, 5]
    # The output went on with the passage: its next tokens come from there, although
    # "2 3 4" last occurred elsewhere (followed by 9).
    tokens += [2, 3, 4]
    assert proposer.propose([DraftRequest("r", tokens, 4)])["r"].tokens == [5, 6, 8, 2]
    # Once it leaves the passage, the latest occurrence counts again (of "0": two tokens).
    tokens += [0]
    assert proposer.propose([DraftRequest("r", tokens, 4)])["r"].tokens == [7, 1]


def test_proposals_grow_while_the_output_keeps_them_all() -> None:
    proposer = NgramProposer(ngram_max=3, ngram_min=1)
    passage = list(range(10, 60))
    tokens = [1, *passage, 2, *passage[:3]]

    def propose() -> list[int]:
        return proposer.propose([DraftRequest("r", tokens, 2, max_tokens=8)])["r"].tokens

    assert propose() == passage[3:5]
    tokens += passage[3:6]  # both kept, and one more
    assert propose() == passage[6:10]
    tokens += passage[6:11]
    assert propose() == passage[11:19]  # at most 8
    tokens += passage[11:20]
    assert propose() == passage[20:28]
    tokens += passage[20:22]  # one of eight kept: back to two
    assert propose() == passage[22:24]
    # Without a most, proposals keep their size.
    assert NgramProposer(3, 1).propose([DraftRequest("q", tokens, 2)])["q"].tokens == passage[22:24]


def test_a_match_of_one_token_proposes_fewer() -> None:
    tokens = [5, 1, 2, 3, 4, 6, 5]  # only "5" recurs
    for short, expected in ((2, [1, 2]), (0, None), (9, [1, 2, 3, 4])):
        proposer = NgramProposer(ngram_max=3, ngram_min=1, short_match_tokens=short)
        got = proposer.propose([DraftRequest("r", tokens, 4)])
        assert (got["r"].tokens if "r" in got else None) == expected
    # Longer matches propose the full count; ngram_min=2 ignores single-token matches.
    longer = [*tokens[:-1], 1, 2]
    assert NgramProposer(3, 1, 2).propose([DraftRequest("r", longer, 4)])["r"].tokens == [
        3,
        4,
        6,
        1,
    ]
    assert NgramProposer(3, 2, 2).propose([DraftRequest("r", tokens, 4)]) == {}


def test_speculative_options() -> None:
    assert speculative_config(None) is None and speculative_config(False) is None
    assert speculative_config(True) == SpeculativeConfig()
    assert speculative_config("ngram") == SpeculativeConfig(method="ngram")
    assert speculative_config(6).num_tokens == 6
    assert speculative_config({"num_tokens": 2, "ngram_max": 5}).ngram_max == 5
    for bad in ("medusa", {"num_tokens": -1}, {"method": "draft"}, {"bogus": 1}, 1.5):
        with pytest.raises(tallow.InvalidArgumentError):
            speculative_config(bad)
    with pytest.raises(tallow.InvalidArgumentError):
        SpeculativeConfig(ngram_min=4, ngram_max=2)
    with pytest.raises(tallow.InvalidArgumentError):
        SpeculativeConfig(short_match_tokens=-1)
    with pytest.raises(tallow.InvalidArgumentError):
        SpeculativeConfig(num_branches=-1)
    assert speculative_config({"num_branches": 2}).num_branches == 2
    with pytest.raises(tallow.InvalidArgumentError):
        SpeculativeConfig(max_num_tokens=65)


def test_draft_requests_need_an_engine_with_a_draft_model(model: _core.Model) -> None:
    engine = Engine(model, EngineConfig(n_ctx=64, kv_pages=8, speculative="ngram"))
    with pytest.raises(tallow.InvalidArgumentError, match="draft model"):
        engine.add("r", [1, 2, 3], SamplingParams(speculative="draft"))
    with pytest.raises(tallow.InvalidArgumentError, match="vocabulary"):
        DraftModelProposer(model, n_vocab=model.n_vocab + 1, kv_pages=4)
