"""The `tallow` command line: output on stdout, status on stderr, one-line errors."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import gguf
import pytest
from conftest import assert_one_line_error, free_port, run_cli

import tallow
import tallow.bench
from tallow import _core


def test_generate_streams_only_the_text_to_stdout(smollm2: tallow.LLM) -> None:
    prompt = "The largest planet in the solar system is"
    expected = smollm2.generate(prompt, max_tokens=12, temperature=0)
    proc = run_cli("generate", prompt, "-n", "12", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == expected.text
    stderr = proc.stderr.decode()
    assert "12 tokens" in stderr and "finish: length" in stderr


def test_generate_with_seed_and_stop(smollm2: tallow.LLM) -> None:
    prompt = "Once upon a time"
    args = ["--temperature", "0.9", "--seed", "42", "--top-k", "20", "--top-p", "0.9"]
    expected = smollm2.generate(
        prompt, max_tokens=20, temperature=0.9, seed=42, top_k=20, top_p=0.9
    )
    proc = run_cli("generate", prompt, "-n", "20", *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == expected.text
    # A stop string taken from the middle of that text cuts it there.
    stop = expected.text[len(expected.text) // 2 :][:3]
    cut = expected.text[: expected.text.index(stop)]
    proc = run_cli("generate", prompt, "-n", "20", *args, "--stop", stop)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == cut
    assert "finish: stop" in proc.stderr.decode()


def test_generate_rejects_bad_arguments_before_loading() -> None:
    proc = run_cli("generate", "Hi", "--top-p", "1.5", "-m", "/nonexistent/model.gguf")
    assert proc.returncode == 1
    assert_one_line_error(proc, "top_p")
    proc = run_cli("generate", "Hi", "--temperature", "-1")
    assert_one_line_error(proc, "temperature")
    proc = run_cli("generate", "Hi", "-n", "-5")
    assert_one_line_error(proc, "max_tokens")


def test_tokenize_file_matches_llama_cpp(reference_dir: Path) -> None:
    # -f reads raw bytes (no newline translation), as llama-tokenize -f does.
    for name, file_name in (("unicode", "unicode.txt"), ("code", "code.py")):
        text_file = reference_dir / "tokenizer" / file_name
        expected = json.loads(
            (reference_dir / "tokenizer" / f"{name}.smollm2.ids.json").read_text()
        )
        proc = run_cli("tokenize", "--ids", "-f", str(text_file))
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == expected


def test_tokenize_text_and_stdin() -> None:
    proc = run_cli("tokenize", "--ids", "Hello world")
    assert json.loads(proc.stdout) == [19556, 905]
    proc = run_cli("tokenize", "--ids", input=b"Hello world")
    assert json.loads(proc.stdout) == [19556, 905]
    proc = run_cli("tokenize", "Hello world\n")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.decode().splitlines()
    assert [row.split(None, 1) for row in rows] == [
        ["19556", '"Hello"'],
        ["905", '" world"'],
        [rows[2].split()[0], '"\\n"'],
    ]


def test_tokenize_special_tokens() -> None:
    plain = json.loads(run_cli("tokenize", "--ids", "<|im_start|>hi").stdout)
    parsed = json.loads(run_cli("tokenize", "--ids", "--parse-special", "<|im_start|>hi").stdout)
    assert parsed[0] == 1 and len(parsed) == 2
    assert len(plain) > len(parsed)
    # smollm2 adds neither BOS nor EOS, so --add-special changes nothing for it.
    assert json.loads(run_cli("tokenize", "--ids", "--add-special", "hi").stdout) == parsed[1:]


def test_tokenize_rejects_invalid_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe")
    proc = run_cli("tokenize", "-f", str(bad))
    assert proc.returncode == 1
    assert_one_line_error(proc, "not valid UTF-8", "offset 3")
    proc = run_cli("tokenize", "-f", str(tmp_path / "missing.txt"))
    assert_one_line_error(proc, "missing.txt", "no such file")


def test_info(smollm2_path: Path) -> None:
    proc = run_cli("info")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert f"model: {smollm2_path}" in out
    assert "architecture: llama" in out
    assert "vocabulary: 49152 tokens" in out
    for line in (
        "llama.block_count = 30",
        "llama.embedding_length = 576",
        "llama.attention.head_count = 9",
        "llama.attention.head_count_kv = 3",
        "llama.feed_forward_length = 1536",
        "llama.context_length = 8192",
    ):
        assert line in out
    assert re.search(r"^tensors: 272, 134\.\dM parameters", out, re.M)
    assert re.search(r"^  Q4_1\s+210 tensors", out, re.M)
    assert re.search(r"^  F32\s+61 tensors", out, re.M)
    assert re.search(r"^  Q8_0\s+1 tensors", out, re.M)
    # Long arrays are abbreviated: the vocabulary is not printed whole.
    tokens_line = next(line for line in out.splitlines() if "tokenizer.ggml.tokens" in line)
    assert "49152 × str" in tokens_line and len(tokens_line) < 200
    assert max(len(line) for line in out.splitlines()) < 300


def test_usage_errors_and_version() -> None:
    proc = run_cli()
    assert proc.returncode == 2
    assert b"usage: tallow" in proc.stderr
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.decode().strip() == f"tallow {tallow.__version__}"


def test_unknown_model_name() -> None:
    proc = run_cli("info", "-m", "no-such-model")
    assert proc.returncode == 1
    line = assert_one_line_error(proc, "no-such-model", "smollm2-135m", "gemma3-270m")
    assert line.startswith("tallow: error: unknown model")


def test_console_script_is_installed() -> None:
    script = shutil.which("tallow", path=str(Path(sys.executable).parent))
    assert script is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-memory", "lots"], "not a size: 'lots'"),
        (["--max-batch", "0"], "--max-batch must be positive"),
        (["--ctx", "-4"], "the context size must be positive"),
        (["--kv-memory", "2TB"], "memory"),
        (["--kv-memory", "9" * 400], "too large"),
        (["--ctx", "100000000"], "n_ctx=100000000"),
        (["--max-request-bytes", "0"], "--max-request-bytes must be positive"),
        (["--read-timeout", "-1"], "--read-timeout must be positive"),
        (["--api-key", " "], "the API key is empty"),
    ],
)
def test_serve_rejects_bad_arguments(args: list[str], message: str) -> None:
    proc = run_cli("serve", "--port", str(free_port()), *args)
    assert proc.returncode == 1
    assert_one_line_error(proc, message)
    # The model failed to load before the server said it was serving.
    assert b"serving" not in proc.stderr


def test_serve_port_out_of_range_or_in_use() -> None:
    proc = run_cli("serve", "--port", "99999")
    assert proc.returncode == 2
    assert b"a port is between 0 and 65535" in proc.stderr and b"Traceback" not in proc.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_cli("serve", "--port", str(port))
    assert proc.returncode == 1
    assert_one_line_error(proc, f"cannot listen on 127.0.0.1:{port}", "in use")


def _shell(command: str) -> subprocess.CompletedProcess[bytes]:
    """``python -m tallow`` run by a shell, for redirections that close streams."""
    python = shlex.quote(sys.executable)
    return subprocess.run(
        ["bash", "-c", command.replace("tallow", f"{python} -m tallow", 1)],
        capture_output=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("tallow tokenize <&-", "standard input is closed"),
        ("tallow generate - <&-", "standard input is closed"),
        ("tallow chat <&-", "standard input is closed"),
        ("tallow generate hi -n 2 >&-", "standard output is closed"),
        ("tallow tokenize hi >&-", "standard output is closed"),
    ],
)
def test_closed_standard_streams(command: str, message: str) -> None:
    proc = _shell(command)
    assert proc.returncode == 1
    assert_one_line_error(proc, message)


def test_generate_with_a_context_beyond_the_model(smollm2_path: Path) -> None:
    proc = run_cli("generate", "hi", "--ctx", "100000000")
    assert proc.returncode == 1
    assert_one_line_error(proc, "n_ctx=100000000", "8192")


def test_a_fifo_is_not_a_model(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    proc = run_cli("info", "-m", str(fifo), timeout=60)
    assert proc.returncode == 1
    assert_one_line_error(proc, "not a regular file")


def test_ctrl_c_while_a_command_makes_a_class_is_an_interruption(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python 3.11 wraps an exception raised while a class is made (Ctrl-C while a command
    imports a module of dataclasses) in a RuntimeError: still an interruption, 130 and one
    line; any other RuntimeError is not taken for one."""
    from tallow import cli

    class Interrupted:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt

    def making_a_class(args: object) -> int:
        type("Made", (), {"field": Interrupted()})
        return 0

    monkeypatch.setattr(cli, "_cmd_list", making_a_class)
    assert cli.main(["list"]) == 130
    assert capsys.readouterr().err == "tallow: error: interrupted\n"

    def failing(args: object) -> int:
        raise RuntimeError("not an interruption")

    monkeypatch.setattr(cli, "_cmd_list", failing)
    with pytest.raises(RuntimeError, match="not an interruption"):
        cli.main(["list"])


