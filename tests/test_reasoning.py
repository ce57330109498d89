"""Reasoning: a reply's thinking block apart from its answer, its budget, and a constraint or
tools that apply to the answer only; through the Python API, the async API and the server.

The model is the default one with two of its unused control tokens renamed ``<think>`` and
``</think>`` (so that it counts as a model that reasons) and a chat template in Qwen 3's manner:
``enable_thinking`` false writes an empty block, otherwise the generation prompt opens the block
(as DeepSeek-R1's does). Its greedy tokens inside the block are whatever it writes; a budget then
closes the block, and the answer follows. Oracles: the same greedy tokens from a plain forward.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx
import numpy as np
import openai
import pytest
from conftest import serving
from test_rope_scaling import rewrite

import tallow
from tallow import _core
from tallow.output import OutputState
from tallow.reasoning import Block, Channels, ReasoningSplit, block_of, marks, splitter
from tallow.scheduler import SchedulerOutput

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
BAN = {0: float("-inf"), 2: float("-inf")}
"""The end-of-text and end-of-turn tokens, banned so that replies run their whole length (the
135M model would end at once)."""


@pytest.fixture(scope="module")
def thinker_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = _core.Model(str(smollm2_path))
    tokens = list(model.metadata()["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    tokens[3], tokens[4] = "<think>", "</think>"
    fields = {"tokenizer.ggml.tokens": tokens, "tokenizer.chat_template": TEMPLATE}
    return rewrite(smollm2_path, tmp_path_factory.mktemp("think") / "thinker.gguf", fields, {})


@pytest.fixture(scope="module")
def thinker(thinker_path: Path) -> tallow.LLM:
    return tallow.LLM(thinker_path, n_ctx=512, progress=False)


def greedy(model: _core.Model, ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``ids`` (none of :data:`BAN`), one plain forward each."""
    kv = model.new_kv_cache(max_pages=model.kv_pages_to_hold(len(ids) + n, chunk=len(ids)))
    seq = kv.create()
    kv.reserve(seq, len(ids))
    logits = model.forward(kv, [(seq, ids, "last")])
    out: list[int] = []
    for _ in range(n):
        row = logits[-1].copy()
        row[list(BAN)] = -np.inf
        out.append(int(np.argmax(row)))
        kv.reserve(seq, 1)
        logits = model.forward(kv, [(seq, out[-1:], "last")])
    return out


def test_the_marks_and_where_a_block_starts(thinker: tallow.LLM, smollm2: tallow.LLM) -> None:
    model = thinker._model
    assert marks(model) == (3, 4) and marks(smollm2._model) is None
    ids = model.tokenize("<|im_start|>assistant\n", False, True)
    assert block_of(model, [*ids, 3, 198], 7) == Block(3, 4, opened=True, budget=7)
    assert block_of(model, [*ids, 3, 198, 198, 4, 198, 198], None) is None
    assert block_of(model, ids, None) == Block(3, 4, opened=False)
    assert block_of(smollm2._model, [*ids, 3], None) is None


def test_splitting_a_reply() -> None:
    split = ReasoningSplit(Block(3, 4, opened=False))
    assert [split.push(t) for t in (3, 10, 3, 4, 11, 4)] == [
        (True, True),
        (True, False),
        (True, False),  # the opening mark again, inside: reasoning text
        (True, True),
        (False, False),
        (False, False),  # a closing mark in the answer is answer
    ]
    split = ReasoningSplit(Block(3, 4, opened=False))
    assert split.push(10) == (False, False) and not split.reasoning


def test_the_budget_closes_the_block_and_the_answer_follows(thinker: tallow.LLM) -> None:
    model = thinker._model
    prompt = thinker._prompts.chat_ids(MESSAGES)
    assert prompt[-2:] == [3, *model.tokenize("\n", False, False)]
    thought = greedy(model, prompt, 6)
    assert 4 not in thought  # the model would go on thinking: the budget must close it
    answer = greedy(model, [*prompt, *thought, 4], 8)
    result = thinker.chat(
        MESSAGES, max_tokens=15, temperature=0, reasoning_budget=6, logit_bias=BAN
    )
    assert result.token_ids == [*thought, 4, *answer]
    assert result.reasoning == model.detokenize(thought).lstrip()
    assert result.text == model.detokenize(answer).lstrip()
    # Streamed: the answer's text only; the reasoning comes with the result.
    stream = thinker.chat_stream(
        MESSAGES, max_tokens=15, temperature=0, reasoning_budget=6, logit_bias=BAN
    )
    assert "".join(stream) == result.text
    assert stream.result is not None and stream.result.reasoning == result.reasoning


