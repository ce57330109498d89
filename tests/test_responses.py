"""OpenAI's Responses API, driven by the official ``openai`` client against the session's server
(the default model), whole and streamed, with tool round trips and ``previous_response_id``; the
answers compared with :meth:`tallow.LLM.chat` on the same conversation."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server import OPENAI_ERROR, _json, post_hostile

import tallow

MODEL = "smollm2-135m"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
}
AS_CHAT = {
    "type": "function",
    "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
}


def test_a_response_is_the_chat_reply(client: openai.OpenAI, smollm2: tallow.LLM) -> None:
    want = smollm2.chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
        max_tokens=12,
        temperature=0,
    )
    got = client.responses.create(
        model=MODEL, instructions="Be brief.", input="Hi there", max_output_tokens=12, temperature=0
    )
    assert got.object == "response" and got.model == MODEL
    assert got.output_text == want.text
    assert got.status == ("incomplete" if want.finish_reason == "length" else "completed")
    assert got.usage is not None and got.usage.input_tokens == want.prompt_tokens
    assert got.usage.output_tokens == want.completion_tokens
    # Message items, with text parts, are the same conversation.
    items: Any = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi there"}]},
    ]
    same = client.responses.create(model=MODEL, input=items, max_output_tokens=12, temperature=0)
    assert same.output_text == want.text
    # Stored: it can be fetched again.
    again = httpx.get(f"{client.base_url}responses/{got.id}").json()
    assert again["id"] == got.id and again["output"][0]["content"][0]["text"] == want.text


def test_a_stream_tells_the_same_response(client: openai.OpenAI) -> None:
    whole = client.responses.create(
        model=MODEL, input="Count to five", max_output_tokens=16, temperature=0
    )
    kinds: list[str] = []
    deltas: list[str] = []
    final: Any = None
    for event in client.responses.create(
        model=MODEL, input="Count to five", max_output_tokens=16, temperature=0, stream=True
    ):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "".join(deltas) == whole.output_text == final.output_text
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done")


def test_previous_response_id_goes_on_from_a_response(
    client: openai.OpenAI, smollm2: tallow.LLM
) -> None:
    first = client.responses.create(
        model=MODEL, input="Name a fruit.", max_output_tokens=8, temperature=0
    )
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input="And a vegetable?",
        max_output_tokens=8,
        temperature=0,
    )
    want = smollm2.chat(
        [
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And a vegetable?"},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert second.output_text == want.text
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, previous_response_id="resp_nope", input="x")
    assert caught.value.code == "previous_response_not_found"
    unstored = client.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, previous_response_id=unstored.id, input="y")


def test_a_tool_round_trip(client: openai.OpenAI, smollm2: tallow.LLM) -> None:
    ask = "What is the weather in Paris?"
    got = client.responses.create(
        model=MODEL,
        input=ask,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        temperature=0,
    )
    (call,) = [item for item in got.output if item.type == "function_call"]
    assert call.name == "get_weather"
    want = smollm2.chat(
        [{"role": "user", "content": ask}],
        max_tokens=64,
        temperature=0,
        tools=[AS_CHAT],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert want.tool_calls is not None
    assert json.loads(call.arguments) == json.loads(want.tool_calls[0].arguments)
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=got.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
        tools=[WEATHER],  # type: ignore[list-item]
        max_output_tokens=12,
        temperature=0,
    )
    expected = smollm2.chat(
        [
            {"role": "user", "content": ask},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny"},
        ],
        max_tokens=12,
        temperature=0,
        tools=[AS_CHAT],
    )
    assert answer.output_text == expected.text
    # The same history given as items, without a stored response.
    items: Any = [
        {"role": "user", "content": ask},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
    ]
    given_items = client.responses.create(
        model=MODEL,
        input=items,
        tools=[WEATHER],
        max_output_tokens=12,
        temperature=0,  # type: ignore[list-item]
    )
    assert given_items.output_text == expected.text
    # Streamed, the call comes as a function_call item with its arguments.
    events = list(
        client.responses.create(
            model=MODEL,
            input=ask,
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=64,
            temperature=0,
            stream=True,
        )
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and all(json.loads(e.arguments) for e in done)


def test_parallel_tool_calls_false_gives_one_call(
    client: openai.OpenAI, smollm2: tallow.LLM
) -> None:
    ask = "What is the weather in Paris?"
    several = smollm2.chat(
        [{"role": "user", "content": ask}],
        max_tokens=64,
        temperature=0,
        tools=[AS_CHAT],
        tool_choice="required",
    )
    assert several.tool_calls is not None and len(several.tool_calls) > 1
    got = client.responses.create(
        model=MODEL,
        input=ask,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=64,
        temperature=0,
    )
    calls = [item for item in got.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [
        (several.tool_calls[0].name, several.tool_calls[0].arguments)
    ]
    assert got.parallel_tool_calls is False


def test_text_format_constrains_the_answer(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"fruit": {"type": "string", "enum": ["apple", "pear"]}},
        "required": ["fruit"],
        "additionalProperties": False,
    }
    got = client.responses.create(
        model=MODEL,
        input="Pick a fruit.",
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
        max_output_tokens=32,
        temperature=0,
    )
    assert json.loads(got.output_text)["fruit"] in ("apple", "pear")
    assert got.status == "completed"
    # The client's stream helper gathers the same response from the events.
    with client.responses.stream(
        model=MODEL,
        input="Pick a fruit.",
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
        max_output_tokens=32,
        temperature=0,
    ) as stream:
        assert stream.get_final_response().output_text == got.output_text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": [{"type": "input_image"}]}, "input"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"model": MODEL, "input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"model": MODEL, "input": "x", "text": {"format": {"type": "yaml"}}}, "text"),
        ({"model": MODEL, "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": MODEL, "input": "word " * 600}, "input"),
        ({"model": MODEL, "input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort"),
        ({"model": MODEL, "input": "x", "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)
def test_bad_responses_requests_are_answered_400(
    server: str, body: dict[str, Any], param: str
) -> None:
    response = httpx.post(f"{server}/v1/responses", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


_FIELDS = [
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "tools",
    "tool_choice",
    "text",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "store",
    "metadata",
    "reasoning",
    "parallel_tool_calls",
]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(changes=st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=4), whole=_json)
def test_no_responses_body_gets_a_server_error(
    server: str, changes: dict[str, Any], whole: object
) -> None:
    body: object = whole
    if changes or not isinstance(whole, dict):
        body = {"model": MODEL, "input": "Hi", "max_output_tokens": 2, **changes}
        tokens = body.get("max_output_tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            body["max_output_tokens"] = min(tokens, 4)
    response = post_hostile(server, "/v1/responses", body)
    if response.status_code >= 400:
        assert set(response.json()["error"]) == OPENAI_ERROR
    elif "text/event-stream" in response.headers["content-type"]:
        assert "event: response." in response.text
    else:
        assert response.json()["object"] == "response"
