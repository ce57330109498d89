"""The wgpu backend, on whatever adapter wgpu finds (Mesa's llvmpipe on a machine without a GPU;
the test command installs it): every architecture's logits and greedy tokens (mixtures of
experts too) against transformers and the CPU backend, the engine's continuous batching,
prefix cache and speculation on the GPU, and the device option's errors. Tiny models keep
llvmpipe's slow kernels quick.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import all_logits, run_cli
from test_architectures import (
    ARCHITECTURES,
    LOOKUP_FORMATS,
    MOE,
    check_lookup_format_on_a_gpu,
    check_mixture_on_a_gpu,
)

import tallow
from tallow import _core
from tallow.engine import Engine, EngineConfig, SamplingParams

# An f16 KV pool rounds keys and values: transformers' logits within this on the F32 files
# (the CPU backend's f16 pool is as far); the Q8_0 files keep the architecture test's bound.
TOLERANCE = {"f32": 5e-3, "q8_0": 0.3}


def test_devices_list_the_cpu_and_a_gpu() -> None:
    devices = _core.devices()
    assert devices[0][0] == "cpu" and devices[0][2] == "cpu"
    gpus = [d for d in devices if d[0].startswith("wgpu:")]
    assert gpus, "no GPU adapter: install mesa-vulkan-drivers"
    assert [d[0] for d in gpus] == [f"wgpu:{i}" for i in range(len(gpus))]
    assert all(d[2].startswith("wgpu (") for d in gpus)


@pytest.mark.parametrize(("arch", "f32_tolerance"), ARCHITECTURES)
@pytest.mark.parametrize("file_type", ["f32", "q8_0"])
def test_every_architecture_matches_transformers_and_the_cpu(
    arch_dir: Path, prompt: list[int], arch: str, f32_tolerance: float, file_type: str
) -> None:
    path = str(arch_dir / arch / f"{arch}-{file_type}.gguf")
    gpu = _core.Model(path, device="gpu")
    assert gpu.device == "wgpu:0"
    reference = np.load(arch_dir / arch / "ref_logits.npy")
    on_gpu = all_logits(gpu, prompt, "f16")
    assert float(np.abs(on_gpu - reference).max()) <= TOLERANCE[file_type]
    on_cpu = all_logits(_core.Model(path), prompt, "f16")
    # The CPU's products read activations quantized to 8 bits where the weights are
    # quantized; the GPU's read them in f32.
    cpu_bound = 1e-3 if file_type == "f32" else 0.3
    assert float(np.abs(on_gpu - on_cpu).max()) <= cpu_bound


def test_q8_0_pages_on_the_gpu_give_the_cpus_logits(reference_dir: Path) -> None:
    """KV pages of Q8_0 blocks on the GPU, rounded as the CPU rounds them: next to the CPU's
    logits with the same pages, as the f16 pages of both are (the CPU's products round its
    activations to 8 bits), and apart from the GPU's own with f16 pages."""
    path = str(tallow.resolve_model("smollm2-135m"))
    text = (reference_dir / "perplexity" / "apache-2.0.txt").read_text()[:400]
    gpu, cpu = _core.Model(path, device="gpu"), _core.Model(path)
    ids = cpu.tokenize(text, True, False)[:48]
    logits = {
        (name, kv): all_logits(model, ids, kv)
        for name, model in [("gpu", gpu), ("cpu", cpu)]
        for kv in ["f16", "q8_0"]
    }
    apart = float(np.abs(logits["gpu", "f16"] - logits["cpu", "f16"]).max())
    assert float(np.abs(logits["gpu", "q8_0"] - logits["cpu", "q8_0"]).max()) <= 2 * apart
    assert float(np.abs(logits["gpu", "q8_0"] - logits["gpu", "f16"]).max()) > 0