def test_ctrl_c_that_python_would_drop_still_interrupts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C inside a callback whose exceptions Python prints and drops (the import
    system's module locks are freed through weak references' callbacks) interrupts the
    command all the same: 130 and one line, no "Exception ignored" with its traceback."""
    import gc
    import weakref

    from tallow import cli

    class Lock:
        pass

    def interrupted(_: object) -> None:
        raise KeyboardInterrupt

    def freeing_a_lock(args: object) -> int:
        lock = Lock()
        ref = weakref.ref(lock, interrupted)
        del lock
        gc.collect()
        # The command would otherwise run on to its end.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pass
        return 0 if ref() is None else 1

    monkeypatch.setattr(cli, "_cmd_list", freeing_a_lock)
    start = time.monotonic()
    assert cli.main(["list"]) == 130
    assert time.monotonic() - start < 5
    assert capsys.readouterr().err == "tallow: error: interrupted\n"


@pytest.mark.parametrize("delay", [0.08, 0.15, 0.3, 0.5])
def test_ctrl_c_while_starting_or_loading(delay: float, smollm2_path: Path) -> None:
    """Ctrl-C at any moment once tallow's code runs: exit 130 with one line, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tallow", "generate", "hi", "-n", "400", "--temperature", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err, err.decode()
    # A shell sees 130 either way: CPython ends a process by SIGINT itself when an interrupt
    # went through code run by exec() (a dataclass being made while the core loads), even
    # though main() caught it.
    assert proc.returncode in (130, -signal.SIGINT), err.decode()
    assert err.decode().rstrip().endswith("tallow: error: interrupted")


