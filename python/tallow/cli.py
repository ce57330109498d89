"""The ``tallow`` command line.

Commands: ``pull``, ``list``, ``generate``, ``chat``, ``serve``, ``bench``, ``tokenize``,
``perplexity``, ``info``. Results go to stdout; status, progress and timings go to stderr.
Every error prints one line ``tallow: error: ...`` on stderr and exits with status 1 (130 when
interrupted, 2 for bad usage).
"""

from __future__ import annotations

import _thread
import signal

# Ctrl-C while the rest of this module loads (the core with it) is kept for main(), which
# exits with 130 as for any interruption, instead of a traceback from inside an import.
_interrupted_early: list[int] = []
try:
    _sigint = signal.signal(signal.SIGINT, lambda signum, frame: _interrupted_early.append(signum))
except ValueError:  # imported outside the main thread: no signals to take
    _sigint = None

import argparse
import contextlib
import functools
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

# Only light modules here: the heavy ones (numpy, the engine) are imported by the commands,
# after main() is listening for Ctrl-C.
from tallow._progress import format_bytes
from tallow.errors import InvalidArgumentError, ModelNotFoundError, TallowError

if TYPE_CHECKING:
    from tallow.llm import LLM

if _sigint is not None:
    signal.signal(signal.SIGINT, _sigint)

__all__ = ["build_parser", "main"]

# How long after a dropped Ctrl-C it is delivered again (see `_interrupts_kept`): long enough
# for the callback that dropped it to have returned.
_INTERRUPT_AGAIN_S = 0.01

# (elements per block, bytes per block) of the GGML tensor types, for the size summary.
_TYPE_BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "F64": (1, 8),
    "I8": (1, 1),
    "I16": (1, 2),
    "I32": (1, 4),
    "I64": (1, 8),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q8_1": (32, 36),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "Q8_K": (256, 292),
}

# Hyper-parameters shown by `tallow info`, as suffixes of "<architecture>.".
_HPARAMS = (
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "rope.freq_base",
    "rope.dimension_count",
    "vocab_size",
)


def _status(message: str) -> None:
    print(f"tallow: {message}", file=sys.stderr, flush=True)


