"""Embeddings: pooled final hidden states against transformers, through every front end.

The oracle: transformers' logits at the 32 prompt positions of each tiny reference model
(``shared/reference/arch``) are its final hidden states (after the output norm) times the output
matrix; with a vocabulary of 512 over a width of 64 that matrix has full column rank, so a least
squares solve gives back transformers' hidden states exactly (for gemma2, after undoing its final
soft-cap). Mean, last-token and CLS pooling of any prefix of the prompt are then known.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest
from conftest import assert_one_line_error, f32_pool, run_cli, serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_architectures import ARCHITECTURES, GGUF_NAMES, MOE
from test_rope_scaling import rewrite
from test_server import OPENAI_ERROR, _json, post_hostile

import tallow
from tallow import _core
from tallow.engine import Engine, EngineConfig, SamplingParams
from tallow.pooling import Pooler

F32 = npt.NDArray[np.float32]


def transformers_hidden(arch_dir: Path, arch: str) -> npt.NDArray[np.float64]:
    """transformers' final hidden states at the 32 prompt positions, from its logits."""
    reader = gguf.GGUFReader(arch_dir / arch / f"{arch}-f32.gguf")
    tensors = {t.name: t for t in reader.tensors}
    out = tensors.get("output.weight", tensors["token_embd.weight"])
    matrix = np.asarray(out.data, dtype=np.float64).reshape(-1, int(out.shape[0]))
    logits = np.load(arch_dir / arch / "ref_logits.npy").astype(np.float64)
    name = GGUF_NAMES.get(arch, arch)
    cap = reader.get_field(f"{name}.final_logit_softcapping")
    if cap is not None:
        c = float(cap.contents())
        logits = c * np.arctanh(logits / c)
    hidden, *_ = np.linalg.lstsq(matrix, logits.T, rcond=None)
    return hidden.T


def pooled(hidden: npt.NDArray[np.float64], pooling: str, k: int) -> npt.NDArray[np.float64]:
    return {"mean": hidden[:k].mean(axis=0), "last": hidden[k - 1], "cls": hidden[0]}[pooling]


@pytest.mark.parametrize("arch", [a for a, _ in ARCHITECTURES] + MOE)
def test_pooled_hidden_states_match_transformers(
    arch_dir: Path, prompt: list[int], arch: str
) -> None:
    hidden = transformers_hidden(arch_dir, arch)
    llm = tallow.LLM(arch_dir / arch / f"{arch}-f32.gguf", progress=False, kv_dtype="f32")
    for pooling in ("mean", "last", "cls"):
        lengths = (1, 7, 32)
        got = llm.embed([prompt[:k] for k in lengths], pooling=pooling, normalize=False)
        assert got.shape == (3, 64) and got.dtype == np.float32
        for row, k in zip(got, lengths, strict=True):
            want = pooled(hidden, pooling, k)
            assert np.abs(row - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), (pooling, k)


class _Recording:
    """A model whose forward calls are recorded: the row kinds of each batch."""

    def __init__(self, model: _core.Model) -> None:
        self.model = model
        self.kinds: list[set[str]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.model, name)

    def forward(self, kv: _core.KvCache, batch: list[tuple[object, ...]], *a: object, **k: object):  # type: ignore[no-untyped-def]
        self.kinds.append({str(c[2]) for c in batch})
        return self.model.forward(kv, batch, *a, **k)  # type: ignore[call-overload]


def _drain(engine: Engine) -> tuple[list[int], dict[str, F32]]:
    tokens: list[int] = []
    vectors: dict[str, F32] = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            if out.embedding is not None:
                vectors[out.request_id] = out.embedding
            else:
                tokens += out.new_token_ids
    return tokens, vectors


