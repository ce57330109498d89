"""Zero-shot classification: label probabilities against the log-likelihoods ``generate``
reports for the same prompt, the same answers from every front end, the prefix cache serving
the instruction, and bad input refused."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from conftest import assert_one_line_error, run_cli, serving

import tallow
from tallow import InvalidArgumentError, _core
from tallow.engine import Engine, EngineConfig, SamplingParams
from tallow.scheduler import Request, Scheduler
from tallow.stopping import StopConditions

LABELS = ["positive", "negative review", "neither of those two"]
TEXTS = [
    "I loved this movie, it was wonderful!",
    "Terrible service, never again.",
    "The meeting is at 3pm.",
]


def label_logprob(llm: tallow.LLM, prompt: list[int], label: list[int]) -> float:
    """The log-likelihood of ``label`` after ``prompt``, token by token through generate: each
    token forced by a logit bias, its log probability the model's own."""
    total = 0.0
    for j, token in enumerate(label):
        result = llm.generate(
            prompt + label[:j], max_tokens=1, temperature=0, logprobs=True, logit_bias={token: 100}
        )
        assert result.token_ids == [token] and result.logprobs is not None
        total += result.logprobs[0].logprob
    return total


def softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    return [x / sum(e) for x in e]


@pytest.mark.parametrize("prompt", [None, "Review: {text}\nOne of {labels}. The review is"])
def test_probabilities_are_the_softmax_of_label_likelihoods(
    smollm2: tallow.LLM, prompt: str | None
) -> None:
    labels = LABELS if prompt is None else [" " + label for label in LABELS]
    task = smollm2.classify_task(labels, prompt)
    tokens = [smollm2.tokenize(label, add_special=False) for label in labels]
    assert [len(t) > 1 for t in tokens] == [False, True, True]
    results = smollm2.classify(TEXTS, labels, prompt)
    assert len(results) == len(TEXTS)
    for text, result in zip(TEXTS, results, strict=True):
        ids = task.prompt_ids(text)
        plain = [label_logprob(smollm2, ids, t) for t in tokens]
        # The first token's probability among the labels' first tokens: the log-likelihoods
        # less the log of the first tokens' total probability.
        firsts = {t[0] for t in tokens}
        shift = math.log(sum(math.exp(label_logprob(smollm2, ids, [f])) for f in firsts))
        expected = [lp - shift for lp in plain]
        assert result.labels == labels and result.prompt_tokens == len(ids)
        assert result.logprobs == pytest.approx(expected, abs=2e-3)
        assert result.probs == pytest.approx(softmax(plain), abs=1e-3)
        assert sum(result.probs) == pytest.approx(1.0)
        assert result.label == labels[result.probs.index(max(result.probs))]


class _Recording:
    """A model whose forward calls are recorded: the ``vocab`` each one asks for."""

    def __init__(self, model: _core.Model) -> None:
        self.model = model
        self.vocabs: list[object] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.model, name)

    def forward(self, kv: _core.KvCache, batch: list[tuple[object, ...]], *a: object, **k: object):  # type: ignore[no-untyped-def]
        self.vocabs.append(k.get("vocab"))
        return self.model.forward(kv, batch, *a, **k)  # type: ignore[call-overload]