def test_enable_thinking_false_leaves_no_block(thinker: tallow.LLM) -> None:
    model = thinker._model
    result = thinker.chat(
        MESSAGES, max_tokens=8, temperature=0, enable_thinking=False, logit_bias=BAN
    )
    assert result.reasoning is None
    prompt = thinker._prompts.chat_ids(MESSAGES, template_kwargs={"enable_thinking": False})
    assert model.detokenize(prompt).endswith("</think>\n\n")
    assert result.token_ids == greedy(model, prompt, 8)
    same = thinker.chat(
        MESSAGES,
        max_tokens=8,
        temperature=0,
        chat_template_kwargs={"enable_thinking": False},
        logit_bias=BAN,
    )
    assert same.token_ids == result.token_ids
    with pytest.raises(tallow.InvalidArgumentError, match="cannot set 'messages'"):
        thinker.chat(MESSAGES, chat_template_kwargs={"messages": []})
    with pytest.raises(tallow.InvalidArgumentError, match="reasoning_budget"):
        thinker.chat(MESSAGES, reasoning_budget=-1)


def test_a_constraint_applies_to_the_answer_only(thinker: tallow.LLM) -> None:
    model = thinker._model
    prompt = thinker._prompts.chat_ids(MESSAGES)
    thought = greedy(model, prompt, 5)
    result = thinker.chat(
        MESSAGES,
        max_tokens=20,
        temperature=0,
        reasoning_budget=5,
        choice=["yes", "no"],
        logit_bias=BAN,
    )
    assert result.token_ids[:6] == [*thought, 4]  # the reasoning is free
    assert result.text in ("yes", "no")
    assert result.reasoning == model.detokenize(thought).lstrip()


def test_the_async_api_gives_reasoning_deltas(thinker_path: Path, thinker: tallow.LLM) -> None:
    want = thinker.chat(MESSAGES, max_tokens=12, temperature=0, reasoning_budget=4, logit_bias=BAN)

    async def main() -> tuple[str, str]:
        async with tallow.AsyncLLM(thinker_path, n_ctx=512) as llm:
            params = tallow.SamplingParams(
                max_tokens=12, temperature=0.0, reasoning_budget=4, logit_bias=BAN
            )
            chat = llm.chat_prompt(MESSAGES, params)
            thoughts, text = [], []
            async for out in llm.outputs(chat.ids, chat.params):
                thoughts.append(out.reasoning)
                text.append(out.text)
            return "".join(thoughts), "".join(text)

    assert anyio.run(main) == (want.reasoning, want.text)


@pytest.fixture(scope="module")
def think_server(thinker_path: Path) -> Iterator[str]:
    with serving("-m", str(thinker_path), "--ctx", "512") as url:
        yield url


