"""Writes a random-weight Llama-shaped GGUF straight in a quantized layout, for measuring speed at
sizes no test model has (a weight's value does not change the work). Unlike quantizing an F16 file
with llama.cpp's llama-quantize, it needs nothing but numpy and gguf and takes seconds, so a
machine with no llama.cpp build (a GPU host, say) can make its own.

Blocks are random bytes with their f16 scales set to small finite values, so activations stay
finite, and weights centred on zero, as a trained model's are: Q4_K's sub-block minimums are set
to cancel their scales' mean (random ones would shift every weight by about +0.2, and the
hidden states of such a model drift into values too small for f32's normal range, which no
trained model produces and which slow any engine's arithmetic). ``q4_k_m`` lays the types out
as llama-quantize's Q4_K_M does: Q4_K, with Q6_K for the embedding and for attn_v and ffn_down
in the layers it gives more bits.

Two more shapes measure mixture of experts: ``moe`` is a Qwen 3 MoE (``qwen3moe``) of 3.5B
parameters, 32 experts of width 1024 in each of 16 layers, 4 used per token (0.66B active), and
``moe-active`` the dense Qwen 3 with as many active parameters (the same layers, one FFN of
4 x 1024): a MoE's decode that reads only its chosen experts runs near the dense one's speed.

Usage: python benches/random_model.py VOCAB_GGUF OUT.gguf SIZE [TYPE]
  VOCAB_GGUF  a GGUF whose tokenizer the model takes (smollm2-135m's, say)
  SIZE        1b, 3b or 8b (Llama 3.2 1B / 3B and Llama 3 8B shapes), moe or moe-active
  TYPE        q4_k_m (default), q4_0 or q8_0
"""

from __future__ import annotations

import sys

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
F32 = Q.F32
ROUTER = "ffn_gate_inp"
SHAPES = {  # hidden, layers, ffn (of each expert), heads, kv heads
    "1b": (2048, 16, 8192, 32, 8),
    "3b": (3072, 28, 8192, 24, 8),
    "8b": (4096, 32, 14336, 32, 8),
    "moe": (2048, 16, 1024, 32, 8),
    "moe-active": (2048, 16, 4096, 32, 8),
}
# The mixture-of-experts shapes: experts and experts used per token.
EXPERTS = {"moe": (32, 4)}
# The architecture of each shape.
ARCH = {"moe": "qwen3moe", "moe-active": "qwen3"}
# Byte offsets of each block's f16 scales (set to small values; everything else is random).
SCALES = {Q.Q4_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q6_K: (208,)}
SCALE = {Q.Q4_0: 0.002, Q.Q8_0: 0.0005, Q.Q4_K: 0.001, Q.Q6_K: 0.0005}