def test_one_token_labels_read_only_their_logits(smollm2: tallow.LLM, smollm2_path: Path) -> None:
    """Labels of one token each: the LM head computes their logits alone, and the scores are
    those of the whole logits (the full path, taken where a generation shares the step), and
    the log-likelihoods that generate reports less one constant."""
    labels = ["positive", "negative", "neutral"]
    task = smollm2.classify_task(labels)
    tokens = [smollm2.tokenize(label, add_special=False) for label in labels]
    assert all(len(t) == 1 for t in tokens)
    model = _core.Model(str(smollm2_path))
    config = EngineConfig(n_ctx=512, kv_pages=64)

    def scores(beside_generation: bool) -> tuple[dict[str, list[float]], list[object]]:
        engine = Engine(model, config)
        recording = _Recording(model)
        engine.model = recording  # type: ignore[assignment]
        if beside_generation:
            # Its prompt is computed first, so that its rows of logits share every step.
            engine.add("gen", [1, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True))
            engine.step()
        for i, text in enumerate(TEXTS):
            engine.add(str(i), task.prompt_ids(text), task.params)
        out: dict[str, list[float]] = {}
        while engine.has_work():
            for o in engine.step():
                if o.scores is not None:
                    out[o.request_id] = o.scores
        return out, recording.vocabs

    fast, vocabs = scores(False)
    assert sorted(t[0] for t in tokens) in vocabs
    full, full_vocabs = scores(True)
    assert all(v is None for v in full_vocabs)
    for i, text in enumerate(TEXTS):
        assert fast[str(i)] == pytest.approx(full[str(i)], abs=1e-5)
        plain = [label_logprob(smollm2, task.prompt_ids(text), t) for t in tokens]
        shift = math.log(sum(math.exp(lp) for lp in plain))
        assert fast[str(i)] == pytest.approx([lp - shift for lp in plain], abs=2e-3)
        result = smollm2.classify(text, labels)[0]
        assert result.probs == pytest.approx(softmax(plain), abs=1e-3)


def test_the_instruction_comes_from_the_prefix_cache(smollm2: tallow.LLM) -> None:
    first = smollm2.classify(TEXTS[0], LABELS)[0]
    again = smollm2.classify(TEXTS[1], LABELS)[0]
    # The chat template's opening and the instruction (whole pages of it) are cached.
    assert again.cached_tokens >= 16 and again.cached_tokens < again.prompt_tokens
    assert first.label == "positive"


def test_async_and_sync_agree(smollm2_path: Path, smollm2: tallow.LLM) -> None:
    expected = smollm2.classify(TEXTS, LABELS)

    async def main() -> list[tallow.Classification]:
        async with tallow.AsyncLLM(smollm2_path, n_ctx=512) as llm:
            return await llm.classify(TEXTS, LABELS)

    got = anyio.run(main)
    for a, b in zip(got, expected, strict=True):
        assert a.label == b.label
        assert a.probs == pytest.approx(b.probs, abs=1e-5)


@pytest.mark.parametrize(
    ("texts", "labels", "prompt", "needle"),
    [
        (["x"], [], None, "at least two labels"),
        (["x"], ["yes"], None, "at least two labels"),
        (["x"], ["yes", "yes"], None, "given twice"),
        (["x"], ["yes", ""], None, "must not be empty"),
        (["x"], "yes,no", None, "list of strings"),
        ([""], ["yes", "no"], None, "must not be empty"),
        (["   "], ["yes", "no"], None, "must not be empty"),
        ([], ["yes", "no"], None, "no texts"),
        (["x"], ["yes", "no"], "no placeholder", "{text}"),
        (["x"], ["yes", "no"], "{text} and {text}", "{text}"),
    ],
)
def test_bad_input_is_refused(
    smollm2: tallow.LLM, texts: list[str], labels: object, prompt: str | None, needle: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=needle.replace("{", r"\{")):
        smollm2.classify(texts, labels, prompt)  # type: ignore[arg-type]


def labels_of(smollm2: tallow.LLM, n: int, tokens: int) -> list[str]:
    """``n`` distinct labels of ``tokens`` tokens each: a word of one token, then ``" x"``."""
    words = []
    for token in range(1000, smollm2.n_vocab):
        word = smollm2.detokenize([token])
        if word[:1] == " " and word[1:].isalpha() and smollm2.tokenize(word, False) == [token]:
            words.append(word)
            if len(words) == n:
                break
    labels = [word + " x" * (tokens - 1) for word in words]
    assert len(set(labels)) == n
    assert {len(smollm2.tokenize(label, add_special=False)) for label in labels} == {tokens}
    return labels


def many_labels(smollm2: tallow.LLM) -> dict[str, list[str]]:
    """Labels whose tokens after their first total 512 or more: more than one step scores."""
    return {
        "100 labels of 7 tokens": labels_of(smollm2, 100, 7),
        "two labels of 300 tokens": labels_of(smollm2, 2, 300),
        "1000 labels": labels_of(smollm2, 1000, 2),
    }


