"""Decode's read rate against the machine's, the two measured in turns, token by token.

On a machine whose memory is shared (a VM), the rate at which the cores can read moves from one
second to the next, at times by a factor of two: a decode measured over a second beside a probe
measured before or after it says little. Here every decode step (one token, generated as
``tallow bench``'s tg does) comes right after a read of a probe buffer as large as the weights
a step reads (``tallow._core.ReadProbe``), so that both see the same milliseconds of the
machine; the probe is calibrated again before each round, so that it reads with the loop that
reads fastest where the memory is fastest. A round of ``--tokens`` steps reports the probe's
rate and decode's (bytes over the summed times) and their ratio, the share; the summary is the
median share of the rounds, grouped by the probe's rate (to the nearest 20 GB/s), since the
share differs between the machine's slow and fast minutes.

    python benches/decode_bandwidth.py [-m MODEL] [--rounds 12] [--tokens 64]

(threads: ``TALLOW_NUM_THREADS``, all cores by default).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from tallow import _core, bench
from tallow.catalog import resolve_model


def round_times(
    model: _core.Model, probe: _core.ReadProbe, n_tokens: int, seed: int
) -> tuple[float, float]:
    """Summed seconds of ``n_tokens`` probe reads and of the ``n_tokens`` decode steps that
    each follows one."""
    probing = 0.0

    def read_probe() -> None:
        nonlocal probing
        probing += probe.seconds()

    decoding = bench.decode_seconds(model, n_tokens, seed=seed, before_step=read_probe)
    return probing, decoding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    model = _core.Model(str(resolve_model(args.model)))
    per_token = model.decode_weight_bytes
    probe = _core.ReadProbe(per_token)
    # Untimed, as `tallow bench` warms up: threads, page tables, the kernels' first touches.
    bench.prefill(model, 16)
    bench.decode(model, 2)
    shares: dict[int, list[float]] = defaultdict(list)
    print(f"{per_token / 2**20:.1f} MiB of weights a token, a probe of {probe.bytes / 2**20:.0f}")
    print("| round | probe (GB/s) | decode reads (GB/s) | share |")
    print("|--:|--:|--:|--:|")
    for r in range(args.rounds):
        # Which summing loop reads fastest can change with the memory's state.
        probe.calibrate()
        probing, decoding = round_times(model, probe, args.tokens, seed=r)
        rate = probe.bytes * args.tokens / probing
        reads = per_token * args.tokens / decoding
        shares[round(rate / 20e9) * 20].append(reads / rate)
        print(f"| {r} | {rate / 1e9:.1f} | {reads / 1e9:.1f} | {reads / rate:.0%} |")
    for level, values in sorted(shares.items()):
        print(
            f"probe near {level} GB/s: decode reads {statistics.median(values):.0%} of it "
            f"(median of {len(values)} rounds, {min(values):.0%}-{max(values):.0%})"
        )


if __name__ == "__main__":
    main()
