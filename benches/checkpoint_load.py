"""Loading a Hugging Face checkpoint folder: time and peak memory of converting it as it loads,
beside loading the GGUF that ``tallow convert`` writes of it.

The folder is a random Llama-shaped checkpoint written here (``--hidden``, ``--layers``,
``--ff``, ``--vocab``; F16 or BF16 safetensors, split into shards of ``--shard`` bytes with
their index, as transformers saves large models), with the tiny reference model's
``tokenizer.model`` (its vocabulary padded to ``--vocab``). Each load runs in a fresh process:
its peak resident memory (``VmHWM``, which counts the pages of mapped files it touched) and its
wall time to a loaded model, for each ``--quantize`` type.

    python benches/checkpoint_load.py [--dir /tmp/ckpt] [--hidden 2048 --layers 16 --ff 5632]
        [--dtype f16] [--quantize q8_0 --quantize q4_0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared"


def write_checkpoint(folder: Path, args: argparse.Namespace) -> int:
    """A random checkpoint in ``folder``; its safetensors' bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    h, ff, layers, vocab = args.hidden, args.ff, args.layers, args.vocab
    heads, kv_heads = h // 64, max(1, h // 256)
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    shapes["lm_head.weight"] = (vocab, h)
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv_heads * 64, h),
            p + "self_attn.v_proj.weight": (kv_heads * 64, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (ff, h),
            p + "mlp.up_proj.weight": (ff, h),
            p + "mlp.down_proj.weight": (h, ff),
        }
    rng = np.random.default_rng(0)
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        n = int(np.prod(shape)) * 2
        if shards[-1] and size + n > args.shard:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    weight_map = {}
    total = 0
    for k, names in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, object] = {}
        offset = 0
        for name in names:
            n = int(np.prod(shapes[name])) * 2
            header[name] = {
                "dtype": args.dtype.upper(),
                "shape": list(shapes[name]),
                "data_offsets": [offset, offset + n],
            }
            offset += n
            weight_map[name] = file
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(folder / file, "wb") as out:
            out.write(struct.pack("<Q", len(raw)) + raw)
            for name in names:
                values = rng.standard_normal(shapes[name], dtype=np.float32) * 0.02
                if args.dtype == "bf16":
                    out.write((values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
                else:
                    out.write(values.astype(np.float16).tobytes())
        total += offset
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": h,
        "intermediate_size": ff,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (folder / "config.json").write_text(json.dumps(config))
    tiny = SHARED / "reference" / "arch" / "llama3" / "hf"
    for file in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copy(tiny / file, folder / file)
    return total


# The peak is the process's VmHWM: ru_maxrss would carry over the high-water mark of the
# process that started it.
_PROBE = """
import sys, time
from tallow import _core
start = time.perf_counter()
model = _core.Model(sys.argv[1], quantize=sys.argv[2] or None)
seconds = time.perf_counter() - start
status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
print(seconds, int(status) * 1024, model.file_size)
"""


def probe(path: Path, quantize: str | None) -> tuple[float, int, int]:
    """Seconds to load ``path``, the process's peak resident bytes, and the model's size."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path), quantize or ""],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[0]), int(out[1]), int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--ff", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    parser.add_argument("--shard", type=int, default=1 << 30, help="bytes per shard")
    parser.add_argument("--quantize", action="append", default=None)
    args = parser.parse_args()
    from tallow import _core

    root = args.dir or Path(tempfile.mkdtemp(prefix="tallow-ckpt-"))
    folder = root / "checkpoint"
    start = time.perf_counter()
    total = write_checkpoint(folder, args)
    # Written pages still going to disk would slow the first loads down.
    os.sync()
    print(
        f"checkpoint: {total / 2**30:.2f} GiB of {args.dtype} safetensors in "
        f"{len(list(folder.glob('*.safetensors')))} shards ({time.perf_counter() - start:.0f} s)"
    )
    print("| load | quantize | seconds | peak RSS (GiB) | model (GiB) | peak / model |")
    print("|---|---|--:|--:|--:|--:|")
    for quantize in args.quantize or ["q8_0"]:
        gguf = root / f"model-{quantize}.gguf"
        _core.convert_checkpoint(folder, gguf, quantize)
        os.sync()
        for what, path, q in (("folder", folder, quantize), ("GGUF", gguf, None)):
            seconds, peak, size = probe(path, q)
            print(
                f"| {what} | {quantize} | {seconds:.2f} | {peak / 2**30:.2f} | "
                f"{size / 2**30:.2f} | {peak / size:.2f} |"
            )
        os.unlink(gguf)
    if args.dir is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
