"""Structured output: JSON schemas, choices, regular expressions and grammars constrain what
smollm2-135m generates, through every front end: :class:`tallow.LLM`, :class:`AsyncLLM` and
the server (driven by the official ``openai`` client), streamed and not, greedy and sampled.
Each output is checked by an independent oracle (``json.loads`` and ``jsonschema``,
``re.fullmatch``), and the three front ends give the same outputs for the same requests.

Every schema bounds its strings, numbers and arrays and closes its objects
(``additionalProperties: false``), so that a complete output always fits the token budget:
any unfinished output fails its test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import jsonschema
import numpy as np
import openai
import pydantic
import pytest

import tallow
from tallow import _core, structured
from tallow.async_llm import AsyncLLM
from tallow.tools import check_tools

MODEL = "smollm2-135m"
N_CTX = 512
"""The context of the requests (and of conftest's ``server``)."""
MAX_TOKENS = 320


def text(n: int = 24) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


def integer(low: int = 0, high: int = 1000) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high}


def obj(required: list[str] | None = None, **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


def array(items: dict[str, Any], most: int = 3, least: int = 0) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": least, "maxItems": most}


SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("a person", obj(name=text(), age=integer(0, 120))),
    ("a book", obj(title=text(40), author=text(), year=integer(1400, 2030))),
    ("a city", obj(name=text(), country=text(), population=integer(0, 40_000_000))),
    ("a traffic light", obj(color={"enum": ["red", "amber", "green"]})),
    ("a yes/no answer", obj(answer={"type": "boolean"}, reason=text(60))),
    ("a shopping list", obj(items=array(text(16), most=4, least=1))),
    ("a point", obj(x={"type": "number", "minimum": -100, "maximum": 100}, y=integer(-100, 100))),
    ("a user", obj(user=obj(id=integer(), email=text(30)), active={"type": "boolean"})),
    (
        "an order",
        obj(
            id=integer(1, 99999),
            lines=array(obj(sku=text(8), qty=integer(1, 20)), most=2, least=1),
            status={"enum": ["new", "paid", "shipped"]},
        ),
    ),
    ("a color", obj(rgb=array(integer(0, 255), most=3, least=3))),
    ("a tag cloud", obj(tags=array({"enum": ["red", "blue", "green", "gold"]}, most=3))),
    (
        "a movie",
        obj(
            required=["title"],
            title=text(),
            rating={"type": "number", "minimum": 0, "maximum": 10},
            genre={"enum": ["drama", "comedy", "horror"]},
        ),
    ),
    (
        "a recipe",
        obj(dish=text(), steps=array(text(30), most=3, least=1), vegan={"type": "boolean"}),
    ),
    ("a weather report", obj(city=text(), celsius=integer(-50, 50), sky={"enum": ["sun", "rain"]})),
    (
        "a nested config",
        obj(server=obj(host=text(), port=integer(1, 65535)), debug={"type": "boolean"}),
    ),
    ("a pet", obj(kind={"enum": ["cat", "dog", "fish"]}, name=text(12), legs={"enum": [0, 2, 4]})),
    ("a chess move", obj(piece={"enum": ["king", "queen", "rook", "pawn"]}, square=text(2))),
    ("a matrix", obj(rows=array(array(integer(0, 9), most=2, least=2), most=2, least=2))),
    (
        "a contact",
        obj(
            required=["name", "phones"],
            name=text(),
            phones=array(obj(kind={"enum": ["home", "work"]}, number=text(12)), most=2, least=1),
            note={"type": ["string", "null"], "maxLength": 20},
        ),
    ),
    ("an empty report", obj(ok={"const": True}, errors=array(text(10), most=0))),
]

CHOICES = ["positive", "negative", "neutral"]
REGEX = r"[A-Z][a-z]{2,8} [0-9]{1,2}, (19|20)[0-9]{2}"


def cases() -> list[tuple[str, dict[str, Any], str]]:
    """(user message, the option that constrains the answer, what checks it) for every case:
    the 20 schemas, then choices and regular expressions."""
    out: list[tuple[str, dict[str, Any], str]] = [
        (f"Describe {what} as JSON.", {"json_schema": schema}, "json_schema")
        for what, schema in SCHEMAS
    ]
    for review in ["I loved this film!", "Terrible service.", "It was fine, I guess."]:
        out.append((f"Sentiment of: {review}", {"choice": CHOICES}, "choice"))
    for event in ["the moon landing", "the fall of the Berlin wall"]:
        out.append((f"When was {event}? Answer with a date.", {"regex": REGEX}, "regex"))
    return out