def _read_utf8(data: bytes, origin: str) -> str:
    """Decode raw bytes as UTF-8 (strict: invalid bytes are an error, nothing is translated)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(
            f"{origin} is not valid UTF-8 (invalid byte at offset {exc.start})"
        ) from None


def _read_file(path: str) -> str:
    if path == "-":
        return _read_utf8(_stdin().buffer.read(), "standard input")
    return _read_utf8(Path(path).read_bytes(), path)


def _stdin() -> TextIO:
    if sys.stdin is None:  # started with stdin closed (`<&-`)
        raise InvalidArgumentError("standard input is closed")
    return sys.stdin


def _check_arg_text(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError("the text argument is not valid UTF-8") from None
    return text


def _load(args: argparse.Namespace, n_ctx: int | None = None, kv_dtype: str = "f16") -> LLM:
    """The model ``args`` name (``--model``, ``--device``, ``--quantize``)."""
    from tallow.llm import LLM

    model = args.model
    start = time.perf_counter()
    device = getattr(args, "device", None)
    llm = LLM(model, n_ctx=n_ctx, device=device, kv_dtype=kv_dtype, quantize=args.quantize)
    on = "" if llm.device == "cpu" else f" on {llm.device} ({llm.device_name})"
    _status(
        f"loaded {model} ({llm.architecture}, {llm.n_vocab} tokens of vocabulary){on} "
        f"in {time.perf_counter() - start:.2f} s"
    )
    return llm


# -- commands -----------------------------------------------------------------------------------


def _cmd_pull(args: argparse.Namespace) -> int:
    from tallow import catalog

    path = catalog.pull(args.name, force=args.force)
    print(path)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from tallow import catalog, hub

    entries = catalog.load_catalog()
    for name in sorted(entries):
        entry = entries[name]
        mark = "*" if name == catalog.DEFAULT_MODEL else " "
        state = "pulled" if catalog.is_present(name) else "not pulled"
        print(f"{mark} {name:<16} {format_bytes(entry.size):>10}  {state:<10}  {entry.description}")
    ggufs = hub.cached_ggufs()
    if ggufs:
        print("\nHub models in the Hugging Face cache (-m hf://REPO/FILE):")
    for gguf in ggufs:
        parts = f" ({gguf.parts} parts)" if gguf.parts > 1 else ""
        print(f"  {gguf.repo:<40} {format_bytes(gguf.size):>10}  {gguf.file}{parts}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from tallow.engine import sampling_params

    prompt = _read_file("-") if args.prompt == "-" else _check_arg_text(args.prompt)
    max_tokens = None if args.max_tokens == -1 else args.max_tokens
    # Check the sampling arguments before spending time on loading the model.
    sampling_params(max_tokens, args.temperature, args.top_k, args.top_p, args.seed, args.stop)
    llm = _load(args, args.ctx)
    stream = llm.stream(
        prompt,
        max_tokens=max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
    )
    out = sys.stdout
    for piece in stream:
        out.write(piece)
        out.flush()
    result = stream.result
    assert result is not None
    if out.isatty():
        out.write("\n")
        out.flush()

    def rate(n: int, seconds: float) -> str:
        return f"{n / seconds:.1f} tokens/s" if seconds > 0 else "-"

    _status(
        f"prompt: {result.prompt_tokens} tokens in {result.prompt_seconds:.2f} s "
        f"({rate(result.prompt_tokens, result.prompt_seconds)}); "
        f"generated: {result.completion_tokens} tokens in {result.completion_seconds:.2f} s "
        f"({rate(result.completion_tokens, result.completion_seconds)}); "
        f"finish: {result.finish_reason}"
    )
    return 0


_CHAT_HELP = "/reset clears the conversation, /exit (or Ctrl-D) quits, Ctrl-C stops an answer"


def _cmd_chat(args: argparse.Namespace) -> int:
    from tallow.engine import sampling_params

    max_tokens = None if args.max_tokens == -1 else args.max_tokens
    sampling_params(max_tokens, args.temperature, args.top_k, args.top_p, args.seed, None)
    _stdin()
    llm = _load(args, args.ctx)
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    start: list[dict[str, str]] = []
    if args.system:
        start.append({"role": "system", "content": args.system})
    history = list(start)
    _status(_CHAT_HELP)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            history = list(start)
            print("(conversation cleared)", flush=True)
            continue
        if text.startswith("/"):
            print(f"(unknown command {text.split()[0]}; {_CHAT_HELP})", flush=True)
            continue
        history.append({"role": "user", "content": line})
        reply = _answer(
            functools.partial(
                llm.chat_stream,
                history,
                max_tokens,
                args.temperature,
                args.top_k,
                args.top_p,
                args.seed,
            )
        )
        if reply is None:
            history.pop()
        else:
            history.append({"role": "assistant", "content": reply})


def _answer(start: Callable[[], Iterator[str]]) -> str | None:
    """Print the pieces of an answer as they come, until it ends or Ctrl-C stops it; return
    the text printed, or None when the answer could not start (the error is printed)."""
    stopped = threading.Event()
    # From here on Ctrl-C only sets a flag: the engine is never interrupted in a step.
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stopped.set())
    pieces: list[str] = []
    try:
        try:
            stream = start()
        except TallowError as e:
            print(f"({_one_line(str(e))}; /reset starts over)", flush=True)
            return None
        try:
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
                pieces.append(piece)
                if stopped.is_set():
                    break
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    finally:
        signal.signal(signal.SIGINT, previous)
    print(" [stopped]" if stopped.is_set() else "", flush=True)
    return "".join(pieces)


def _cmd_serve(args: argparse.Namespace) -> int:
    from tallow.server import ServerOptions, parse_size, serve

    try:
        kv_memory = None if args.kv_memory is None else parse_size(args.kv_memory)
        max_request_bytes = parse_size(args.max_request_bytes)
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from None
    if args.max_batch <= 0:
        raise InvalidArgumentError(f"--max-batch must be positive, got {args.max_batch}")
    if args.ctx is not None and args.ctx <= 0:
        raise InvalidArgumentError(f"the context size must be positive, got {args.ctx}")
    if max_request_bytes <= 0:
        raise InvalidArgumentError("--max-request-bytes must be positive")
    if not 0 < args.read_timeout < 1e6:
        raise InvalidArgumentError(f"--read-timeout must be positive, got {args.read_timeout}")
    api_key = args.api_key if args.api_key is not None else os.environ.get("TALLOW_API_KEY")
    if api_key is not None and not api_key.strip():
        raise InvalidArgumentError("the API key is empty")
    origins = tuple(o.strip() for arg in args.allowed_origins for o in arg.split(",") if o.strip())
    options = ServerOptions(
        api_key=api_key,
        allowed_origins=origins,
        max_request_bytes=max_request_bytes,
        read_timeout=args.read_timeout,
        parse_special_in_messages=args.parse_special_in_messages,
    )
    chat_template = None
    if args.chat_template is not None:
        try:
            chat_template = Path(args.chat_template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"cannot read the chat template: {e}") from None
    settings = {
        "max_batch": args.max_batch,
        "kv_memory": kv_memory,
        "kv_dtype": args.kv_dtype,
        "n_ctx": args.ctx,
        "device": args.device,
        "quantize": args.quantize,
        "chat_template": chat_template,
        "options": options,
    }
    if args.threads is not None and args.threads < 1:
        raise InvalidArgumentError(f"--threads must be positive, got {args.threads}")
    if args.replicas is None:
        if args.max_replicas is not None or args.routing is not None:
            raise InvalidArgumentError("--max-replicas and --routing go with --replicas")
        if args.threads is not None:
            # Read when the first forward pass starts the thread pool.
            os.environ["TALLOW_NUM_THREADS"] = str(args.threads)
        serve(
            args.model,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            on_ready=lambda url: _status(f"serving {args.model} on {url}"),
            **settings,
        )
        return 0
    if "RAY_ADDRESS" not in os.environ:
        # Read when Ray is imported (see tallow.ray.LOOPBACK_ENV): the local cluster's own
        # services then listen on loopback alone.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import tallow.ray
    except ImportError as e:
        raise InvalidArgumentError(
            f"--replicas runs on Ray Serve, which is not installed ({e}): pip install 'tallow[ray]'"
        ) from None
    tallow.ray.run(
        args.model,
        host=args.host,
        port=args.port,
        replicas=args.replicas,
        max_replicas=args.max_replicas,
        threads=args.threads or 1,
        routing=args.routing or "prefix",
        settings=settings,
        log_level=args.log_level,
        on_ready=lambda url: _status(
            f"serving {args.model} on {url} ({args.replicas} replicas on Ray Serve)"
        ),
    )
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    for name in ("prompt", "gen", "depth", "npp", "ntg", "npl", "reps", "threads"):
        value = getattr(args, name)
        if value is not None and value < (1 if name in ("reps", "threads", "npl") else 0):
            raise InvalidArgumentError(f"--{name} must be positive, got {value}")
    if args.threads is not None:
        # Read when the first forward pass starts the thread pool.
        os.environ["TALLOW_NUM_THREADS"] = str(args.threads)
    threads = int(os.environ.get("TALLOW_NUM_THREADS") or os.cpu_count() or 1)
    import numpy as np

    from tallow import _core, bench, catalog
    from tallow.engine import load_model

    path = catalog.resolve_model(args.model)
    model = load_model(path, device=args.device, quantize=args.quantize)
    params = sum(int(np.prod(dims)) for _, _, dims in model.tensors())
    size = model.file_size
    # Warm-up: threads, page tables and kernels' first touches.
    bench.prefill(model, 16)
    bench.decode(model, 2)
    tests: list[tuple[str, Callable[[int], float]]] = []
    depth = args.depth
    if depth + max(args.prompt, args.gen) > model.n_ctx_max:
        raise InvalidArgumentError(
            f"--depth {depth} and {max(args.prompt, args.gen)} more tokens go beyond this "
            f"model's context of {model.n_ctx_max}"
        )
    at = f" @ d{depth}" if depth else ""  # llama-bench's names
    kv = args.kv_dtype
    if args.prompt:
        tests.append(
            (
                f"pp{args.prompt}{at}",
                lambda seed: bench.prefill(model, args.prompt, seed, depth, kv),
            )
        )
    if args.gen:
        tests.append(
            (f"tg{args.gen}{at}", lambda seed: bench.decode(model, args.gen, seed, depth, kv))
        )
    if args.npp and args.ntg:
        name = f"pp{args.npp}+tg{args.ntg} x{args.npl}"
        tests.append(
            (
                name,
                lambda seed: bench.batched(model, args.npp, args.ntg, args.npl, seed, kv).total_tps,
            )
        )
    if model.device == "cpu":
        _status(f"kernels: {_core.isa()} (TALLOW_ISA caps them)")
    else:
        name, backend = model.device_info
        _status(f"device: {model.device}, {name} ({backend})")
    print("| model | size | params | threads | test | t/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    decode_rate = None
    for name, run in tests:
        rates = [run(seed) for seed in range(args.reps)]
        spread = float(np.std(rates, ddof=1)) if len(rates) > 1 else 0.0
        print(
            f"| {path.name} | {size / 2**20:.2f} MiB | {params / 1e6:.2f} M | {threads} | "
            f"{name} | {float(np.mean(rates)):.2f} ± {spread:.2f} |",
            flush=True,
        )
        if name.startswith("tg"):
            decode_rate = float(np.mean(rates))
    used = bench.memory(model)  # before the bandwidth probe's buffer adds to the peak
    if decode_rate is not None:
        _status(f"decode: {bench.decode_reads(model, decode_rate)}")
    _status(f"memory: {used}")
    return 0


def _cmd_tokenize(args: argparse.Namespace) -> int:
    if args.file is not None and args.text is not None:
        raise InvalidArgumentError("give either TEXT or -f FILE, not both")
    if args.file is not None:
        text = _read_file(args.file)
    elif args.text is not None:
        text = _check_arg_text(args.text)
    else:
        text = _read_file("-")
    llm = _load(args)
    ids = llm.tokenize(text, add_special=args.add_special, parse_special=args.parse_special)
    if args.ids:
        print(json.dumps(ids))
    else:
        for tid in ids:
            print(f"{tid:>6} {json.dumps(llm.detokenize([tid]), ensure_ascii=False)}")
    return 0


def _cmd_classify(args: argparse.Namespace) -> int:
    texts = [_check_arg_text(t) for t in args.text]
    if not texts:
        texts = [line for line in _read_file("-").splitlines() if line.strip()]
    labels = [label.strip() for label in _check_arg_text(args.labels).split(",")]
    llm = _load(args)
    results = llm.classify(texts, labels, args.prompt)
    for text, result in zip(texts, results, strict=True):
        probs = dict(zip(result.labels, result.probs, strict=True))
        if args.json:
            line = {"text": text, "label": result.label, "probs": probs}
            print(json.dumps(line, ensure_ascii=False))
        else:
            shown = "  ".join(f"{label}={p:.3f}" for label, p in probs.items())
            print(f"{result.label}\t{shown}\t{text}")
    return 0


def _cmd_embed(args: argparse.Namespace) -> int:
    texts = [_check_arg_text(t) for t in args.text]
    if not texts:
        texts = [line for line in _read_file("-").splitlines() if line.strip()]
    if not texts:
        raise InvalidArgumentError("no text to embed: give TEXT or lines on stdin")
    llm = _load(args)
    vectors = llm.embed(
        texts, normalize=not args.no_normalize, pooling=args.pooling, dimensions=args.dimensions
    )
    for text, vector in zip(texts, vectors, strict=True):
        line = {"text": text, "embedding": [float(v) for v in vector]}
        print(json.dumps(line, ensure_ascii=False))
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from tallow import _core

    folder = Path(args.folder).expanduser()
    if not folder.is_dir():
        raise ModelNotFoundError(f"no checkpoint folder at {folder}")
    out = Path(args.out).expanduser()
    start = time.perf_counter()
    _core.convert_checkpoint(folder, out, args.type)
    size = out.stat().st_size
    _status(f"wrote {out} ({format_bytes(size)}) in {time.perf_counter() - start:.2f} s")
    return 0


def _cmd_perplexity(args: argparse.Namespace) -> int:
    text = _read_file(args.file)
    llm = _load(args, kv_dtype=args.kv_dtype)
    start = time.perf_counter()
    _status(f"perplexity of {args.file} with a context of {args.ctx} tokens")

    def progress(i: int, n: int, ppl: float) -> None:
        sep = "\n" if i == n else ","
        if i == 1:
            sys.stderr.write(f"tallow: {n} chunks: ")
        sys.stderr.write(f"[{i}]{ppl:.4f}{sep}")
        sys.stderr.flush()

    ppl = llm.perplexity(text, ctx=args.ctx, progress=progress)
    _status(f"done in {time.perf_counter() - start:.2f} s")
    print(f"PPL = {ppl:.4f}")
    return 0


def _summarize(value: object, width: int = 60, items: int = 4) -> str:
    if isinstance(value, str):
        if len(value) > width:
            return f"{value[:width]!r}... ({len(value)} characters)"
        return repr(value)
    if isinstance(value, list):
        kinds = sorted({type(v).__name__ for v in value}) or ["empty"]
        shown = ", ".join(_summarize(v, 24, 2) for v in value[:items])
        more = ", ..." if len(value) > items else ""
        return f"[{shown}{more}] ({len(value)} × {'/'.join(kinds)})"
    return repr(value)


def _write_info(llm: LLM, out: TextIO) -> None:
    meta = llm.metadata()
    arch = llm.architecture
    out.write(f"model: {llm.path} ({format_bytes(llm.file_size)})\n")
    if "general.name" in meta:
        out.write(f"name: {meta['general.name']}\n")
    features = ", ".join(llm.architecture_features)
    out.write(f"architecture: {arch} ({features})\n")
    out.write(
        f"vocabulary: {llm.n_vocab} tokens; bos {llm.bos_id}, eos {llm.eos_id}, "
        f"add_bos {str(llm.add_bos).lower()}, end of generation {llm.eog_ids}\n"
    )
    if "tokenizer.ggml.model" in meta:
        pre = meta.get("tokenizer.ggml.pre", "default")
        out.write(f"tokenizer: {meta['tokenizer.ggml.model']} (pre-tokenizer {pre})\n")
    out.write("hyper-parameters:\n")
    for key in _HPARAMS:
        full = f"{arch}.{key}"
        if full in meta:
            out.write(f"  {full} = {meta[full]}\n")

    out.write(f"metadata: {len(meta)} keys\n")
    for key in sorted(meta):
        out.write(f"  {key} = {_summarize(meta[key])}\n")

    tensors = llm.tensors()
    by_type: Counter[str] = Counter()
    params_by_type: Counter[str] = Counter()
    bytes_by_type: Counter[str] = Counter()
    for _name, type_name, dims in tensors:
        n = 1
        for d in dims:
            n *= d
        by_type[type_name] += 1
        params_by_type[type_name] += n
        block = _TYPE_BLOCKS.get(type_name)
        if block is not None:
            bytes_by_type[type_name] += n // block[0] * block[1]
    total_params = sum(params_by_type.values())
    total_bytes = sum(bytes_by_type.values())
    out.write(
        f"tensors: {len(tensors)}, {total_params / 1e6:.1f}M parameters, "
        f"{format_bytes(total_bytes)}\n"
    )
    for type_name in sorted(by_type, key=lambda t: (-by_type[t], t)):
        size = format_bytes(bytes_by_type[type_name]) if type_name in _TYPE_BLOCKS else "? bytes"
        out.write(
            f"  {type_name:<5} {by_type[type_name]:>5} tensors "
            f"{params_by_type[type_name] / 1e6:>9.2f}M parameters {size:>12}\n"
        )


def _cmd_info(args: argparse.Namespace) -> int:
    if args.devices:
        from tallow import _core

        for device, name, backend, memory in _core.devices():
            size = "" if memory is None else f", {format_bytes(memory)}"
            print(f"{device:<8} {name} ({backend}{size})")
        return 0
    llm = _load(args)
    _write_info(llm, sys.stdout)
    return 0


# -- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tallow``."""
    from tallow import __version__, catalog

    parser = argparse.ArgumentParser(
        prog="tallow",
        description="Run GGUF language models on the CPU or a GPU.",
        epilog=(
            "MODEL is a path to a .gguf file, a catalog name (see `tallow list`), or a Hugging "
            "Face Hub name: user/repo:QUANT, user/repo (Q4_K_M, else Q8_0, else the first GGUF) "
            "or hf://user/repo/path/file.gguf. Catalog models are pulled into $TALLOW_HOME "
            "(default ~/.cache/tallow), Hub models into the Hugging Face cache ($HF_HOME; "
            "$HF_TOKEN for gated repos), on first use."
        ),
    )
    parser.add_argument("--version", action="version", version=f"tallow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "-m",
            "--model",
            default=catalog.DEFAULT_MODEL,
            help="model file, catalog name, Hub name user/repo[:QUANT] or checkpoint folder "
            f"(config.json, *.safetensors) (default: {catalog.DEFAULT_MODEL})",
        )
        p.add_argument(
            "--quantize",
            default=None,
            metavar="TYPE",
            help="for a checkpoint folder: round its matrices as it loads to llama-quantize's "
            "file type TYPE (q4_k_m, q8_0, q6_k, q5_k_m, q4_0, f16, ...; default: the "
            "checkpoint's precision)",
        )

    def device_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--device",
            default=None,
            help="where the model runs: cpu, gpu (the first GPU), wgpu:N, cuda:N or metal (see "
            "`tallow info --devices`; default: $TALLOW_DEVICE, else cpu)",
        )

    def kv_dtype_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--kv-dtype",
            default="f16",
            help="what the KV cache holds keys and values in: f16 (default), q8_0 (about half "
            "the memory), q4_0 (about a quarter) or bf16 (f32's range, CPU only)",
        )

    p = sub.add_parser("pull", help="download a catalog or Hub model into the cache")
    p.add_argument(
        "name",
        nargs="?",
        default=catalog.DEFAULT_MODEL,
        help="catalog name, user/repo[:QUANT] or hf://user/repo/path/file.gguf",
    )
    p.add_argument("--force", action="store_true", help="download even if already present")
    p.set_defaults(func=_cmd_pull)

    p = sub.add_parser("list", help="list the catalog models and the Hub models in the cache")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser(
        "generate",
        help="continue a prompt (the text goes to stdout as it is generated)",
        description="Continue PROMPT ('-' reads it from stdin). Only the generated text goes "
        "to stdout; status and timings go to stderr.",
    )
    p.add_argument("prompt", metavar="PROMPT")
    model_arg(p)
    device_arg(p)
    p.add_argument(
        "-n",
        "--max-tokens",
        type=int,
        default=128,
        help="tokens to generate (-1: until the context is full; default 128)",
    )
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="0 = off (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="1 = off (default 0.95)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop before this text (repeatable)",
    )
    p.add_argument("--ctx", type=int, default=None, help="context size (default 4096 or less)")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser(
        "chat",
        help="chat with a model in the terminal",
        description="An interactive chat using the model's chat template, the answer streamed "
        "as it is generated. " + _CHAT_HELP + ".",
    )
    model_arg(p)
    device_arg(p)
    p.add_argument("--system", default=None, help="a system message to start with")
    p.add_argument(
        "-n",
        "--max-tokens",
        type=int,
        default=-1,
        help="most tokens per answer (-1: until the end of turn or context; default)",
    )
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="0 = off (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="1 = off (default 0.95)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--ctx", type=int, default=None, help="context size (default 4096 or less)")
    p.set_defaults(func=_cmd_chat)

    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL at http://HOST:PORT/v1 (completions, chat completions, "
        "models), with /health and Prometheus /metrics.",
    )
    model_arg(p)
    device_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000)")
    p.add_argument(
        "--max-batch", type=int, default=64, help="most requests generated at once (default 64)"
    )
    p.add_argument(
        "--kv-memory",
        default=None,
        metavar="SIZE",
        help="memory of the KV cache, e.g. 512MiB or 2GB (default: max-batch full contexts)",
    )
    kv_dtype_arg(p)
    p.add_argument(
        "--ctx", type=int, default=None, help="context per request (default 4096 or less)"
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require this key (Authorization: Bearer KEY) on every /v1 request "
        "(default: $TALLOW_API_KEY; none when unset)",
    )
    p.add_argument(
        "--allowed-origins",
        action="append",
        default=[],
        metavar="ORIGINS",
        help="web origins whose pages may call the API from a browser, comma-separated or "
        "repeated ('*' for any; default: none)",
    )
    p.add_argument(
        "--max-request-bytes",
        default="8MiB",
        metavar="SIZE",
        help="largest request body; larger ones get 413 (default 8MiB)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="time a client has to send a request's headers, and again its body (default 30)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template to use instead of the model's own (e.g. one that "
        "describes tools)",
    )
    p.add_argument(
        "--parse-special-in-messages",
        action="store_true",
        help="parse control-token text in chat messages as control tokens (unsafe: a user "
        "can then write turns of other roles)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="server log level (default info)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="N",
        help="run N replicas (processes) on a local Ray Serve cluster, or on the one "
        "$RAY_ADDRESS names (needs tallow[ray])",
    )
    p.add_argument(
        "--max-replicas",
        type=int,
        default=None,
        metavar="M",
        help="with --replicas N: scale between N and M replicas with the load",
    )
    p.add_argument(
        "-t",
        "--threads",
        type=int,
        default=None,
        help="threads of each replica with --replicas (default 1); of the server otherwise "
        "(default: all cores)",
    )
    p.add_argument(
        "--routing",
        choices=["prefix", "random"],
        default=None,
        help="with --replicas: send requests whose prompts share a prefix to the replica that "
        "has it cached (prefix, the default), or to replicas at random",
    )
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser(
        "bench",
        help="prefill, decode and batched tokens/s (llama-bench's shape)",
        description="Measure prompt processing (ppN: one forward over N tokens), generation "
        "(tgN: N tokens one at a time) and batched serving (ppA+tgB xC: C requests of A prompt "
        "tokens generating B each, through the engine; all tokens over the wall time), each "
        "repeated -r times; prints mean ± standard deviation. 0 skips a test (the batched "
        "one when --npp or --ntg is 0).",
    )
    model_arg(p)
    device_arg(p)
    p.add_argument("-p", "--prompt", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("-n", "--gen", type=int, default=128, help="generated tokens (default 128)")
    p.add_argument(
        "-d",
        "--depth",
        type=int,
        default=0,
        help="tokens of context already in the cache for pp and tg, as llama-bench's -d "
        "(default 0)",
    )
    p.add_argument("--npp", type=int, default=128, help="batched: prompt tokens (default 128)")
    p.add_argument("--ntg", type=int, default=128, help="batched: generated tokens (default 128)")
    p.add_argument("--npl", type=int, default=16, help="batched: requests (default 16)")
    p.add_argument("-r", "--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all cores)")
    kv_dtype_arg(p)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "tokenize",
        help="print the token ids of a text",
        description="Print the tokens of TEXT, of -f FILE, or of stdin. Files and stdin are "
        "read as raw bytes and decoded as strict UTF-8 (no newline translation; invalid UTF-8 "
        "is an error). No BOS/EOS is added unless --add-special.",
    )
    p.add_argument("text", nargs="?", metavar="TEXT")
    p.add_argument("-f", "--file", help="read the text from FILE ('-': stdin)")
    model_arg(p)
    p.add_argument("--ids", action="store_true", help="print only a JSON list of ids")
    p.add_argument("--add-special", action="store_true", help="add BOS/EOS as the model asks")
    p.add_argument(
        "--parse-special", action="store_true", help="match control tokens written in the text"
    )
    p.set_defaults(func=_cmd_tokenize)

    p = sub.add_parser(
        "classify",
        help="zero-shot classification of texts into labels",
        description="For each TEXT (or each non-empty line of stdin), the probability of each "
        "label as the model's answer: the chat template around an instruction to pick one, or "
        "--prompt with {text} (and optionally {labels}) in it. Prints the most probable label, "
        "every label's probability and the text, tab-separated (--json: one object a line).",
    )
    p.add_argument("text", nargs="*", metavar="TEXT")
    p.add_argument("-l", "--labels", required=True, help="the labels, comma-separated")
    p.add_argument("--prompt", help="a prompt holding {text} instead of the chat template")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    model_arg(p)
    device_arg(p)
    p.set_defaults(func=_cmd_classify)

    p = sub.add_parser(
        "embed",
        help="embeddings of texts",
        description="For each TEXT (or each non-empty line of stdin), the model's final hidden "
        "states pooled into one vector (the pooling the model's metadata names, else the last "
        "token's) and scaled to unit length. Prints one JSON object a line: the text and its "
        "embedding.",
    )
    p.add_argument("text", nargs="*", metavar="TEXT")
    p.add_argument("--pooling", choices=["mean", "last", "cls"], help="instead of the model's")
    p.add_argument("--dimensions", type=int, help="keep the first N values (Matryoshka models)")
    p.add_argument("--no-normalize", action="store_true", help="leave the vectors' length")
    model_arg(p)
    device_arg(p)
    p.set_defaults(func=_cmd_embed)

    p = sub.add_parser(
        "perplexity",
        help="perplexity of a model on a text file (llama.cpp's protocol)",
        description="Perplexity as llama-perplexity computes it: chunks of CTX tokens, the "
        "second half of each scored. Prints `PPL = x` on stdout, progress on stderr.",
    )
    model_arg(p)
    device_arg(p)
    p.add_argument("-f", "--file", required=True, help="UTF-8 text file ('-': stdin)")
    p.add_argument("--ctx", type=int, default=512, help="chunk size in tokens (default 512)")
    kv_dtype_arg(p)
    p.set_defaults(func=_cmd_perplexity)

    p = sub.add_parser(
        "convert",
        help="write a Hugging Face checkpoint folder as a GGUF file",
        description="Convert FOLDER (config.json, *.safetensors, tokenizer.model, "
        "tokenizer_config.json, as transformers saves a model) into OUT, as llama.cpp's "
        "convert_hf_to_gguf.py does: the same metadata, tensor names and layouts.",
    )
    p.add_argument("folder", metavar="FOLDER")
    p.add_argument("out", metavar="OUT", help="the GGUF file to write")
    p.add_argument(
        "--type",
        default=None,
        metavar="TYPE",
        help="llama-quantize's file type: Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q3_K_M, Q3_K_S, "
        "Q3_K_L, Q2_K, IQ4_XS, IQ4_NL, Q8_0, Q5_1, Q5_0, Q4_1, Q4_0, F16, BF16 or F32, each matrix "
        "in the format llama-quantize gives it (default: the checkpoint's precision)",
    )
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser(
        "info",
        help="show a model's metadata and tensor summary, or the devices",
        description="Show MODEL's metadata, hyper-parameters and tensors; with --devices, "
        "the devices models can run on.",
    )
    model_arg(p)
    p.add_argument(
        "--devices", action="store_true", help="list the CPU and the GPUs found, and exit"
    )
    p.set_defaults(func=_cmd_info)
    return parser


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 0 and 65535, got {port}")
    return port


def _one_line(message: str) -> str:
    return " ".join(message.split()) or "unknown error"


def _error(message: str) -> None:
    try:
        sys.stderr.write(f"tallow: error: {_one_line(message)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _interrupt_main_again() -> None:
    """Ctrl-C for the main thread, as if pressed again (a signal, which also cuts short a
    sleep or a blocking read there, where the platform can aim one at a thread)."""
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
    else:
        _thread.interrupt_main(signal.SIGINT)


@contextlib.contextmanager
def _interrupts_kept() -> Iterator[None]:
    """Ctrl-C that lands while Python runs a callback whose exceptions it drops (a weak
    reference's, such as the import system's module locks, or a ``__del__``) is delivered again
    a moment later, where it interrupts the command, instead of being printed as an ignored
    exception and lost (the command then ran on to its end). One that has not come when the
    command ends is not sent: the command finished regardless."""
    previous = sys.unraisablehook
    pending: list[threading.Timer] = []

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            # From another thread: raised in this hook, the interruption would be dropped again.
            again = threading.Timer(_INTERRUPT_AGAIN_S, _interrupt_main_again)
            again.daemon = True
            pending.append(again)
            again.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
        for again in pending:
            again.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    # Started with stdout or stderr closed (`>&-`): write such output nowhere, and refuse the
    # commands whose results go to stdout.
    stdout_closed = sys.stdout is None
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    with _interrupts_kept():
        try:
            if _interrupted_early:
                raise KeyboardInterrupt
            args = build_parser().parse_args(argv)
            if stdout_closed and args.func is not _cmd_serve:
                raise InvalidArgumentError("standard output is closed")
            status: int = args.func(args)
            return status
        except KeyboardInterrupt:
            _error("interrupted")
            return 130
        except RuntimeError as exc:
            # Ctrl-C while a command imports a module that makes a dataclass: Python 3.11 wraps
            # what a class's making raises in a RuntimeError.
            if not isinstance(exc.__cause__, KeyboardInterrupt):
                raise
            _error("interrupted")
            return 130
        except BrokenPipeError:
            # The reader went away (e.g. `| head`): stop quietly, and keep Python from complaining
            # again when it flushes stdout at exit.
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            return 1
        except TallowError as exc:
            _error(str(exc))
            return 1
        except OSError as exc:
            if exc.strerror and exc.filename:
                _error(f"{exc.filename}: {exc.strerror}")
            else:
                _error(str(exc) or type(exc).__name__)
            return 1
