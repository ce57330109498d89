"""Gemma 3 270M (real weights, Q4_K_M) against llama.cpp: perplexity and greedy continuations
(``shared/reference``; its token ids are checked by the tokenizer's Rust tests).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import tallow
from tallow import _core

LLAMA_CPP_PPL = 8.5524
"""llama-perplexity -c 256 on apache-2.0.txt (the reference README)."""
NEAR_TIE = 0.5
"""How far behind ours llama.cpp's choice may be where the two part (as in test_generate.py): two
engines that sum in another order and quantize the activations of slightly different values
drift by a few hundredths of a logit over a dozen tokens."""
FIRST_AGREEING = 1
"""The first token of every continuation agrees (the reference README: small models' greedy
continuations may diverge after some tokens, not at once). Later ones may part at a near tie:
"Hello, my name is" has two tokens within 0.01 of each other at its sixth token."""


@pytest.fixture(scope="module")
def gemma3_path() -> Path:
    return tallow.resolve_model("gemma3-270m")


def test_perplexity_within_one_percent_of_llama_cpp(gemma3_path: Path, reference_dir: Path) -> None:
    text = (reference_dir / "perplexity" / "apache-2.0.txt").read_text()
    with tallow.LLM(gemma3_path, n_ctx=256) as llm:
        assert llm.architecture == "gemma3"
        ppl = llm.perplexity(text, ctx=256)
    assert abs(ppl / LLAMA_CPP_PPL - 1) < 0.01, ppl


def test_greedy_continuations_match_llama_cpp_up_to_a_near_tie(
    gemma3_path: Path, reference_dir: Path
) -> None:
    cases = json.loads((reference_dir / "greedy" / "llamacpp_greedy.json").read_text())
    llm = tallow.LLM(gemma3_path, n_ctx=128)
    model = _core.Model(str(gemma3_path))
    whole = 0
    for case in cases["gemma3-270m"]:
        prompt_ids = llm.tokenize(case["prompt"], add_special=True)
        want = llm.tokenize(case["greedy_continuation_16_tokens"], add_special=False)
        got = llm.generate(case["prompt"], max_tokens=16, temperature=0).token_ids
        # Replay the same path to see how close llama.cpp's choice was where they part.
        context = model.new_context(128)
        logits = context.eval(prompt_ids)
        for step, (ours, theirs) in enumerate(zip(got, want, strict=False)):
            assert ours == int(np.argmax(logits)), (case["prompt"], step)
            if ours != theirs:
                gap = float(logits[ours] - logits[theirs])
                assert gap < NEAR_TIE and step >= FIRST_AGREEING, (case["prompt"], step, gap)
                break
            logits = context.eval([ours])
        else:
            whole += 1
    # Most prompts agree all the way.
    assert whole >= len(cases["gemma3-270m"]) // 2, whole


def test_local_layers_keep_only_their_window_of_kv(gemma3_path: Path, reference_dir: Path) -> None:
    """1500 prompt tokens in chunks of 256, then 16 decode steps: the local (sliding-window)
    layers give their pages back as the sequence grows, so the pool holds every page of the
    global layers and about a window's worth for each local group; the logits are those of the
    whole prompt in one chunk, where every page is still there and the window is a mask."""
    model = _core.Model(str(gemma3_path))
    window, page_size, n = 512, 16, 1500
    assert model.metadata()["gemma3.attention.sliding_window"] == window
    text = (reference_dir / "perplexity" / "apache-2.0.txt").read_text()
    ids = model.tokenize(text, True, False)[:n]
    assert len(ids) == n

    whole = model.new_kv_cache(max_pages=model.kv_pages_to_hold(n + 16, chunk=n))
    one = whole.create()
    whole.reserve(one, n)
    expected = model.forward(whole, [(one, ids, "last")])

    kv = model.new_kv_cache(max_pages=model.kv_pages_to_hold(n + 16, chunk=256))
    # 18 layers, 3 global: six groups of three, one global and five local.
    assert kv.n_groups == 6
    seq = kv.create()
    for start in range(0, n, 256):
        chunk = ids[start : start + 256]
        kv.reserve(seq, len(chunk))
        logits = model.forward(kv, [(seq, chunk, "last")])
        assert kv.stats()["pages_used"] <= kv.pages_to_hold(start + len(chunk), chunk=256)
    assert np.array_equal(logits, expected)

    for _ in range(16):
        token = int(np.argmax(logits[-1]))
        for cache, s in ((kv, seq), (whole, one)):
            cache.reserve(s, 1)
        logits = model.forward(kv, [(seq, [token], "last")])
        assert np.array_equal(logits, model.forward(whole, [(one, [token], "last")]))
    length = n + 16
    every = math.ceil(length / page_size)
    # The last query sees positions length - window ..: a local group keeps the pages from
    # there on.
    local = every - (length - window) // page_size
    assert kv.stats()["pages_used"] == every + 5 * local
    # Under half the pages of keeping every position of every layer.
    assert 2 * (every + 5 * local) < 6 * every
    kv.free(seq)
    assert kv.n_free == kv.n_pages


def test_a_cached_prefix_longer_than_the_window_gives_the_same_tokens(
    gemma3_path: Path, reference_dir: Path
) -> None:
    """A 900-token prompt (past the local layers' window of 512), then the same prompt again:
    the second attaches the cached prefix, the global layers' pages and only the local layers'
    pages that its end sees, and generates the same greedy tokens."""
    text = (reference_dir / "perplexity" / "apache-2.0.txt").read_text()
    with tallow.LLM(gemma3_path, n_ctx=1024) as llm:
        prompt = llm.tokenize(text, add_special=True)[:900]
        first = llm.generate(prompt, max_tokens=8, temperature=0).token_ids
        before = llm.stats()["prefix_hit_tokens"]
        again = llm.generate(prompt, max_tokens=8, temperature=0).token_ids
        hit = llm.stats()["prefix_hit_tokens"] - before
    assert hit >= 800, hit
    assert again == first
