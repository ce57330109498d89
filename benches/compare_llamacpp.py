"""tallow beside llama.cpp on the same machine, in the same run: prefill (pp512), decode
(tg128), batched serving (128 prompt + 128 generated tokens x 16 requests, total tokens/s:
through the engine's step loop, and as concurrent requests to ``AsyncLLM``), the time from
starting a process to its first generated token (the load, repacking included, with the file in
the page cache) and the peak resident memory of generating 128 tokens from a short prompt (with
GNU time, ``/usr/bin/time``): of the engine alone (the Rust example ``simple``, built here with
cargo, beside ``llama-simple``) and, for the memory, of ``tallow generate`` (which adds the
Python interpreter and numpy).

The two engines take turns, one repetition each, so that a change of load on a shared machine
hits both. llama.cpp's tools (``llama-bench``, ``llama-batched-bench``, ``llama-simple``) come
from ``--llama-bin`` (built by ``../shared/tools/build-llama-cpp.sh``).

With ``--random 1b`` (``3b``, ``8b``) the model is a random-weight Llama-shaped Q4_K_M file
that ``random_model.py`` writes (once, into ``$TALLOW_HOME/random``; smollm2-135m's tokenizer):
the sizes people run, where a decode step streams the whole file (``moe`` and ``moe-active``:
a Qwen 3 mixture of experts and the dense model with as many active parameters). Decode's rows
also say what each engine's tg128 reads: the bytes of weights a step reads times its rate,
beside the rate at which this machine's compute threads read a buffer of as many bytes
(``tallow._core.read_bandwidth``), probed just before and just after each engine's decode: on a
host whose memory reads at one rate in one minute and at another in the next, a probe taken
minutes away from a decode says little about it. Each share is of the mean of the probes
around that decode, and the row says so where they differ by more than a tenth.

    python benches/compare_llamacpp.py --llama-bin BIN [-m MODEL | --random SIZE] [-r 3]

(BIN: llama.cpp's ``build/bin``.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import random_model
from batched_bench import run_llama_cpp

from tallow import _core, bench
from tallow.catalog import resolve_model, tallow_home


def llama_bench(binary: Path, model: Path, threads: int, prompt: int, gen: int) -> float:
    """llama-bench's tokens/s for one test, ``pp{prompt}`` or ``tg{gen}`` (the other 0), one
    repetition."""
    out = subprocess.run(
        [str(binary), "-m", str(model), "-p", str(prompt), "-n", str(gen), "-r", "1"]
        + ["-t", str(threads), "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (row,) = json.loads(out)
    return float(row["avg_ts"])


def decode_cell(rates: list[float], probes: list[tuple[float, float]], step: int) -> str:
    """What an engine's tg128 rounds (``rates``, tokens/s) read a second, ``step`` bytes a
    token, with their mean share of the read probes just before and after each (``probes``)."""
    reads = statistics.mean(rates) * step
    pairs = zip(rates, probes, strict=True)
    shares = [rate * step / statistics.mean(around) for rate, around in pairs]
    every = [r for around in probes for r in around]
    moved = any(abs(a - b) > 0.1 * max(a, b) for a, b in probes)
    return (
        f"{reads / 1e9:.2f} GB/s ({statistics.mean(shares):.0%} of {min(every) / 1e9:.1f}"
        f"-{max(every) / 1e9:.1f}{'; the probes around it differ' if moved else ''})"
    )


def seconds(command: list[str]) -> float:
    """Wall time of a command, in seconds."""
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def peak_rss_mib(command: list[str]) -> float:
    """Peak resident memory of a command, in MiB, as GNU time reports it (a parent's own
    rusage would count its memory too: Linux charges the pre-exec image to the child)."""
    with tempfile.NamedTemporaryFile("r") as report:
        subprocess.run(
            ["/usr/bin/time", "-f", "%M", "-o", report.name, *command],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        return int(report.read().split()[-1]) / 1024  # KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-bin", required=True, type=Path)
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument(
        "--random", choices=sorted(random_model.SHAPES), help="a random Q4_K_M model of this size"
    )
    parser.add_argument("-r", "--reps", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ["TALLOW_NUM_THREADS"] = str(args.threads)
    path = random_path(args.random) if args.random else resolve_model(args.model)
    model = _core.Model(str(path))
    bench.prefill(model, 16)  # warm-up
    ours: dict[str, list[float]] = defaultdict(list)
    theirs: dict[str, list[float]] = defaultdict(list)
    batched_name = "pp128+tg128 x16"
    # The same requests sent concurrently to AsyncLLM, against the same llama.cpp figure.
    served_name = "pp128+tg128 x16, AsyncLLM"
    step = model.decode_weight_bytes
    # Per round, the read probes just before and after each engine's decode.
    probes: dict[str, list[tuple[float, float]]] = {"ours": [], "theirs": []}
    llama_bench_bin = args.llama_bin / "llama-bench"
    for rep in range(args.reps):
        theirs["pp512"].append(llama_bench(llama_bench_bin, path, args.threads, 512, 0))
        ours["pp512"].append(bench.prefill(model, 512, seed=rep))
        # Each decode between two probes, the probe between them shared.
        before = _core.read_bandwidth(step)
        theirs["tg128"].append(llama_bench(llama_bench_bin, path, args.threads, 0, 128))
        between = _core.read_bandwidth(step)
        ours["tg128"].append(bench.decode(model, 128, seed=rep))
        after = _core.read_bandwidth(step)
        probes["theirs"].append((before, between))
        probes["ours"].append((between, after))
        rows = run_llama_cpp(
            args.llama_bin / "llama-batched-bench", path, 128, 128, "16", args.threads
        )
        theirs[batched_name].append(rows[16][2])
        ours[batched_name].append(bench.batched(model, 128, 128, 16, seed=rep).total_tps)
        ours[served_name].append(bench.served(path, 128, 128, 16, seed=rep))
        theirs[served_name].append(rows[16][2])
        print(f"round {rep + 1} of {args.reps} done", file=sys.stderr, flush=True)

    prompt = "Hello, my name is"
    theirs_simple = [str(args.llama_bin / "llama-simple"), "-m", str(path), "-n"]
    ours_simple = [str(build_simple()), str(path), "-n"]
    first_token = "first token from a new process (s)"
    # Cheap beside the rest, and moved by how fast the host hands out fresh memory: 5 turns
    # at least.
    for _ in range(max(args.reps, 5)):
        theirs[first_token].append(seconds([*theirs_simple, "1", prompt]))
        ours[first_token].append(seconds([*ours_simple, "1", prompt]))
    theirs_rss = peak_rss_mib([*theirs_simple, "128", prompt])
    engine_rss = peak_rss_mib([*ours_simple, "128", prompt])
    generate = [sys.executable, "-m", "tallow", "generate", prompt, "-m", str(path)]
    cli_rss = peak_rss_mib([*generate, "-n", "128", "--temperature", "0"])
    file_mib = path.stat().st_size / 2**20

    print(f"model {path.name} ({file_mib:.1f} MiB), {args.threads} threads, {args.reps} rounds")
    print("| test | tallow t/s | llama.cpp t/s | ratio |")
    print("|---|--:|--:|--:|")
    for name in ("pp512", "tg128", batched_name, served_name):
        a, b = statistics.mean(ours[name]), statistics.mean(theirs[name])
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    a, b = (statistics.median(rates[first_token]) for rates in (ours, theirs))
    print(f"| {first_token}, engine, median | {a:.2f} | {b:.2f} | {b / a:.2f} |")
    a, b = (statistics.mean(rates["tg128"]) for rates in (ours, theirs))
    print(
        f"| tg128 reads ({step / 2**20:.1f} MiB a token; share of the probes around it, GB/s) | "
        f"{decode_cell(ours['tg128'], probes['ours'], step)} | "
        f"{decode_cell(theirs['tg128'], probes['theirs'], step)} | {a / b:.2f} |"
    )
    for name, ours_rss in (("engine", engine_rss), ("tallow generate", cli_rss)):
        print(
            f"| peak RSS, 128 tokens, {name} (MiB) | "
            f"{ours_rss:.1f} ({ours_rss / file_mib:.3f}x file) | "
            f"{theirs_rss:.1f} ({theirs_rss / file_mib:.3f}x file) | "
            f"{ours_rss / theirs_rss:.2f} |"
        )


def random_path(size: str) -> Path:
    """The random ``size`` Q4_K_M model, written first if it is not there yet."""
    path = tallow_home() / "random" / f"llama-{size}-q4_k_m.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        random_model.write(str(resolve_model("smollm2-135m")), str(partial), size)
        partial.rename(path)
    return path


def build_simple() -> Path:
    """Builds the Rust example ``simple`` (release) and returns its path."""
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "-p", "tallow-model", "--example", "simple"],
        cwd=root,
        check=True,
    )
    target = Path(os.environ.get("CARGO_TARGET_DIR", root / "target"))
    return target / "release" / "examples" / "simple"


if __name__ == "__main__":
    main()
