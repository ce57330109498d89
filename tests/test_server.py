"""``tallow serve`` driven over HTTP by the official ``openai`` client (sync and async) and by
raw requests for the error cases.

The server is the session's (conftest's ``server``: a free port of 127.0.0.1, a context of 512
positions). Greedy answers are compared with :class:`tallow.LLM` on the same model.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import anyio
import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tallow

N_CTX = 512
"""The context of conftest's ``server``."""
MODEL = "smollm2-135m"


def metric(server: str, name: str) -> float:
    text = httpx.get(f"{server}/metrics").text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


# -- completions and chat -------------------------------------------------------------------------


def test_models_and_health(server: str, client: openai.OpenAI) -> None:
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_completion_matches_the_python_api(client: openai.OpenAI, smollm2: tallow.LLM) -> None:
    prompt = "The capital of France is"
    expected = smollm2.generate(prompt, max_tokens=12, temperature=0)
    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert done.choices[0].text == expected.text
    assert done.choices[0].finish_reason == expected.finish_reason == "length"
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (
        expected.prompt_tokens,
        12,
    )
    assert done.usage.total_tokens == expected.prompt_tokens + 12

    pieces = []
    finish = None
    usage = None
    for chunk in client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.text)
            finish = c.finish_reason or finish
    assert "".join(pieces) == expected.text
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 12


def test_chat_matches_the_python_api(client: openai.OpenAI, smollm2: tallow.LLM) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
    expected = smollm2.chat(messages, max_tokens=24, temperature=0)
    done = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0
    )
    choice = done.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert done.usage is not None and done.usage.prompt_tokens == expected.prompt_tokens

    roles, pieces, finish = [], [], None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=24, temperature=0, stream=True
    ):
        for c in chunk.choices:
            roles.append(c.delta.role)
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert roles[0] == "assistant"
    assert "".join(pieces) == expected.text
    assert finish == expected.finish_reason


def test_stop_sequences_and_max_tokens(client: openai.OpenAI) -> None:
    prompt = "1, 2, 3, 4, 5,"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    text = full.choices[0].text
    assert full.choices[0].finish_reason == "length"
    assert full.usage is not None and full.usage.completion_tokens == 16
    # Stop at the second comma of the continuation.
    stop = ","
    cut = text.index(stop, text.index(stop) + 1)
    for stream in (False, True):
        if stream:
            pieces = []
            finish = None
            for chunk in client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=16,
                temperature=0,
                stop=["%%", stop],
                stream=True,
            ):
                for c in chunk.choices:
                    pieces.append(c.text)
                    finish = c.finish_reason or finish
            got = "".join(pieces)
        else:
            done = client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=["%%", stop]
            )
            got, finish = done.choices[0].text, done.choices[0].finish_reason
        assert got == text[: text.index(stop)]
        assert finish == "stop"
    assert cut > 0
    short = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0)
    assert short.usage is not None and short.usage.completion_tokens == 3
    assert text.startswith(short.choices[0].text)


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> list[str]:
        done = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=seed, n=2
        )
        return [c.text for c in sorted(done.choices, key=lambda c: c.index)]

    first = sample(1234)
    assert len(first) == 2 and first == sample(1234)
    # The two choices of a request have seeds of their own.
    assert first[0] != first[1]
    assert any(sample(seed) != first for seed in (1, 2, 3))


def test_logprobs(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = done.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 5
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.logprob <= 0
    assert "".join(e.token for e in content) == done.choices[0].message.content


def test_32_concurrent_streaming_clients(server: str, client: openai.OpenAI) -> None:
    prompts = [f"Item {i}: the {w} is" for i, w in enumerate(["sun", "sea", "moon", "road"] * 8)]
    alone = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0)
        .choices[0]
        .text
        for p in prompts
    ]
    aclient = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    results: dict[int, str] = {}

    async def one(i: int) -> None:
        pieces = []
        stream = await aclient.completions.create(
            model=MODEL, prompt=prompts[i], max_tokens=10, temperature=0, stream=True
        )
        async for chunk in stream:
            pieces.extend(c.text for c in chunk.choices)
        results[i] = "".join(pieces)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(one, i)
        await aclient.close()

    anyio.run(main)
    assert [results[i] for i in range(len(prompts))] == alone


# -- disconnects ----------------------------------------------------------------------------------


def test_a_disconnected_stream_frees_its_pages(server: str) -> None:
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        events = 0
        while events < 3:
            events += next(lines).startswith("data: ")
        # Still reading: the request holds pages. Leaving the block closes the connection.
        assert metric(server, "tallow_kv_pages_used") > 0
        assert metric(server, "tallow_requests_running") == 1
    deadline = time.monotonic() + 30
    while metric(server, "tallow_kv_pages_used") > 0 or metric(server, "tallow_requests_running"):
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.1)
    assert metric(server, "tallow_requests_waiting") == 0


