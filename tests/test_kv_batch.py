"""The paged KV pool and the batched forward through the extension module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tallow
from tallow import _core


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> _core.Model:
    return _core.Model(str(smollm2_path))


def test_pool_hands_out_pages_in_order() -> None:
    kv = _core.KvCache(1, 1, 8, page_size=4, max_pages=5)
    assert (kv.page_size, kv.n_pages) == (4, 5)
    a, b = kv.create(), kv.create()
    kv.reserve(a, 6)
    kv.reserve(b, 1)
    assert kv.page_table(a) == [0, 1]
    assert kv.page_table(b) == [2]
    assert kv.free_pages() == [3, 4]
    assert kv.pages_needed(b, 8) == 2
    with pytest.raises(tallow.ModelError, match="pages"):
        kv.reserve(b, 12)
    assert kv.seq_len(b) == 1
    assert kv.free(a) == [1, 0]
    assert kv.free_pages() == [3, 4, 1, 0]
    stats = kv.stats()
    assert (stats["pages_used"], stats["tokens_stored"], stats["n_sequences"]) == (1, 1, 1)
    assert stats["utilization"] == pytest.approx(0.25)
    with pytest.raises(tallow.InvalidArgumentError):
        kv.seq_len(a)
    with pytest.raises(tallow.InvalidArgumentError):
        _core.KvCache(1, 1, 8, max_pages=4, max_bytes=10**6)


def test_batched_forward_matches_one_sequence_at_a_time(model: _core.Model) -> None:
    prompts = [
        model.tokenize("Hello, my name is", False, False),
        model.tokenize("for i in range(10):", False, False),
    ]
    alone = [model.new_context(32).eval(p) for p in prompts]
    kv = model.new_kv_cache(max_pages=8)
    seqs = [kv.create() for _ in prompts]
    for seq, p in zip(seqs, prompts, strict=True):
        kv.reserve(seq, len(p))
    logits = model.forward(kv, [(s, p, "last") for s, p in zip(seqs, prompts, strict=True)])
    assert logits.shape == (2, model.n_vocab)
    for row, expected in zip(logits, alone, strict=True):
        np.testing.assert_allclose(row, expected, rtol=0, atol=1e-3)
    with pytest.raises(tallow.InvalidArgumentError, match="reserved"):
        model.forward(kv, [(seqs[0], [1] * 20, "last")])
    with pytest.raises(tallow.InvalidArgumentError, match="logits"):
        model.forward(kv, [(seqs[0], [1], "first")])
    with pytest.raises(tallow.InvalidArgumentError, match="does not fit"):
        model.forward(_core.KvCache(2, 1, 8, max_pages=4), [(0, [1], "last")])


def test_chosen_tokens_logits_are_columns_of_the_logits(model: _core.Model) -> None:
    """``vocab``: the logits of those tokens only, equal to their columns of the whole
    logits, for every row of a batch; a token outside the vocabulary or ``vocab`` with the
    argmax output is refused."""
    vocab = [model.n_vocab - 1, 7, 300, 7]
    results = []
    for chosen in (None, vocab):
        kv = model.new_kv_cache(page_size=16, max_pages=8)
        a, b = kv.create(), kv.create()
        kv.reserve(a, 5)
        kv.reserve(b, 3)
        batch = [(a, [1, 2, 3, 4, 5], "all"), (b, [9, 8, 7], "last")]
        results.append(model.forward(kv, batch, vocab=chosen))
    whole, chosen = results
    assert chosen.shape == (6, len(vocab))
    assert np.array_equal(chosen, whole[:, vocab])
    kv = model.new_kv_cache(page_size=16, max_pages=8)
    seq = kv.create()
    kv.reserve(seq, 1)
    with pytest.raises(tallow.ModelError, match="vocabulary"):
        model.forward(kv, [(seq, [1], "last")], vocab=[model.n_vocab])
    with pytest.raises(tallow.InvalidArgumentError, match="vocab"):
        model.forward(kv, [(seq, [1], "last")], "argmax", vocab=[1])


def test_drawn_tokens_are_the_samplers_draws(model: _core.Model) -> None:
    """``output="draw"``: each row's token drawn on the model's device as ``draws`` says is
    the token its sampler draws from that row's logits (the same seed taken the same way),
    greedy rows included; bad draws are refused."""
    params = [(0.9, 40, 0.95, 0.02), (1.2, 0, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (0.7, 5, 0.5, 0.1)]
    kv = model.new_kv_cache(page_size=16, max_pages=8)
    seqs = [kv.create() for _ in params]
    for seq in seqs:
        kv.reserve(seq, 4)
    batch = [(s, [1 + s, 20, 300 + 7 * s, 40], "last") for s in seqs]
    logits = model.forward(kv, batch)
    on_device = [_core.Sampler(t, k, p, 1000 + i, min_p=m) for i, (t, k, p, m) in enumerate(params)]
    on_host = [_core.Sampler(t, k, p, 1000 + i, min_p=m) for i, (t, k, p, m) in enumerate(params)]
    assert all(s.draws_on_device for s in on_device)
    drawn_rows, sampled_rows = [], []
    for _ in range(12):
        kv = model.new_kv_cache(page_size=16, max_pages=8)
        for seq in [kv.create() for _ in params]:
            kv.reserve(seq, 4)
        draws = [s.next_draw() for s in on_device]
        drawn = model.forward(kv, batch, "draw", draws=draws)
        assert drawn.dtype == np.uint32 and drawn.shape == (len(params),)
        drawn_rows.append(drawn.tolist())
        sampled_rows.append([s.sample(row) for s, row in zip(on_host, logits, strict=True)])
    assert drawn_rows == sampled_rows
    columns = list(zip(*drawn_rows, strict=True))
    assert len(set(columns[2])) == 1 and columns[2][0] == int(np.argmax(logits[2]))
    assert len(set(columns[1])) > 3, columns[1]
    greedy = (0.0, 0, 1.0, 0.0, 0)
    for draws, match in (([greedy], "draws for"), ([(-1.0, 0, 1.0, 0.0, 0)] * 4, "temperature")):
        with pytest.raises(tallow.InvalidArgumentError, match=match):
            model.forward(kv, batch, "draw", draws=draws)
    with pytest.raises(tallow.InvalidArgumentError, match="draws"):
        model.forward(kv, batch, "draw")
    with pytest.raises(tallow.InvalidArgumentError, match="draws"):
        model.forward(kv, batch, "argmax", draws=[greedy] * 4)  # type: ignore[call-overload]


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_a_branch_forked_inside_its_parents_new_tokens(model: _core.Model, depth: int) -> None:
    """A fork truncated to ``depth`` of the tokens its parent computes in the same forward
    (the shape of a tree of guesses verified at once): its rows are those of one sequence
    holding the parent's first ``depth`` new tokens then the branch's, and the parent's rows
    are unchanged by it. Positions cross a page boundary."""
    prompt = list(range(100, 160))
    trunk, branch = [500, 501, 502, 503, 504], [601, 602, 603]
    kv = model.new_kv_cache(page_size=16, max_pages=64)
    seq = kv.create()
    kv.reserve(seq, len(prompt))
    model.forward(kv, [(seq, prompt, "none")])
    kv.reserve(seq, len(trunk))
    fork = kv.fork(seq)
    kv.truncate(fork, len(prompt) + 1 + depth)
    kv.reserve(fork, len(branch))
    rows = model.forward(kv, [(seq, trunk, "all"), (fork, branch, "all", seq)])

    def alone(tokens: list[int]) -> np.ndarray:
        cache = model.new_kv_cache(page_size=16, max_pages=64)
        s = cache.create()
        cache.reserve(s, len(tokens))
        return model.forward(cache, [(s, tokens, "all")])

    assert np.array_equal(rows[: len(trunk)], alone(prompt + trunk)[-len(trunk) :])
    along = alone(prompt + trunk[: 1 + depth] + branch)[-len(branch) :]
    assert np.array_equal(rows[len(trunk) :], along)
