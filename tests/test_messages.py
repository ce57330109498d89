"""Anthropic's Messages API, driven by the official ``anthropic`` client against the session's
server (the default model), whole and streamed, with tool round trips; the answers compared with
:meth:`tallow.LLM.chat` on the same conversation."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server import _json, post_hostile

import tallow

MODEL = "smollm2-135m"
GREEDY = {"temperature": 0}
"""Greedy decoding (recent clients no longer send ``temperature`` themselves)."""
USER = [{"role": "user", "content": "Name three colours."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
}
AS_OPENAI = {
    "type": "function",
    "function": {
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    },
}


@pytest.fixture(scope="module")
def claude(server: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0)


def test_a_message_is_the_chat_reply(claude: anthropic.Anthropic, smollm2: tallow.LLM) -> None:
    want = smollm2.chat(
        [{"role": "system", "content": "Be brief."}, *USER], max_tokens=16, temperature=0
    )
    got = claude.messages.create(
        model=MODEL, max_tokens=16, extra_body=GREEDY, system="Be brief.", messages=USER
    )
    assert got.type == "message" and got.role == "assistant" and got.model == MODEL
    assert [b.type for b in got.content] == ["text"]
    assert got.content[0].text == want.text
    assert got.stop_reason == ("max_tokens" if want.finish_reason == "length" else "end_turn")
    assert got.usage.input_tokens + (got.usage.cache_read_input_tokens or 0) == want.prompt_tokens
    assert got.usage.output_tokens == want.completion_tokens
    # Text blocks, and a system prompt as blocks, are the same conversation.
    blocks = claude.messages.create(
        model=MODEL,
        max_tokens=16,
        extra_body=GREEDY,
        system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": USER[0]["content"]}]}],
    )
    assert blocks.content[0].text == want.text


def test_a_stream_tells_the_same_message(claude: anthropic.Anthropic) -> None:
    whole = claude.messages.create(model=MODEL, max_tokens=20, extra_body=GREEDY, messages=USER)
    events: list[str] = []
    with claude.messages.stream(model=MODEL, max_tokens=20, extra_body=GREEDY, messages=USER) as s:
        for event in s:
            events.append(event.type)
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "content_block_stop" in events
    assert events.count("message_delta") == 1


def test_stop_sequences(claude: anthropic.Anthropic, smollm2: tallow.LLM) -> None:
    free = smollm2.chat(USER, max_tokens=24, temperature=0).text
    stop = free.split()[1]
    got = claude.messages.create(
        model=MODEL, max_tokens=24, extra_body=GREEDY, messages=USER, stop_sequences=[stop]
    )
    assert got.stop_reason == "stop_sequence" and got.stop_sequence == stop
    assert got.content[0].text == free[: free.index(stop)]


def test_a_tool_round_trip(claude: anthropic.Anthropic, smollm2: tallow.LLM) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    got = claude.messages.create(
        model=MODEL,
        max_tokens=64,
        extra_body=GREEDY,
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert got.stop_reason == "tool_use"
    (use,) = [b for b in got.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input, dict)
    assert isinstance(use.input["city"], str) and use.id
    want = smollm2.chat(
        ask,
        max_tokens=64,
        temperature=0,
        tools=[AS_OPENAI],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert want.tool_calls is not None
    assert json.loads(want.tool_calls[0].arguments) == use.input
    # The result goes back; the model answers in text.
    history: list[Any] = [
        *ask,
        {"role": "assistant", "content": [b.model_dump() for b in got.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}],
        },
    ]
    answer = claude.messages.create(
        model=MODEL, max_tokens=16, extra_body=GREEDY, messages=history, tools=[WEATHER]
    )
    expected = smollm2.chat(
        [
            *ask,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": use.id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": json.dumps(use.input)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": use.id, "content": "Sunny, 21 C"},
        ],
        max_tokens=16,
        temperature=0,
        tools=[AS_OPENAI],
    )
    text = "".join(b.text for b in answer.content if b.type == "text")
    assert text == expected.text
    # Streamed, the call comes as a tool_use block with its input as JSON deltas.
    with claude.messages.stream(
        model=MODEL,
        max_tokens=64,
        extra_body=GREEDY,
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "any"},
    ) as s:
        final = s.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert streamed and final.stop_reason == "tool_use"  # "any": one call or more
    assert all(b.name == "get_weather" and isinstance(b.input, dict) for b in streamed)


def test_disable_parallel_tool_use_gives_one_call(
    claude: anthropic.Anthropic, smollm2: tallow.LLM
) -> None:
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    several = smollm2.chat(
        ask, max_tokens=64, temperature=0, tools=[AS_OPENAI], tool_choice="required"
    )
    assert several.tool_calls is not None and len(several.tool_calls) > 1
    got = claude.messages.create(
        model=MODEL,
        max_tokens=64,
        extra_body=GREEDY,
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    uses = [b for b in got.content if b.type == "tool_use"]
    assert len(uses) == 1 and got.stop_reason == "tool_use"
    assert uses[0].input == json.loads(several.tool_calls[0].arguments)


def test_count_tokens(claude: anthropic.Anthropic, smollm2: tallow.LLM) -> None:
    counted = claude.messages.count_tokens(model=MODEL, system="Be brief.", messages=USER)
    ids = smollm2._prompts.chat_ids([{"role": "system", "content": "Be brief."}, *USER])
    assert counted.input_tokens == len(ids)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": MODEL, "messages": USER}, 400),  # no max_tokens
        ({"model": MODEL, "max_tokens": 4, "messages": []}, 400),
        ({"model": MODEL, "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, 400),
        (
            {
                "model": MODEL,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            },
            400,
        ),
        ({"model": MODEL, "max_tokens": 4, "messages": USER, "temperature": 1.5}, 400),
        ({"model": MODEL, "max_tokens": 4, "messages": USER, "thinking": {"type": "x"}}, 400),
        ({"model": MODEL, "max_tokens": 4, "messages": USER, "tool_choice": {"type": "x"}}, 400),
        (
            {
                "model": MODEL,
                "max_tokens": 4,
                "messages": USER,
                "tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"},
            },
            400,
        ),
        ({"model": MODEL, "max_tokens": 10**6, "messages": USER}, 400),
        ({"model": "claude-opus", "max_tokens": 4, "messages": USER}, 404),
    ],
)
def test_bad_messages_get_anthropic_errors(server: str, body: dict[str, Any], status: int) -> None:
    response = httpx.post(f"{server}/v1/messages", json=body, timeout=60)
    assert response.status_code == status, response.text
    answer = response.json()
    assert answer["type"] == "error" and answer["error"]["message"]
    kind = {400: "invalid_request_error", 404: "not_found_error"}[status]
    assert answer["error"]["type"] == kind


_FIELDS = [
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
    "stream",
    "metadata",
]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]),
    changes=st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=4),
    whole=_json,
)
def test_no_messages_body_gets_a_server_error(
    server: str, path: str, changes: dict[str, Any], whole: object
) -> None:
    body: object = whole
    if changes or not isinstance(whole, dict):
        body = {"model": MODEL, "max_tokens": 2, "messages": USER, **changes}
        if isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool):
            body["max_tokens"] = min(body["max_tokens"], 4)
    response = post_hostile(server, path, body)
    if response.status_code >= 400:
        assert response.json()["type"] == "error"
    elif "text/event-stream" in response.headers["content-type"]:
        assert "event: message_stop" in response.text or "event: error" in response.text
    else:
        assert "content" in response.json() or "input_tokens" in response.json()


def test_structured_output(claude: anthropic.Anthropic, server: str) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green"]}},
        "required": ["colour"],
    }
    got = claude.messages.create(
        model=MODEL,
        max_tokens=32,
        messages=USER,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        extra_body=GREEDY,
    )
    assert json.loads(got.content[0].text)["colour"] in ("red", "green")
    bad = httpx.post(
        f"{server}/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 4,
            "messages": USER,
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "bogus"}}},
        },
    )
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
