"""The continuous batcher, tested with a real paged KV pool and no model.

A fake "model" stands in for ``Model.forward``: it records the tokens each step writes into each
KV sequence (checking they land at the reserved positions) and "samples" a token that is a hash
of everything in that sequence, like greedy decoding. So a request whose KV was recomputed
after a preemption gets the same tokens only if the scheduler fed it exactly the right tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from tallow import _core
from tallow.errors import InvalidArgumentError, ModelError
from tallow.scheduler import Request, RequestStatus, Scheduler, SchedulerOutput, Step
from tallow.stopping import StopConditions

KvCache: Any = getattr(_core, "KvCache", None)
pytestmark = pytest.mark.skipif(KvCache is None, reason="tallow._core has no KvCache yet")

PS = 4  # tokens per page in every test
EOS = 0
VOCAB = 50


class Pool:
    """A ``KvCache`` beside the token each of its slots holds: :class:`FakeModel` writes them,
    and a copy-on-write copy made by ``reserve`` copies them too."""

    def __init__(self, kv: KvCache) -> None:
        self.kv = kv
        self.slots: dict[tuple[int, int], int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)

    def reserve(self, seq: int, n: int) -> None:
        before, length = self.kv.page_table(seq), self.kv.seq_len(seq)
        self.kv.reserve(seq, n)
        last = len(before) - 1
        if length % PS and self.kv.page_table(seq)[last] != before[last]:
            src, dst = before[last], self.kv.page_table(seq)[last]
            for offset in range(length % PS):
                self.slots[(dst, offset)] = self.slots[(src, offset)]


def make_kv(n_pages: int, **kw: Any) -> Any:
    return Pool(KvCache(1, 1, 8, page_size=PS, dtype="f16", max_pages=n_pages, **kw))


def make(
    n_pages: int = 8, *, budget: int = 64, max_num_seqs: int = 8, **kw: Any
) -> tuple[Any, Scheduler]:
    kv = make_kv(n_pages)
    s = Scheduler(kv, max_num_seqs=max_num_seqs, max_tokens_per_step=budget, eog_ids=[EOS], **kw)
    return kv, s


def req(
    rid: str,
    n_prompt: int,
    max_tokens: int | None = 16,
    *,
    start: int = 100,
    **kw: Any,
) -> Request:
    prompt = [start + i for i in range(n_prompt)]
    return Request(rid, prompt, StopConditions(max_tokens=max_tokens, **kw))


def tables(kv: Any, s: Scheduler) -> dict[str, list[int]]:
    """Page table of every running request."""
    out = {}
    for rid in s.running:
        r = s.get(rid)
        assert r is not None and r.seq is not None
        out[rid] = kv.page_table(r.seq)
    return out


def chunks(step: Step) -> list[tuple[str, int, list[int], bool]]:
    return [(c.request_id, c.start_pos, c.token_ids, c.logits) for c in step.chunks]


class FakeModel:
    """Writes each scheduled token into the KV slot its sequence's page table gives, and
    samples hash(the tokens read back through the page table) % VOCAB, like greedy decoding.
    Reading a position nobody wrote fails, and a page holding other tokens than the request's
    (a wrong prefix-cache hit, a page reused too early) changes the sampled tokens."""

    def __init__(self, kv: Any, avoid: Sequence[int] = (EOS,)) -> None:
        self.kv = kv
        self.avoid = set(avoid)
        self.slots: dict[tuple[int, int], int] = kv.slots

    def next_token(self, tokens: Sequence[int]) -> int:
        t = hash(tuple(tokens)) % VOCAB
        while t in self.avoid:
            t = (t + 1) % VOCAB
        return t

    def read(self, seq: int, n: int) -> list[int]:
        table = self.kv.page_table(seq)
        return [self.slots[(table[pos // PS], pos % PS)] for pos in range(n)]

    def forward(self, step: Step) -> dict[str, int | list[int]]:
        """The sampled token of each request; for a chunk with a draft, greedy verification:
        the draft tokens equal to the model's choice, then the model's next choice."""
        out: dict[str, int | list[int]] = {}
        for c in step.chunks:
            end = c.start_pos + len(c.token_ids)
            assert self.kv.seq_len(c.seq) == end
            table = self.kv.page_table(c.seq)
            for pos, token in enumerate(c.token_ids, start=c.start_pos):
                self.slots[(table[pos // PS], pos % PS)] = token
            if not c.logits:
                continue
            known = end - len(c.draft)
            kept: list[int] = []
            for i in range(len(c.draft) + 1):
                choice = self.next_token(self.read(c.seq, known + i))
                kept.append(choice)
                if i == len(c.draft) or choice != c.draft[i]:
                    break
            out[c.request_id] = kept if c.draft else kept[0]
        return out


def run(
    s: Scheduler, model: FakeModel, max_steps: int = 1000, check: Callable[[], None] | None = None
) -> dict[str, list[SchedulerOutput]]:
    """Run until every request is done; outputs per request."""
    outs: dict[str, list[SchedulerOutput]] = {}
    for _ in range(max_steps):
        if not s.has_work():
            return outs
        step = s.schedule()
        for o in s.update(step, model.forward(step)):
            outs.setdefault(o.request_id, []).append(o)
        if check is not None:
            check()
    raise AssertionError("did not finish")


def tokens_of(outs: list[SchedulerOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


# -- admission and pages --------------------------------------------------------------------------


def test_admission_order_and_exact_page_tables() -> None:
    kv, s = make(8)
    s.add(req("a", 5))
    s.add(req("b", 3, start=200))
    s.add(req("c", 6, start=300))
    assert s.waiting == ["a", "b", "c"]
    step = s.schedule()
    assert chunks(step) == [
        ("a", 0, [100, 101, 102, 103, 104], True),
        ("b", 0, [200, 201, 202], True),
        ("c", 0, [300, 301, 302, 303, 304, 305], True),
    ]
    assert step.batch() == [
        (0, [100, 101, 102, 103, 104], "last"),
        (1, [200, 201, 202], "last"),
        (2, [300, 301, 302, 303, 304, 305], "last"),
    ]
    assert step.sample_ids == ["a", "b", "c"]
    assert s.running == ["a", "b", "c"] and s.waiting == []
    assert tables(kv, s) == {"a": [0, 1], "b": [2], "c": [3, 4]}
    assert kv.free_pages() == [5, 6, 7]
    outs = s.update(step, [11, 12, 13])
    assert [(o.request_id, o.new_token_ids, o.finished) for o in outs] == [
        ("a", [11], False),
        ("b", [12], False),
        ("c", [13], False),
    ]
    step = s.schedule()
    assert chunks(step) == [("a", 5, [11], True), ("b", 3, [12], True), ("c", 6, [13], True)]
    assert tables(kv, s) == {"a": [0, 1], "b": [2], "c": [3, 4]}
    s.update(step, {"a": 21, "b": 22, "c": 23})
    step = s.schedule()
    # b's position 4 opens a new page; the others still have room.
    assert chunks(step) == [("a", 6, [21], True), ("b", 4, [22], True), ("c", 7, [23], True)]
    assert tables(kv, s) == {"a": [0, 1], "b": [2, 5], "c": [3, 4]}
    assert kv.free_pages() == [6, 7]


def test_max_num_seqs_admits_the_next_in_fifo_order_when_one_finishes() -> None:
    kv, s = make(8, max_num_seqs=2)
    s.add(req("a", 2, max_tokens=2))
    s.add(req("b", 2, max_tokens=5))
    s.add(req("c", 2, max_tokens=1))
    s.add(req("d", 2, max_tokens=1))
    step = s.schedule()
    assert [c.request_id for c in step.chunks] == ["a", "b"]
    assert s.waiting == ["c", "d"]
    s.update(step, [5, 6])
    step = s.schedule()
    assert [c.request_id for c in step.chunks] == ["a", "b"]
    outs = s.update(step, [7, 8])
    assert (outs[0].request_id, outs[0].finished, outs[0].finish_reason) == ("a", True, "length")
    # a's page is back on the free list at once.
    assert kv.free_pages() == [2, 3, 4, 5, 6, 7, 0]
    step = s.schedule()
    assert chunks(step) == [("b", 3, [8], True), ("c", 0, [100, 101], True)]
    assert s.running == ["b", "c"] and s.waiting == ["d"]
    assert tables(kv, s) == {"b": [1], "c": [2]}


def test_chunked_prefill_mixes_decodes_within_the_token_budget() -> None:
    kv, s = make(16, budget=4)
    s.add(req("a", 3))
    s.add(req("b", 10, start=200))
    step = s.schedule()
    assert chunks(step) == [("a", 0, [100, 101, 102], True), ("b", 0, [200], False)]
    assert step.sample_ids == ["a"]
    assert s.update(step, {"a": 50})[0].new_token_ids == [50]
    step = s.schedule()
    # The decode comes first, then the prompt chunk fills the budget.
    assert chunks(step) == [("a", 3, [50], True), ("b", 1, [201, 202, 203], False)]
    assert tables(kv, s) == {"a": [0], "b": [1]}
    s.update(step, [51])
    step = s.schedule()
    assert chunks(step) == [("a", 4, [51], True), ("b", 4, [204, 205, 206], False)]
    assert tables(kv, s) == {"a": [0, 2], "b": [1, 3]}
    s.update(step, [52])
    step = s.schedule()
    assert chunks(step) == [("a", 5, [52], True), ("b", 7, [207, 208, 209], True)]
    assert tables(kv, s) == {"a": [0, 2], "b": [1, 3, 4]}
    outs = s.update(step, [53, 60])
    assert [(o.request_id, o.new_token_ids) for o in outs] == [("a", [53]), ("b", [60])]
    step = s.schedule()
    assert chunks(step) == [("a", 6, [53], True), ("b", 10, [60], True)]
    assert step.num_tokens == 2


def test_budget_smaller_than_the_running_set_serves_the_oldest_first() -> None:
    _, s = make(8, budget=2)
    for rid in "abc":
        s.add(req(rid, 1))
    step = s.schedule()
    assert [c.request_id for c in step.chunks] == ["a", "b"]
    s.update(step, [1, 2])
    step = s.schedule()
    assert [c.request_id for c in step.chunks] == ["a", "b"]
    assert step.num_tokens == 2 and s.waiting == ["c"]


def test_waiting_head_blocks_admission_when_its_chunk_does_not_fit() -> None:
    kv, s = make(4)
    s.add(req("a", 9))  # 3 pages
    s.add(req("b", 5))  # 2 pages: does not fit
    s.add(req("c", 1))  # would fit, but does not overtake b
    step = s.schedule()
    assert [c.request_id for c in step.chunks] == ["a"]
    assert s.waiting == ["b", "c"] and kv.free_pages() == [3]


# -- finishing and freeing ------------------------------------------------------------------------


def test_pages_are_freed_the_moment_a_request_finishes() -> None:
    kv, s = make(8)
    s.add(req("a", 6, max_tokens=3))
    s.add(req("b", 2, max_tokens=10))
    step = s.schedule()
    assert tables(kv, s) == {"a": [0, 1], "b": [2]}
    s.update(step, [1, 2])
    step = s.schedule()
    s.update(step, [3, 4])
    step = s.schedule()
    assert tables(kv, s) == {"a": [0, 1], "b": [2]}
    outs = s.update(step, [5, 6])
    assert outs[0] == SchedulerOutput("a", [5], True, "length")
    assert s.running == ["b"]
    # Released last page first, to the tail of the FIFO free list.
    assert kv.free_pages() == [3, 4, 5, 6, 7, 1, 0]
    assert kv.stats()["pages_used"] == 1


def test_eos_stop_token_ids_and_ignore_eos() -> None:
    _, s = make(8)
    s.add(req("eos", 1))
    s.add(req("ignore", 1, ignore_eos=True))
    s.add(req("stopid", 1, ignore_eos=True, stop_token_ids=[7]))
    step = s.schedule()
    outs = s.update(step, [EOS, EOS, 7])
    assert outs == [
        SchedulerOutput("eos", [], True, "stop", EOS),
        SchedulerOutput("ignore", [EOS], False),
        SchedulerOutput("stopid", [], True, "stop", 7),
    ]
    assert s.running == ["ignore"]


def test_max_tokens_zero_and_prompts_that_can_never_fit() -> None:
    kv, s = make(2, max_model_len=20)
    s.add(req("zero", 1, max_tokens=0))
    s.add(req("huge", 9))  # 3 pages > 2 in the pool
    s.add(req("ok", 8))
    assert s.waiting == ["ok"]
    step = s.schedule()
    outs = s.update(step, [5])
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [
        ("zero", True, "length"),
        ("huge", True, "length"),
        ("ok", False, None),
    ]
    assert outs[0].error is None
    assert isinstance(outs[1].error, ModelError) and "KV pool" in str(outs[1].error)
    _, s2 = make(8, max_model_len=4)
    s2.add(req("long", 5))
    out = s2.update(s2.schedule(), [])
    assert out[0].finish_reason == "length" and "max_model_len" in str(out[0].error)
    assert kv.stats()["pages_used"] == 2


def test_a_request_alone_filling_the_pool_ends_with_length() -> None:
    kv, s = make(2)  # 8 positions
    s.add(req("a", 6, max_tokens=None))
    model = FakeModel(kv)
    outs = run(s, model)["a"]
    # Positions 6 and 7 take the first two sampled tokens; the third has no room.
    assert tokens_of(outs) == [
        model.next_token(list(range(100, 106))),
        *tokens_of(outs)[1:],
    ]
    assert len(tokens_of(outs)) == 3
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert outs[-1].error is not None and s.num_preemptions == 0
    assert kv.free_pages() == [1, 0]


def test_max_model_len_ends_with_length() -> None:
    kv, s = make(8, max_model_len=8)
    s.add(req("a", 6, max_tokens=None))
    outs = run(s, FakeModel(kv))["a"]
    # max_model_len counts prompt and completion: 6 + 2.
    assert len(tokens_of(outs)) == 2
    assert outs[-1].finish_reason == "length" and outs[-1].error is None
    # A prompt that fills max_model_len leaves no room for a token.
    _, s2 = make(8, max_model_len=6)
    s2.add(req("full", 6))
    out = s2.update(s2.schedule(), [])
    assert out[0].finish_reason == "length" and "no room" in str(out[0].error)


# -- preemption -----------------------------------------------------------------------------------


def test_preempts_the_youngest_and_recomputes_it_to_the_same_state() -> None:
    kv, s = make(4)
    model = FakeModel(kv)
    s.add(req("a", 6, max_tokens=3))
    s.add(req("b", 4, max_tokens=3, start=200))
    s.add(req("c", 4, max_tokens=3, start=300))
    step = s.schedule()
    assert tables(kv, s) == {"a": [0, 1], "b": [2], "c": [3]}
    assert kv.free_pages() == []
    s.update(step, model.forward(step))
    c_first = s.get("c")
    assert c_first is not None
    c_tokens = list(c_first.output_token_ids)
    step = s.schedule()
    # b needs a page for position 4: the youngest (c) is preempted and its page goes to b.
    assert step.preempted == ["c"]
    assert [c.request_id for c in step.chunks] == ["a", "b"]
    assert tables(kv, s) == {"a": [0, 1], "b": [2, 3]}
    assert kv.free_pages() == []
    c_req = s.get("c")
    assert c_req is not None
    assert (c_req.status, c_req.seq, c_req.num_computed) == (RequestStatus.PREEMPTED, None, 0)
    assert c_req.output_token_ids == c_tokens
    assert s.waiting == ["c"] and s.stats()["preemptions"] == 1
    outs: dict[str, list[SchedulerOutput]] = {}
    for o in s.update(step, model.forward(step)):
        outs.setdefault(o.request_id, []).append(o)
    step = s.schedule()
    s.update(step, model.forward(step))  # a and b finish: max_tokens=3
    assert kv.free_pages() == [1, 0, 3, 2]
    step = s.schedule()
    # c's prompt and its generated token are its new prompt.
    assert chunks(step) == [("c", 0, [300, 301, 302, 303, *c_tokens], True)]
    assert tables(kv, s) == {"c": [1, 0]}
    c_second = s.update(step, model.forward(step))
    rest = run(s, model)
    c_all = c_tokens + tokens_of(c_second) + tokens_of(rest["c"])
    assert len(c_all) == 3 and rest["c"][-1].finish_reason == "length"
    # Alone in a big pool, c generates the same tokens.
    kv2, alone = make(16)
    alone.add(req("c", 4, max_tokens=3, start=300))
    assert tokens_of(run(alone, FakeModel(kv2))["c"]) == c_all
    assert kv.stats()["pages_free"] == 4


def test_a_decode_preempts_the_youngest_after_a_chunked_prompt() -> None:
    kv, s = make(4, budget=5)
    s.add(req("a", 12, max_tokens=2))
    s.add(req("b", 3, max_tokens=8, start=200))
    step = s.schedule()
    # a takes 5 tokens (2 pages) of its prompt; b does not fit in the budget.
    assert chunks(step) == [("a", 0, [100, 101, 102, 103, 104], False)]
    s.update(step, {})
    step = s.schedule()
    assert chunks(step) == [("a", 5, [105, 106, 107, 108, 109], False)]
    assert tables(kv, s) == {"a": [0, 1, 2]}
    s.update(step, {})
    step = s.schedule()
    assert chunks(step) == [("a", 10, [110, 111], True), ("b", 0, [200, 201, 202], True)]
    assert tables(kv, s) == {"a": [0, 1, 2], "b": [3]}
    s.update(step, [1, 2])
    step = s.schedule()
    # a's decode at position 12 needs a page: b (younger) is preempted, though it was
    # about to decode.
    assert step.preempted == ["b"]
    assert chunks(step) == [("a", 12, [1], True)]
    assert tables(kv, s) == {"a": [0, 1, 2, 3]}
    outs = s.update(step, [3])
    assert outs == [SchedulerOutput("a", [3], True, "length")]
    assert kv.free_pages() == [3, 2, 1, 0]
    step = s.schedule()
    assert chunks(step) == [("b", 0, [200, 201, 202, 2], True)]


# -- abort ----------------------------------------------------------------------------------------


def test_abort_waiting_running_and_in_flight() -> None:
    kv, s = make(8, max_num_seqs=2)
    s.add(req("a", 5))
    s.add(req("b", 2))
    s.add(req("w", 2))
    step = s.schedule()
    s.update(step, [1, 2])
    assert s.abort("w") and s.waiting == []
    assert not s.abort("w") and not s.abort("nope")
    # Not in flight: b's page is freed at once.
    assert s.abort("b")
    assert kv.free_pages() == [3, 4, 5, 6, 7, 2]
    step = s.schedule()
    assert [c.request_id for c in step.chunks] == ["a"]
    # In flight: a keeps its pages until the update, which drops its sampled token.
    assert s.abort("a")
    assert tables(kv, s) == {"a": [0, 1]}
    outs = s.update(step, [9])
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outs] == [
        ("w", [], "abort"),
        ("b", [], "abort"),
        ("a", [], "abort"),
    ]
    assert kv.free_pages() == [3, 4, 5, 6, 7, 2, 1, 0]
    assert not s.has_work()
    assert s.stats()["running"] == 0 and s.stats()["finished"] == 3


def test_a_failed_step_ends_its_requests_and_frees_their_reserved_pages() -> None:
    kv, s = make(8, budget=8, max_num_seqs=3)
    s.add(req("a", 3))
    s.add(req("b", 2))
    s.update(s.schedule(), [5, 6])
    s.add(req("c", 6))
    step = s.schedule()
    # a and b decode; c's prompt gets the rest of the budget (6 tokens, two new pages).
    assert chunks(step) == [
        ("a", 3, [5], True),
        ("b", 2, [6], True),
        ("c", 0, [100, 101, 102, 103, 104, 105], True),
    ]
    assert tables(kv, s) == {"a": [0], "b": [1], "c": [2, 3]}
    s.add(req("w", 2))  # waiting, not in the step
    failure = ModelError("the forward pass failed")
    outs = s.fail(step, failure)
    assert [(o.request_id, o.finish_reason, o.error) for o in outs] == [
        ("a", "abort", failure),
        ("b", "abort", failure),
        ("c", "abort", failure),
    ]
    assert all(o.finished and o.new_token_ids == [] for o in outs)
    assert kv.stats()["pages_used"] == 0
    assert s.running == [] and s.waiting == ["w"]
    with pytest.raises(RuntimeError):
        s.fail(step, "twice")
    # The scheduler goes on with the request that was waiting.
    outs = run(s, FakeModel(kv))
    assert tokens_of(outs["w"]) and outs["w"][-1].finish_reason == "length"
    assert kv.stats()["pages_used"] == 0


# -- prefix caching -------------------------------------------------------------------------------


def run_one(s: Scheduler, model: FakeModel, r: Request) -> list[SchedulerOutput]:
    s.add(r)
    return run(s, model)[r.request_id]


def test_a_cached_prefix_is_reused_page_for_page() -> None:
    kv, s = make(8)
    model = FakeModel(kv)
    first = req("a", 10, max_tokens=1)
    run_one(s, model, first)
    # a's two full pages are cached; all its pages are free again, last page first.
    assert [kv.is_cached(p) for p in range(3)] == [True, True, False]
    assert kv.free_pages() == [3, 4, 5, 6, 7, 2, 1, 0]

    b = Request("b", [*first.prompt_token_ids[:9], 7, 7], StopConditions(max_tokens=2))
    s.add(b)
    step = s.schedule()
    # Only what follows the cached pages is computed.
    assert chunks(step) == [("b", 8, [108, 7, 7], True)]
    assert tables(kv, s) == {"b": [0, 1, 3]}
    assert kv.free_pages() == [4, 5, 6, 7, 2]
    stats = s.stats()
    assert (stats["prefix_queried_tokens"], stats["prefix_hit_tokens"]) == (10 + 11, 8)
    outs = s.update(step, model.forward(step))
    outs += run(s, model)["b"]
    # The same tokens as computing everything.
    kv2, alone = make(8, prefix_caching=False)
    expected = run_one(alone, FakeModel(kv2), Request("b", b.prompt_token_ids, b.params))
    assert tokens_of(outs) == tokens_of(expected)


def test_running_requests_share_cached_pages_and_the_last_token_is_computed() -> None:
    kv, s = make(8, budget=16)
    model = FakeModel(kv)
    s.add(req("a", 8, max_tokens=4))
    step = s.schedule()
    s.update(step, model.forward(step))
    # A prompt equal to a's (two full pages): the first page is reused, and three tokens of
    # the second, copied for b, which computes the last token again for its logits.
    s.add(req("b", 8, max_tokens=4))
    step = s.schedule()
    assert chunks(step) == [
        ("a", 8, step.chunks[0].token_ids, True),
        ("b", 7, [107], True),
    ]
    assert tables(kv, s) == {"a": [0, 1, 2], "b": [0, 3]}
    assert kv.stats()["pages_shared"] == 1
    s.update(step, model.forward(step))
    outs = run(s, model)
    assert tokens_of(outs["a"]) and tokens_of(outs["b"])
    assert kv.stats()["pages_used"] == 0


def test_cached_pages_are_evicted_least_recently_freed_first() -> None:
    kv, s = make(6, budget=16)
    model = FakeModel(kv)
    run_one(s, model, req("a", 8, max_tokens=1, start=100))  # pages 0, 1
    run_one(s, model, req("b", 8, max_tokens=1, start=200))  # pages 2, 3
    assert kv.free_pages() == [4, 5, 1, 0, 3, 2]
    assert [kv.is_cached(p) for p in range(6)] == [True, True, True, True, False, False]
    # 16 new tokens take the two never-used pages, then a's (freed before b's).
    run_one(s, model, req("c", 16, max_tokens=1, start=300))
    assert kv.free_pages() == [3, 2, 0, 1, 5, 4]
    stats = kv.stats()
    assert stats["evicted_pages"] == 2
    assert s.kv.match_prefix(list(range(100, 108)), 8) == (0, 0)
    assert s.kv.match_prefix(list(range(200, 208)), 8) == (8, 2)


def test_a_preempted_request_finds_its_own_pages_again() -> None:
    kv, s = make(4, budget=8)
    model = FakeModel(kv)
    s.add(req("a", 4, max_tokens=6, start=100))
    s.add(req("b", 4, max_tokens=6, start=200))
    outs = run(s, model)
    assert s.num_preemptions > 0
    assert s.stats()["prefix_hit_tokens"] > 0
    for rid, start in (("a", 100), ("b", 200)):
        kv2, alone = make(8, prefix_caching=False)
        expected = run_one(alone, FakeModel(kv2), req(rid, 4, max_tokens=6, start=start))
        assert tokens_of(outs[rid]) == tokens_of(expected)


def test_without_prefix_caching_nothing_is_cached() -> None:
    kv, s = make(8, prefix_caching=False)
    model = FakeModel(kv)
    run_one(s, model, req("a", 10, max_tokens=1))
    s.add(req("b", 10, max_tokens=1))
    assert chunks(s.schedule())[0][1] == 0
    assert kv.stats()["cached_pages"] == 0


# -- speculative decoding -------------------------------------------------------------------------


def run_with_drafts(
    s: Scheduler, model: FakeModel, propose: Callable[[Request], list[int]]
) -> dict[str, list[SchedulerOutput]]:
    outs: dict[str, list[SchedulerOutput]] = {}
    while s.has_work():
        step = s.schedule({r.request_id: propose(r) for r in s.decoding()})
        for o in s.update(step, model.forward(step)):
            outs.setdefault(o.request_id, []).append(o)
        for rid in s.running:
            r = s.get(rid)
            assert r is not None and r.seq is not None
            # Rejected draft tokens left no KV behind.
            assert model.kv.seq_len(r.seq) == r.num_computed
    return outs


@pytest.mark.parametrize("draft", ["perfect", "wrong", "half", "too long"])
def test_drafts_keep_what_the_model_agrees_with_and_drop_the_rest(draft: str) -> None:
    kv0, alone = make(16)
    expected = tokens_of(run_one(alone, FakeModel(kv0), req("a", 6, max_tokens=12)))
    assert len(expected) == 12

    def propose(r: Request) -> list[int]:
        # Tokens after the last sampled one.
        right = expected[len(r.output_token_ids) : len(r.output_token_ids) + 3]
        if draft == "perfect":
            return right
        if draft == "wrong":
            return [(t + 1) % VOCAB or 1 for t in right]
        if draft == "half":
            return right[:1] + [(t + 1) % VOCAB or 1 for t in right[1:]]
        # The whole rest then more: cut to what max_tokens leaves.
        return expected[len(r.output_token_ids) :] + [1] * 40

    kv, s = make(16, max_model_len=64)
    s.add(req("a", 6, max_tokens=12))
    outs = run_with_drafts(s, FakeModel(kv), propose)
    assert tokens_of(outs["a"]) == expected
    assert outs["a"][-1].finish_reason == "length"
    stats = s.stats()
    assert stats["pages_used"] == 0
    rate = stats["spec_acceptance_rate"]
    if draft == "perfect":
        assert rate == 1.0 and stats["spec_tokens_per_step"] > 3
        assert stats["steps"] <= 1 + 12 // 4 + 1
    elif draft == "wrong":
        assert rate == 0.0 and stats["spec_tokens_per_step"] == 1.0
    elif draft == "half":
        assert 0.3 < rate < 0.4
    else:
        # Drafts never reach past max_tokens: every drafted token was a real continuation.
        assert rate == 1.0


def test_drafts_mix_with_plain_requests_and_prompts_in_one_step() -> None:
    kv0, alone = make(32)
    expected = {
        rid: tokens_of(run_one(alone, FakeModel(kv0), req(rid, n, max_tokens=10, start=start)))
        for rid, n, start in (("a", 5, 100), ("b", 7, 200), ("c", 9, 300))
    }
    kv, s = make(32, budget=12)
    model = FakeModel(kv)
    s.add(req("a", 5, max_tokens=10, start=100))
    s.add(req("b", 7, max_tokens=10, start=200))
    s.add(req("c", 9, max_tokens=10, start=300))

    def propose(r: Request) -> list[int]:
        if r.request_id == "b":
            return []  # a plain request
        n = len(r.output_token_ids)
        return expected[r.request_id][n : n + 2]

    outs = run_with_drafts(s, model, propose)
    assert {rid: tokens_of(o) for rid, o in outs.items()} == expected
    assert s.stats()["spec_acceptance_rate"] == 1.0


def test_a_draft_is_cut_to_the_free_pages() -> None:
    kv, s = make(2)  # 8 positions
    s.add(req("a", 3, max_tokens=None))
    step = s.schedule()
    s.update(step, [5])
    # One page holds a's 3 prompt tokens and the next; a draft of 6 gets what fits in two.
    step = s.schedule({"a": [1, 2, 3, 4, 5, 6]})
    assert chunks(step) == [("a", 3, [5, 1, 2, 3, 4], True)]
    assert step.chunks[0].draft == [1, 2, 3, 4]
    assert step.batch() == [(step.chunks[0].seq, [5, 1, 2, 3, 4], "all")]
    with pytest.raises(InvalidArgumentError, match="not an accepted prefix"):
        s.update(step, {"a": [9, 9]})
    outs = s.update(step, {"a": [1, 2, 7]})
    assert outs[0].new_token_ids == [1, 2, 7]
    r = s.get("a")
    assert r is not None and r.seq is not None
    assert kv.seq_len(r.seq) == r.num_computed == 6


# -- protocol errors ------------------------------------------------------------------------------


def test_protocol_misuse_is_an_error() -> None:
    _, s = make(8)
    s.add(req("a", 2))
    with pytest.raises(InvalidArgumentError):
        s.add(req("a", 2))
    with pytest.raises(InvalidArgumentError):
        s.add(Request("e", [], StopConditions()))
    step = s.schedule()
    with pytest.raises(RuntimeError):
        s.schedule()
    with pytest.raises(RuntimeError):
        s.stop("a")  # the output processor ends requests between update() and schedule()
    with pytest.raises(InvalidArgumentError):
        s.update(step, [])
    with pytest.raises(RuntimeError):
        s.update(Step(index=99), [])
    assert s.update(step, [4])[0].new_token_ids == [4]
    with pytest.raises(InvalidArgumentError):
        Scheduler(make_kv(2), max_tokens_per_step=0)


# -- properties -----------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
# A prompt whose cached prefix ends inside a page, in a pool with no room for the copy of that
# page: it starts from the whole pages instead.
@example(n_pages=3, budget=1, max_num_seqs=1, reqs=[(0, 9, 4, None), (0, 10, 1, None)])
@given(
    n_pages=st.integers(min_value=2, max_value=12),
    budget=st.integers(min_value=1, max_value=16),
    max_num_seqs=st.integers(min_value=1, max_value=5),
    reqs=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=8),  # arrival step
            st.integers(min_value=1, max_value=20),  # prompt length
            st.integers(min_value=0, max_value=10),  # max_tokens
            st.one_of(st.none(), st.integers(min_value=0, max_value=30)),  # abort at step
        ),
        min_size=1,
        max_size=10,
    ),
)
def test_random_workloads_never_leak_pages_or_exceed_the_budget(
    n_pages: int,
    budget: int,
    max_num_seqs: int,
    reqs: list[tuple[int, int, int, int | None]],
) -> None:
    kv, s = make(n_pages, budget=budget, max_num_seqs=max_num_seqs)
    model = FakeModel(kv)
    outs: dict[str, list[SchedulerOutput]] = {}
    aborted: set[str] = set()
    for t in range(3000):
        for i, (arrive, n, max_tokens, _) in enumerate(reqs):
            if arrive == t:
                s.add(req(f"r{i}", n, max_tokens, start=10 * (i % 3)))
        for i, (_, _, _, abort_at) in enumerate(reqs):
            if abort_at == t and s.abort(f"r{i}"):
                aborted.add(f"r{i}")
        if t > max(r[0] for r in reqs) and not s.has_work():
            break
        step = s.schedule()
        assert step.num_tokens <= budget
        assert len(s.running) <= max_num_seqs
        assert len({c.request_id for c in step.chunks}) == len(step.chunks)
        # Every page in use belongs to running requests; shared ones are cached prefixes.
        pages = [p for table in tables(kv, s).values() for p in table]
        stats = kv.stats()
        assert len(set(pages)) == stats["pages_used"]
        assert len({p for p in pages if pages.count(p) > 1}) == stats["pages_shared"]
        for rid in s.running:
            r = s.get(rid)
            assert r is not None and r.seq is not None
            assert kv.seq_len(r.seq) == r.num_computed <= r.num_tokens
        for o in s.update(step, model.forward(step)):
            outs.setdefault(o.request_id, []).append(o)
    else:
        raise AssertionError("did not finish")
    event(f"preempted: {s.num_preemptions > 0}")
    event(f"prefix hits: {kv.stats()['prefix_hit_tokens'] > 0}")
    stats = kv.stats()
    assert stats["pages_free"] == stats["pages_total"] == n_pages
    assert stats["n_sequences"] == 0
    assert set(outs) == {f"r{i}" for i in range(len(reqs))}
    for rid, got in outs.items():
        assert got[-1].finished and sum(x.finished for x in got) == 1
        if rid in aborted:
            assert got[-1].finish_reason == "abort"
            continue
        i = int(rid[1:])
        _, n, max_tokens, _ = reqs[i]
        if got[-1].error is None:
            # Preemptions and batching change nothing: the same tokens as alone.
            kv2, alone = make(64)
            alone.add(req(rid, n, max_tokens, start=10 * (i % 3)))
            assert tokens_of(got) == tokens_of(run(alone, FakeModel(kv2))[rid])


# -- sliding-window layer groups --------------------------------------------------------------


def test_a_windowed_layer_group_lets_a_long_request_run_in_a_pool_too_small_to_keep_it() -> None:
    """Layer 0 global, layer 1 with a window of 8: the windowed group gives its old pages back,
    so 24 prompt tokens and 24 generated ones (12 pages a layer) run in 18 pages with chunks
    of 8, with the same tokens as in a pool of global layers that keeps everything."""
    big, reference = make(64, budget=8)
    reference.add(req("a", 24, 24))
    want = tokens_of(run(reference, FakeModel(big))["a"])

    kv = Pool(KvCache(2, 1, 8, page_size=PS, dtype="f16", max_pages=18, windows=[None, 8]))
    assert kv.n_groups == 2
    # 48 positions: 12 global pages, and at most (8 - 1 + 8) / 4 + 1 windowed ones.
    assert kv.pages_to_hold(48, 8) == 12 + 5
    s = Scheduler(kv, max_num_seqs=4, max_tokens_per_step=8, eog_ids=[EOS])
    s.add(req("a", 24, 24))
    peak = 0

    def check() -> None:
        nonlocal peak
        peak = max(peak, int(kv.stats()["pages_used"]))

    outs = run(s, FakeModel(kv), check=check)["a"]
    assert tokens_of(outs) == want
    assert (outs[-1].finish_reason, outs[-1].error) == ("length", None)
    assert s.num_preemptions == 0
    assert 12 < peak <= 17
    assert kv.n_free == 18


def test_windowed_groups_share_a_cached_prefix_only_where_its_end_sees_it() -> None:
    """A second request with the same 24-token prompt attaches the cached prefix: the global
    layer's pages and the windowed layer's last ones, and computes the same tokens."""
    kv = Pool(KvCache(2, 1, 8, page_size=PS, dtype="f16", max_pages=64, windows=[None, 8]))
    s = Scheduler(kv, max_num_seqs=4, max_tokens_per_step=64, eog_ids=[EOS])
    model = FakeModel(kv)
    s.add(req("a", 24, 4))
    first = tokens_of(run(s, model)["a"])
    s.add(req("b", 24, 4))
    step = s.schedule()
    # The last prompt token is always computed: the cached prefix is 5 whole pages and 3
    # tokens of the sixth.
    assert chunks(step) == [("b", 23, [123], True)]
    b = s.get("b")
    assert b is not None and b.seq is not None
    released = 2**32 - 1
    # A query at 23 sees 16..23: windowed pages 4 and 5 came from the cache, 0..3 did not.
    assert kv.page_table(b.seq, 1)[:4] == [released] * 4
    assert released not in kv.page_table(b.seq, 0)
    outs = s.update(step, model.forward(step))
    rest = run(s, model)
    assert tokens_of(outs + rest.get("b", [])) == first


# -- embeddings -----------------------------------------------------------------------------------


def embedding(rid: str, n_prompt: int, pooling: str, start: int = 100) -> Request:
    r = req(rid, n_prompt, max_tokens=None, start=start)
    r.pooling = pooling  # type: ignore[assignment]
    return r


def test_embeddings_take_the_rows_their_pooling_needs_and_finish_after_their_prompt() -> None:
    kv, s = make(16, budget=4)
    model = FakeModel(kv)
    for pooling in ("mean", "last", "cls"):
        s.add(embedding(pooling, 6, pooling, start=100 if pooling == "mean" else 200))
    rows: dict[str, list[tuple[int, int, str, bool]]] = {}
    finished: list[str] = []
    while s.has_work():
        step = s.schedule()
        assert not step.sample_ids  # nothing is sampled for an embedding
        for c, (_, _, kind) in zip(step.chunks, step.batch(), strict=True):
            rows.setdefault(c.request_id, []).append((c.start_pos, c.n_hidden, kind, c.pooled))
            assert not c.logits
        for out in s.update(step, model.forward(step)):
            assert out.finished and out.finish_reason == "stop" and not out.new_token_ids
            finished.append(out.request_id)
    assert sorted(finished) == ["cls", "last", "mean"]
    # Every row of every chunk for mean pooling; the first chunk's for CLS; the last row.
    assert rows["mean"] == [(0, 4, "hidden-all", False), (4, 2, "hidden-all", True)]
    assert rows["cls"][0][0] == 0 and rows["cls"][0][1] > 0
    assert all(r[1] == 0 for r in rows["cls"][1:])
    assert rows["cls"][-1][3] and rows["last"][-1][1:] == (1, "hidden-last", True)
    assert all(r[1] == 0 for r in rows["last"][:-1])


def test_mean_pooling_computes_every_token_where_last_token_pooling_reuses_a_prefix() -> None:
    kv, s = make(16)
    model = FakeModel(kv)
    run_one(s, model, req("a", 10, max_tokens=1))  # caches two pages of tokens 100..107
    for pooling in ("mean", "cls", "last"):
        r = embedding(pooling, 10, pooling)
        s.add(r)
        step = s.schedule()
        assert chunks(step)[0][1] == (0 if pooling != "last" else 8)
        s.update(step, model.forward(step))
        assert r.num_cached_tokens == (0 if pooling != "last" else 8)


def test_an_embedding_may_fill_the_context() -> None:
    kv, s = make(16, max_model_len=8)
    s.add(embedding("e", 8, "mean"))
    s.add(req("g", 8))
    outs = run(s, FakeModel(kv))
    assert outs["e"][-1].error is None and outs["e"][-1].finish_reason == "stop"
    assert isinstance(outs["g"][-1].error, ModelError)