def test_a_client_gone_before_a_whole_answer_frees_its_pages(server: str) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/completions", json=body, timeout=1.0)
    deadline = time.monotonic() + 30
    while metric(server, "tallow_kv_pages_used") > 0 or metric(server, "tallow_requests_running"):
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.1)


def test_metrics_count_requests_and_tokens(server: str, client: openai.OpenAI) -> None:
    before = metric(server, "tallow_generation_tokens_total")
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    assert metric(server, "tallow_generation_tokens_total") == before + 4
    text = httpx.get(f"{server}/metrics").text
    for name in (
        "tallow_time_to_first_token_seconds_bucket",
        "tallow_inter_token_latency_seconds_bucket",
        'tallow_requests_total{endpoint="/v1/completions",status="200"}',
        "tallow_kv_pages_total",
        "tallow_requests_waiting",
        "tallow_prefix_cache_hit_tokens_total",
        "tallow_prefix_cache_queried_tokens_total",
        "tallow_prefix_cache_evicted_pages_total",
        "tallow_prefix_cache_pages",
    ):
        assert name in text


def requests_counted(server: str, endpoint: str, status: int) -> float:
    """``tallow_requests_total`` of ``endpoint`` answered with ``status`` (0 before any)."""
    text = httpx.get(f"{server}/metrics").text
    labels = re.escape(f'{{endpoint="{endpoint}",status="{status}"}}')
    match = re.search(rf"^tallow_requests_total{labels} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


EXPLODING = 'start: a\na: a a | "x" | a a a\n'
"""A grammar whose parse grows with every token, beyond the limits on its work after about a
hundred tokens: the request fails while it is generated."""


def test_metrics_count_requests_by_the_status_sent(server: str, smollm2: tallow.LLM) -> None:
    """A request that fails while it is generated is counted as the 400 it gets; its stream,
    whose 200 was sent before the failure (an error event ends it), as a 200."""
    endpoint = "/v1/completions"
    body = {
        "model": MODEL,
        "prompt": "x",
        "max_tokens": 400,
        "temperature": 0,
        "logit_bias": {str(t): -100 for t in smollm2.eog_ids},
        "guided_grammar": EXPLODING,
    }
    before = {status: requests_counted(server, endpoint, status) for status in (200, 400)}
    assert httpx.post(f"{server}{endpoint}", json=body, timeout=120).status_code == 400
    assert requests_counted(server, endpoint, 400) == before[400] + 1
    assert requests_counted(server, endpoint, 200) == before[200]
    with httpx.stream(
        "POST", f"{server}{endpoint}", json={**body, "stream": True}, timeout=120
    ) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and '"error"' in events[-2]
    assert requests_counted(server, endpoint, 200) == before[200] + 1
    assert requests_counted(server, endpoint, 400) == before[400] + 1


# -- bad requests ---------------------------------------------------------------------------------


def post(server: str, path: str, body: object, **headers: str) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {"content-type": "application/json", **headers}
    return httpx.post(f"{server}{path}", content=content, headers=headers, timeout=60)


OPENAI_ERROR = {"message", "type", "param", "code"}
"""The fields of OpenAI's error object."""


def post_hostile(server: str, path: str, body: object) -> httpx.Response:
    """``body`` posted as a hostile client would send it (JSON with ASCII escapes, so that lone
    surrogates travel as ``\\ud800``); the answer, which must not be a 5xx."""
    response = post(server, path, json.dumps(body, ensure_ascii=True))
    assert response.status_code < 500, response.text
    return response


def assert_error(
    response: httpx.Response, status: int, param: str | None, code: str | None
) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert (error["param"], error["code"]) == (param, code)


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"model": MODEL, "prompt": "Hi"}


