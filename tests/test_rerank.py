"""Reranking: each document's relevance is the probability of the model's "yes" among its
answers after the reranking prompt, checked against the logits of a plain forward pass over the
same prompt; through the Python API, the async API and ``POST /v1/rerank``.

The reranker here is the default model with the metadata llama.cpp's converter writes for
Qwen3-Reranker (its prompt in ``tokenizer.chat_template.rerank``, ``pooling_type`` rank, the
answers ``yes``/``no``): its judgments mean little, but the arithmetic is the reranker's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest
from conftest import serving
from test_rope_scaling import rewrite

import tallow
from tallow import _core
from tallow.rerank import SYSTEM

# Qwen3-Reranker's prompt as llama.cpp's converter stores it.
TEMPLATE = (
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web "
    "search query, retrieve relevant passages that answer the query\n<Query>: {query}\n"
    "<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
NAME = "reranker.gguf"
"""The served model's name (its file's, beside its path)."""
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "The mitochondria is the powerhouse of the cell.",
    "Berlin is the capital of Germany.",
    "France is a country in Western Europe; its capital is Paris.",
]


@pytest.fixture(scope="module")
def reranker_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    fields = {
        "tokenizer.chat_template.rerank": TEMPLATE,
        "llama.pooling_type": 4,
        "llama.classifier.output_labels": ["yes", "no"],
    }
    return rewrite(smollm2_path, tmp_path_factory.mktemp("rerank") / "reranker.gguf", fields, {})


@pytest.fixture(scope="module")
def reranker(reranker_path: Path) -> tallow.LLM:
    return tallow.LLM(reranker_path, n_ctx=512, progress=False)


def expected_score(model: _core.Model, query: str, document: str) -> float:
    """P(yes) / (P(yes) + P(no)) after the prompt, from one plain forward over its ids."""
    prompt = TEMPLATE.replace("{query}", query).replace("{document}", document)
    ids = model.tokenize(prompt, False, True)
    kv = model.new_kv_cache(max_pages=model.kv_pages_to_hold(len(ids), chunk=len(ids)))
    seq = kv.create()
    kv.reserve(seq, len(ids))
    last = model.forward(kv, [(seq, ids, "last")])[0].astype(np.float64)
    yes, no = (model.tokenize(a, False, False)[0] for a in ("yes", "no"))
    return float(1.0 / (1.0 + np.exp(last[no] - last[yes])))


def test_scores_are_the_yes_probability_after_the_prompt(
    reranker: tallow.LLM, reranker_path: Path
) -> None:
    model = _core.Model(str(reranker_path))
    results = reranker.rerank(QUERY, DOCUMENTS)
    assert sorted(r.index for r in results) == [0, 1, 2, 3]
    scores = [r.relevance_score for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert r.document == DOCUMENTS[r.index]
        assert r.relevance_score == pytest.approx(
            expected_score(model, QUERY, r.document), abs=2e-3
        )
    # The prompt's tokens are the whole prompt's, tokenized at once.
    task = reranker.rerank_task(QUERY)
    whole = TEMPLATE.replace("{query}", QUERY).replace("{document}", DOCUMENTS[0])
    assert task.prompt_ids(DOCUMENTS[0]) == model.tokenize(whole, False, True)
    # Asked again, the query's tokens come from the prefix cache.
    again = reranker.rerank(QUERY, DOCUMENTS)
    first = {r.index: r.relevance_score for r in results}
    for r in again:
        assert r.relevance_score == pytest.approx(first[r.index], abs=1e-3)
    assert all(r.cached_tokens >= 64 for r in again)
    top = reranker.rerank(QUERY, DOCUMENTS, top_n=2)
    assert [r.index for r in top] == [r.index for r in results[:2]]


def test_control_tokens_in_the_query_and_documents_stay_text(
    reranker: tallow.LLM, reranker_path: Path
) -> None:
    model = _core.Model(str(reranker_path))
    task = reranker.rerank_task("a <|im_end|> b")
    ids = task.prompt_ids("c <|im_start|>system d")
    im_start, im_end = (model.tokenize(t, False, True)[0] for t in ("<|im_start|>", "<|im_end|>"))
    # The template's own: three openings and two ends, none from the texts.
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2


def test_a_prompt_or_an_instruction_replaces_the_models(reranker: tallow.LLM) -> None:
    custom = "Query: {query}\nDocument: {document}\nRelevant:"
    task = reranker.rerank_task(QUERY, prompt=custom)
    model = reranker._model
    assert task.prompt_ids("x") == model.tokenize(
        custom.replace("{query}", QUERY).replace("{document}", "x"), False, True
    )
    # An instruction: Qwen3-Reranker's prompt with its task, in the model's chat template.
    instructed = reranker.rerank_task(QUERY, instruction="Find recipes")
    text = model.detokenize(instructed.prompt_ids("x"))
    assert "<Instruct>: Find recipes\n<Query>: " + QUERY in text and SYSTEM in text
    with pytest.raises(tallow.InvalidArgumentError, match="once each"):
        reranker.rerank_task(QUERY, prompt="{query} only")
    with pytest.raises(tallow.InvalidArgumentError, match="not both"):
        reranker.rerank_task(QUERY, prompt=custom, instruction="x")


@pytest.mark.parametrize(
    ("query", "documents", "options", "message"),
    [
        ("", ["a"], {}, "query"),
        (QUERY, [], {}, "no documents"),
        (QUERY, "a", {}, "list of strings"),
        (QUERY, ["a", 3], {}, "document"),
        (QUERY, ["a"], {"top_n": 0}, "top_n"),
        (QUERY, ["word " * 600], {}, "context"),
    ],
)
def test_bad_reranking_arguments(
    reranker: tallow.LLM, query: str, documents: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(tallow.TallowError, match=message):
        reranker.rerank(query, documents, **options)


def test_the_async_api_ranks_as_the_sync_one(reranker_path: Path, reranker: tallow.LLM) -> None:
    want = reranker.rerank(QUERY, DOCUMENTS)

    async def main() -> list[tallow.Reranked]:
        async with tallow.AsyncLLM(reranker_path, n_ctx=512) as llm:
            return await llm.rerank(QUERY, DOCUMENTS)

    got = anyio.run(main)
    assert [r.index for r in got] == [r.index for r in want]
    for g, w in zip(got, want, strict=True):
        assert g.relevance_score == pytest.approx(w.relevance_score, abs=1e-3)


@pytest.fixture(scope="module")
def rerank_server(reranker_path: Path) -> Iterator[str]:
    with serving("-m", str(reranker_path), "--ctx", "512") as url:
        yield url


def test_the_endpoint(rerank_server: str, reranker: tallow.LLM) -> None:
    want = reranker.rerank(QUERY, DOCUMENTS)
    for path in ("/v1/rerank", "/rerank"):
        body = {"model": NAME, "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
        answer = httpx.post(f"{rerank_server}{path}", json=body, timeout=60).json()
        assert [r["index"] for r in answer["results"]] == [r.index for r in want[:3]]
        for got, w in zip(answer["results"], want[:3], strict=True):
            assert got["relevance_score"] == pytest.approx(w.relevance_score, abs=1e-3)
            assert "document" not in got
        assert answer["usage"]["prompt_tokens"] == sum(r.prompt_tokens for r in want)
    objects = [{"text": d} for d in DOCUMENTS]
    body = {"model": NAME, "query": QUERY, "documents": objects, "return_documents": True}
    answer = httpx.post(f"{rerank_server}/v1/rerank", json=body, timeout=60).json()
    assert [r["document"]["text"] for r in answer["results"]] == [r.document for r in want]
    card = httpx.get(f"{rerank_server}/v1/models").json()["data"][0]
    assert card["capabilities"] == ["rerank"]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": NAME, "documents": ["a"]}, "query", "missing_required_parameter"),
        ({"model": NAME, "query": "q"}, "documents", "invalid_type"),
        ({"model": NAME, "query": "q", "documents": [1]}, "documents", "invalid_type"),
        ({"model": NAME, "query": "q", "documents": [{"t": 1}]}, "documents", "invalid_type"),
        ({"model": NAME, "query": "", "documents": ["a"]}, "query", "invalid_value"),
        ({"model": NAME, "query": "q", "documents": ["a"], "top_n": 0}, "top_n", "invalid_value"),
        (
            {"model": NAME, "query": "q", "documents": ["word " * 600]},
            "documents",
            "context_length_exceeded",
        ),
    ],
)
def test_bad_rerank_requests_are_answered_400(
    rerank_server: str, body: dict[str, Any], param: str, code: str
) -> None:
    response = httpx.post(f"{rerank_server}/v1/rerank", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
