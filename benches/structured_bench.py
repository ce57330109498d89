"""What constrained decoding costs: generated tokens per second of requests whose output must
follow a JSON schema, against the same requests unconstrained, on the same prompts.

Each request is a chat turn asking for a JSON description (greedy, ``max_tokens`` tokens: each
schema asks for more than that, and free requests ignore the end-of-generation token, so both
generate the same number of tokens). One request at a time goes through
:class:`tallow.LLM` (tokens/s of its decode phase); several at once through one
:class:`tallow.AsyncLLM` (generated tokens over the wall time of the whole batch). The ratio
constrained/free is what the token masks cost.

    python benches/structured_bench.py -m smollm2-135m --concurrency 1,8 -r 3
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import anyio

import tallow
from tallow.async_llm import AsyncLLM
from tallow.catalog import resolve_model


def many(items: dict[str, Any]) -> dict[str, Any]:
    """An array longer than any output of the benchmark: every request runs to its last token,
    constrained or not, so both sides generate the same number of tokens."""
    return {"type": "array", "items": items, "minItems": 200}


def closed(**properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


STRING = {"type": "string"}
INTEGER = {"type": "integer"}

SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("the people of a town", closed(people=many(closed(name=STRING, age=INTEGER)))),
    ("a library", closed(books=many(closed(title=STRING, author=STRING, year=INTEGER)))),
    ("an online shop's orders", closed(orders=many(closed(id=INTEGER, paid={"type": "boolean"})))),
    ("the cities of a country", closed(country=STRING, cities=many(STRING))),
]


def requests(n: int) -> list[tuple[list[dict[str, str]], dict[str, Any]]]:
    """``n`` (messages, schema) pairs, cycling through the schemas."""
    out = []
    for i in range(n):
        what, schema = SCHEMAS[i % len(SCHEMAS)]
        message = f"Describe {what} as JSON ({i})."
        out.append(([{"role": "user", "content": message}], schema))
    return out


def free_or(constrained: bool, schema: dict[str, Any]) -> dict[str, Any]:
    """A request's options: the schema, or none and the end-of-generation token ignored (so
    that free requests run to their last token as constrained ones do)."""
    return {"json_schema": schema} if constrained else {"ignore_eos": True}


def one_at_a_time(llm: tallow.LLM, n: int, max_tokens: int, constrained: bool) -> float:
    """Decode tokens/s over ``n`` requests run one after another."""
    tokens, seconds = 0, 0.0
    for messages, schema in requests(n):
        options = free_or(constrained, schema)
        out = llm.chat(messages, max_tokens=max_tokens, temperature=0, **options)
        tokens += out.completion_tokens
        seconds += out.completion_seconds
    return tokens / seconds


def concurrent(path: Path, n: int, max_tokens: int, constrained: bool) -> float:
    """Generated tokens/s of ``n`` requests at once (wall time of the batch)."""
    counts: list[int] = []

    async def main() -> float:
        async with AsyncLLM(path, max_num_seqs=n) as llm:

            async def one(messages: list[dict[str, str]], schema: dict[str, Any]) -> None:
                options = free_or(constrained, schema)
                done = await llm.chat(messages, max_tokens=max_tokens, temperature=0, **options)
                counts.append(done.completion_tokens)

            # Compiled once before timing, as a server sees the same schemas again.
            for messages, schema in requests(len(SCHEMAS)):
                await one(messages, schema)
            counts.clear()
            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for messages, schema in requests(n):
                    tg.start_soon(one, messages, schema)
            return sum(counts) / (time.perf_counter() - t0)

    return anyio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=8, help="requests per measurement")
    parser.add_argument("--concurrency", default="1,8", help="requests at once, comma-separated")
    parser.add_argument("-r", "--repeat", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()

    path = resolve_model(args.model)
    llm = tallow.LLM(path)
    print(f"model {args.model}, {args.requests} requests, up to {args.max_tokens} tokens each")
    print(f"{'at once':>8} {'free tok/s':>11} {'json tok/s':>11} {'ratio':>6}")
    for level in (int(c) for c in args.concurrency.split(",")):
        best = {}
        for constrained in (False, True):
            runs = []
            for _ in range(args.repeat):
                if level == 1:
                    runs.append(one_at_a_time(llm, args.requests, args.max_tokens, constrained))
                else:
                    runs.append(concurrent(path, level, args.max_tokens, constrained))
            best[constrained] = max(runs)
        ratio = best[True] / best[False]
        print(f"{level:>8} {best[False]:>11.1f} {best[True]:>11.1f} {ratio:>6.2f}")


if __name__ == "__main__":
    main()
