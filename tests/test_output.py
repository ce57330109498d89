"""The output processor (:mod:`tallow.output`) behind the scheduler, as the engine drives them,
without a model: a toy vocabulary whose pieces split words and UTF-8 characters across tokens.

Stop strings, held-back text, log probabilities, tool calls and the line between a request
that failed and one that ran out of room are all decided here, the same for every front end.
"""

from __future__ import annotations

from typing import Any

import pytest

from tallow import _core
from tallow.errors import ModelError
from tallow.output import OutputState, RequestOutput, ResultBuilder
from tallow.scheduler import Request, Scheduler
from tallow.stopping import DetokenizeDecoder, StopConditions
from tallow.tools import tool_use

PS = 4
EOS = 0
PIECES = {1: "Hel", 2: "lo", 3: " wo", 4: "rld", 5: "!", 6: "\xe2", 7: "\x82\xac", 8: " "}
PIECES.update({10 + i: c for i, c in enumerate('<tool_call>{"name": "f", "arguments": {}}/')})


def detok(ids: list[int]) -> str:
    raw = "".join(PIECES[i] for i in ids).encode("latin-1")
    return raw.decode("utf-8", errors="replace")


class Driver:
    """A scheduler and each request's output state, stepped with given tokens as the engine
    steps them with sampled ones."""

    def __init__(self, n_pages: int = 8) -> None:
        self.kv = _core.KvCache(1, 1, 8, page_size=PS, dtype="f16", max_pages=n_pages)
        self.sched = Scheduler(self.kv, max_num_seqs=4, max_tokens_per_step=64, eog_ids=[EOS])
        self.states: dict[str, OutputState] = {}

    def add(self, rid: str, n_prompt: int = 1, max_tokens: int | None = 16, **state: Any) -> None:
        stop = state.pop("stop", ())
        prompt = [100 + i for i in range(n_prompt)]
        self.sched.add(Request(rid, prompt, StopConditions(max_tokens=max_tokens)))
        self.states[rid] = OutputState(DetokenizeDecoder(detok), stop, **state)

    def step(self, sampled: dict[str, list[int]]) -> list[RequestOutput]:
        step = self.sched.schedule()
        outs = []
        for out in self.sched.update(step, {r: sampled[r] for r in step.sample_ids}):
            rows = [(t, -0.5 * t, []) for t in sampled.get(out.request_id, [])]
            result = self.states[out.request_id].process(out, rows)
            if result.finished and not out.finished:
                self.sched.stop(out.request_id)
            outs.append(result)
        return outs

    def feed(self, rid: str, tokens: list[int]) -> list[RequestOutput]:
        """One token per step until the request ends."""
        outs: list[RequestOutput] = []
        for t in tokens:
            outs += self.step({rid: [t]})
            if outs[-1].finished:
                break
        return outs