def test_sizes() -> None:
    from tallow.server import parse_size

    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("2G") == parse_size("2gb") == 2 * 10**9
    assert parse_size("1.5 KiB") == 1536
    assert parse_size("1000000") == 10**6
    for bad in ("", "MiB", "12 parsecs", "-3M", "1iB"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_bench_at_depth_names_its_tests_as_llama_bench(smollm2_path: Path) -> None:
    """``-d N``: pp and tg after N tokens of context, named as llama-bench names them."""
    args = ("bench", "-m", str(smollm2_path), "-p", "16", "-n", "4", "--npp", "0", "-r", "1")
    proc = run_cli(*args, "-d", "64")
    assert proc.returncode == 0, proc.stderr.decode()
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in proc.stdout.decode().splitlines()[2:]
    ]
    assert [r[4] for r in rows] == ["pp16 @ d64", "tg4 @ d64"]
    assert all(float(r[5].split()[0]) > 0 for r in rows)
    # A depth beyond the model's context (8192 for smollm2) is refused.
    assert_one_line_error(run_cli(*args, "-d", "8190"), "--depth 8190", "context of 8192")


def test_decode_reads_every_weight_but_the_embedding_unless_it_is_the_output(
    smollm2_path: Path, arch_dir: Path
) -> None:
    tied = []
    for path in (smollm2_path, arch_dir / "llama3" / "llama3-q8_0.gguf"):
        sizes = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
        tied.append("output.weight" not in sizes)
        want = sum(sizes.values()) - (0 if tied[-1] else sizes["token_embd.weight"])
        assert _core.Model(str(path)).decode_weight_bytes == want
    assert tied == [True, False]


