"""``tallow serve --replicas 2`` on a local Ray Serve cluster (replicas of one thread each):
the official ``openai`` client gets the same greedy answers as from one ``tallow serve``, a
replica killed in the middle of a stream fails only its own requests and is replaced, and
prefix-aware routing raises the prefix cache's hit rate over random routing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import serving

ray = pytest.importorskip(
    "ray", reason="the replica tests need Ray Serve (pip install 'tallow[ray]'; in the test extra)"
)
serve = pytest.importorskip("ray.serve")

from tallow.ray import REPLICA_HEADER, routing_key  # noqa: E402

MODEL = "smollm2-135m"
ARGS = ("-m", MODEL, "--ctx", "512", "--max-batch", "16", "--replicas", "2", "--threads", "1")


@pytest.fixture(scope="module")
def replicas() -> Iterator[str]:
    """The base URL of two replicas behind prefix-aware routing."""
    with serving(*ARGS) as url:
        yield url


@pytest.fixture
def cluster(replicas: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A driver connected to the replicas' Ray cluster (to see and kill replicas)."""
    # The cluster listens on loopback alone (see tallow.ray.LOOPBACK_ENV): a driver finds it
    # when Ray takes this machine's address to be loopback too, as that variable makes it.
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    ray.init(address="auto", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def running_replicas() -> list[str]:
    """Names of the replica actors that are alive."""
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::tallow#tallow-replica#")
    )


def test_the_routing_key_is_the_prompt_or_the_messages() -> None:
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
    assert routing_key("/v1/chat/completions", json.dumps(chat).encode()) == "system\nS\nuser\nU\n"
    assert routing_key("/v1/completions", b'{"prompt": "abc"}') == "abc"
    assert routing_key("/v1/completions", b'{"prompt": ["abc", "d"]}') == "abc"
    assert routing_key("/v1/completions", b'{"prompt": [1, 2]}') == "[1, 2]"
    assert routing_key("/v1/completions", b"not json") == ""
    assert routing_key("/health", b"") == ""


SYSTEMS = [
    f"You are assistant number {i}. " + " ".join(f"rule-{i}-{j} applies." for j in range(24))
    for i in range(32)
]
QUESTIONS = ["Hello!", "What can you do?"]


def hit_rate(url: str) -> float:
    """Prompt tokens served from the prefix cache over all, for chats that share system
    prompts, sent one at a time with the system prompts taking turns."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    cached = total = 0
    for question in QUESTIONS:
        for system in SYSTEMS:
            done = client.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
                max_tokens=1,
                temperature=0,
            )
            assert done.usage is not None and done.usage.prompt_tokens_details is not None
            cached += done.usage.prompt_tokens_details.cached_tokens or 0
            total += done.usage.prompt_tokens
    return cached / total


def test_prefix_routing_raises_the_prefix_cache_hit_rate_over_random_routing() -> None:
    with serving(*ARGS, "--routing", "prefix") as url:
        prefix = hit_rate(url)
    with serving(*ARGS, "--routing", "random") as url:
        random = hit_rate(url)
    print(f"prefix cache hit rate: prefix-aware routing {prefix:.3f}, random routing {random:.3f}")
    # Each system prompt's first chat computes it; with prefix-aware routing the second finds
    # it, at random half of the time (that random routing comes within 0.1 of prefix-aware
    # routing, 25 lucky draws of 32 or more, has a chance of 1 in 1000).
    assert prefix > 0.4
    assert prefix > random + 0.1


CASES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    {"prompt": "The three primary colors are"},
    {"prompt": "def fibonacci(n):"},
]


def answer(client: openai.OpenAI, case: dict[str, Any], stream: bool) -> tuple[str, str | None]:
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "temperature": 0, **case}
    chat = "messages" in case
    endpoint: Any = client.chat.completions if chat else client.completions
    if not stream:
        choice = endpoint.create(**kw).choices[0]
        return (choice.message.content if chat else choice.text), choice.finish_reason
    text, finish = [], None
    for chunk in endpoint.create(stream=True, **kw):
        for c in chunk.choices:
            text.append((c.delta.content or "") if chat else c.text)
            finish = c.finish_reason or finish
    return "".join(text), finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_replicas_answer_as_one_server(replicas: str, server: str, stream: bool) -> None:
    many = openai.OpenAI(base_url=f"{replicas}/v1", api_key="unused", max_retries=0)
    one = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    for case in CASES:
        assert answer(many, case, stream) == answer(one, case, stream), case
    assert [m.id for m in many.models.list()] == [MODEL]
    # The chat page comes from the replicas too.
    page = httpx.get(f"{replicas}/", timeout=30)
    assert page.status_code == 200 and "chat.js" in page.text


def stream_events(url: str, body: dict[str, Any], on_first: Any = None) -> tuple[str, list[str]]:
    """The replica that answered a streamed request, and its events' data."""
    events: list[str] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        name = r.headers[REPLICA_HEADER]
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3 and on_first is not None:
                    on_first(name)
    return name, events


def test_a_replica_killed_mid_stream_fails_only_its_own_requests(
    replicas: str, cluster: Any
) -> None:
    before = running_replicas()
    assert len(before) == 2
    story = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story about a castle."}],
        "max_tokens": 400,
        "temperature": 0.8,
        "stream": True,
    }
    killed: list[str] = []

    def kill(name: str) -> None:
        killed.append(name)
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)

    name, events = stream_events(replicas, story, on_first=kill)
    assert killed == [name]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "replica" in error["message"] and error["type"] == "server_error"
    # The other replica goes on answering, whole and streamed, while the dead one is replaced.
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda _: httpx.post(f"{replicas}/v1/completions", json=body, timeout=120),
                range(4),
            )
        )
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    assert {r.headers[REPLICA_HEADER] for r in results} <= set(before) - {name}
    deadline = time.monotonic() + 120
    while True:
        now = running_replicas()
        healthy = serve.status().applications["tallow"].deployments["tallow-replica"]
        if len(now) == 2 and name not in now and healthy.replica_states.get("RUNNING") == 2:
            break
        assert time.monotonic() < deadline, f"not replaced: {now}, {healthy.replica_states}"
        time.sleep(0.5)
    _, events = stream_events(replicas, {**story, "max_tokens": 8})
    assert events[-1] == "[DONE]" and "error" not in events[-2]


def test_the_replica_benchmark_runs() -> None:
    """``benches/ray_bench.py`` (whose figures are in the README), on a small load: a rate for
    one server, one replica and two."""
    bench = Path(__file__).parent.parent / "benches" / "ray_bench.py"
    args = ["--clients", "4", "--requests", "1", "--tokens", "8"]
    out = subprocess.run(
        [sys.executable, str(bench), *args], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr
    rates = [float(m.group(1)) for m in re.finditer(r"  +(\d+\.\d)$", out.stdout, re.MULTILINE)]
    assert len(rates) == 3 and all(rate > 0 for rate in rates), out.stdout