def more_bits(layer: int, layers: int) -> bool:
    """Whether llama-quantize's Q4_K_M gives this layer's attn_v and ffn_down Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(name: str, layer: int, layers: int, kind: str) -> Q:
    if kind != "q4_k_m":
        return {"q4_0": Q.Q4_0, "q8_0": Q.Q8_0}[kind]
    if name == "token_embd.weight":
        return Q.Q6_K
    down = ("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")
    if name.endswith(down) and more_bits(layer, layers):
        return Q.Q6_K
    return Q.Q4_K


def random_blocks(rng: np.random.Generator, shape: tuple[int, ...], ty: Q) -> np.ndarray:
    """Random blocks of ``ty`` for a tensor of ``shape`` (rows last), as bytes: ``shape``
    with the last dimension in bytes."""
    block, size = gguf.GGML_QUANT_SIZES[ty]
    *outer, cols = shape
    data = rng.integers(0, 256, size=(*outer, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(SCALE[ty]).tobytes(), dtype=np.uint8)
    for offset in SCALES[ty]:
        data[..., offset : offset + 2] = scale
    if ty == Q.Q4_K:
        centre_q4_k(data)
    return data.reshape(*outer, -1)


def centre_q4_k(blocks: np.ndarray) -> None:
    """Makes every Q4_K sub-block's weights, ``d * sc * q - dmin * m`` with ``q`` uniform in
    0..15, average zero: ``dmin = 7.5 * d`` and each sub-block's 6-bit minimum ``m`` equal to
    its scale ``sc``. In the 12 packed scale bytes (at 4..16), sub-blocks 0-3 keep ``sc`` and
    ``m`` in the low 6 bits of bytes 0-3 and 4-7, and 4-7 keep theirs in the nibbles of bytes
    8-11 with the top two bits in bytes 0-3 (``sc``) and 4-7 (``m``): equal bytes 0-3 and 4-7
    and equal nibbles in bytes 8-11 make every ``m`` its ``sc``."""
    dmin = np.frombuffer(np.float16(7.5 * SCALE[Q.Q4_K]).tobytes(), dtype=np.uint8)
    blocks[..., 2:4] = dmin
    blocks[..., 8:12] = blocks[..., 4:8]
    blocks[..., 12:16] = (blocks[..., 12:16] & 0x0F) * 0x11


def copy_tokenizer(reader: gguf.GGUFReader, w: gguf.GGUFWriter) -> int:
    """Copies the tokenizer's fields; returns the vocabulary's size."""
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            if field.types[-1] == gguf.GGUFValueType.STRING:
                val = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
            else:
                val = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(name, val)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode())
        else:
            w.add_key_value(name, field.parts[field.data[0]].tolist()[0], vtype)
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def write(src: str, out: str, size: str, kind: str = "q4_k_m") -> None:
    """Writes the random ``size`` model in ``kind`` blocks to ``out``, with ``src``'s tokenizer."""
    hidden, layers, ffn, heads, kv = SHAPES[size]
    hd = hidden // heads
    arch = ARCH.get(size, "llama")
    w = gguf.GGUFWriter(out, arch)
    vocab = copy_tokenizer(gguf.GGUFReader(src), w)
    w.add_name(f"random-llama-{size}-{kind}")
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_key_length(hd)
    w.add_value_length(hd)
    n_expert, n_used = EXPERTS.get(size, (0, 0))
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_used)
        w.add_expert_feed_forward_length(ffn)

    specs: list[tuple[str, tuple[int, ...], int]] = [
        ("token_embd.weight", (vocab, hidden), 0),
        ("output_norm.weight", (hidden,), 0),
    ]
    for i in range(layers):
        p = f"blk.{i}."
        specs += [
            (p + "attn_norm.weight", (hidden,), i),
            (p + "attn_q.weight", (heads * hd, hidden), i),
            (p + "attn_k.weight", (kv * hd, hidden), i),
            (p + "attn_v.weight", (kv * hd, hidden), i),
            (p + "attn_output.weight", (hidden, heads * hd), i),
            (p + "ffn_norm.weight", (hidden,), i),
        ]
        if arch != "llama":
            specs += [(p + "attn_q_norm.weight", (hd,), i), (p + "attn_k_norm.weight", (hd,), i)]
        if n_expert:
            specs += [
                # The router stays F32, as llama-quantize leaves it (`ROUTER` below).
                (p + "ffn_gate_inp.weight", (n_expert, hidden), i),
                (p + "ffn_gate_exps.weight", (n_expert, ffn, hidden), i),
                (p + "ffn_up_exps.weight", (n_expert, ffn, hidden), i),
                (p + "ffn_down_exps.weight", (n_expert, hidden, ffn), i),
            ]
        else:
            specs += [
                (p + "ffn_gate.weight", (ffn, hidden), i),
                (p + "ffn_up.weight", (ffn, hidden), i),
                (p + "ffn_down.weight", (hidden, ffn), i),
            ]
    # Each tensor's type, resolved once: norms are ones and routers small noise in f32,
    # matrices random blocks.
    typed = [
        (
            name,
            shape,
            F32 if len(shape) == 1 or ROUTER in name else tensor_type(name, layer, layers, kind),
        )
        for name, shape, layer in specs
    ]
    rng = np.random.default_rng(0)

    # Streamed: tensor infos first, then each tensor as it is drawn (8B never sits in memory).
    for name, shape, ty in typed:
        if ty == F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
            continue
        block, size_ = gguf.GGML_QUANT_SIZES[ty]
        *outer, cols = shape
        byte_shape = (*outer, cols // block * size_)
        nbytes = int(np.prod(byte_shape))
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, ty in typed:
        if ty != F32:
            w.write_tensor_data(random_blocks(rng, shape, ty))
        elif ROUTER in name:
            # Different tokens choose different experts.
            w.write_tensor_data(rng.normal(0, 0.02, size=shape).astype(np.float32))
        else:
            w.write_tensor_data(np.ones(shape, dtype=np.float32))
    w.close()


def main() -> None:
    src, out, size = sys.argv[1:4]
    write(src, out, size, sys.argv[4] if len(sys.argv) > 4 else "q4_k_m")
    print(out)


if __name__ == "__main__":
    main()