def test_long_prompts_pool_across_chunks_beside_generation(
    arch_dir: Path, prompt: list[int]
) -> None:
    """Prompts cut into chunks of 5 tokens, in steps shared with a generating request: every
    pooling still matches transformers, no step computes logits for an embedding's rows, and
    the generation is the one it makes alone."""
    hidden = transformers_hidden(arch_dir, "qwen3")
    model = _core.Model(str(arch_dir / "qwen3" / "qwen3-f32.gguf"))
    config = EngineConfig(max_tokens_per_step=5, kv_pages=64, page_size=4, kv_dtype="f32")
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    engine = Engine(model, config)
    engine.add("gen", prompt[:9], greedy)
    for pooling in ("mean", "last", "cls"):
        engine.add(pooling, prompt, SamplingParams(max_tokens=None, pooling=pooling))
    recording = _Recording(model)
    engine.model = recording  # type: ignore[assignment]
    tokens, vectors = _drain(engine)
    assert sorted(vectors) == ["cls", "last", "mean"]
    for pooling, vector in vectors.items():
        want = pooled(hidden, pooling, len(prompt))
        assert np.abs(vector - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), pooling
    # Steps that held generation's rows and embeddings' rows both.
    assert any({"last", "hidden-all"} <= kinds for kinds in recording.kinds)
    alone = Engine(model, config)
    alone.add("gen", prompt[:9], greedy)
    assert _drain(alone) == (tokens, {}) and len(tokens) == 12


def test_a_preempted_embedding_starts_over() -> None:
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    pooler = Pooler("mean", 3)
    pooler.add(rows[:2], 0)
    pooler.add(rows[2:], 2)
    np.testing.assert_allclose(pooler.result(), rows.mean(axis=0))
    # Preempted after its first chunk: computed again from position 0.
    pooler.add(rows[:1], 0)
    pooler.add(rows[1:], 1)
    np.testing.assert_allclose(pooler.result(), rows.mean(axis=0))
    cls = Pooler("cls", 3)
    cls.add(rows, 0)
    cls.add(rows[:0], 4)
    np.testing.assert_array_equal(cls.result(), rows[0])


