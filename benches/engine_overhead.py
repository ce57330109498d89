"""The engine's own time per decode step, beside the model's forward: scheduling, the
sampler's bookkeeping, stop checks and detokenizing are the host's, and where the forward is
fast (a small model, a GPU replaying a step as one graph) they are a share of each step worth
knowing. Runs ``--seqs`` requests of ``--tokens`` tokens each through ``Engine.step`` and
prints, per decode step, the step's time, the forward's (``Model.forward``, the Rust side's
host work included) and the rest.

    python benches/engine_overhead.py [-m MODEL] [--device cpu] [--seqs 1 8 32] [--tokens 64]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tallow import _core
from tallow.catalog import resolve_model
from tallow.engine import Engine, SamplingParams


class TimedModel:
    """``model`` with the time spent in its ``forward`` added up."""

    def __init__(self, model: _core.Model) -> None:
        self.model = model
        self.seconds = 0.0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.model.forward(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def decode_steps(model: _core.Model, seqs: int, tokens: int, temperature: float) -> str:
    """A line of the mean step, forward and engine times of the decode steps of ``seqs``
    requests generating ``tokens`` tokens each."""
    engine = Engine(model)
    for i in range(seqs):
        prompt = model.tokenize(f"Tell me story number {i}.", True, False)
        params = SamplingParams(max_tokens=tokens, temperature=temperature, seed=i, ignore_eos=True)
        engine.add(f"r{i}", prompt, params)
    timed = TimedModel(model)
    engine.model = timed  # type: ignore[assignment]
    # The prompts' steps first: what follows is decode alone.
    for _ in range(2):
        engine.step()
    steps, total, forward = 0, 0.0, 0.0
    while engine.has_work():
        start, before = time.perf_counter(), timed.seconds
        engine.step()
        total += time.perf_counter() - start
        forward += timed.seconds - before
        steps += 1
    micros = [1e6 * v / max(steps, 1) for v in (total, forward, total - forward)]
    return (
        f"| {seqs} | {temperature} | {steps} | {micros[0]:.0f} | {micros[1]:.0f} | "
        f"{micros[2]:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seqs", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.8)
    args = parser.parse_args()
    model = _core.Model(str(resolve_model(args.model)), device=args.device)
    print(f"{args.model} on {model.device}")
    print("| requests | temperature | decode steps | step µs | forward µs | engine µs |")
    print("|--:|--:|--:|--:|--:|--:|")
    for seqs in args.seqs:
        print(decode_steps(model, seqs, args.tokens, args.temperature))


if __name__ == "__main__":
    main()
