"""Decode speed with speculative decoding against plain decoding, on input-grounded tasks.

Each task is a prompt whose answer repeats much of the prompt (fixing a typo in a text,
editing code, continuing a copy), and one whose answer is free text. For each task and
setting the script prints the decode tokens per second (after the first token), the speedup
over plain decoding, the acceptance rate and the tokens gained per step, and checks that
greedy outputs are the same with and without speculation.

Settings: plain decoding; prompt lookup (``ngram``) with 4 and 6 proposed tokens, growing to
16 while every proposed token is kept (and with 4 of a fixed size; with 4 but no proposals
after a match of only one token, ``ngram_min=2``), alone or with alternative
guesses verified beside them (tree speculation, ``num_branches``); and a draft model: the
default model (Q4_1) drafting for the same model requantized to Q8_0 (written once next to it
with the ``gguf`` package, from the Q4_1 weights).

    python benches/speculative_bench.py [-m MODEL] [--max-tokens 200] [-r 3] [--no-draft]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from tallow import _core
from tallow.catalog import resolve_model
from tallow.engine import Engine, EngineConfig, SamplingParams

REPO = Path(__file__).resolve().parent.parent

TEXT = (REPO.parent / "shared" / "reference" / "perplexity" / "apache-2.0.txt").read_text()[:1500]
CODE = (REPO / "python" / "tallow" / "stopping.py").read_text()[:1800]


def chat(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


TASKS = {
    "fix a typo": chat(
        "Fix the typo in this text and repeat it exactly otherwise:\n\n"
        + TEXT.replace("License", "Lisence", 1)
    ),
    "edit code": chat("Repeat this code with the docstrings removed:\n\n" + CODE),
    "continue a copy": CODE[:1200] + "\n\n# The same module again:\n\n" + CODE[:200],
    # Nothing to copy: speculation must not cost anything here.
    "free text": chat("Write a short story about a lighthouse keeper and a storm."),
}


def requantized_q8_0(path: Path) -> Path:
    """``path`` with its Q4_1 tensors requantized to Q8_0 (written once beside it)."""
    import gguf

    out = path.with_name(path.name.replace("Q4_1", "Q8_0"))
    if out == path:
        out = path.with_suffix(".q8_0.gguf")
    if out.exists():
        return out
    reader = gguf.GGUFReader(path)
    arch = str(reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    writer = gguf.GGUFWriter(str(out) + ".partial", arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        data, kind = tensor.data, tensor.tensor_type
        if kind == gguf.GGMLQuantizationType.Q4_1:
            floats = gguf.quants.dequantize(data, kind)
            data, kind = (
                gguf.quants.quantize(floats, gguf.GGMLQuantizationType.Q8_0),
                (gguf.GGMLQuantizationType.Q8_0),
            )
        writer.add_tensor(tensor.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(str(out) + ".partial", out)
    return out


def decode(
    model: _core.Model, prompt: list[int], max_tokens: int, speculative: object
) -> tuple[list[int], float, dict[str, float]]:
    """(tokens, decode tokens per second after the first token, engine stats)."""
    engine = Engine(model, EngineConfig(n_ctx=2048, kv_pages=256, speculative=speculative))
    engine.add("r", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    tokens: list[int] = []
    start = 0.0
    first = 0
    while engine.has_work():
        outs = engine.step()
        for o in outs:
            tokens += o.new_token_ids
        if not start and tokens:
            start, first = time.perf_counter(), len(tokens)
    seconds = time.perf_counter() - start
    return tokens, (len(tokens) - first) / seconds, engine.stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-draft", action="store_true", help="skip the draft-model runs")
    parser.add_argument("-r", "--reps", type=int, default=3, help="runs per setting (median)")
    args = parser.parse_args()
    os.environ["TALLOW_NUM_THREADS"] = str(args.threads)
    path = resolve_model(args.model)
    model = _core.Model(str(path))
    print(f"model {path.name}, {args.threads} threads, greedy, {args.max_tokens} tokens")
    print(
        f"{'task':<16} {'setting':<24} {'tok/s':>7} {'speedup':>7} {'accept':>6} "
        f"{'tok/step':>8} same"
    )
    every = {"adaptive": False}
    settings: list[tuple[str, object]] = [
        # Every proposed token verified: proposals of a fixed size, and those that double
        # while all their tokens are kept.
        ("k=4, fixed, every token", {"num_tokens": 4, "max_num_tokens": 4, **every}),
        ("k=4, every token", {"num_tokens": 4, **every}),
        # Drafts cut to the tokens that pay for themselves (the default).
        ("k=4", {"num_tokens": 4}),
        ("k=6", {"num_tokens": 6}),
        # Without proposals after single-token matches.
        ("k=4, ngram_min=2", {"num_tokens": 4, "ngram_min": 2}),
        # Tree speculation: alternative guesses from the other occurrences of the match.
        ("k=4, 2 branches, every", {"num_tokens": 4, "num_branches": 2, **every}),
        ("k=4, 2 branches", {"num_tokens": 4, "num_branches": 2}),
        ("k=6, 3 branches", {"num_tokens": 6, "num_branches": 3}),
    ]
    for task, text in TASKS.items():
        prompt = model.tokenize(text, False, True)
        # Plain and speculative runs take turns, so that a change of load on a shared machine
        # hits both; each rate is the median of its runs.
        rates: dict[str, list[float]] = {name: [] for name in ["plain", *dict(settings)]}
        outputs: dict[str, list[int]] = {}
        stats: dict[str, dict[str, float]] = {}
        for _ in range(args.reps):
            plain, rate, _ = decode(model, prompt, args.max_tokens, None)
            rates["plain"].append(rate)
            outputs["plain"] = plain
            for name, spec in settings:
                spec = {"method": "ngram", **spec}
                outputs[name], rate, stats[name] = decode(model, prompt, args.max_tokens, spec)
                rates[name].append(rate)
        plain_rate = statistics.median(rates["plain"])
        print(f"{task:<16} {'plain':<24} {plain_rate:>7.1f} {1.0:>7.2f} {'-':>6} {1.0:>8.2f}")
        for name, _ in settings:
            rate = statistics.median(rates[name])
            print(
                f"{task:<16} {name:<24} {rate:>7.1f} {rate / plain_rate:>7.2f} "
                f"{stats[name]['spec_acceptance_rate']:>6.2f} "
                f"{stats[name]['spec_tokens_per_step']:>8.2f} {outputs[name] == outputs['plain']}"
            )
    if args.no_draft:
        return
    # The same model at two quantizations: the Q4_1 file drafts for a Q8_0 requantization.
    target = _core.Model(str(requantized_q8_0(path)))
    draft = {"method": "draft", "draft_model": str(path), "num_tokens": 4}
    for task, text in TASKS.items():
        prompt = target.tokenize(text, False, True)
        plain, plain_rate, _ = decode(target, prompt, args.max_tokens, None)
        got, rate, stats = decode(target, prompt, args.max_tokens, draft)
        print(f"{task:<16} {'Q8_0 plain':<24} {plain_rate:>7.1f} {1.0:>7.2f} {'-':>6} {1.0:>8.2f}")
        print(
            f"{task:<16} {'Q8_0, Q4_1 draft k=4':<24} {rate:>7.1f} {rate / plain_rate:>7.2f} "
            f"{stats['spec_acceptance_rate']:>6.2f} {stats['spec_tokens_per_step']:>8.2f} "
            f"{got == plain}"
        )


if __name__ == "__main__":
    main()
