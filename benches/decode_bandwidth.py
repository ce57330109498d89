"""Decode's read rate against the machine's, each round bracketed by its own probes.

On a machine whose memory is shared (a VM), the rate at which the cores can read moves from one
minute to the next, at times by a factor of two: a decode measured in one minute beside a probe
measured in another says little. Each round here reads the probe (``tallow._core.read_bandwidth``
over as many bytes as a decode step reads), generates ``--tokens`` tokens one at a time as
``tallow bench``'s tg does, and reads the probe again; a round whose two probes differ by more
than a tenth saw the machine change under it and is left out of the summary. The summary is the
median share of the probe's rate that decode read, over the rounds kept, grouped by the probe's
rate (to the nearest 20 GB/s), since the share differs between the machine's slow and fast
minutes.

    python benches/decode_bandwidth.py [-m MODEL] [--rounds 12] [--tokens 64]

(threads: ``TALLOW_NUM_THREADS``, all cores by default).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from tallow import _core, bench
from tallow.catalog import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    model = _core.Model(str(resolve_model(args.model)))
    per_token = model.decode_weight_bytes
    # Untimed, as `tallow bench` warms up: threads, page tables, the kernels' first touches.
    bench.prefill(model, 16)
    bench.decode(model, 2)
    shares: dict[int, list[float]] = defaultdict(list)
    print(f"{per_token / 2**20:.1f} MiB of weights a token")
    print("| round | probe before (GB/s) | decode reads (GB/s) | probe after (GB/s) | share |")
    print("|--:|--:|--:|--:|--:|")
    for r in range(args.rounds):
        before = _core.read_bandwidth(per_token, 1)
        rate = bench.decode(model, args.tokens, seed=r)
        after = _core.read_bandwidth(per_token, 1)
        reads = per_token * rate
        probe = (before + after) / 2
        steady = abs(before - after) <= 0.1 * max(before, after)
        if steady:
            shares[round(probe / 20e9) * 20].append(reads / probe)
        print(
            f"| {r} | {before / 1e9:.1f} | {reads / 1e9:.1f} | {after / 1e9:.1f} "
            f"| {reads / probe:.0%}{'' if steady else ' (probes differ: left out)'} |"
        )
    for level, values in sorted(shares.items()):
        print(
            f"probe near {level} GB/s: decode reads {statistics.median(values):.0%} of it "
            f"(median of {len(values)} rounds, {min(values):.0%}-{max(values):.0%})"
        )


if __name__ == "__main__":
    main()