@pytest.fixture(scope="module")
def matryoshka_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model named as a Matryoshka family (Qwen3-Embedding): its embeddings may
    be cut short."""
    fields: dict[str, object] = {
        "general.basename": "Qwen3-Embedding",
        "general.name": "Qwen3 Embedding 0.6B",
    }
    dst = tmp_path_factory.mktemp("matryoshka") / "matryoshka.gguf"
    return rewrite(smollm2_path, dst, fields, {})


@pytest.fixture(scope="module")
def matryoshka(matryoshka_path: Path) -> tallow.LLM:
    return tallow.LLM(matryoshka_path, n_ctx=512, progress=False)


def test_normalize_and_dimensions(smollm2: tallow.LLM, matryoshka: tallow.LLM) -> None:
    texts = ["The cat sat on the mat.", "A dog ran in the park.", "The cat sat on the mat."]
    raw = smollm2.embed(texts, normalize=False)
    unit = smollm2.embed(texts)
    assert raw.shape == (3, 576)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-5)
    np.testing.assert_allclose(unit[0], unit[2], atol=1e-4)  # the same text, the same vector
    assert not np.allclose(unit[0], unit[1])
    # Cut short only where the model was trained for it (the same weights, another name).
    assert tallow.pooling.truncatable(matryoshka._model)
    assert not tallow.pooling.truncatable(smollm2._model)
    short = matryoshka.embed(texts, dimensions=64)
    np.testing.assert_allclose(
        short, raw[:, :64] / np.linalg.norm(raw[:, :64], axis=1, keepdims=True), atol=1e-5
    )
    with pytest.raises(tallow.InvalidArgumentError, match="not trained for shorter ones"):
        smollm2.embed(texts, dimensions=64)
    np.testing.assert_allclose(smollm2.embed(texts, dimensions=576), unit, atol=1e-6)
    one = smollm2.embed(texts[0])
    assert one.shape == (576,)
    np.testing.assert_allclose(one, unit[0], atol=1e-6)


def test_the_pooling_comes_from_the_metadata(
    arch_dir: Path, prompt: list[int], tmp_path: Path
) -> None:
    src = arch_dir / "qwen3" / "qwen3-f32.gguf"
    hidden = transformers_hidden(arch_dir, "qwen3")
    for code, pooling in ((1, "mean"), (2, "cls"), (3, "last")):
        path = rewrite(src, tmp_path / f"pooled-{code}.gguf", {"qwen3.pooling_type": code}, {})
        llm = tallow.LLM(path, progress=False, kv_dtype="f32")
        got = llm.embed([prompt], normalize=False)[0]
        np.testing.assert_allclose(got, pooled(hidden, pooling, len(prompt)), atol=1e-4)
    # A model that names none pools its last token.
    llm = tallow.LLM(src, progress=False, kv_dtype="f32")
    np.testing.assert_allclose(
        llm.embed([prompt], normalize=False)[0], pooled(hidden, "last", len(prompt)), atol=1e-4
    )


def test_bidirectional_models_are_refused(arch_dir: Path, tmp_path: Path) -> None:
    src = arch_dir / "qwen3" / "qwen3-f32.gguf"
    path = rewrite(src, tmp_path / "encoder.gguf", {"qwen3.attention.causal": False}, {})
    with pytest.raises(tallow.UnsupportedError, match="bidirectional attention"):
        tallow.LLM(path, progress=False)


@pytest.mark.parametrize(
    ("texts", "options", "message"),
    [
        ([], {}, "input must be"),
        (["a", [1, 2]], {}, "not a mix"),
        ([[1], []], {}, "non-empty"),
        ([[10**9]], {}, "out of range"),
        (b"bytes", {}, "input must be"),
        ("text", {"pooling": "max"}, "pooling must be one of"),
        ("text", {"dimensions": 0}, "dimensions"),
        ("text", {"dimensions": 577}, "dimensions"),
        ("text", {"normalize": "yes"}, "normalize"),
        ("text", {"dimensions": 64}, "not trained"),
    ],
)
def test_bad_embedding_arguments(
    smollm2: tallow.LLM, texts: object, options: dict[str, object], message: str
) -> None:
    with pytest.raises(tallow.InvalidArgumentError, match=message):
        smollm2.embed(texts, **options)  # type: ignore[arg-type]


def test_an_input_longer_than_the_context_is_a_model_error(smollm2: tallow.LLM) -> None:
    """As for every prompt; an input as long as the context fits (nothing is generated)."""
    with pytest.raises(tallow.ModelError, match="longer than the context"):
        smollm2.embed("word " * 600)
    with pytest.raises(tallow.ModelError, match="longer than the context"):
        smollm2.embed([[1] * 513])
    assert smollm2.embed([[1] * 512]).shape == (1, 576)


def test_forward_returns_hidden_rows_apart_from_logits(arch_dir: Path, prompt: list[int]) -> None:
    """One batch: logits for one sequence, hidden states for two others (no LM head row)."""
    model = _core.Model(str(arch_dir / "qwen3" / "qwen3-f32.gguf"))
    hidden = transformers_hidden(arch_dir, "qwen3")
    kv = f32_pool(model)
    seqs = [kv.create() for _ in range(3)]
    for seq, n in zip(seqs, (4, 6, 5), strict=True):
        kv.reserve(seq, n)
    batch = [
        (seqs[0], prompt[:4], "last"),
        (seqs[1], prompt[:6], "hidden-all"),
        (seqs[2], prompt[:5], "hidden-last"),
    ]
    with pytest.raises(tallow.InvalidArgumentError, match="hidden=True"):
        model.forward(kv, batch)
    logits, states = model.forward(kv, batch, hidden=True)
    assert logits.shape == (1, 512) and states.shape == (7, 64)
    np.testing.assert_allclose(states[:6], hidden[:6], atol=1e-4)
    np.testing.assert_allclose(states[6], hidden[4], atol=1e-4)
    reference = np.load(arch_dir / "qwen3" / "ref_logits.npy")
    np.testing.assert_allclose(logits[0], reference[3], atol=1e-4)
    with pytest.raises(tallow.InvalidArgumentError, match="branch"):
        model.forward(kv, [(seqs[0], [1], "hidden-last", seqs[1])], hidden=True)


# -- the server -----------------------------------------------------------------------------------

MODEL = "smollm2-135m"


def test_the_server_embeds_as_the_python_api(client: openai.OpenAI, smollm2: tallow.LLM) -> None:
    texts = ["The cat sat on the mat.", "Embeddings through the official client."]
    want = smollm2.embed(texts)
    # The client asks for base64 by default and decodes it.
    got = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in got.data] == [0, 1]
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), want, atol=1e-5)
    assert got.usage.prompt_tokens == sum(len(smollm2.tokenize(t)) for t in texts)
    assert got.usage.total_tokens == got.usage.prompt_tokens
    floats = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, want[0], atol=1e-5)
    ids = smollm2.tokenize(texts[1])
    by_ids = client.embeddings.create(model=MODEL, input=[ids], encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, want[1], atol=1e-5)
    mean = httpx.post(
        f"{client.base_url}embeddings",
        json={"model": MODEL, "input": "x y z", "pooling": "mean", "normalize": False},
    ).json()
    np.testing.assert_allclose(
        mean["data"][0]["embedding"],
        smollm2.embed("x y z", pooling="mean", normalize=False),
        atol=1e-4,
    )
    card = client.models.retrieve(MODEL).model_dump()
    assert card["capabilities"] == ["generate", "embed"]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": MODEL}, "input", "missing_required_parameter"),
        ({"model": MODEL, "input": []}, "input", "invalid_type"),
        ({"model": MODEL, "input": [[1], []]}, "input", "invalid_type"),
        ({"model": MODEL, "input": ["a", 1]}, "input", "invalid_type"),
        ({"model": MODEL, "input": [10**6]}, "input", "invalid_value"),
        (
            {"model": MODEL, "input": "a", "encoding_format": "int8"},
            "encoding_format",
            "invalid_value",
        ),
        ({"model": MODEL, "input": "a", "dimensions": 0}, "dimensions", "invalid_value"),
        ({"model": MODEL, "input": "a", "dimensions": 100000}, "dimensions", "invalid_value"),
        ({"model": MODEL, "input": "a", "dimensions": 64}, "dimensions", "invalid_value"),
        ({"model": MODEL, "input": [[1] * 513]}, "input", "context_length_exceeded"),
        ({"model": MODEL, "input": "a", "pooling": "max"}, "pooling", "invalid_value"),
        ({"model": MODEL, "input": "a " * 600}, "input", "context_length_exceeded"),
        ({"model": "gpt-4", "input": "a"}, "model", "model_not_found"),
    ],
)
def test_bad_embedding_requests_are_answered_400(
    server: str, body: dict[str, Any], param: str, code: str
) -> None:
    response = httpx.post(f"{server}/v1/embeddings", json=body)
    assert response.status_code == (404 if code == "model_not_found" else 400), response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error


_FIELDS = ["input", "encoding_format", "dimensions", "pooling", "normalize", "model"]


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(changes=st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=3), whole=_json)
def test_no_embedding_body_gets_a_server_error(
    server: str, changes: dict[str, Any], whole: object
) -> None:
    body: object = whole
    if changes or not isinstance(whole, dict):
        body = {"model": MODEL, "input": "hello", **changes}
    response = post_hostile(server, "/v1/embeddings", body)
    if response.status_code >= 400:
        assert set(response.json()["error"]) == OPENAI_ERROR
    else:
        assert response.json()["data"]


def test_the_server_cuts_a_matryoshka_model_s_embeddings(
    matryoshka_path: Path, matryoshka: tallow.LLM
) -> None:
    with serving("-m", str(matryoshka_path), "--ctx", "512") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        got = client.embeddings.create(model="matryoshka.gguf", input="a short text", dimensions=32)
    assert len(got.data[0].embedding) == 32
    np.testing.assert_allclose(
        got.data[0].embedding, matryoshka.embed("a short text", dimensions=32), atol=1e-5
    )


# -- the command line -----------------------------------------------------------------------------


def test_the_command_line_embeds_as_the_python_api(
    smollm2: tallow.LLM, matryoshka_path: Path, matryoshka: tallow.LLM
) -> None:
    texts = ["first text", "second text"]
    proc = run_cli(
        "embed", "-m", str(matryoshka_path), "--pooling", "mean", "--dimensions", "48", *texts
    )
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [line["text"] for line in lines] == texts
    want = matryoshka.embed(texts, pooling="mean", dimensions=48)
    np.testing.assert_allclose([line["embedding"] for line in lines], want, atol=1e-5)
    from_stdin = run_cli("embed", "-m", MODEL, "--no-normalize", input=b"first text\n\n")
    (line,) = [json.loads(x) for x in from_stdin.stdout.decode().splitlines()]
    np.testing.assert_allclose(
        line["embedding"], smollm2.embed("first text", normalize=False), atol=1e-4
    )
    assert_one_line_error(run_cli("embed", "-m", MODEL, "--dimensions", "0", "x"), "dimensions")
