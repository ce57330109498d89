"""Embeddings: what pooling costs beside a plain forward of the same tokens, and throughput with
concurrent clients.

Cost: for texts of each length, in turns on the same model in the same run, the median time of
a forward whose hidden-state rows come back and are pooled against one that returns the last
row's logits (the prompt of a generation), both ``Model.forward`` from an empty sequence; and
of ``LLM.embed`` of one text against ``LLM.generate`` of one token (the same engine path: one
step each, tokenization and scheduling included). Each text is new (random words), so that no
prefix is cached.

Throughput: ``--clients`` tasks, each embedding ``--per-client`` texts one after another
through one ``AsyncLLM`` (its continuous batcher runs them together): embeddings and tokens per
second.

    python benches/embed_bench.py [-m MODEL] [--pooling mean] [--trials 30] [--clients 16]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import anyio
import numpy as np
from classify_bench import texts_of

import tallow
from tallow import _core
from tallow.engine import load_model


def text_of(llm: tallow.LLM, n_tokens: int, rng: random.Random) -> str:
    """A text of random words, ``n_tokens`` tokens long with the model's special tokens."""
    special = len(llm.tokenize("x")) - len(llm.tokenize("x", add_special=False))
    (text,) = texts_of(llm, n_tokens - special, 1, rng.randrange(2**32))
    return text


def forward_ms(model: _core.Model, ids: list[int], rows: str) -> float:
    """One forward over ``ids`` from an empty sequence: the last row's logits (``"last"``), or
    the hidden states ``rows`` asks for, pooled (their mean)."""
    kv = model.new_kv_cache(max_pages=model.kv_pages_to_hold(len(ids), chunk=len(ids)))
    seq = kv.create()
    kv.reserve(seq, len(ids))
    start = time.perf_counter()
    if rows == "last":
        model.forward(kv, [(seq, ids, "last")])
    else:
        _, hidden = model.forward(kv, [(seq, ids, rows)], hidden=True)
        hidden.mean(axis=0, dtype=np.float64)
    return (time.perf_counter() - start) * 1000


def cost(args: argparse.Namespace, llm: tallow.LLM, model: _core.Model) -> None:
    """Medians, in turns: a forward whose rows are pooled against one with the last row's
    logits (``Model.forward``), and ``LLM.embed`` against ``LLM.generate`` of one token (the
    same engine path, one step each)."""
    rng = random.Random(1)
    rows = "hidden-last" if args.pooling == "last" else "hidden-all"
    print(f"pooling cost ({args.pooling}), median of {args.trials} texts, ms:")
    print(
        f"{'tokens':>7} {'forward+pool':>13} {'forward':>8} {'ratio':>6}"
        f" {'embed':>8} {'generate 1':>11} {'ratio':>6}"
    )
    for n in args.tokens:
        times: dict[str, list[float]] = {"pool": [], "plain": [], "embed": [], "generate": []}
        for _ in range(args.trials):
            ids = llm.tokenize(text_of(llm, n, rng))
            times["pool"].append(forward_ms(model, ids, rows))
            times["plain"].append(forward_ms(model, llm.tokenize(text_of(llm, n, rng)), "last"))
            text = text_of(llm, n, rng)
            start = time.perf_counter()
            llm.embed(text, pooling=args.pooling)
            times["embed"].append((time.perf_counter() - start) * 1000)
            text = text_of(llm, n, rng)
            start = time.perf_counter()
            llm.generate(text, max_tokens=1, temperature=0)
            times["generate"].append((time.perf_counter() - start) * 1000)
        m = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{n:>7} {m['pool']:>13.2f} {m['plain']:>8.2f} {m['pool'] / m['plain']:>6.3f}"
            f" {m['embed']:>8.2f} {m['generate']:>11.2f} {m['embed'] / m['generate']:>6.3f}"
        )


def throughput(args: argparse.Namespace) -> None:
    rng = random.Random(2)

    async def main() -> tuple[float, int]:
        async with tallow.AsyncLLM(args.model, max_num_seqs=args.clients) as llm:
            probe = tallow.LLM(args.model, progress=False)
            texts = [
                [text_of(probe, args.tokens[0], rng) for _ in range(args.per_client)]
                for _ in range(args.clients)
            ]
            probe.close()
            await llm.embed(texts[0][0], pooling=args.pooling)  # warm up

            async def client(mine: list[str]) -> None:
                for text in mine:
                    await llm.embed(text, pooling=args.pooling)

            start = time.perf_counter()
            async with anyio.create_task_group() as group:
                for mine in texts:
                    group.start_soon(client, mine)
            return time.perf_counter() - start, args.clients * args.per_client

    elapsed, count = anyio.run(main)
    print(
        f"throughput: {args.clients} clients x {args.per_client} texts of {args.tokens[0]} "
        f"tokens: {count / elapsed:.1f} embeddings/s, {count * args.tokens[0] / elapsed:.0f} "
        f"tokens/s ({elapsed:.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=tallow.DEFAULT_MODEL)
    parser.add_argument("--pooling", default="mean", choices=["mean", "last", "cls"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=8)
    args = parser.parse_args()
    path = tallow.resolve_model(args.model)
    llm = tallow.LLM(path, n_ctx=max(args.tokens) + 1, progress=False)
    model = load_model(path)
    print(f"{args.model} on {_core.isa()}")
    cost(args, llm, model)
    llm.close()
    throughput(args)


if __name__ == "__main__":
    main()
