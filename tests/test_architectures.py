"""Every architecture against Hugging Face transformers, on the tiny random models of
``shared/reference/arch`` (see its README: the files, the oracle and the tolerances).

The logits of the 32 prompt positions must match transformers' (float32, eager attention) within
the README's bounds for each file type, and greedy decoding of the F32 file must give
transformers' 16 tokens. An f32 KV cache keeps the comparison about the forward pass alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import SHARED, all_logits, f32_pool, run_cli
from test_rope_scaling import rewrite

import tallow
from tallow import _core
from tallow.engine import Engine, EngineConfig, SamplingParams

# (folder, tolerance of the F32 file). The README allows 5e-3 for the GELU models (llama.cpp's
# GELU goes through an f16 table); tallow's exact GELU meets 1e-4 there too.
ARCHITECTURES = [("llama3", 1e-4), ("mistral", 1e-4), ("qwen2", 1e-4), ("qwen3", 1e-4)]
ARCHITECTURES += [("phi3", 1e-4), ("gemma2", 1e-4), ("gemma3", 1e-4)]
TOLERANCE = {"f16": 2e-2, "q8_0": 0.3}
GGUF_NAMES = {"llama3": "llama", "mistral": "llama", "mixtral": "llama"}
# Mixture of experts: every layer routes each token to 2 of 8 experts.
MOE = ["qwen3moe", "mixtral", "qwen2moe", "gpt-oss"]
# Where a quantized file's router logits move across a near tie, a token runs another expert
# and its logits move far (the README's account); the bulk of positions must still be close:
# (median over positions of the largest difference, largest difference anywhere).
MOE_TOLERANCE = {"f16": (5e-2, 0.5), "q8_0": (0.3, 2.5)}
# What llama.cpp computed for each file (its greedy tokens, with an f32 KV cache).
LLAMA_CPP = SHARED / "tools" / "arch-refs" / "summary.json"


def check_mixture_on_a_gpu(
    arch_dir: Path, prompt: list[int], arch: str, file_type: str, device: str
) -> None:
    """A mixture of experts' file run on ``device`` and on the CPU, both with f16 KV pages:
    each gives transformers' logits at most positions, within what the pages (and Q8_0 weights)
    round, where a router logit moved across a near tie may send a token to another expert
    (qwen2moe's gap is 0.0005; see above); and the two agree at most positions."""
    path = str(arch_dir / arch / f"{arch}-{file_type}.gguf")
    reference = np.load(arch_dir / arch / "ref_logits.npy")
    on_gpu = all_logits(_core.Model(path, device=device), prompt, "f16")
    on_cpu = all_logits(_core.Model(path), prompt, "f16")
    median, most = {"f32": (5e-3, 0.5), "q8_0": MOE_TOLERANCE["q8_0"]}[file_type]
    for logits in (on_gpu, on_cpu):
        per_position = np.abs(logits - reference).max(axis=1)
        assert float(np.median(per_position)) <= median, per_position
        assert float(per_position.max()) <= most, per_position
    # The CPU's products read activations quantized to 8 bits where the weights are quantized;
    # the GPUs' read them in f32 (or f16).
    cpu_bound = 1e-3 if file_type == "f32" else 0.3
    assert float(np.median(np.abs(on_gpu - on_cpu).max(axis=1))) <= cpu_bound


# The formats whose quants index a table of 16 values.
LOOKUP_FORMATS = ["IQ4_NL", "IQ4_XS", "MXFP4"]


def check_lookup_format_on_a_gpu(
    arch_dir: Path, tmp_path: Path, prompt: list[int], ty: str, device: str
) -> None:
    """Weights of ``ty`` (one of ``LOOKUP_FORMATS``) on ``device`` and on the CPU: llama3
    converted to that file type (llama-quantize's choice of formats for each matrix), or for
    MXFP4 gpt-oss as released (its experts in MXFP4). The two give the same logits within what
    the CPU's activations, quantized to 8 bits, round (at most positions for gpt-oss, whose
    router may send a token elsewhere across a near tie)."""
    # Imported here: test_checkpoints imports this module.
    from test_checkpoints import released_gpt_oss

    if ty == "MXFP4":
        folder, _, _ = released_gpt_oss(arch_dir, tmp_path)
        path = tmp_path / "gpt-oss-mxfp4.gguf"
        _core.convert_checkpoint(folder, path)
    else:
        path = tmp_path / f"llama3-{ty}.gguf"
        _core.convert_checkpoint(arch_dir / "llama3" / "hf", path, quantize=ty)
    assert ty in {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    on_gpu = all_logits(_core.Model(str(path), device=device), prompt, "f16")
    on_cpu = all_logits(_core.Model(str(path)), prompt, "f16")
    per_position = np.abs(on_gpu - on_cpu).max(axis=1)
    assert float(np.median(per_position) if ty == "MXFP4" else per_position.max()) <= 0.3


def _greedy(model: _core.Model, ids: list[int], n: int) -> list[int]:
    kv = f32_pool(model)
    seq = kv.create()
    kv.reserve(seq, len(ids))
    tokens: list[int] = []
    logits = model.forward(kv, [(seq, ids, "last")])
    for _ in range(n):
        tokens.append(int(np.argmax(logits[-1])))
        kv.reserve(seq, 1)
        logits = model.forward(kv, [(seq, tokens[-1:], "last")])
    return tokens


@pytest.mark.parametrize(("arch", "f32_tolerance"), ARCHITECTURES)
@pytest.mark.parametrize("file_type", ["f32", "f16", "q8_0"])
def test_logits_match_transformers(
    arch_dir: Path, prompt: list[int], arch: str, f32_tolerance: float, file_type: str
) -> None:
    model = _core.Model(str(arch_dir / arch / f"{arch}-{file_type}.gguf"))
    reference = np.load(arch_dir / arch / "ref_logits.npy")
    diff = float(np.abs(all_logits(model, prompt) - reference).max())
    assert diff <= TOLERANCE.get(file_type, f32_tolerance), diff


@pytest.mark.parametrize("arch", MOE)
@pytest.mark.parametrize("file_type", ["f32", "f16", "q8_0"])
def test_mixture_of_experts_logits_match_transformers(
    arch_dir: Path, prompt: list[int], arch: str, file_type: str
) -> None:
    model = _core.Model(str(arch_dir / arch / f"{arch}-{file_type}.gguf"))
    reference = np.load(arch_dir / arch / "ref_logits.npy")
    per_position = np.abs(all_logits(model, prompt) - reference).max(axis=1)
    if file_type == "f32":
        assert float(per_position.max()) <= 1e-4, per_position
    else:
        median, most = MOE_TOLERANCE[file_type]
        assert float(np.median(per_position)) <= median, per_position
        assert float(per_position.max()) <= most, per_position


@pytest.mark.parametrize("arch", MOE)
@pytest.mark.parametrize("file_type", ["f32", "f16", "q8_0"])
def test_mixture_of_experts_greedy_tokens_match_llama_cpp(
    arch_dir: Path, prompt: list[int], arch: str, file_type: str
) -> None:
    """The quantized files' near ties (see above) send llama.cpp's greedy continuation away
    from transformers' (Q8_0 agrees for 3 to 5 tokens): the same file must give the same
    tokens here, near ties and all."""
    expected = json.loads(LLAMA_CPP.read_text())["models"][arch][file_type]["llamacpp"]["greedy"]
    model = _core.Model(str(arch_dir / arch / f"{arch}-{file_type}.gguf"))
    assert _greedy(model, prompt, len(expected)) == expected


def test_leading_dense_layers_run_a_dense_feed_forward(
    arch_dir: Path, prompt: list[int], tmp_path: Path
) -> None:
    """A mixture whose first layers are dense (``leading_dense_block_count``, as DeepSeek's and
    GLM-4.5's): qwen3moe with layer 0's experts all made one expert, so that any routing gives
    that expert's output, against the same model with layer 0 written as a dense feed-forward
    of that expert's weights (and no router)."""
    src = arch_dir / "qwen3moe" / "qwen3moe-f32.gguf"
    stacks = {
        t.name: np.asarray(t.data, dtype=np.float64)
        for t in gguf.GGUFReader(src).tensors
        if t.name.startswith("blk.0.ffn_") and t.name.endswith("_exps.weight")
    }
    alike = {name: np.repeat(w[:1], len(w), axis=0) for name, w in stacks.items()}
    count, ff = stacks["blk.0.ffn_gate_exps.weight"].shape[:2]
    dense = {name.replace("_exps", ""): w[0] for name, w in stacks.items()}
    alike_path = rewrite(src, tmp_path / "alike.gguf", {}, alike)
    dense_path = rewrite(
        src,
        tmp_path / "dense.gguf",
        {"qwen3moe.leading_dense_block_count": 1, "qwen3moe.feed_forward_length": int(ff)},
        dense,
        drop=frozenset(stacks) | {"blk.0.ffn_gate_inp.weight"},
    )
    assert count == 8
    logits = {p: all_logits(_core.Model(str(p)), prompt) for p in (src, alike_path, dense_path)}
    assert float(np.abs(logits[alike_path] - logits[dense_path]).max()) <= 1e-4
    # The experts made alike change the model: the comparison above is not of two originals.
    assert float(np.abs(logits[alike_path] - logits[src]).max()) > 1e-2
    proc = run_cli("info", "-m", str(dense_path))
    assert proc.returncode == 0, proc.stderr
    assert "8 experts, 2 per token, the first layer dense" in proc.stdout.decode()


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_sliding_window_layers_give_back_their_pages_and_keep_the_logits(
    arch_dir: Path, prompt: list[int], arch: str
) -> None:
    """Token by token through pages of 4 positions (the window is 8): the windowed layers'
    page tables lose the pages no query sees, the pool holds only the window for them, and
    every position's logits still match transformers'."""
    model = _core.Model(str(arch_dir / arch / f"{arch}-f32.gguf"))
    reference = np.load(arch_dir / arch / "ref_logits.npy")
    metadata = model.metadata()
    assert metadata[f"{arch}.attention.sliding_window"] == 8
    n_layer = metadata[f"{arch}.block_count"]
    assert isinstance(n_layer, int)
    kv = model.new_kv_cache(dtype="f32", page_size=4, max_pages=64)
    # gemma2: two local and two global layers, groups of two; gemma3: five local layers and a
    # global one, groups of one.
    assert kv.n_groups == {"gemma2": 2, "gemma3": 6}[arch]
    seq = kv.create()
    for pos, token in enumerate(prompt):
        kv.reserve(seq, 1)
        logits = model.forward(kv, [(seq, [token], "last")])
        assert float(np.abs(logits[0] - reference[pos]).max()) <= 1e-4, pos
    released = 2**32 - 1
    tables = [kv.page_table(seq, layer) for layer in range(n_layer)]
    assert all(len(t) == len(prompt) // 4 for t in tables)
    # The last query (position 31) sees positions 24..31, pages 6 and 7: the windowed
    # layers hold only those, the global ones every page.
    windowed = [t for t in tables if released in t]
    assert 0 < len(windowed) < n_layer
    assert all(t[:6] == [released] * 6 and released not in t[6:] for t in windowed)
    assert all(released not in t for t in tables if t not in windowed)
    pages_used = sum(len(t) - t.count(released) for t in tables) // (n_layer // kv.n_groups)
    assert kv.stats()["pages_used"] == pages_used
    kv.free(seq)
    assert kv.n_free == kv.n_pages


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_engine_with_a_pool_smaller_than_the_context_still_matches_transformers(
    arch_dir: Path, prompt: list[int], arch: str
) -> None:
    """Through the engine (scheduler, batched steps, several requests): three requests
    prefilled together in a pool of pages of 4 positions too small to keep every layer's 48
    positions for the three, which fits because the sliding-window layers give their pages
    back; every request's greedy tokens are transformers', with no preemption."""
    model = _core.Model(str(arch_dir / arch / f"{arch}-f32.gguf"))
    expected = [int(t) for t in np.load(arch_dir / arch / "ref_greedy.npy")]
    every_position = 3 * model.kv_pages_to_hold(48, page_size=4, chunk=48)
    # Without prefix caching, so that the three requests share no page.
    config = EngineConfig(
        max_num_seqs=3,
        max_tokens_per_step=3 * len(prompt),
        page_size=4,
        kv_pages=every_position * 3 // 4,
        prefix_caching=False,
    )
    engine = Engine(model, config)
    params = SamplingParams(max_tokens=len(expected), temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add(f"r{i}", prompt, params)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(3)}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            tokens[out.request_id] += out.new_token_ids
    assert all(t == expected for t in tokens.values()), tokens
    assert engine.scheduler.num_preemptions == 0


@pytest.mark.parametrize("arch", [arch for arch, _ in ARCHITECTURES] + MOE)
def test_greedy_tokens_match_transformers(arch_dir: Path, prompt: list[int], arch: str) -> None:
    model = _core.Model(str(arch_dir / arch / f"{arch}-f32.gguf"))
    expected = [int(t) for t in np.load(arch_dir / arch / "ref_greedy.npy")]
    assert _greedy(model, prompt, len(expected)) == expected


@pytest.mark.parametrize("arch", [arch for arch, _ in ARCHITECTURES] + MOE)
def test_every_architecture_runs_through_the_public_api(arch_dir: Path, arch: str) -> None:
    with tallow.LLM(arch_dir / arch / f"{arch}-q8_0.gguf", n_ctx=64) as llm:
        result = llm.generate("Hello there", max_tokens=8, temperature=0)
        assert result.completion_tokens > 0
        assert llm.architecture == GGUF_NAMES.get(arch, arch)


def test_info_describes_the_architecture(arch_dir: Path) -> None:
    proc = run_cli("info", "-m", str(arch_dir / "phi3" / "phi3-q8_0.gguf"))
    assert proc.returncode == 0, proc.stderr
    assert "architecture: phi3 (NeoX RoPE, fused QKV, fused gate/up)" in proc.stdout.decode()
    proc = run_cli("info", "-m", str(arch_dir / "qwen2moe" / "qwen2moe-q8_0.gguf"))
    assert proc.returncode == 0, proc.stderr
    described = "architecture: qwen2moe (NeoX RoPE, 8 experts, 2 per token, a shared expert)"
    assert described in proc.stdout.decode()


CAPPED = """
import sys, numpy as np
from tallow import _core
model = _core.Model(sys.argv[1])
kv = model.new_kv_cache(dtype="f32", max_pages=model.kv_pages_to_hold(64, chunk=64))
seq = kv.create()
ids = [int(t) for t in np.load(sys.argv[2])]
kv.reserve(seq, len(ids))
np.save(sys.argv[3], model.forward(kv, [(seq, ids, "all")]))
print(_core.isa())
"""


@pytest.mark.parametrize("cap", ["avx2", "scalar"])
def test_capped_instruction_sets_compute_the_same_model(
    arch_dir: Path, prompt: list[int], tmp_path: Path, cap: str
) -> None:
    """TALLOW_ISA runs a lesser CPU's kernels (every one: matrix products, attention with and
    without a window, activations): the gemma3 reference still matches transformers."""
    if cap == "avx2" and _core.isa() not in ("avx2", "avx512", "avx512vnni"):
        pytest.skip("this CPU has no AVX2")
    model = arch_dir / "gemma3" / "gemma3-f32.gguf"
    out = tmp_path / "logits.npy"
    proc = subprocess.run(
        [sys.executable, "-c", CAPPED, str(model), str(arch_dir / "prompt_ids.npy"), str(out)],
        env={**os.environ, "TALLOW_ISA": cap},
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == cap
    reference = np.load(arch_dir / "gemma3" / "ref_logits.npy")
    assert float(np.abs(np.load(out) - reference).max()) < 1e-4


def test_an_unknown_cap_is_reported_and_ignored() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "from tallow import _core; print(_core.isa())"],
        env={**os.environ, "TALLOW_ISA": "sse9"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "ignoring TALLOW_ISA" in proc.stderr and "avx2" in proc.stderr
    assert proc.stdout.strip() == _core.isa()