def test_decode_of_a_mixture_reads_the_share_of_experts_a_token_uses(arch_dir: Path) -> None:
    """qwen3moe: 2 of 8 experts a token, so a quarter of every ``*_exps`` tensor."""
    path = arch_dir / "qwen3moe" / "qwen3moe-q8_0.gguf"
    sizes = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    experts = sum(size for name, size in sizes.items() if "_exps." in name)
    assert experts > 0
    want = sum(sizes.values()) - sizes["token_embd.weight"] - experts + experts // 4
    assert _core.Model(str(path)).decode_weight_bytes == want


def test_bench_prints_a_row_per_test(smollm2_path: Path) -> None:
    proc = run_cli(
        "bench",
        "-m",
        str(smollm2_path),
        "-p",
        "32",
        "-n",
        "8",
        "--npp",
        "16",
        "--ntg",
        "4",
        "--npl",
        "2",
        "-r",
        "2",
        "-t",
        "2",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().splitlines()
    assert lines[0] == "| model | size | params | threads | test | t/s |"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[4] for r in rows] == ["pp32", "tg8", "pp16+tg4 x2"]
    # The process's memory; nothing on a device for the CPU.
    assert re.search(r"memory: host [\d.]+ MiB peak RSS \([\d.]+ MiB now\)\n", proc.stderr.decode())
    # What decode reads: the weights a token reads at the tg row's rate, beside the machine's.
    reads = re.search(
        r"decode: ([\d.]+) MiB of weights a token, ([\d.]+) GB/s; "
        r"this machine reads ([\d.]+) GB/s \((\d+)% of it\)\n",
        proc.stderr.decode(),
    )
    assert reads, proc.stderr.decode()
    mib, achieved, limit, share = (float(g) for g in reads.groups())
    tg = float(rows[1][5].split(" ± ")[0])
    assert abs(mib * 2**20 * tg / 1e9 - achieved) <= 0.01 * achieved + 0.01
    assert limit > 0.1 and abs(100 * achieved / limit - share) <= 1
    for r in rows:
        assert r[0] == smollm2_path.name and r[3] == "2"
        assert r[2] == "134.52 M"
        mean, spread = (float(x) for x in r[5].split(" ± "))
        assert mean > 0 and spread >= 0
    proc = run_cli("bench", "-r", "0")
    assert_one_line_error(proc, "--reps must be positive")
    # A batched test without prompt tokens is skipped, as a 0 skips the other tests.
    proc = run_cli("bench", "-m", str(smollm2_path), "-p", "8", "-n", "0", "--npp", "0", "-r", "1")
    assert proc.returncode == 0, proc.stderr.decode()
    rows = proc.stdout.decode().splitlines()[2:]
    assert [r.strip("|").split("|")[4].strip() for r in rows] == ["pp8"]


def test_served_throughput_counts_every_token_of_concurrent_requests(
    smollm2_path: Path,
) -> None:
    # `served` checks that every request generated all its tokens before it reports a rate.
    rate = tallow.bench.served(smollm2_path, npp=16, ntg=4, npl=3)
    assert rate > 0


def test_a_probe_takes_turns_with_decode_steps(smollm2_path: Path) -> None:
    """``decode_seconds`` calls its hook once before each step, outside the time it reports;
    a ``ReadProbe`` covers whole MiB and times each read afresh."""
    model = _core.Model(str(smollm2_path))
    probe = _core.ReadProbe(3 * 2**20 + 1)
    assert probe.bytes == 4 * 2**20
    reads: list[float] = []
    seconds = tallow.bench.decode_seconds(
        model, 3, before_step=lambda: reads.append(probe.seconds())
    )
    assert len(reads) == 3 and all(r > 0 for r in reads)
    assert seconds > 0
    probe.calibrate()
    assert probe.seconds() > 0
    # A hook that sleeps adds nothing to the steps' time.
    slow = tallow.bench.decode_seconds(model, 2, before_step=lambda: time.sleep(0.5))
    assert slow < 0.5
