"""KV memory of one long request on a model with sliding-window layers (gemma3-270m by
default): a prompt of N tokens prefilled in chunks of 512 (as the engine's scheduler does),
then 32 decode steps. Prints, per context length, the most KV pages the sequence held at once
(during a prefill chunk, which holds the window and the chunk), the pages it holds while
decoding, and the bytes of keeping every position of every layer (what a pool without layer
groups holds).

    python benches/kv_window_memory.py [-m MODEL] [--contexts 2048 4096 8192]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

from tallow import _core
from tallow.catalog import resolve_model

CHUNK = 512
DECODE = 32
TEXT = Path(__file__).resolve().parents[1].parent / "shared/reference/perplexity/apache-2.0.txt"


def prompt(model: _core.Model, n: int) -> list[int]:
    """``n`` token ids of real text (repeated as needed)."""
    ids = model.tokenize(TEXT.read_text(), True, False)
    return (ids * math.ceil(n / len(ids)))[:n]


def measure(model: _core.Model, n_prompt: int) -> dict[str, float]:
    ids = prompt(model, n_prompt)
    total = n_prompt + DECODE
    kv = model.new_kv_cache(max_pages=model.kv_pages_to_hold(total, chunk=CHUNK))
    seq = kv.create()
    peak = 0
    start = time.perf_counter()
    for first in range(0, n_prompt, CHUNK):
        chunk = ids[first : first + CHUNK]
        kv.reserve(seq, len(chunk))
        logits = model.forward(kv, [(seq, chunk, "last")])
        peak = max(peak, int(kv.stats()["pages_used"]))
    for _ in range(DECODE):
        kv.reserve(seq, 1)
        logits = model.forward(kv, [(seq, [int(np.argmax(logits[-1]))], "last")])
        peak = max(peak, int(kv.stats()["pages_used"]))
    seconds = time.perf_counter() - start
    decoding = int(kv.stats()["pages_used"])
    page_bytes = model.kv_page_bytes()
    every_page = kv.n_groups * math.ceil(total / kv.page_size)
    return {
        "tokens": total,
        "peak_pages": peak,
        "peak_mib": peak * page_bytes / 2**20,
        "decode_mib": decoding * page_bytes / 2**20,
        "all_layers_mib": every_page * page_bytes / 2**20,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="gemma3-270m")
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096, 8192])
    args = parser.parse_args()
    model = _core.Model(str(resolve_model(args.model)))
    print(f"{args.model}: {model.kv_page_bytes()} bytes per page of 16 positions")
    print("| context | peak pages | peak KV MiB | decoding KV MiB | every position kept MiB | s |")
    print("|---|---|---|---|---|---|")
    for n in args.contexts:
        r = measure(model, n - DECODE)
        print(
            f"| {r['tokens']} | {r['peak_pages']} | {r['peak_mib']:.1f} | {r['decode_mib']:.1f} | "
            f"{r['all_layers_mib']:.1f} | {r['seconds']:.1f} |"
        )


if __name__ == "__main__":
    main()