@pytest.mark.parametrize(
    "case", ["100 labels of 7 tokens", "two labels of 300 tokens", "1000 labels"]
)
@pytest.mark.parametrize("prompt", [None, "Review: {text}\nThe review is"])
def test_labels_beyond_one_step_are_refused(
    smollm2: tallow.LLM, case: str, prompt: str | None
) -> None:
    labels = many_labels(smollm2)[case]
    with pytest.raises(InvalidArgumentError, match="^labels: "):
        smollm2.classify("I loved it", labels, prompt)


def test_labels_beyond_the_kv_pool_are_refused(smollm2: tallow.LLM) -> None:
    """Within one step's budget, but each label's branch takes pages of its own: more than the
    pool of this LLM holds (it was a ModelError, a 500 on the server)."""
    pages = int(smollm2.stats()["pages_total"])
    # Two tokens per branch: within the step, at least a page each.
    labels = labels_of(smollm2, pages + 10, 3)
    assert 2 * len(labels) < 512
    with pytest.raises(InvalidArgumentError, match="^labels: .*KV pool"):
        smollm2.classify("I loved it", labels, "Review: {text}\nLabel:")
    # The LLM goes on.
    assert smollm2.classify("I loved it", [" good", " bad"], "Review: {text}\nLabel:")


def test_labels_too_long_to_list_are_refused(smollm2: tallow.LLM) -> None:
    """Labels listed in the prompt that leave no room for a text: the labels' fault; a prompt
    of the caller's that leaves none: the prompt's."""
    labels = labels_of(smollm2, 200, 2)
    with pytest.raises(InvalidArgumentError, match="^labels: listed in the prompt"):
        smollm2.classify("I loved it", labels)
    with pytest.raises(InvalidArgumentError, match="^prompt: "):
        smollm2.classify("I loved it", labels, "word " * 600 + "{text}")


@pytest.mark.parametrize("prompt", [None, "One of {labels}.\nReview: {text}\nThe review is"])
def test_placeholders_in_labels_and_texts_stay_as_they_are(
    smollm2: tallow.LLM, prompt: str | None
) -> None:
    """``{text}`` and ``{labels}`` are filled in the prompt alone: a label holding ``{text}``
    does not take the text in, nor a text holding ``{labels}`` the labels."""
    labels = [" good", " bad {text}"] if prompt else ["good", "bad {text}"]
    task = smollm2.classify_task(labels, prompt)
    text = "I loved it, {labels} and {text}!"
    prompt_text = smollm2.detokenize(task.prompt_ids(text))
    assert prompt_text.count(text) == 1
    assert prompt_text.count("bad {text}") == 1
    assert prompt_text.count("I loved it") == 1
    result = smollm2.classify("I loved it, a wonderful film!", labels, prompt)[0]
    assert result.label == labels[0]


def test_branches_are_forked_with_the_last_chunk_and_freed_after() -> None:
    kv = tallow._core.KvCache(1, 1, 8, page_size=4, dtype="f16", max_pages=16)
    s = Scheduler(kv, max_tokens_per_step=64)
    request = Request("a", [1, 2, 3, 4, 5, 6], StopConditions(max_tokens=None))
    request.branches = [[7, 8], [], [9]]
    s.add(request)
    step = s.schedule()
    parent, *branches = step.chunks
    assert parent.scoring and parent.n_rows == 1 and step.sample_ids == []
    assert [(c.token_ids, c.branch_of, c.n_rows) for c in branches] == [
        ([7, 8], parent.seq, 2),
        ([9], parent.seq, 1),
    ]
    # Each branch shares the parent's full page and copies its partly filled one.
    assert kv.page_table(branches[0].seq)[0] == kv.page_table(parent.seq)[0]
    assert kv.page_table(branches[0].seq)[1] != kv.page_table(parent.seq)[1]
    assert step.batch()[1] == (branches[0].seq, [7, 8], "all", parent.seq)
    outs = s.update(step, [])
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [("a", True, "stop")]
    assert kv.stats()["pages_used"] == 0