@pytest.mark.parametrize("arch", MOE)
@pytest.mark.parametrize("file_type", ["f32", "q8_0"])
def test_mixtures_of_experts_match_transformers_and_the_cpu(
    arch_dir: Path, prompt: list[int], arch: str, file_type: str
) -> None:
    """Each token's experts chosen, grouped and multiplied on the GPU."""
    check_mixture_on_a_gpu(arch_dir, prompt, arch, file_type, "gpu")


@pytest.mark.parametrize("ty", LOOKUP_FORMATS)
def test_lookup_formats_give_the_cpus_logits(
    arch_dir: Path, tmp_path: Path, prompt: list[int], ty: str
) -> None:
    """IQ4_NL, IQ4_XS and MXFP4 weights decoded on the GPU."""
    check_lookup_format_on_a_gpu(arch_dir, tmp_path, prompt, ty, "gpu")


@pytest.mark.parametrize("arch", ["llama3", "qwen3", "phi3", "gemma3", "qwen3moe", "gpt-oss"])
def test_greedy_tokens_match_transformers(arch_dir: Path, prompt: list[int], arch: str) -> None:
    """Token by token through the engine on the GPU, as transformers decodes."""
    model = _core.Model(str(arch_dir / arch / f"{arch}-f32.gguf"), device="gpu")
    expected = [int(t) for t in np.load(arch_dir / arch / "ref_greedy.npy")]
    pages = model.kv_pages_to_hold(64, chunk=64)
    engine = Engine(model, EngineConfig(max_num_seqs=1, n_ctx=64, kv_pages=pages))
    assert _run(engine, {"r": prompt}, len(expected)) == {"r": expected}


def _run(
    engine: Engine, requests: dict[str, list[int]], n: int, logprobs: bool = False
) -> dict[str, list[int]]:
    """Greedy tokens of each request, run to the end; with ``logprobs`` the engine samples
    from the logits on the host instead of taking the device's argmax."""
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=logprobs)
    for rid, ids in requests.items():
        engine.add(rid, ids, params)
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            tokens[out.request_id] += out.new_token_ids
    return tokens


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_greedy_tokens_chosen_on_the_device_are_the_argmax_of_the_logits(
    arch_dir: Path, prompt: list[int], device: str
) -> None:
    """``output="argmax"`` gives the first largest of the logits the same batch gives (gemma2
    soft-caps them), row by row over chunks that ask for all, the last or no logits."""
    model = _core.Model(str(arch_dir / "gemma2" / "gemma2-q8_0.gguf"), device=device)
    chunks = [(prompt[:8], "last"), (prompt[8:13], "all"), (prompt[13:17], "none")]

    def forward(output: str) -> np.ndarray:
        kv = model.new_kv_cache(max_pages=3 * model.kv_pages_to_hold(16, chunk=16))
        batch = []
        for ids, logits in chunks:
            seq = kv.create()
            kv.reserve(seq, len(ids))
            batch.append((seq, ids, logits))
        return model.forward(kv, batch, output)  # type: ignore[call-overload, no-any-return]

    logits, tokens = forward("logits"), forward("argmax")
    assert tokens.dtype == np.uint32 and tokens.shape == (6,)
    assert tokens.tolist() == np.argmax(logits, axis=1).tolist()
    with pytest.raises(
        tallow.InvalidArgumentError, match="output must be 'logits', 'argmax' or 'draw'"
    ):
        forward("tokens")


def test_engine_batches_caches_prefixes_and_speculates_on_the_gpu(
    arch_dir: Path, prompt: list[int]
) -> None:
    """Eight concurrent requests (shared prefixes among them) give each one's tokens alone;
    the prefix cache serves a repeated prompt; prompt-lookup speculation keeps greedy tokens."""
    model = _core.Model(str(arch_dir / "gemma3" / "gemma3-q8_0.gguf"), device="gpu")
    requests = {f"r{i}": prompt[: 8 + 3 * i] for i in range(8)}
    pages = model.kv_pages_to_hold(64, chunk=64)

    def config(n: int, **kwargs: object) -> EngineConfig:
        return EngineConfig(max_num_seqs=n, n_ctx=64, kv_pages=n * pages, **kwargs)

    alone = {
        rid: _run(Engine(model, config(1)), {rid: ids}, 6)[rid] for rid, ids in requests.items()
    }
    engine = Engine(model, config(8))
    assert _run(engine, requests, 6) == alone
    stats = engine.kv.stats()
    before = stats["prefix_hit_tokens"]
    assert _run(engine, {"again": requests["r7"]}, 6) == {"again": alone["r7"]}
    assert engine.kv.stats()["prefix_hit_tokens"] > before
    repetitive = (prompt[:6] * 4)[:24]
    plain = _run(Engine(model, config(1)), {"p": repetitive}, 12)
    ngram = Engine(model, config(1, speculative="ngram"))
    assert _run(ngram, {"p": repetitive}, 12) == plain


