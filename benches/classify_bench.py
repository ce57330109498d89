"""Latency of zero-shot classification (``LLM.classify``, one text at a time) beside its floor,
and throughput with concurrent clients.

The floor of a classification is one forward over the prompt's tokens that the prefix cache
cannot serve (the text's own, the few of the instruction after its last whole page, and the
template's close of the turn) at the depth of the cached instruction, with the labels riding
along: measured in the same run on the same model, through ``Model.forward`` on a sequence
forked from the cached prefix. A label of one token rides for free (its probability is read
from the text's last row, and where every label is one token the LM head computes only their
logits); a label of several tokens adds a branch of its tokens but the last, with their rows
of logits, to that forward. Both floors are printed: the text's tokens alone,
and the one forward the engine runs (the text and the labels' branches). Every request has a
text of its own (random words), so that only the instruction is cached.

    python benches/classify_bench.py [-m MODEL] [--trials 200] [--clients 16]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import anyio

import tallow

WORDS = [
    "the",
    "a",
    "river",
    "house",
    "green",
    "market",
    "quietly",
    "opened",
    "seven",
    "cold",
    "morning",
    "train",
    "city",
    "people",
    "music",
    "bright",
    "old",
    "letter",
    "window",
    "small",
    "road",
    "later",
    "under",
    "because",
    "never",
    "found",
    "paper",
]
# Labels of one token each (their probability is read from the text's last row), and labels
# of up to three tokens (their other tokens computed in branches, in the same forward).
LABEL_SETS = {
    "2": ["positive", "negative"],
    "4": ["world", "business", "science", "technology"],
    "4, multi-token": ["world news", "sports", "business", "science and technology"],
}


def texts_of(llm: tallow.LLM, n_tokens: int, count: int, seed: int) -> list[str]:
    """``count`` texts of random words, each ``n_tokens`` tokens long."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        words = " ".join(rng.choice(WORDS) for _ in range(n_tokens))
        ids = llm.tokenize(words, add_special=False)[:n_tokens]
        text = llm.detokenize(ids)
        if len(llm.tokenize(text, add_special=False)) == n_tokens:
            out.append(text)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Floor:
    """One forward over a prompt's tokens after its cached part, on a sequence forked from
    that part (computed once) in a pool of its own."""

    def __init__(self, model: object, prompt: list[int], cached: int) -> None:
        self.model = model
        self.kv = model.new_kv_cache(page_size=16, max_pages=64)  # type: ignore[attr-defined]
        self.prefix = self.kv.create()
        self.kv.reserve(self.prefix, cached)
        model.forward(self.kv, [(self.prefix, prompt[:cached], "none")])  # type: ignore[attr-defined]
        self.cached = cached

    def time_ms(
        self, prompt: list[int], branches: list[list[int]], vocab: list[int] | None = None
    ) -> float:
        """One forward over the uncached part of ``prompt``, with ``branches`` (token lists)
        forked from it in the same forward as the engine forks a scoring request's; the logits
        of the tokens ``vocab`` only, where given (as the engine asks for one-token labels)."""
        rest = prompt[self.cached :]
        seq = self.kv.fork(self.prefix)
        self.kv.reserve(seq, len(rest))
        batch: list[tuple[int, list[int], str] | tuple[int, list[int], str, int]] = [
            (seq, rest, "last")
        ]
        for tokens in branches:
            fork = self.kv.fork(seq)
            self.kv.reserve(fork, len(tokens))
            batch.append((fork, tokens, "all", seq))
        start = time.perf_counter()
        self.model.forward(self.kv, batch, vocab=vocab)  # type: ignore[attr-defined]
        elapsed = time.perf_counter() - start
        for entry in batch:
            self.kv.free(entry[0])
        return elapsed * 1000


def latency(args: argparse.Namespace, llm: tallow.LLM, model: object) -> None:
    """Each text classified, then its floor measured, one after the other (so that both see
    the same machine)."""
    print(
        "| text tokens | labels | uncached tokens | branch tokens | text floor P50 / P95 (ms) "
        "| one-forward floor P50 / P95 (ms) | P50 (ms) | P95 (ms) | P99 (ms) "
        "| P95 / one-forward floor P95 | P95 / text floor P95 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n_tokens in (4, 16):
        for seed, (kind, labels) in enumerate(LABEL_SETS.items()):
            task = llm.classify_task(labels)
            texts = texts_of(llm, n_tokens, args.trials + 5, seed=n_tokens * 10 + seed)
            for text in texts[:5]:  # warm: the instruction enters the prefix cache
                (warm,) = llm.classify(text, labels)
            floor = Floor(model, task.prompt_ids(texts[0]), warm.cached_tokens)
            # The engine's branches: each label's tokens but the last, for labels of several.
            continuations = task.params.continuations or ()
            branches = [ids[:-1] for ids in continuations if len(ids) > 1]
            # One-token labels: the LM head computes their logits alone.
            vocab = None if branches else sorted({ids[0] for ids in continuations})
            times, text_floors, floors, uncached = [], [], [], []
            for text in texts[5:]:
                start = time.perf_counter()
                (result,) = llm.classify(text, labels)
                times.append((time.perf_counter() - start) * 1000)
                text_floors.append(floor.time_ms(task.prompt_ids(text), []))
                one = floor.time_ms(task.prompt_ids(text), [list(b) for b in branches], vocab)
                floors.append(one)
                uncached.append(result.prompt_tokens - result.cached_tokens)
            p50, p95, p99 = (percentile(times, q) for q in (50, 95, 99))
            t50, t95 = percentile(text_floors, 50), percentile(text_floors, 95)
            f50, f95 = percentile(floors, 50), percentile(floors, 95)
            print(
                f"| {n_tokens} | {kind} | {statistics.median(uncached):g} "
                f"| {sum(map(len, branches))} | {t50:.2f} / {t95:.2f} | {f50:.2f} / {f95:.2f} "
                f"| {p50:.2f} | {p95:.2f} | {p99:.2f} | {p95 / f95:.2f} | {p95 / t95:.2f} |"
            )


def throughput(args: argparse.Namespace) -> None:
    labels = LABEL_SETS["4, multi-token"]

    async def main() -> tuple[int, float]:
        async with tallow.AsyncLLM(args.model, n_ctx=512) as llm:
            sync = tallow.LLM(args.model)
            texts = texts_of(sync, 16, args.clients * args.per_client, seed=7)
            await llm.classify(texts[0], labels)
            start = time.perf_counter()

            async def client(i: int) -> None:
                for text in texts[i :: args.clients]:
                    await llm.classify(text, labels)

            async with anyio.create_task_group() as group:
                for i in range(args.clients):
                    group.start_soon(client, i)
            return len(texts), time.perf_counter() - start

    n, elapsed = anyio.run(main)
    print(
        f"\n{args.clients} concurrent clients, texts of 16 tokens into 4 labels: "
        f"{n / elapsed:.1f} classifications/s ({n} in {elapsed:.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=8)
    args = parser.parse_args()
    llm = tallow.LLM(args.model, n_ctx=512)
    # The floors run on the engine's own weights: a second copy would evict the first from
    # the caches at every turn, where a process serving classifications has one.
    latency(args, llm, llm._model)
    throughput(args)


if __name__ == "__main__":
    main()
