"""One request path: the same requests through :class:`tallow.LLM`, :class:`tallow.AsyncLLM`
and the server (the official ``openai`` client), whole and streamed, give the same text, finish
reasons, token counts and log probabilities.

The cases cover what the prompt processor and the output processor decide: text, token-id and
empty prompts, stop strings, stop token ids, logit bias, penalties, min-p, seeded sampling, log
probabilities and chat. Every case names its sampling settings, since the server's defaults are
OpenAI's and the Python API's llama.cpp's.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest

import tallow
from tallow.async_llm import AsyncLLM

MODEL = "smollm2-135m"
N_CTX = 512


@dataclass(frozen=True)
class Case:
    name: str
    prompt: str | list[int] | list[dict[str, str]]
    """A completion's prompt (text or token ids), or a chat's messages."""
    options: dict[str, Any]

    @property
    def chat(self) -> bool:
        return bool(self.prompt) and isinstance(self.prompt[0], dict)


@dataclass(frozen=True)
class Outcome:
    """What a front end gave for a case."""

    text: str
    finish_reason: str | None
    """None where the front end does not report it (AsyncLLM's text streams)."""
    tokens: int | None
    """Completion tokens, where the front end reports them."""
    logprobs: list[tuple[str, float, dict[str, float]]] | None = None
    """Per token: its text, its log probability and the top alternatives."""


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def cases(smollm2: tallow.LLM) -> list[Case]:
    greedy = {"temperature": 0.0}
    prompt = "The three primary colors are"
    # Ban the greedy first token, and stop at the fifth token the biased reply would have.
    banned = smollm2.generate(prompt, max_tokens=1, **greedy).token_ids[0]
    biased = smollm2.generate(prompt, max_tokens=8, logit_bias={banned: -100}, **greedy)
    stop_id = biased.token_ids[4]
    assert stop_id not in biased.token_ids[:4]
    return [
        Case("greedy", "The capital of France is", {"max_tokens": 16, **greedy}),
        Case("stop string", "1, 2, 3, 4,", {"max_tokens": 40, "stop": [" 7", "nine"], **greedy}),
        Case(
            "sampled",
            "Once upon a time",
            {"max_tokens": 24, "temperature": 0.9, "top_k": 30, "top_p": 0.9, "seed": 7},
        ),
        Case(
            "min_p and penalties",
            "The cat sat on the mat. The cat",
            {
                "max_tokens": 24,
                "temperature": 0.7,
                "min_p": 0.1,
                "seed": 3,
                "repetition_penalty": 1.3,
                "frequency_penalty": 0.5,
                "presence_penalty": 0.4,
            },
        ),
        Case(
            "bias and stop ids",
            prompt,
            {
                "max_tokens": 24,
                "logit_bias": {banned: -100},
                "stop_token_ids": [stop_id],
                **greedy,
            },
        ),
        Case("token ids", smollm2.tokenize("def fib(n):"), {"max_tokens": 12, **greedy}),
        Case("empty", "", {"max_tokens": 8, **greedy}),
        Case(
            "logprobs",
            "The sky is",
            {"max_tokens": 8, "logprobs": True, "top_logprobs": 3, **greedy},
        ),
        Case("chat", chat("Name a fruit."), {"max_tokens": 24, **greedy}),
        Case(
            "chat sampled with a stop",
            chat("Write a short poem about rain."),
            {
                "max_tokens": 48,
                "temperature": 0.8,
                "top_k": 40,
                "top_p": 0.95,
                "seed": 11,
                "stop": ["\n"],
            },
        ),
    ]


def python_outcome(result: tallow.GenerationResult, llm_detok: Any) -> Outcome:
    logprobs = None
    if result.logprobs is not None:
        logprobs = [
            (llm_detok([e.token_id]), e.logprob, {llm_detok([t]): lp for t, lp in e.top})
            for e in result.logprobs
        ]
    return Outcome(result.text, result.finish_reason, result.completion_tokens, logprobs)


def run_llm(llm: tallow.LLM, cases: list[Case], stream: bool) -> list[Outcome]:
    out = []
    for case in cases:
        call = (llm.chat_stream if case.chat else llm.stream) if stream else None
        if call is not None:
            pieces = call(case.prompt, **case.options)  # type: ignore[arg-type]
            text = "".join(pieces)
            assert pieces.result is not None and pieces.result.text == text
            out.append(python_outcome(pieces.result, llm.detokenize))
        else:
            generate = llm.chat if case.chat else llm.generate
            out.append(python_outcome(generate(case.prompt, **case.options), llm.detokenize))  # type: ignore[arg-type]
    return out


def run_async_llm(path: Path, cases: list[Case], stream: bool) -> list[Outcome]:
    """Every case at once, as concurrent requests of one AsyncLLM."""
    out: list[Outcome | None] = [None] * len(cases)

    async def one(llm: AsyncLLM, i: int) -> None:
        case = cases[i]
        if stream:
            pieces = llm.chat_stream if case.chat else llm.stream
            text = "".join([p async for p in pieces(case.prompt, **case.options)])  # type: ignore[arg-type]
            out[i] = Outcome(text, None, None)
        else:
            generate = llm.chat if case.chat else llm.generate
            out[i] = python_outcome(await generate(case.prompt, **case.options), llm.detokenize)  # type: ignore[arg-type]

    async def main() -> None:
        async with (
            AsyncLLM(path, n_ctx=N_CTX, max_num_seqs=16) as llm,
            anyio.create_task_group() as tg,
        ):
            for i in range(len(cases)):
                tg.start_soon(one, llm, i)

    anyio.run(main)
    return [o for o in out if o is not None]


def server_body(case: Case) -> dict[str, Any]:
    """The case's options as the server's fields: OpenAI's, then vLLM's in ``extra_body``."""
    options = dict(case.options)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": options.pop("max_tokens")}
    for name in ("temperature", "top_p", "seed", "stop", "frequency_penalty", "presence_penalty"):
        if name in options:
            body[name] = options.pop(name)
    if "logit_bias" in options:
        body["logit_bias"] = {str(t): b for t, b in options.pop("logit_bias").items()}
    if options.pop("logprobs", False):
        k = options.pop("top_logprobs")
        if case.chat:
            body.update(logprobs=True, top_logprobs=k)
        else:
            body["logprobs"] = k
    body["extra_body"] = options  # top_k, min_p, repetition_penalty, stop_token_ids
    if case.chat:
        body["messages"] = case.prompt
    else:
        body["prompt"] = case.prompt
    return body


def completion_logprobs(lp: Any) -> list[tuple[str, float, dict[str, float]]] | None:
    if lp is None:
        return None
    return [
        (t, v, dict(top))
        for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True)
    ]