def test_llm_runs_on_the_gpu_through_the_public_api(arch_dir: Path) -> None:
    path = arch_dir / "qwen2" / "qwen2-q8_0.gguf"
    with tallow.LLM(path, n_ctx=64, device="gpu") as gpu, tallow.LLM(path, n_ctx=64) as cpu:
        assert gpu.device == "wgpu:0" and cpu.device == "cpu"
        assert gpu.device_name
        result = gpu.generate("Hello there", max_tokens=8, temperature=0)
        assert result.completion_tokens > 0


def test_bad_devices_are_clear_errors(arch_dir: Path) -> None:
    path = str(arch_dir / "llama3" / "llama3-f32.gguf")
    with pytest.raises(tallow.InvalidArgumentError, match="device must be one of 'cpu', 'gpu'"):
        _core.Model(path, device="tpu")
    with pytest.raises(tallow.InvalidArgumentError, match="the cpu device has no number"):
        _core.Model(path, device="cpu:1")
    with pytest.raises(tallow.InvalidArgumentError, match="a GPU's number must follow"):
        _core.Model(path, device="wgpu:x")
    with pytest.raises(tallow.ModelError, match="no GPU wgpu:99"):
        _core.Model(path, device="wgpu:99")
    gpu = _core.Model(path, device="gpu")
    with pytest.raises(
        tallow.UnsupportedError, match="wgpu does not hold KV pages of f32; it holds f16, q8_0"
    ):
        gpu.new_kv_cache(dtype="f32", max_pages=4)
    # A pool on the CPU cannot serve a model on the GPU.
    kv = _core.Model(path).new_kv_cache(max_pages=4)
    seq = kv.create()
    kv.reserve(seq, 2)
    with pytest.raises(tallow.InvalidArgumentError, match="not on this model's device"):
        gpu.forward(kv, [(seq, [1, 2], "last")])