def _raw(field: str, value: bytes) -> bytes:
    """A request body whose ``field`` is the raw JSON ``value`` (which json.dumps cannot
    write: too deep, or not valid Unicode)."""
    base = {**(CHAT if field == "messages" else COMPLETION), field: None}
    head = json.dumps(base).encode()
    return head.replace(f'"{field}": null'.encode(), f'"{field}": '.encode() + value)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [
        ("/v1/completions", b"{not json", 400, None, "invalid_json"),
        # Nesting past what a parser's recursion takes.
        ("/v1/completions", b"[" * 100_000, 400, None, "invalid_json"),
        ("/v1/chat/completions", b'{"a":' * 100_000, 400, None, "invalid_json"),
        ("/v1/completions", _raw("prompt", b"[" * 5000 + b"]" * 5000), 400, None, "invalid_json"),
        ("/v1/completions", _raw("prompt", b"[" * 70 + b"]" * 70), 400, None, "invalid_json"),
        # Lone surrogates, which JSON can spell but Unicode text cannot hold.
        ("/v1/completions", _raw("prompt", b'"a\\ud800b"'), 400, None, "invalid_json"),
        (
            "/v1/chat/completions",
            _raw("messages", b'[{"role": "user", "content": "\\udfff"}]'),
            400,
            None,
            "invalid_json",
        ),
        ("/v1/completions", _raw("stop", b'"\\ud800"'), 400, None, "invalid_json"),
        # Integers of more digits than Python reads, or beyond any float.
        ("/v1/completions", _raw("seed", b"1" * 5000), 400, None, "invalid_json"),
        ("/v1/completions", _raw("max_tokens", b"9" * 5000), 400, None, "invalid_json"),
        ("/v1/chat/completions", _raw("temperature", b"7" * 5000), 400, None, "invalid_json"),
        ("/v1/completions", _raw("temperature", b"7" * 400), 400, "temperature", "invalid_value"),
        ("/v1/completions", _raw("top_p", b"-" + b"7" * 400), 400, "top_p", "invalid_value"),
        ("/v1/completions", _raw("seed", b"7" * 400), 400, "seed", "invalid_value"),
        ("/v1/chat/completions", b"\xff\xfe", 400, None, "invalid_json"),
        ("/v1/completions", [1, 2], 400, None, "invalid_body"),
        ("/v1/completions", {"prompt": "Hi"}, 400, "model", "missing_required_parameter"),
        ("/v1/completions", {"model": MODEL}, 400, "prompt", "missing_required_parameter"),
        ("/v1/chat/completions", {"model": MODEL}, 400, "messages", "invalid_type"),
        ("/v1/completions", {**COMPLETION, "model": 7}, 400, "model", "invalid_type"),
        ("/v1/completions", {**COMPLETION, "max_tokens": "ten"}, 400, "max_tokens", "invalid_type"),
        (
            "/v1/completions",
            {**COMPLETION, "temperature": "hot"},
            400,
            "temperature",
            "invalid_type",
        ),
        ("/v1/completions", {**COMPLETION, "stream": "yes"}, 400, "stream", "invalid_type"),
        ("/v1/completions", {**COMPLETION, "stop": [1]}, 400, "stop", "invalid_type"),
        ("/v1/completions", {**COMPLETION, "prompt": {"a": 1}}, 400, "prompt", "invalid_type"),
        ("/v1/completions", {**COMPLETION, "prompt": [1, 10**9]}, 400, "prompt", "invalid_value"),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "robot", "content": "x"}]},
            400,
            "messages",
            "invalid_value",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": 5}]},
            400,
            "messages",
            "invalid_value",
        ),
        ("/v1/completions", {**COMPLETION, "model": "gpt-4"}, 404, "model", "model_not_found"),
        ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "model", "model_not_found"),
        (
            "/v1/completions",
            {**COMPLETION, "prompt": "word " * 600},
            400,
            "prompt",
            "context_length_exceeded",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": "word " * 600}]},
            400,
            "messages",
            "context_length_exceeded",
        ),
        ("/v1/completions", {**COMPLETION, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
        ("/v1/completions", {**COMPLETION, "max_tokens": -5}, 400, "max_tokens", "invalid_value"),
        (
            "/v1/completions",
            {**COMPLETION, "max_tokens": N_CTX + 1},
            400,
            "max_tokens",
            "invalid_value",
        ),
        (
            "/v1/completions",
            {**COMPLETION, "max_tokens": N_CTX},
            400,
            "max_tokens",
            "context_length_exceeded",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "max_completion_tokens": 10**6},
            400,
            "max_completion_tokens",
            "invalid_value",
        ),
        ("/v1/completions", {**COMPLETION, "temperature": 3}, 400, "temperature", "invalid_value"),
        ("/v1/completions", {**COMPLETION, "top_p": 1.5}, 400, "top_p", "invalid_value"),
        ("/v1/completions", {**COMPLETION, "n": 0}, 400, "n", "invalid_value"),
        (
            "/v1/completions",
            {**COMPLETION, "presence_penalty": 9},
            400,
            "presence_penalty",
            "invalid_value",
        ),
        (
            "/v1/completions",
            {**COMPLETION, "logit_bias": {"abc": 1}},
            400,
            "logit_bias",
            "invalid_value",
        ),
        (
            "/v1/completions",
            {**COMPLETION, "logit_bias": {"5": 500}},
            400,
            "logit_bias",
            "invalid_value",
        ),
        (
            "/v1/completions",
            {**COMPLETION, "stop_token_ids": [2, 10**6]},
            400,
            "stop_token_ids",
            "invalid_value",
        ),
        (
            "/v1/completions",
            {**COMPLETION, "stop_token_ids": "2"},
            400,
            "stop_token_ids",
            "invalid_type",
        ),
        ("/v1/completions", {**COMPLETION, "logprobs": 99}, 400, "logprobs", "invalid_value"),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs", "invalid_value"),
        (
            "/v1/completions",
            {**COMPLETION, "stream_options": {"include_usage": True}},
            400,
            "stream_options",
            "invalid_value",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "tools": [{"type": "function"}]},
            400,
            "tools",
            "invalid_value",
        ),
    ],
)
def test_bad_requests_get_an_openai_error(
    server: str, path: str, body: object, status: int, param: str | None, code: str | None
) -> None:
    assert_error(post(server, path, body), status, param, code)