def test_branches_that_never_fit_are_refused() -> None:
    # 3 pages: the prompt takes 2, the branch a copy of the last page and one more.
    kv = tallow._core.KvCache(1, 1, 8, page_size=4, dtype="f16", max_pages=3)
    s = Scheduler(kv, max_tokens_per_step=64, prefix_caching=False)
    request = Request("a", [1, 2, 3, 4, 5, 6], StopConditions(max_tokens=None))
    request.branches = [[7, 8, 9]]
    s.add(request)
    outs = s.update(s.schedule(), [])
    assert outs and outs[0].error is not None and "do not fit" in str(outs[0].error)
    assert kv.stats()["pages_used"] == 0


@pytest.fixture(scope="module")
def classify_server(smollm2_path: Path) -> Iterator[str]:
    with serving("-m", "smollm2-135m", "--ctx", "512") as url:
        yield url


def test_endpoint(classify_server: str, smollm2: tallow.LLM) -> None:
    body = {"model": "smollm2-135m", "input": TEXTS, "labels": LABELS}
    response = httpx.post(f"{classify_server}/v1/classify", json=body, timeout=120)
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["object"] == "list" and got["model"] == "smollm2-135m"
    expected = smollm2.classify(TEXTS, LABELS)
    assert [d["index"] for d in got["data"]] == [0, 1, 2]
    for d, e in zip(got["data"], expected, strict=True):
        assert d["label"] == e.label and d["num_classes"] == 3
        assert d["probs"] == pytest.approx(e.probs, abs=1e-5)
    assert got["usage"]["prompt_tokens"] == sum(e.prompt_tokens for e in expected)
    assert got["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize(
    ("change", "status", "param"),
    [
        ({"labels": []}, 400, "labels"),
        ({"labels": ["a", "a"]}, 400, "labels"),
        ({"labels": "a"}, 400, "labels"),
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": [1, 2]}, 400, "input"),
        ({"prompt": "no placeholder"}, 400, "prompt"),
        ({"input": "word " * 600}, 400, "input"),
        ({"model": "other"}, 404, "model"),
    ],
)
def test_endpoint_refuses_bad_input(
    classify_server: str, change: dict[str, object], status: int, param: str
) -> None:
    body = {"model": "smollm2-135m", "input": "fine", "labels": ["yes", "no"], **change}
    response = httpx.post(f"{classify_server}/v1/classify", json=body, timeout=60)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_endpoint_names_labels_beyond_one_step_or_the_context(
    classify_server: str, smollm2: tallow.LLM
) -> None:
    cases = [*many_labels(smollm2).values(), labels_of(smollm2, 200, 2)]
    for labels in cases:
        body = {"model": "smollm2-135m", "input": ["fine", "bad"], "labels": labels}
        response = httpx.post(f"{classify_server}/v1/classify", json=body, timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "labels"


def test_command_line(smollm2: tallow.LLM) -> None:
    expected = smollm2.classify(TEXTS[:2], LABELS)
    labels = ",".join(LABELS)
    proc = run_cli("classify", "-m", "smollm2-135m", "-l", labels, "--json", *TEXTS[:2])
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [line["text"] for line in lines] == TEXTS[:2]
    for line, e in zip(lines, expected, strict=True):
        assert line["label"] == e.label
        assert list(line["probs"].values()) == pytest.approx(e.probs, abs=1e-5)
    stdin = "\n".join(TEXTS[:2]).encode()
    proc = run_cli("classify", "-m", "smollm2-135m", "-l", labels, input=stdin)
    assert proc.returncode == 0, proc.stderr.decode()
    rows = [line.split("\t") for line in proc.stdout.decode().splitlines()]
    assert [r[2] for r in rows] == TEXTS[:2]
    assert [r[0] for r in rows] == [e.label for e in expected]
    assert_one_line_error(run_cli("classify", "-l", "one", "text"), "at least two labels")


def test_tasks_are_made_once_per_labels_and_prompt(smollm2: tallow.LLM) -> None:
    first = smollm2.classify_task(["positive", "negative"])
    assert smollm2.classify_task(("positive", "negative")) is first
    assert smollm2.classify_task(["negative", "positive"]) is not first
    assert smollm2.classify_task(["positive", "negative"], "Text: {text}") is not first
    with pytest.raises(InvalidArgumentError):
        smollm2.classify_task(["positive", "positive"])
    with pytest.raises(InvalidArgumentError):
        smollm2.classify_task(["positive", 3])  # type: ignore[list-item]
