"""Perplexity with llama.cpp's protocol, against llama.cpp's own number."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import tallow

LLAMA_CPP_PPL_SMOLLM2_CTX256 = 17.7438  # reference/README.md: llama-perplexity -c 256 -b 256


def test_cli_perplexity_matches_llama_cpp(reference_dir: Path) -> None:
    text_file = reference_dir / "perplexity" / "apache-2.0.txt"
    proc = run_cli("perplexity", "-m", "smollm2-135m", "-f", str(text_file), "--ctx", "256")
    assert proc.returncode == 0, proc.stderr.decode()
    match = re.fullmatch(r"PPL = (\d+\.\d{4})\n", proc.stdout.decode())
    assert match, proc.stdout
    ppl = float(match.group(1))
    assert abs(ppl - LLAMA_CPP_PPL_SMOLLM2_CTX256) / LLAMA_CPP_PPL_SMOLLM2_CTX256 < 0.01, ppl
    # Progress went to stderr, chunk by chunk, as llama.cpp reports it (8 chunks).
    stderr = proc.stderr.decode()
    assert "[1]" in stderr and "[8]" in stderr and "[9]" not in stderr


def test_perplexity_protocol_against_token_by_token_scoring(smollm2: tallow.LLM) -> None:
    """The API's chunked, batched perplexity equals a direct computation that feeds every chunk
    one token at a time (the decode path) and scores the second half of each chunk."""
    text = (
        "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
        "How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow."
    )
    ctx = 16
    ids = smollm2.tokenize(text, add_special=True)
    n_chunks = len(ids) // ctx
    assert n_chunks >= 2
    seen: list[tuple[int, int]] = []
    ppl = smollm2.perplexity(text, ctx=ctx, progress=lambda i, n, _p: seen.append((i, n)))
    assert seen == [(i, n_chunks) for i in range(1, n_chunks + 1)]

    context = smollm2._model.new_context(ctx)
    nll = []
    for c in range(n_chunks):
        chunk = ids[c * ctx : (c + 1) * ctx]
        context.reset()
        for pos, token in enumerate(chunk[:-1]):
            logits = context.eval([token]).astype(np.float64)
            if pos >= ctx // 2:
                log_probs = logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
                nll.append(-log_probs[chunk[pos + 1]])
    assert len(nll) == n_chunks * (ctx - 1 - ctx // 2)
    expected = math.exp(float(np.mean(nll)))
    assert ppl == pytest.approx(expected, rel=2e-3)


def test_perplexity_needs_two_chunks(smollm2: tallow.LLM) -> None:
    with pytest.raises(tallow.InvalidArgumentError, match="at least 64 tokens"):
        smollm2.perplexity("Too short.", ctx=32)
    with pytest.raises(tallow.InvalidArgumentError, match="ctx"):
        smollm2.perplexity("Too short.", ctx=0)