def test_unknown_routes_and_methods(server: str) -> None:
    assert httpx.get(f"{server}/v1/nothing").status_code == 404
    assert httpx.get(f"{server}/v1/nothing").json()["error"]["message"]
    response = httpx.get(f"{server}/v1/completions")
    assert response.status_code == 405
    assert response.json()["error"]["message"]
    assert_error(httpx.get(f"{server}/v1/models/gpt-4"), 404, "model", "model_not_found")


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**600), max_value=10**600)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["\ud800", "a\udfffb", "<|im_end|>", "\ufdd0", "", MODEL, "user"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
) | st.integers(1, 100).map(_nested)
_FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stop",
    "seed",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "user",
    "echo",
    "best_of",
    "suffix",
    "tools",
    "functions",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
    changes=st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=4),
    whole=_json,
)
def test_no_request_body_gets_a_server_error(
    server: str, path: str, changes: dict[str, Any], whole: object
) -> None:
    """Random JSON values (nesting, huge integers, lone surrogates, odd types) in the fields of
    a valid request, or as the whole body: a 4xx with an error body, or an answer."""
    body: object = whole
    if changes or not isinstance(whole, dict):
        fields: dict[str, Any] = {
            **(CHAT if "chat" in path else COMPLETION),
            "max_tokens": 2,
            **changes,
        }
        # Keep the answers short.
        for name in ("max_tokens", "max_completion_tokens"):
            value = fields.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 4:
                fields[name] = 4
        if fields.get("max_tokens") is None and fields.get("max_completion_tokens") is None:
            fields["max_tokens"] = 2
        body = fields
    response = post_hostile(server, path, body)
    if response.status_code >= 400:
        assert set(response.json()["error"]) == OPENAI_ERROR
    elif "text/event-stream" in response.headers["content-type"]:
        assert response.text.rstrip().endswith("data: [DONE]")
    else:
        assert response.json()["choices"]


def test_a_huge_prompt_does_not_stall_the_server(server: str) -> None:
    """Tokenizing a 5 MB single-word prompt takes seconds: it runs off the event loop, so the
    server answers others meanwhile."""
    body = json.dumps({**COMPLETION, "prompt": "a" * 5_000_000})
    done: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: done.append(post(server, "/v1/completions", body)))
    sender.start()
    time.sleep(0.3)  # the body is on its way or being tokenized
    latencies = []
    while sender.is_alive() and len(latencies) < 20:
        start = time.monotonic()
        assert httpx.get(f"{server}/health", timeout=10).status_code == 200
        latencies.append(time.monotonic() - start)
        time.sleep(0.1)
    sender.join(timeout=120)
    assert done and done[0].status_code == 400, done
    assert done[0].json()["error"]["code"] == "context_length_exceeded"
    assert latencies and max(latencies) < 1.0, latencies


def test_usage_counts_the_prompt_tokens_served_from_the_prefix_cache(
    client: openai.OpenAI, smollm2: tallow.LLM
) -> None:
    """A prompt seen before is served from the prefix cache in whole pages (16 tokens), short
    of its last token; OpenAI's usage.prompt_tokens_details.cached_tokens says how many."""
    prompt = "Caching, once more: " + " ".join(f"item{i}" for i in range(48))
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    stream = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=2,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    streamed = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert first.usage is not None and again.usage is not None and len(streamed) == 1
    n = first.usage.prompt_tokens
    cached = [u.prompt_tokens_details.cached_tokens for u in (first.usage, again.usage, *streamed)]
    assert cached == [0, (n - 1) // 16 * 16, (n - 1) // 16 * 16]
    # The Python API reports the same.
    results = [smollm2.generate(prompt + " (direct)", max_tokens=1) for _ in range(2)]
    assert results[0].cached_tokens == 0
    assert results[1].cached_tokens == (results[1].prompt_tokens - 1) // 16 * 16 > 0
