"""Time to first token with and without a prefix-cache hit.

A long shared system prompt (about ``--system-tokens`` tokens) is followed by a short question.
The first request computes everything (cold); later requests with other questions find the
system prompt's pages in the prefix cache (warm). The same questions also run on an engine with
the prefix cache off. Prints the median time to first token of each and the speedup.

    python benches/prefix_cache_bench.py [-m MODEL] [--system-tokens 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import anyio

from tallow import AsyncLLM
from tallow.engine import SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Name three rivers in Europe.",
    "Why is the sky blue?",
    "What is two plus two?",
    "Who wrote Hamlet?",
    "What do bees make?",
    "How many legs has a spider?",
    "What is the boiling point of water?",
]

SYSTEM_SENTENCE = (
    "You are a helpful assistant for a public library. You answer briefly and precisely, "
    "you cite the catalogue when you can, and you never make up titles or authors. "
)


async def first_token_seconds(llm: AsyncLLM, prompt: list[int]) -> float:
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    async for out in llm.outputs(prompt, params):
        if out.new_token_ids:
            return time.perf_counter() - start
    raise RuntimeError("no token generated")


async def measure(
    model: str, system_tokens: int, runs: int, prefix_caching: bool
) -> tuple[float, list[float], dict[str, float]]:
    """(cold time, warm times, engine stats) on a fresh engine."""
    async with AsyncLLM(model, n_ctx=2048, prefix_caching=prefix_caching) as llm:
        system = SYSTEM_SENTENCE
        while len(llm.model.tokenize(system, False, False)) < system_tokens:
            system += SYSTEM_SENTENCE
        prompts = [
            llm.chat_ids([{"role": "system", "content": system}, {"role": "user", "content": q}])
            for q in QUESTIONS
        ]
        # Warm up the threads and kernels on an unrelated prompt.
        await first_token_seconds(llm, llm.prompt_ids("Hello there"))
        cold = await first_token_seconds(llm, prompts[0])
        warm = [await first_token_seconds(llm, p) for p in prompts[1 : 1 + runs]]
        return cold, warm, llm.stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ["TALLOW_NUM_THREADS"] = str(args.threads)
    runs = min(args.runs, len(QUESTIONS) - 1)
    cold, warm, stats = anyio.run(measure, args.model, args.system_tokens, runs, True)
    _, uncached, _ = anyio.run(measure, args.model, args.system_tokens, runs, False)
    warm_median, uncached_median = statistics.median(warm), statistics.median(uncached)
    print(
        f"model {args.model}, {args.threads} threads, system prompt of {args.system_tokens}+ tokens"
    )
    print(f"time to first token, cold (first request):      {cold * 1000:8.1f} ms")
    print(f"time to first token, prefix cache hit (median): {warm_median * 1000:8.1f} ms")
    print(f"time to first token, cache off (median):        {uncached_median * 1000:8.1f} ms")
    print(f"speedup of a hit over the cache off: {uncached_median / warm_median:.1f}x")
    print(
        f"prefix cache: {stats['prefix_hit_tokens']:.0f} of {stats['prefix_queried_tokens']:.0f} "
        f"prompt tokens found, {stats['cached_pages']:.0f} pages cached"
    )


if __name__ == "__main__":
    main()
