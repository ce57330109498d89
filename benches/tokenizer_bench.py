"""Tokenizer encode speed on one thread: ``LLM.tokenize`` against HF ``tokenizers`` on the same
text, with identical ids checked.

The text is a few MB of Python standard-library sources (code) and its pydoc topics (prose),
file by file. HF's tokenizer is built from the model's own vocabulary and merges, as the tests
build it (``tests/hf_reference.py``); its parallelism is switched off.

    python benches/tokenizer_bench.py [-m MODEL] [--mb 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hf_reference import build_hf_tokenizer

import tallow


def corpus(megabytes: float) -> list[str]:
    """Standard-library sources and the pydoc topics (prose), up to ``megabytes`` of UTF-8."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / "pydoc_data" / "topics.py").read_text(encoding="utf-8")]
    total = len(texts[0].encode())
    for path in sorted(root.rglob("*.py")):
        if total >= megabytes * 1e6:
            break
        try:
            text = path.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text.encode())
    return texts


def best_of(runs: int, encode: object, texts: list[str]) -> tuple[float, list[list[int]]]:
    """The fastest of ``runs`` passes (seconds) and the ids of the last."""
    assert callable(encode)
    best, ids = float("inf"), []
    for _ in range(runs):
        start = time.perf_counter()
        ids = [encode(t) for t in texts]
        best = min(best, time.perf_counter() - start)
    return best, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("--mb", type=float, default=4.0, help="megabytes of text (default 4)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    llm = tallow.LLM(args.model)
    hf = build_hf_tokenizer(llm.path)
    texts = corpus(args.mb)
    size = sum(len(t.encode()) for t in texts) / 1e6

    ours, our_ids = best_of(args.runs, lambda t: llm.tokenize(t, False, False), texts)
    theirs, their_ids = best_of(
        args.runs, lambda t: hf.encode(t, add_special_tokens=False).ids, texts
    )
    same = sum(a == b for a, b in zip(our_ids, their_ids, strict=True))
    n_tokens = sum(len(ids) for ids in our_ids)
    print(f"{len(texts)} files, {size:.2f} MB, {n_tokens} tokens")
    print(f"ids equal in {same} of {len(texts)} files")
    print(f"tallow (LLM.tokenize): {size / ours:7.2f} MB/s")
    print(f"HF tokenizers:         {size / theirs:7.2f} MB/s")
    print(f"ratio: {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
