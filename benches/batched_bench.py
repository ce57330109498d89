"""Prefill and decode throughput with several parallel sequences, in the shape of llama.cpp's
``llama-batched-bench -npp PP -ntg TG -npl 1,4,16``: for each parallel count, every sequence gets
a prompt of PP tokens and generates TG tokens (greedy, end-of-generation ignored).

Runs tallow's engine (the scheduler and the batched forward that AsyncLLM uses) and, when
llama.cpp's tool is found (``--llama-bin`` or ``$LLAMA_CPP_BIN``; built by
``../shared/tools/build-llama-cpp.sh``), the same run of ``llama-batched-bench`` beside it.

    python benches/batched_bench.py -m smollm2-135m --npp 128 --ntg 128 --npl 1,4,16

Columns as llama-batched-bench prints them: PP and TG per sequence, B parallel sequences,
prompt tokens/s (S_PP), generated tokens/s (S_TG), and all tokens over the whole run (S).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from pathlib import Path

from tallow import _core, bench
from tallow.catalog import resolve_model


def run_llama_cpp(
    binary: Path, model: Path, npp: int, ntg: int, npl: str, threads: int
) -> dict[int, tuple[float, float, float]]:
    out = subprocess.run(
        [
            str(binary),
            "-m",
            str(model),
            "-npp",
            str(npp),
            "-ntg",
            str(ntg),
            "-npl",
            npl,
            "-t",
            str(threads),
            "-c",
            str((npp + ntg) * max(int(n) for n in npl.split(","))),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows: dict[int, tuple[float, float, float]] = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and re.fullmatch(r"\d+", cells[0]):
            # PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s
            rows[int(cells[2])] = (float(cells[5]), float(cells[7]), float(cells[9]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("--npp", type=int, default=128)
    parser.add_argument("--ntg", type=int, default=128)
    parser.add_argument("--npl", default="1,4,16")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN"))
    args = parser.parse_args()
    # Read by the engine's thread pool when the first forward pass starts it.
    os.environ["TALLOW_NUM_THREADS"] = str(args.threads)

    path = resolve_model(args.model)
    model = _core.Model(str(path))
    counts = [int(n) for n in args.npl.split(",")]
    binary = None
    if args.llama_bin:
        binary = Path(args.llama_bin)
        if binary.is_dir():
            binary = binary / "llama-batched-bench"
    elif shutil.which("llama-batched-bench"):
        binary = Path(str(shutil.which("llama-batched-bench")))
    theirs = (
        run_llama_cpp(binary, path, args.npp, args.ntg, args.npl, args.threads)
        if binary is not None and binary.exists()
        else {}
    )
    print(f"model {path.name}, npp {args.npp}, ntg {args.ntg}, {args.threads} threads")
    header = f"{'B':>3} | {'tallow S_PP':>11} {'S_TG':>8} {'S':>8}"
    if theirs:
        header += f" | {'llama.cpp S_PP':>14} {'S_TG':>8} {'S':>8} | {'S ratio':>7}"
    print(header)
    for npl in counts:
        run = bench.batched(model, args.npp, args.ntg, npl)
        pp, tg, total = run.prompt_tps, run.generate_tps, run.total_tps
        line = f"{npl:>3} | {pp:>11.1f} {tg:>8.1f} {total:>8.1f}"
        if npl in theirs:
            lpp, ltg, ltotal = theirs[npl]
            line += f" | {lpp:>14.1f} {ltg:>8.1f} {ltotal:>8.1f} | {total / ltotal:>7.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