def chat_logprobs(lp: Any) -> list[tuple[str, float, dict[str, float]]] | None:
    if lp is None or lp.content is None:
        return None
    return [(e.token, e.logprob, {t.token: t.logprob for t in e.top_logprobs}) for e in lp.content]


def run_server(client: openai.OpenAI, cases: list[Case], stream: bool) -> list[Outcome]:
    out = []
    for case in cases:
        body = server_body(case)
        endpoint = client.chat.completions if case.chat else client.completions
        if stream:
            body["stream_options"] = {"include_usage": True}
            text, finish, tokens = [], None, None
            logprobs: list[tuple[str, float, dict[str, float]]] | None = None
            for chunk in endpoint.create(stream=True, **body):
                for c in chunk.choices:
                    text.append((c.delta.content or "") if case.chat else c.text)
                    finish = c.finish_reason or finish
                    got = (
                        chat_logprobs(c.logprobs) if case.chat else completion_logprobs(c.logprobs)
                    )
                    if got is not None:
                        logprobs = (logprobs or []) + got
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            out.append(Outcome("".join(text), finish, tokens, logprobs))
            continue
        done = endpoint.create(**body)
        choice = done.choices[0]
        assert done.usage is not None
        tokens = done.usage.completion_tokens
        if case.chat:
            logprobs = chat_logprobs(choice.logprobs)
            text = choice.message.content or ""
        else:
            logprobs = completion_logprobs(choice.logprobs)
            text = choice.text
        out.append(Outcome(text, choice.finish_reason, tokens, logprobs))
    return out