def test_tallow_device_picks_the_default_device(arch_dir: Path) -> None:
    code = "import sys, tallow; print(tallow.LLM(sys.argv[1], n_ctx=32, progress=False).device)"
    path = str(arch_dir / "mistral" / "mistral-q8_0.gguf")
    env = {**os.environ, "TALLOW_DEVICE": "gpu"}
    proc = subprocess.run(
        [sys.executable, "-c", code, path], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "wgpu:0"


def test_cli_lists_devices_and_generates_on_the_gpu(arch_dir: Path) -> None:
    proc = run_cli("info", "--devices")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert lines[0].startswith("cpu ") and any(line.startswith("wgpu:0 ") for line in lines)
    path = str(arch_dir / "phi3" / "phi3-q8_0.gguf")
    proc = run_cli("generate", "-m", path, "--device", "gpu", "-n", "4", "--temperature", "0", "Hi")
    assert proc.returncode == 0, proc.stderr
    assert "on wgpu:0" in proc.stderr.decode()
    bench = ("bench", "-m", path, "-p", "8", "-n", "2", "--npp", "0", "-r", "1")
    proc = run_cli(*bench, "--device", "gpu")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.decode().splitlines()[2:]
    assert [r.strip("|").split("|")[4].strip() for r in rows] == ["pp8", "tg2"]
    pattern = r"memory: host ([\d.]+) MiB peak RSS .*device ([\d.]+) MiB in use"
    memory = re.search(pattern, proc.stderr.decode())
    assert memory and float(memory[1]) > 0 and float(memory[2]) > 0, proc.stderr
    # What decode reads, beside what the device reads copying as many bytes.
    pattern = r"decode: [\d.]+ MiB of weights a token, [\d.]+ GB/s; wgpu:0 reads ([\d.]+) GB/s"
    reads = re.search(pattern, proc.stderr.decode())
    assert reads and float(reads[1]) > 0, proc.stderr


def test_without_a_gpu_driver_the_cpu_still_runs(arch_dir: Path) -> None:
    """With no Vulkan driver to be found, the module imports, lists the CPU and no wgpu device
    (a CUDA GPU needs no Vulkan), and a GPU is a clear error while the CPU runs."""
    code = (
        "import sys, tallow\n"
        "from tallow import _core\n"
        "print([d[0] for d in _core.devices() if not d[0].startswith('cuda:')])\n"
        "try:\n"
        "    _core.Model(sys.argv[1], device='gpu')\n"
        "except tallow.ModelError as e:\n"
        "    print('error:', e)\n"
        "print(_core.Model(sys.argv[1]).device)\n"
    )
    path = str(arch_dir / "qwen3" / "qwen3-q8_0.gguf")
    env = {
        **os.environ,
        "VK_ICD_FILENAMES": "/nonexistent.json",
        "VK_DRIVER_FILES": "/nonexistent.json",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code, path], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "['cpu']",
        "error: device error: no GPU found (wgpu sees no Vulkan, Metal or DX12 adapter)",
        "cpu",
    ]