CASES = cases()


def check(option: dict[str, Any], output: str) -> None:
    """The oracle: the output parses as the option asks."""
    if "json_schema" in option:
        jsonschema.validate(json.loads(output), option["json_schema"])
    elif "choice" in option:
        assert output in option["choice"], output
    else:
        assert re.fullmatch(option["regex"], output), output


def messages(message: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": message}]


def sampling(mode: str, i: int) -> dict[str, Any]:
    """Greedy, or sampled with every parameter given (the front ends' defaults differ)."""
    if mode == "greedy":
        return {"temperature": 0}
    return {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 100 + i}


# -- the three front ends -------------------------------------------------------------------------


def run_llm(llm: tallow.LLM, mode: str, stream: bool) -> list[str]:
    outputs = []
    for i, (message, option, _) in enumerate(CASES):
        kw: dict[str, Any] = {"max_tokens": MAX_TOKENS, **sampling(mode, i), **option}
        if stream:
            pieces = llm.chat_stream(messages(message), **kw)
            text = "".join(pieces)
            assert pieces.result is not None and pieces.result.finish_reason == "stop"
        else:
            result = llm.chat(messages(message), **kw)
            assert result.finish_reason == "stop", result.text
            text = result.text
        outputs.append(text)
    return outputs


def run_async_llm(path: Path, mode: str, stream: bool) -> list[str]:
    """Every case at once, as concurrent requests of one AsyncLLM."""
    outputs: list[str] = [""] * len(CASES)

    async def one(llm: AsyncLLM, i: int) -> None:
        message, option, _ = CASES[i]
        kw: dict[str, Any] = {"max_tokens": MAX_TOKENS, **sampling(mode, i), **option}
        if stream:
            outputs[i] = "".join([p async for p in llm.chat_stream(messages(message), **kw)])
        else:
            done = await llm.chat(messages(message), **kw)
            assert done.finish_reason == "stop", done.text
            outputs[i] = done.text

    async def main() -> None:
        async with (
            AsyncLLM(path, n_ctx=N_CTX, max_num_seqs=32) as llm,
            anyio.create_task_group() as tg,
        ):
            for i in range(len(CASES)):
                tg.start_soon(one, llm, i)

    anyio.run(main)
    return outputs


def server_fields(option: dict[str, Any], i: int) -> dict[str, Any]:
    """The option as the server takes it: OpenAI's response_format, vLLM's guided_* fields."""
    if "json_schema" in option:
        schema = {"name": f"case{i}", "schema": option["json_schema"], "strict": True}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    if "choice" in option:
        return {"extra_body": {"guided_choice": option["choice"]}}
    return {"extra_body": {"guided_regex": option["regex"]}}


def run_server(client: openai.OpenAI, mode: str, stream: bool) -> list[str]:
    outputs = []
    for i, (message, option, _) in enumerate(CASES):
        params = sampling(mode, i)
        fields = server_fields(option, i)
        # top_k is one of vLLM's fields, beside OpenAI's.
        extra = {**fields.pop("extra_body", {}), **{"top_k": params.pop("top_k", 0)}}
        kw: dict[str, Any] = {
            "model": MODEL,
            "messages": messages(message),
            "max_tokens": MAX_TOKENS,
            "extra_body": extra,
            **params,
            **fields,
        }
        if stream:
            pieces, finish = [], None
            for chunk in client.chat.completions.create(stream=True, **kw):
                for c in chunk.choices:
                    pieces.append(c.delta.content or "")
                    finish = c.finish_reason or finish
            assert finish == "stop"
            outputs.append("".join(pieces))
        else:
            done = client.chat.completions.create(**kw)
            assert done.choices[0].finish_reason == "stop"
            outputs.append(done.choices[0].message.content or "")
    return outputs


@pytest.fixture(scope="module")
def expected(smollm2: tallow.LLM) -> dict[str, list[str]]:
    """Each case's output from LLM.chat, one request at a time, greedy and sampled; each
    checked by its oracle."""
    out = {mode: run_llm(smollm2, mode, stream=False) for mode in ("greedy", "sampled")}
    for outputs in out.values():
        for (_, option, _), output in zip(CASES, outputs, strict=True):
            check(option, output)
    return out


# -- the tests ------------------------------------------------------------------------------------


def test_every_case_parses_as_asked(expected: dict[str, list[str]]) -> None:
    """The oracle holds (checked in the fixture) and sampling is not greedy in disguise."""
    assert len(SCHEMAS) == 20
    assert expected["greedy"] != expected["sampled"]
    kinds = {kind for _, _, kind in CASES}
    assert kinds == {"json_schema", "choice", "regex"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("front_end", ["llm", "async_llm", "server"])
def test_front_ends_give_the_same_constrained_outputs(
    front_end: str,
    mode: str,
    stream: bool,
    expected: dict[str, list[str]],
    smollm2: tallow.LLM,
    smollm2_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if front_end == "llm":
        outputs = run_llm(smollm2, mode, stream)
    elif front_end == "async_llm":
        outputs = run_async_llm(smollm2_path, mode, stream)
    else:
        outputs = run_server(request.getfixturevalue("client"), mode, stream)
    for (_, option, _), output in zip(CASES, outputs, strict=True):
        check(option, output)
    assert outputs == expected[mode]


def test_constrained_and_free_requests_together_match_each_alone(
    smollm2: tallow.LLM, smollm2_path: Path
) -> None:
    """8 constrained requests among unconstrained ones, at once: each gives what it gives
    alone."""
    mixed = [(m, o) for m, o, _ in CASES[:8]] + [(f"Tell me about {w}.", {}) for w in "abcd"]
    alone = [smollm2.chat(messages(m), max_tokens=48, temperature=0, **o).text for m, o in mixed]
    together: list[str] = [""] * len(mixed)

    async def main() -> None:
        async with AsyncLLM(smollm2_path, n_ctx=N_CTX, max_num_seqs=16) as llm:

            async def one(i: int) -> None:
                m, o = mixed[i]
                done = await llm.chat(messages(m), max_tokens=48, temperature=0, **o)
                together[i] = done.text

            async with anyio.create_task_group() as tg:
                for i in range(len(mixed)):
                    tg.start_soon(one, i)

    anyio.run(main)
    assert together == alone


def test_speculative_decoding_keeps_to_the_constraint(smollm2: tallow.LLM) -> None:
    """Drafted tokens the constraint does not allow are rejected: greedy output unchanged,
    sampled output still parses."""
    for i, (message, option, _) in enumerate(CASES[::3]):
        plain = smollm2.chat(messages(message), max_tokens=MAX_TOKENS, temperature=0, **option)
        fast = smollm2.chat(
            messages(message), max_tokens=MAX_TOKENS, temperature=0, speculative=4, **option
        )
        assert fast.text == plain.text
        sampled = smollm2.chat(
            messages(message),
            max_tokens=MAX_TOKENS,
            temperature=0.9,
            seed=i,
            speculative=4,
            **option,
        )
        assert sampled.finish_reason == "stop"
        check(option, sampled.text)


def test_the_sampler_rejects_what_the_constraint_forbids(smollm2_path: Path) -> None:
    """Directly on a sampler: a drafted token the constraint does not allow is rejected even
    where the model is sure of it, and the token drawn instead is allowed."""
    model = _core.Model(str(smollm2_path))
    yes, no, maybe = (model.tokenize(w, False, False)[0] for w in ("yes", "no", "maybe"))
    logits = np.zeros((2, model.n_vocab), dtype=np.float32)
    logits[:, maybe] = 30.0
    logits[:, no] = 5.0
    for temperature in (0.0, 1.0):
        sampler = _core.Sampler(
            temperature, 0, 1.0, 7, constraint=model.constraint("choice", ["yes", "no"])
        )
        ((token, _, _),) = sampler.verify(logits, [maybe])
        assert token in (yes, no)
    greedy = _core.Sampler(0.0, 0, 1.0, constraint=model.constraint("choice", ["yes", "no"]))
    assert _core.sample_batch([greedy], logits[:1])[0][0] == no


def test_json_object_and_grammar(smollm2: tallow.LLM, client: openai.OpenAI) -> None:
    # Any JSON object has no bound on its size: prompts whose answer is short with the kernels
    # of every instruction set (greedy decoding follows their rounding: "Return {"status":
    # "ok"} as JSON." loops on AVX-512 and stops on AVX2).
    for prompt in [
        'Give me a JSON object with one key, "status", whose value is "ok".',
        'Give me a JSON object with one key, "answer", whose value is 42.',
    ]:
        out = smollm2.chat(messages(prompt), max_tokens=MAX_TOKENS, temperature=0, json_object=True)
        assert out.finish_reason == "stop" and isinstance(json.loads(out.text), dict)
        done = client.chat.completions.create(
            model=MODEL,
            messages=messages(prompt),
            max_tokens=MAX_TOKENS,
            temperature=0,
            response_format={"type": "json_object"},
        )
        assert done.choices[0].message.content == out.text
    # Sums of at most four terms: every output ends within the budget.
    lark = 'start: "(" NUM ("+" NUM)? ("+" NUM)? ("+" NUM)? ")"\nNUM: /[1-9][0-9]?/'
    sums = r"\([1-9][0-9]?(\+[1-9][0-9]?){0,3}\)"
    for seed in range(4):
        sampled = {"temperature": 0.9, "top_p": 0.95, "seed": seed}
        out = smollm2.generate("A sum:", max_tokens=40, top_k=40, grammar=lark, **sampled)
        assert out.finish_reason == "stop" and re.fullmatch(sums, out.text), out.text
        done = client.completions.create(
            model=MODEL,
            prompt="A sum:",
            max_tokens=40,
            extra_body={"guided_grammar": lark, "top_k": 40},
            **sampled,
        )
        assert done.choices[0].text == out.text


def test_a_pydantic_model_is_a_schema(smollm2: tallow.LLM) -> None:
    class Pet(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        name: str = pydantic.Field(max_length=12)
        legs: int = pydantic.Field(ge=0, le=8)

    out = smollm2.chat(messages("Describe a pet."), max_tokens=MAX_TOKENS, json_schema=Pet)
    pet = Pet.model_validate_json(out.text)
    assert 0 <= pet.legs <= 8


def test_strict_schemas_close_the_objects_that_do_not_say() -> None:
    """OpenAI's strict mode: an object schema that says neither ``additionalProperties`` nor
    ``unevaluatedProperties`` takes no keys it does not name, wherever it is (properties,
    items, definitions, branches); what a schema says is kept, and ``allOf``'s branches stay
    open (closing each would forbid the others' keys)."""
    leaf = {"type": "object", "properties": {"a": {"type": "string"}}}
    schema = {
        "type": "object",
        "properties": {"x": leaf, "list": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
        "$defs": {"item": {"properties": {"b": {"type": "integer"}}}},
        "anyOf": [leaf, {"type": "string"}],
        "allOf": [{"type": "object", "properties": {"y": leaf}}],
        "patternProperties": {"^o": {"type": "object", "additionalProperties": True}},
    }
    got = structured.closed(schema)
    assert got["additionalProperties"] is False
    assert got["properties"]["x"]["additionalProperties"] is False
    assert got["$defs"]["item"]["additionalProperties"] is False
    assert got["anyOf"][0]["additionalProperties"] is False
    assert got["anyOf"][1] == {"type": "string"}
    assert "additionalProperties" not in got["allOf"][0]
    assert got["allOf"][0]["properties"]["y"]["additionalProperties"] is False
    assert got["patternProperties"]["^o"]["additionalProperties"] is True
    assert "additionalProperties" not in schema and "additionalProperties" not in leaf
    # A strict tool's parameters are closed the same way; other tools' are left as given.
    tools = [
        {"type": "function", "function": {"name": name, "parameters": leaf, **extra}}
        for name, extra in [("strict", {"strict": True}), ("loose", {})]
    ]
    strict, loose = (t["function"]["parameters"] for t in check_tools(tools))
    assert strict["additionalProperties"] is False and "additionalProperties" not in loose
    with pytest.raises(tallow.InvalidArgumentError, match="strict must be a boolean"):
        check_tools([{"type": "function", "function": {"name": "f", "strict": "yes"}}])


def test_a_strict_response_format_keeps_to_the_keys_it_names(client: openai.OpenAI) -> None:
    """A schema of ``{"tags": [...]}`` that does not say ``additionalProperties`` (as
    pydantic's do not): read as JSON Schema reads it, smollm2 adds a key of its own
    (``{"tags": [", "], "json": {", ": "}, "}}``); with ``"strict": true`` it gives exactly
    the object named. Its strings and list are bounded, so the answer ends in the budget."""
    tags = {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}
    schema = {"type": "object", "properties": {"tags": tags}, "required": ["tags"]}
    done = client.chat.completions.create(
        model=MODEL,
        messages=messages("List three colors as JSON tags."),
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "tags", "schema": schema, "strict": True},
        },
    )
    assert done.choices[0].finish_reason == "stop"
    answer = json.loads(done.choices[0].message.content or "")
    assert set(answer) == {"tags"}
    with pytest.raises(openai.BadRequestError, match="strict' must be a boolean"):
        client.chat.completions.create(
            model=MODEL,
            messages=messages("Hi"),
            max_tokens=4,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "t", "schema": schema, "strict": "yes"},
            },
        )


# -- bad constraints ------------------------------------------------------------------------------

EXPLODING = [f"word{i}" for i in range(200_000)]
"""A choice far beyond the limit on a constraint's source (128 KiB)."""

BAD: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    # (Python option, server fields, what the message says)
    ({"json_schema": {"type": 5}}, {"guided_json": {"type": 5}}, "JSON schema"),
    (
        {"json_schema": {"$ref": "#/nowhere"}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/x"}}}},
        "JSON schema",
    ),
    ({"regex": "(unclosed"}, {"guided_regex": "(unclosed"}, "regular expression"),
    ({"grammar": "start: missing"}, {"guided_grammar": "start: missing"}, "grammar"),
    ({"choice": EXPLODING}, {"guided_choice": EXPLODING}, "bytes long"),
]


@pytest.mark.parametrize(("option", "fields", "needle"), BAD)
def test_bad_constraints_are_grammar_errors_and_400s(
    option: dict[str, Any],
    fields: dict[str, Any],
    needle: str,
    smollm2: tallow.LLM,
    smollm2_path: Path,
    server: str,
) -> None:
    with pytest.raises(tallow.GrammarError, match=needle):
        smollm2.generate("Hi", max_tokens=4, **option)

    async def main() -> None:
        async with AsyncLLM(smollm2_path, n_ctx=N_CTX) as llm:
            with pytest.raises(tallow.GrammarError, match=needle):
                await llm.generate("Hi", max_tokens=4, **option)

    anyio.run(main)
    body = {"model": MODEL, "messages": messages("Hi"), "max_tokens": 4, **fields}
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert needle.lower() in error["message"].lower()
    assert error["param"] == next(iter(fields))


AMBIGUOUS = 'start: a\na: a a | "x" | a a a\n'
"""A grammar whose parse grows with every token: it goes beyond the limits on its work after
about a hundred tokens, while generating."""


def test_a_grammar_that_explodes_while_generating_fails_its_request(
    smollm2: tallow.LLM, smollm2_path: Path, server: str
) -> None:
    """Every front end reports the failure as the constraint's error, never as a normal end
    of the text: GrammarError in Python, a 400 naming the field from the server (an error
    event once a stream has begun)."""
    bias = {t: -100.0 for t in smollm2.eog_ids}  # no way out: the parse must grow
    kw: dict[str, Any] = {"max_tokens": 400, "temperature": 0, "logit_bias": bias}
    with pytest.raises(tallow.GrammarError, match="max is 500"):
        smollm2.generate("x", grammar=AMBIGUOUS, **kw)
    stream = smollm2.stream("x", grammar=AMBIGUOUS, **kw)
    with pytest.raises(tallow.GrammarError, match="max is 500"):
        for _ in stream:
            pass
    assert stream.result is None

    async def main() -> None:
        async with AsyncLLM(smollm2_path, n_ctx=N_CTX) as llm:
            with pytest.raises(tallow.GrammarError, match="max is 500"):
                await llm.generate("x", grammar=AMBIGUOUS, **kw)
            # The engine goes on serving.
            done = await llm.generate("x", max_tokens=3, temperature=0)
            assert done.completion_tokens == 3

    anyio.run(main)
    body = {
        "model": MODEL,
        "prompt": "x",
        "max_tokens": 400,
        "temperature": 0,
        "logit_bias": {str(t): -100 for t in bias},
        "guided_grammar": AMBIGUOUS,
    }
    r = httpx.post(f"{server}/v1/completions", json=body, timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "guided_grammar"
    assert "max is 500" in r.json()["error"]["message"]
    with httpx.stream(
        "POST", f"{server}/v1/completions", json={**body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["param"] == "guided_grammar" and "max is 500" in error["message"]
    # Text before the failure was streamed, and no event claimed a normal end.
    texts = [json.loads(e)["choices"][0] for e in events[:-2]]
    assert texts and all(c["finish_reason"] is None for c in texts)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"guided_choice": "yes"}, "guided_choice"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": 5}, "guided_regex"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_json": {"maximum": 10**400}}, "guided_json"),
        ({"guided_json": '{"type": "number", "maximum": NaN}'}, "guided_json"),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ],
)
def test_malformed_constraint_fields_are_400s(
    fields: dict[str, Any], param: str, server: str
) -> None:
    body = {"model": MODEL, "messages": messages("Hi"), "max_tokens": 4, **fields}
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_more_than_one_constraint_is_an_error(smollm2: tallow.LLM) -> None:
    with pytest.raises(tallow.InvalidArgumentError, match="at most one"):
        smollm2.generate("Hi", regex="a+", choice=["a"])
    with pytest.raises(tallow.InvalidArgumentError, match="list of strings"):
        smollm2.generate("Hi", choice="yes")