@pytest.fixture(scope="module")
def expected(smollm2: tallow.LLM, cases: list[Case]) -> list[Outcome]:
    return run_llm(smollm2, cases, stream=False)


def same_logprobs(
    got: list[tuple[str, float, dict[str, float]]],
    want: list[tuple[str, float, dict[str, float]]],
) -> bool:
    """Equal tokens, and log probabilities equal within what a batch of another shape changes."""
    if [(t, sorted(top)) for t, _, top in got] != [(t, sorted(top)) for t, _, top in want]:
        return False
    close = lambda a, b: math.isclose(a, b, abs_tol=1e-3)  # noqa: E731
    return all(
        close(a, b) and all(close(top_a[k], top_b[k]) for k in top_a)
        for (_, a, top_a), (_, b, top_b) in zip(got, want, strict=True)
    )


def test_the_cases_exercise_what_they_name(
    cases: list[Case], expected: list[Outcome], smollm2: tallow.LLM
) -> None:
    """Each case does what it is there for, so that agreeing on it means something."""
    by_name = {c.name: o for c, o in zip(cases, expected, strict=True)}
    greedy = smollm2.generate("Once upon a time", max_tokens=24, temperature=0)
    assert by_name["sampled"].text != greedy.text
    assert by_name["stop string"].finish_reason == "stop"
    assert " 7" not in by_name["stop string"].text and "6" in by_name["stop string"].text
    assert by_name["bias and stop ids"].finish_reason == "stop"
    assert by_name["bias and stop ids"].tokens == 4
    assert by_name["empty"].tokens == 8
    lp = by_name["logprobs"].logprobs
    assert lp is not None and len(lp) == 8 and all(len(top) == 3 for _, _, top in lp)
    assert by_name["chat sampled with a stop"].finish_reason == "stop"
    assert "\n" not in by_name["chat sampled with a stop"].text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("front_end", ["llm", "async_llm", "server"])
def test_every_front_end_gives_the_same_results(
    front_end: str,
    stream: bool,
    cases: list[Case],
    expected: list[Outcome],
    smollm2: tallow.LLM,
    smollm2_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if front_end == "llm":
        got = run_llm(smollm2, cases, stream)
    elif front_end == "async_llm":
        got = run_async_llm(smollm2_path, cases, stream)
    else:
        got = run_server(request.getfixturevalue("client"), cases, stream)
    for case, g, want in zip(cases, got, expected, strict=True):
        assert g.text == want.text, case.name
        if g.finish_reason is not None:
            assert g.finish_reason == want.finish_reason, case.name
        if g.tokens is not None:
            assert g.tokens == want.tokens, case.name
        # AsyncLLM's text streams carry text alone.
        if want.logprobs is not None and not (front_end == "async_llm" and stream):
            assert g.logprobs is not None, case.name
            assert same_logprobs(g.logprobs, want.logprobs), case.name
        elif want.logprobs is None:
            assert g.logprobs is None, case.name


def test_llm_and_async_llm_take_the_same_arguments_with_the_same_defaults() -> None:
    for name in ("generate", "stream", "chat", "chat_stream"):
        sync = inspect.signature(getattr(tallow.LLM, name)).parameters
        async_ = inspect.signature(getattr(AsyncLLM, name)).parameters
        assert [(p.name, p.kind, p.default) for p in sync.values()] == [
            (p.name, p.kind, p.default) for p in async_.values()
        ], name