def _without_the_vulkan_loader(command: list[str]) -> list[str]:
    """``command`` in a mount namespace where the Vulkan loader library is an empty file (as
    on a machine that never installed it): loading it fails."""
    loader = ctypes.util.find_library("vulkan")
    assert loader, "libvulkan1 is installed by the test command"
    found = subprocess.run(
        ["sh", "-c", f"ldconfig -p | sed -n 's/.*{loader} .*=> //p' | head -1"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    real = os.path.realpath(found)
    hide = f"mount --bind /dev/null {shlex.quote(real)} && exec " + shlex.join(command)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide]


def test_the_module_imports_and_runs_without_a_vulkan_loader(arch_dir: Path) -> None:
    """The built module links no Vulkan library (wgpu opens the loader at run time), so with the
    loader gone it imports, lists no wgpu device, runs a model, and a GPU is a clear error. (The
    build without the wgpu feature is compiled by the test command's clippy step; the release
    script checks the wheel's manylinux policy.)"""
    root = Path(__file__).resolve().parents[1]
    (module,) = (root / "python" / "tallow").glob("_core*.so")
    needed = subprocess.run(["readelf", "-d", str(module)], capture_output=True, text=True)
    assert "NEEDED" in needed.stdout and "vulkan" not in needed.stdout
    code = (
        "import sys, tallow\n"
        "from tallow import _core\n"
        "devices = [d[0] for d in _core.devices() if not d[0].startswith('cuda:')]\n"
        "print(tallow.__file__.startswith(sys.argv[2]), devices)\n"
        "try:\n"
        "    _core.Model(sys.argv[1], device='gpu')\n"
        "except tallow.ModelError as e:\n"
        "    print('error:', e)\n"
        "llm = tallow.LLM(sys.argv[1], n_ctx=64)\n"
        "print(llm.device, llm.generate('Hi', max_tokens=3, temperature=0).completion_tokens)\n"
    )
    path = str(arch_dir / "llama3" / "llama3-q8_0.gguf")
    env = {**os.environ, "PYTHONPATH": str(root / "python")}
    run = _without_the_vulkan_loader([sys.executable, "-c", code, path, str(root / "python")])
    proc = subprocess.run(run, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "True ['cpu']",
        "error: device error: no GPU found (wgpu sees no Vulkan, Metal or DX12 adapter)",
        "cpu 3",
    ]


REAL_MODELS = ["smollm2-135m", "gemma3-270m"]
NEAR_TIE = 0.5
"""How far behind the GPU's choice llama.cpp's may be where the two part (as in
test_gemma3.py): the GPU reads activations in f16 or f32 where llama.cpp's CPU quantizes them
to 8 bits."""


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_models_logits_agree_with_the_cpu(name: str, reference_dir: Path) -> None:
    """Every position of a 64-token prompt: the GPU's next-token distribution within a KL
    divergence of 0.03 nats of the CPU's on average (the CPU quantizes activations to 8 bits;
    both keep f16 KV), and the same most likely token at nine positions in ten or more."""
    path = str(tallow.resolve_model(name))
    text = (reference_dir / "perplexity" / "apache-2.0.txt").read_text()[:2000]
    logits = []
    for device in ("cpu", "gpu"):
        model = _core.Model(path, device=device)
        ids = model.tokenize(text, True, False)[:64]
        logits.append(model.new_context(64).eval(ids, all_logits=True))
    cpu, gpu = (_log_softmax(z) for z in logits)
    kld = (np.exp(cpu) * (cpu - gpu)).sum(axis=1)
    assert float(kld.mean()) < 0.03, kld
    assert float((cpu.argmax(1) == gpu.argmax(1)).mean()) >= 0.9


def _greedy_tokens(model: _core.Model, prompt: list[int], n: int) -> list[int]:
    context = model.new_context(64)
    logits = context.eval(prompt)
    tokens = []
    for _ in range(n):
        tokens.append(int(np.argmax(logits)))
        logits = context.eval(tokens[-1:])
    return tokens


@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_models_greedy_continuations_match_llama_cpp_and_the_cpu(
    name: str, reference_dir: Path
) -> None:
    """The first two prompts of llama.cpp's greedy continuations, decoded token by token on
    the GPU: the same tokens as llama.cpp's and as the CPU backend's, or a near tie where they
    part (never at the first token)."""
    cases = json.loads((reference_dir / "greedy" / "llamacpp_greedy.json").read_text())[name]
    path = str(tallow.resolve_model(name))
    model, cpu = _core.Model(path, device="gpu"), _core.Model(path)
    for case in cases[:2]:
        prompt = model.tokenize(case["prompt"], model.add_bos, False)
        theirs = model.tokenize(case["greedy_continuation_16_tokens"], False, False)
        for want in (theirs, _greedy_tokens(cpu, prompt, len(theirs))):
            context = model.new_context(64)
            logits = context.eval(prompt)
            for step, other in enumerate(want):
                ours = int(np.argmax(logits))
                if ours != other:
                    gap = float(logits[ours] - logits[other])
                    assert gap < NEAR_TIE and step >= 1, (case["prompt"], step, gap)
                    break
                logits = context.eval([ours])


def test_engine_on_a_real_model_on_the_gpu(reference_dir: Path) -> None:
    """smollm2 on the GPU: four concurrent requests give each one's greedy tokens alone (the
    device's argmax, and the host's sampling from logits when log probabilities are asked
    for), a repeated prompt is served from the prefix cache, and prompt-lookup speculation
    keeps the greedy tokens."""
    model = _core.Model(str(tallow.resolve_model("smollm2-135m")), device="gpu")
    text = (reference_dir / "perplexity" / "apache-2.0.txt").read_text()[:600]
    ids = model.tokenize(text, False, False)
    requests = {f"r{i}": ids[5 * i : 5 * i + 6 + 4 * i] for i in range(4)}
    pages = model.kv_pages_to_hold(64, chunk=64)

    def config(n: int, **kwargs: object) -> EngineConfig:
        return EngineConfig(max_num_seqs=n, n_ctx=64, kv_pages=n * pages, **kwargs)

    alone = {
        rid: _run(Engine(model, config(1)), {rid: prompt}, 4)[rid]
        for rid, prompt in requests.items()
    }
    engine = Engine(model, config(4))
    assert _run(engine, requests, 4) == alone
    assert _run(Engine(model, config(4)), requests, 4, logprobs=True) == alone
    before = engine.kv.stats()["prefix_hit_tokens"]
    assert _run(engine, {"again": requests["r3"]}, 4) == {"again": alone["r3"]}
    assert engine.kv.stats()["prefix_hit_tokens"] > before
    repetitive = (ids[:5] * 5)[:24]
    plain = _run(Engine(model, config(1)), {"p": repetitive}, 10)
    ngram = Engine(model, config(1, speculative="ngram"))
    assert _run(ngram, {"p": repetitive}, 10) == plain
    assert ngram.stats()["spec_accepted_tokens"] > 0


_DEVICE_MEMORY = """
import json, sys
from pathlib import Path
from tallow import _core

def file_pages_resident(path):
    # Bytes of the file's memory mappings resident in this process (Linux's smaps).
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(maxsplit=1)[0]
        if "-" in first and not first.endswith(":"):
            inside = line.endswith(path)
        elif inside and first == "Rss:":
            total += int(line.split()[1]) * 1024
    return total

model = _core.Model(sys.argv[1], device="gpu")
loaded = model.device_memory
kv = model.new_kv_cache(max_pages=64)
with_kv = model.device_memory
del kv
print(json.dumps({
    "loaded": loaded, "with_kv": with_kv, "dropped": model.device_memory,
    "page": model.kv_page_bytes(), "resident": file_pages_resident(sys.argv[1]),
    "cpu": _core.Model(sys.argv[1]).device_memory,
}))
"""


def test_weights_go_to_the_device_and_leave_the_host() -> None:
    """The GPU holds each tensor of the file once, as its GGUF blocks (the gguf package's byte
    counts); KV pages add their bytes and give them back; the host keeps the file's pages
    released (under 2% of the weights resident, though reading a tensor maps its neighbours'
    pages too). In a process of its own, where no other model maps the file."""
    path = tallow.resolve_model("smollm2-135m")
    weights = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)
    proc = subprocess.run(
        [sys.executable, "-c", _DEVICE_MEMORY, str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    in_use, peak = got["loaded"]
    assert weights <= in_use <= weights + 2**20 and peak >= in_use
    assert got["with_kv"][0] == in_use + 64 * got["page"]
    assert got["dropped"] == [in_use, in_use + 64 * got["page"]]
    assert got["resident"] < weights / 50
    assert got["cpu"] is None


SOFTWARE_ADAPTER = any("software" in kind for _, _, kind, _ in _core.devices())
"""Whether wgpu's adapter is a CPU rasterizer (Mesa's llvmpipe), where a real model's
prefill runs at a few GFLOP/s."""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "llama_cpp"), [("smollm2-135m", 17.7438), ("gemma3-270m", 8.5524)]
)
def test_real_models_perplexity_on_the_gpu_within_one_percent_of_llama_cpp(
    name: str, llama_cpp: float, reference_dir: Path
) -> None:
    """llama-perplexity -c 256 on apache-2.0.txt (the reference README), on the GPU. Under a
    software adapter the whole text would take a quarter of an hour a model, so there two
    chunks of 128 tokens from its start are scored on the GPU and on the CPU (whose whole-text
    perplexity is checked against llama.cpp's in test_perplexity.py and test_gemma3.py) and
    must agree as closely."""
    text = (reference_dir / "perplexity" / "apache-2.0.txt").read_text()
    ctx = 256
    if SOFTWARE_ADAPTER:
        ctx = 128
        with tallow.LLM(name, n_ctx=ctx, progress=False) as cpu:
            ids = cpu.tokenize(text, add_special=False)
            text = cpu.detokenize(ids[: 2 * ctx + 8])
            llama_cpp = cpu.perplexity(text, ctx=ctx)
    with tallow.LLM(name, n_ctx=ctx, device="gpu", progress=False) as llm:
        ppl = llm.perplexity(text, ctx=ctx)
    assert abs(ppl / llama_cpp - 1) < 0.01, (ppl, llama_cpp)