def test_the_server_returns_reasoning_content(think_server: str, thinker: tallow.LLM) -> None:
    want = thinker.chat(MESSAGES, max_tokens=12, temperature=0, reasoning_budget=4, logit_bias=BAN)
    client = openai.OpenAI(base_url=f"{think_server}/v1", api_key="unused", max_retries=0)
    extra: dict[str, Any] = {"reasoning_budget": 4, "logit_bias": {"0": -100, "2": -100}}
    done = client.chat.completions.create(
        model="thinker.gguf", messages=MESSAGES, max_tokens=12, temperature=0, extra_body=extra
    )
    message = done.choices[0].message.model_dump()
    assert (message["reasoning_content"], message["content"]) == (want.reasoning, want.text)
    stream = client.chat.completions.create(
        model="thinker.gguf",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,
        extra_body=extra,
    )
    thoughts, text = [], []
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta.model_dump()
            thoughts.append(delta.get("reasoning_content") or "")
            text.append(delta.get("content") or "")
    assert ("".join(thoughts), "".join(text)) == (want.reasoning, want.text)
    off = client.chat.completions.create(
        model="thinker.gguf",
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert off.choices[0].message.model_dump().get("reasoning_content") is None
    bad = httpx.post(
        f"{think_server}/v1/chat/completions",
        json={"model": "thinker.gguf", "messages": MESSAGES, "chat_template_kwargs": [1]},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"


def test_the_messages_api_returns_thinking_blocks(think_server: str, thinker: tallow.LLM) -> None:
    want = thinker.chat(MESSAGES, max_tokens=12, temperature=0, reasoning_budget=4, logit_bias=BAN)
    claude = anthropic.Anthropic(base_url=think_server, api_key="unused", max_retries=0)
    extra = {"temperature": 0, "logit_bias": {"0": -100, "2": -100}}
    thinking: Any = {"type": "enabled", "budget_tokens": 4}
    got = claude.messages.create(
        model="thinker.gguf", max_tokens=12, messages=MESSAGES, thinking=thinking, extra_body=extra
    )
    assert [b.type for b in got.content] == ["thinking", "text"]
    assert got.content[0].thinking == want.reasoning  # type: ignore[union-attr]
    assert got.content[1].text == want.text  # type: ignore[union-attr]
    with claude.messages.stream(
        model="thinker.gguf", max_tokens=12, messages=MESSAGES, thinking=thinking, extra_body=extra
    ) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in kinds and "text_delta" in kinds
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in got.content]
    off = claude.messages.create(
        model="thinker.gguf",
        max_tokens=6,
        messages=MESSAGES,
        thinking={"type": "disabled"},
        extra_body=extra,
    )
    assert [b.type for b in off.content] == ["text"]


def test_the_responses_api_returns_a_reasoning_item(think_server: str, thinker: tallow.LLM) -> None:
    want = thinker.chat(MESSAGES, max_tokens=12, temperature=0, reasoning_budget=4, logit_bias=BAN)
    client = openai.OpenAI(base_url=f"{think_server}/v1", api_key="unused", max_retries=0)
    extra = {"reasoning_budget": 4, "logit_bias": {"0": -100, "2": -100}}
    got = client.responses.create(
        model="thinker.gguf",
        input=MESSAGES[0]["content"],
        max_output_tokens=12,
        temperature=0,
        extra_body=extra,
    )
    assert [item.type for item in got.output] == ["reasoning", "message"]
    assert got.output[0].content[0].text == want.reasoning  # type: ignore[union-attr,index]
    assert got.output_text == want.text
    assert got.usage is not None and got.usage.output_tokens_details.reasoning_tokens == 5
    deltas = [
        e.delta
        for e in client.responses.create(
            model="thinker.gguf",
            input=MESSAGES[0]["content"],
            max_output_tokens=12,
            temperature=0,
            extra_body=extra,
            stream=True,
        )
        if e.type == "response.reasoning_text.delta"
    ]
    assert "".join(deltas) == want.reasoning


def test_tool_calls_are_read_from_the_answer(thinker: tallow.LLM) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 8}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    model = thinker._model
    prompt = thinker._prompts.chat_ids(MESSAGES, tools=tools)
    thought = greedy(model, prompt, 3)
    result = thinker.chat(
        MESSAGES,
        max_tokens=60,
        temperature=0,
        reasoning_budget=3,
        logit_bias=BAN,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    # The reasoning is free; the call, constrained, comes after the block and is parsed.
    assert result.token_ids[:4] == [*thought, 4]
    assert result.reasoning == model.detokenize(thought).lstrip()
    assert result.tool_calls is not None
    assert [c.name for c in result.tool_calls] == ["get_weather"]
    assert "<tool_call>" not in result.text and "<tool_call>" not in result.reasoning


HARMONY_TEMPLATE = (
    "{% if reasoning_effort is defined %}<|start|>system<|message|>Reasoning: "
    "{{ reasoning_effort }}<|end|>{% endif %}"
    "{% if tools %}<|start|>developer<|message|># Tools\nnamespace functions {\n"
    "{% for tool in tools %}type {{ tool.function.name }} = (_: "
    "{{ tool.function.parameters | tojson }}) => any;\n{% endfor %}}<|end|>{% endif %}"
    "{% for message in messages %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    "<|start|>assistant to=functions.{{ call.function.name }}<|channel|>commentary json"
    "<|message|>{{ call.function.arguments | tojson }}<|call|>{% endfor %}"
    "{% elif message.role == 'tool' %}<|start|>functions.{{ message.name }} to=assistant"
    "<|channel|>commentary<|message|>{{ message.content }}<|end|>"
    "{% else %}<|start|>{{ message['role'] }}<|message|>{{ message['content'] }}<|end|>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
"""gpt-oss's template in short: the effort in a system message, the tools as a namespace of
functions, past calls as messages addressed to them (``<|call|>`` ends a call)."""
HARMONY = [
    "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"
]  # fmt: skip


@pytest.fixture(scope="module")
def harmony_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model with seven control tokens renamed as gpt-oss's harmony format has
    them."""
    model = _core.Model(str(smollm2_path))
    tokens = list(model.metadata()["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    tokens[3 : 3 + len(HARMONY)] = HARMONY
    fields = {"tokenizer.ggml.tokens": tokens, "tokenizer.chat_template": HARMONY_TEMPLATE}
    return rewrite(smollm2_path, tmp_path_factory.mktemp("harmony") / "harmony.gguf", fields, {})


@pytest.fixture(scope="module")
def harmony(harmony_path: Path) -> tallow.LLM:
    return tallow.LLM(harmony_path, n_ctx=512, progress=False)


def test_harmony_channels_split_the_reasoning_from_the_answer(harmony: tallow.LLM) -> None:
    model = harmony._model
    start, channel, message, end, ret, _ = range(3, 9)
    # <|end|> closes a message, not the turn: <|return|> and <|call|> do.
    assert ret in model.eog_ids and end not in model.eog_ids
    chat = harmony._prompts.chat(MESSAGES, tallow.SamplingParams())
    assistant = model.tokenize("assistant", False, False)
    answer = (channel, *model.tokenize("final", False, False), message)
    close = (end, start, *assistant, *answer)
    want = Channels(start, channel, message, end, tuple(assistant), False, answer, close)
    assert chat.params.reasoning == want
    # To the sampler, everything before the final channel's message is reasoning.
    assert want.sampler_args() == (channel, list(answer), list(close), None, True)
    # A prompt that opens the analysis channel's message: the reply starts as reasoning.
    analysis = [*assistant, channel, *model.tokenize("analysis", False, False)]
    opened = block_of(model, [*chat.ids, *analysis[len(assistant) :], message], None)
    assert opened is not None and isinstance(opened, Channels)
    assert (opened.header, opened.body, opened.answering) == (tuple(analysis), True, False)
    assert splitter(opened, model.detokenize).reasoning
    # One that opens the final channel's message: the reply is the answer from its start.
    final = block_of(model, [*chat.ids, *answer], None)
    assert isinstance(final, Channels) and final.answering and final.sampler_args() is None

    def words(text: str) -> list[int]:
        return model.tokenize(text, False, False)

    reply = [
        channel, *words("analysis"), message, *words("The sky is blue."), end,
        start, *assistant, channel, *words("final"), message, *words("Yes, it is."),
    ]  # fmt: skip
    assert chat.params.reasoning is not None
    state = OutputState(
        model.stream_decoder(),
        reasoning=(chat.params.reasoning, model.stream_decoder(), model.detokenize),
    )
    first = state.process(SchedulerOutput("r", reply[:9], False))
    last = state.process(SchedulerOutput("r", reply[9:], True, "stop"))
    assert first.reasoning + last.reasoning == "The sky is blue."
    assert first.text + last.text == "Yes, it is."
    assert first.reasoning_tokens + last.reasoning_tokens == len(words("The sky is blue.")) + 2


def test_a_reply_that_leaves_the_harmony_format_is_its_answer(harmony: tallow.LLM) -> None:
    model = harmony._model
    chat = harmony._prompts.chat(MESSAGES, tallow.SamplingParams())
    assert chat.params.reasoning is not None
    state = OutputState(
        model.stream_decoder(),
        reasoning=(chat.params.reasoning, model.stream_decoder(), model.detokenize),
    )
    plain = model.tokenize(" word" * 40, False, False)
    out = state.process(SchedulerOutput("r", plain, True, "length"))
    # The first tokens were read as a header (after the prompt's "assistant"); past its bound
    # of 32 tokens the rest is answer.
    header = 32 - len(model.tokenize("assistant", False, False))
    assert out.reasoning == "" and out.text.strip() == " ".join(["word"] * (40 - header))
    result = harmony.chat(MESSAGES, max_tokens=6, temperature=0)
    assert result.reasoning is None


def test_a_harmony_budget_closes_into_the_final_channel(harmony: tallow.LLM) -> None:
    """The budget spent, ``<|end|><|start|>assistant<|channel|>final<|message|>`` is chosen
    token by token; a constraint applies after it."""
    model = harmony._model
    prompt = harmony._prompts.chat_ids(MESSAGES)
    chat = harmony._prompts.chat(MESSAGES, tallow.SamplingParams())
    assert isinstance(chat.params.reasoning, Channels)
    close = list(chat.params.reasoning.close)
    thought = greedy(model, prompt, 3)
    answer = greedy(model, [*prompt, *thought, *close], 5)
    result = harmony.chat(MESSAGES, max_tokens=3 + len(close) + 5, temperature=0,
                          reasoning_budget=3, logit_bias=BAN)  # fmt: skip
    assert result.token_ids == [*thought, *close, *answer]
    assert result.text == model.detokenize(answer).lstrip()
    chosen = harmony.chat(
        MESSAGES,
        max_tokens=40,
        temperature=0,
        reasoning_budget=3,
        choice=["yes", "no"],
        logit_bias=BAN,
    )
    assert chosen.token_ids[: 3 + len(close)] == [*thought, *close]
    assert chosen.text in ("yes", "no")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def harmony_reply(model: _core.Model, header: str, body: str) -> list[int]:
    """A reply that reasons, then sends ``body`` in a message with header ``header`` (its
    ``<|channel|>`` and ``<|constrain|>`` parsed as tokens)."""

    def special(text: str) -> list[int]:
        return model.tokenize(text, False, True)

    return [
        *special("<|channel|>analysis<|message|>"), *model.tokenize("Look it up.", False, False),
        *special(f"<|end|><|start|>{header}<|message|>"), *model.tokenize(body, False, False),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "header",
    [
        "assistant<|channel|>commentary to=functions.get_weather <|constrain|>json",
        "assistant to=functions.get_weather<|channel|>commentary json",
    ],
)
def test_a_harmony_message_to_a_function_is_its_call(harmony: tallow.LLM, header: str) -> None:
    """The recipient may be written after the channel (as gpt-oss writes its calls) or before
    it (as its template writes past calls); either way the message is a call, not text."""
    model = harmony._model
    chat = harmony._prompts.chat(MESSAGES, tallow.SamplingParams(), tools=[WEATHER])
    assert chat.params.tools is not None and chat.params.tools.syntax == "harmony"
    assert chat.params.reasoning is not None
    reply = harmony_reply(model, header, '{"city": "Paris"}')

    def process(use: Any) -> Any:
        state = OutputState(
            model.stream_decoder(),
            tools=use,
            reasoning=(chat.params.reasoning, model.stream_decoder(), model.detokenize),
        )
        return state.process(SchedulerOutput("r", reply, True, "stop"))

    out = process(chat.params.tools)
    assert (out.reasoning, out.text, out.finish_reason) == ("Look it up.", "", "tool_calls")
    assert out.tool_calls is not None
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    # Without tools (or to a recipient not among them), the message is text.
    plain = process(None)
    assert (plain.text, plain.tool_calls, plain.finish_reason) == (
        '{"city": "Paris"}',
        None,
        "stop",
    )
    elsewhere = harmony_reply(model, "assistant<|channel|>commentary to=browser.search", "{}")
    state = OutputState(
        model.stream_decoder(),
        tools=chat.params.tools,
        reasoning=(chat.params.reasoning, model.stream_decoder(), model.detokenize),
    )
    out = state.process(SchedulerOutput("r", elsewhere, True, "stop"))
    assert (out.text, out.tool_calls) == ("{}", None)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_required_harmony_call_follows_the_reasoning(harmony: tallow.LLM, choice: object) -> None:
    """Where a call is required, the reasoning closes into ``<|channel|>commentary``, and the
    call's recipient, ``<|constrain|>json``, arguments and ``<|call|>`` are constrained."""
    model = harmony._model
    chat = harmony._prompts.chat(MESSAGES, tallow.SamplingParams(), tools=[WEATHER])
    thought = greedy(model, chat.ids, 3)
    result = harmony.chat(
        MESSAGES,
        max_tokens=80,
        temperature=0,
        reasoning_budget=3,
        logit_bias=BAN,
        tools=[WEATHER],
        tool_choice=choice,
    )
    close = model.tokenize("<|end|><|start|>assistant<|channel|>commentary", False, True)
    # The three free tokens are the model's own (this one writes no channel: they read as a
    # header, neither reasoning nor text); then the budget closes into the commentary channel.
    assert result.token_ids[: 3 + len(close)] == [*thought, *close]
    assert result.finish_reason == "tool_calls" and result.text == ""
    assert result.tool_calls is not None and len(result.tool_calls) == 1
    call = result.tool_calls[0]
    arguments = json.loads(call.arguments)
    assert call.name == "get_weather" and set(arguments) == {"city"}
    assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 8
    # The call is the one the format spells, ended by <|call|> (the end of the turn).
    header = " to=functions.get_weather <|constrain|>json<|message|>"
    written = model.detokenize(result.token_ids[3 + len(close) :])
    assert written.startswith(header) and json.loads(written[len(header) :]) == arguments


def test_reasoning_effort_reaches_the_template(harmony: tallow.LLM) -> None:
    """gpt-oss reads ``reasoning_effort`` (``Reasoning: high`` in its system message); an
    effort of ``"none"`` also sets ``enable_thinking`` false for templates that read that."""
    params = tallow.engine.sampling_params(reasoning_effort="none")
    assert params.chat_template_kwargs == {"reasoning_effort": "none", "enable_thinking": False}
    given = tallow.engine.sampling_params(
        reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}
    )
    assert given.chat_template_kwargs == {"reasoning_effort": "none", "enable_thinking": True}
    high = harmony._prompts.chat_ids(MESSAGES, template_kwargs={"reasoning_effort": "high"})
    assert "Reasoning: high" in harmony._model.detokenize(high)
    result = harmony.chat(MESSAGES, max_tokens=1, temperature=0, reasoning_effort="high")
    assert result.prompt_tokens == len(high)
    with pytest.raises(tallow.InvalidArgumentError, match="reasoning_effort"):
        harmony.chat(MESSAGES, max_tokens=1, reasoning_effort="extreme")


@pytest.fixture(scope="module")
def harmony_server(harmony_path: Path) -> Iterator[str]:
    with serving("-m", str(harmony_path), "--ctx", "512") as url:
        yield url


def test_the_server_reads_harmony_calls_and_the_effort(
    harmony_server: str, harmony: tallow.LLM
) -> None:
    want = harmony.chat(
        MESSAGES,
        max_tokens=80,
        temperature=0,
        reasoning_budget=3,
        logit_bias=BAN,
        tools=[WEATHER],
        tool_choice="required",
    )
    assert want.tool_calls is not None
    client = openai.OpenAI(base_url=f"{harmony_server}/v1", api_key="unused", max_retries=0)
    extra: dict[str, Any] = {"reasoning_budget": 3, "logit_bias": {"0": -100, "2": -100}}
    done = client.chat.completions.create(
        model="harmony.gguf",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=80,
        temperature=0,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        extra_body=extra,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    got = choice.message.tool_calls[0]
    assert (got.function.name, got.function.arguments) == (  # type: ignore[union-attr]
        want.tool_calls[0].name,
        want.tool_calls[0].arguments,
    )
    # The effort: gpt-oss's system message, as many prompt tokens as the template makes.
    high = harmony._prompts.chat_ids(MESSAGES, template_kwargs={"reasoning_effort": "high"})
    response = client.responses.create(
        model="harmony.gguf",
        input=MESSAGES[0]["content"],
        reasoning={"effort": "high"},
        max_output_tokens=2,
    )
    assert response.usage is not None and response.usage.input_tokens == len(high)
    assert response.reasoning is not None and response.reasoning.effort == "high"
    chat = client.chat.completions.create(
        model="harmony.gguf",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=2,
        reasoning_effort="high",
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == len(high)
    for path, body, param in [
        ("/v1/responses", {"input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort"),
        ("/v1/responses", {"input": "x", "reasoning": "high"}, "reasoning"),
        ("/v1/chat/completions", {"messages": MESSAGES, "reasoning_effort": 3}, "reasoning_effort"),
    ]:
        bad = httpx.post(f"{harmony_server}{path}", json={"model": "harmony.gguf", **body})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