def tokens_of(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def test_stop_string_across_token_boundaries_is_held_back_and_not_emitted() -> None:
    d = Driver()
    d.add("a", stop=["o wor"])
    outs = d.feed("a", [1, 2, 3, 4, 5])
    assert [o.text for o in outs] == ["Hel", "l", "", ""]
    last = outs[-1]
    assert (last.finished, last.finish_reason, last.stop_reason) == (True, "stop", "o wor")
    assert tokens_of(outs) == [1, 2, 3, 4]
    # The output processor ended it: the scheduler freed its pages at once.
    assert not d.sched.has_work() and d.kv.n_free == 8


def test_held_back_text_is_released_when_the_stop_does_not_complete() -> None:
    d = Driver()
    d.add("a", max_tokens=4, stop=["lo!", "rld?"])
    outs = d.feed("a", [1, 2, 3, 4])
    # "l", "lo" and "rld" are held back while they may start a stop string; max_tokens flushes.
    assert [o.text for o in outs] == ["He", "l", "lo wo", "rld"]
    assert outs[-1].finish_reason == "length"
    assert "".join(o.text for o in outs) == "Hello world"


def test_eos_flushes_held_back_text_and_utf8_is_never_split() -> None:
    d = Driver()
    d.add("a", stop=["€!"])
    outs = d.feed("a", [1, 2, 6, 7, EOS])
    # "\xe2" alone is half of "€": held back by the decoder until "\x82\xac" completes it;
    # then "€" is held back as the start of "€!" until the end of generation releases it.
    assert [o.text for o in outs] == ["Hel", "lo", "", "", "€"]
    assert (outs[-1].finish_reason, outs[-1].stop_reason, outs[-1].new_token_ids) == (
        "stop",
        EOS,
        [],
    )


def test_a_stop_string_inside_accepted_draft_tokens_drops_the_tokens_after_it() -> None:
    """Speculative decoding gives several tokens in a step: the output ends at the one that
    completes the stop string, with its log probability and none after it."""
    d = Driver()
    d.add("a", stop=["lo w"], logprobs=True)
    d.step({"a": [1]})
    # The step of the next token carries a draft [2, 3]; the model accepts both and adds 4.
    step = d.sched.schedule({"a": [2, 3]})
    (out,) = d.sched.update(step, {"a": [2, 3, 4]})
    assert out.new_token_ids == [2, 3, 4] and not out.finished
    result = d.states["a"].process(out, [(t, -float(t), []) for t in (2, 3, 4)])
    assert (result.finished, result.finish_reason, result.stop_reason) == (True, "stop", "lo w")
    assert result.new_token_ids == [2, 3] and result.text == "l"
    assert result.logprobs is not None
    assert [(lp.token_id, lp.logprob) for lp in result.logprobs] == [(2, -2.0), (3, -3.0)]
    d.sched.stop("a")
    assert not d.sched.has_work() and d.kv.n_free == 8


def test_requests_in_one_batch_keep_their_own_text_and_stops() -> None:
    d = Driver()
    d.add("a", stop=["wo"])
    d.add("b")
    outs = d.step({"a": [1], "b": [3]})
    outs += d.step({"a": [3], "b": [4]})
    outs += d.step({"b": [EOS]})
    by_id: dict[str, str] = {}
    for o in outs:
        by_id[o.request_id] = by_id.get(o.request_id, "") + o.text
    assert by_id == {"a": "Hel ", "b": " world"}
    assert [o.finish_reason for o in outs if o.finished] == ["stop", "stop"]


def test_tool_calls_are_held_back_and_parsed_when_the_reply_ends() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    use = tool_use(tools, "auto", "{{ '<tool_call>' }}")
    assert use is not None
    d = Driver(n_pages=16)
    d.add("a", max_tokens=None, tools=use)
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    ids = [1, 2, 8] + [10 + '<tool_call>{"name": "f", "arguments": {}}/'.index(c) for c in call]
    outs = d.feed("a", [*ids, EOS])
    result = ResultBuilder(1, logprobs=False)
    shown = [result.add(o) for o in outs]
    done = result.result()
    assert "".join(shown) == done.text == "Hello"
    assert done.finish_reason == "tool_calls"
    assert done.tool_calls is not None
    assert [(c.name, c.arguments) for c in done.tool_calls] == [("f", "{}")]


def test_running_out_of_room_after_tokens_ends_normally_but_before_them_fails() -> None:
    d = Driver(n_pages=2)  # 8 positions
    d.add("a", n_prompt=6, max_tokens=None)
    outs = d.feed("a", [1, 2, 3, 4])
    last = outs[-1]
    assert (last.finish_reason, last.error) == ("length", None)
    assert tokens_of(outs) == [1, 2, 3]
    # A prompt that can never fit produced nothing: the request failed.
    d.add("huge", n_prompt=12)
    (out,) = d.step({})
    assert out.finish_reason == "abort" and isinstance(out.error, ModelError)
    with pytest.raises(ModelError, match="KV pool"):
        ResultBuilder(12, logprobs=False).add(out)
