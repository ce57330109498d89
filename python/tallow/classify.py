"""Zero-shot classification on a language model.

A text is classified by the probability the model gives each label as the continuation of a
prompt that holds the text: the chat template's opening of the assistant's reply to an
instruction (the default), or a prompt of the caller's with ``{text}`` in it. A label's
log-likelihood is the sum over its tokens, the first one's probability taken among the labels'
first tokens; the probabilities are their softmax over the labels (the same as that of the
plain log-likelihoods, which differ from these by one constant). Where every label is one
token, the LM head computes only the labels' logits.

The prompt is cut around the text and each part tokenized alone, so the part before the text
is the same token ids for every text: with prefix caching its KV is computed once. The text's
own tokens and every label are computed in one forward (each label of more than one token in
a branch of the text's KV, see :attr:`tallow.engine.SamplingParams.continuations`): the
labels' tokens after their first must fit in that forward beside the text's last token.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from tallow import checks
from tallow.engine import EngineConfig, SamplingParams
from tallow.errors import InvalidArgumentError
from tallow.output import RequestOutput
from tallow.prompt import Prompts

__all__ = [
    "DEFAULT_INSTRUCTION",
    "Classification",
    "ClassifyTask",
    "ClassifyTasks",
    "check_branches",
    "label_probs",
]

DEFAULT_INSTRUCTION = (
    "Classify the text as one of: {labels}. Answer with the label only.\n\nText: {text}"
)
"""The user's message of the default prompt (rendered with the model's chat template)."""

_TEXT = "{text}"
_LABELS = "{labels}"


@dataclass(frozen=True)
class Classification:
    """The classification of one text."""

    label: str
    """The most probable label."""
    labels: list[str]
    probs: list[float]
    """The probability of each label (of :attr:`labels`), summing to 1."""
    logprobs: list[float]
    """Each label's log-likelihood after the prompt, the sum over its tokens, with its first
    token's probability taken among the labels' first tokens (as if the answer had to start
    like a label): the probabilities are their softmax."""
    prompt_tokens: int
    """Tokens of the prompt (instruction and text)."""
    cached_tokens: int = 0
    """Of those, tokens whose KV came from the prefix cache."""


class ClassifyTask:
    """Texts to classify into ``labels`` with one prompt: their token ids and the result of
    their requests.

    ``prompt`` is ``None`` (the model's chat template around :data:`DEFAULT_INSTRUCTION`) or a
    prompt of the caller's holding ``{text}`` once (and ``{labels}``, the labels joined with
    commas, anywhere), used as it is: control-token text in it is parsed and BOS added where
    the model asks for it. The placeholders are filled in the prompt alone: a label or a text
    that holds ``{text}`` or ``{labels}`` stays as it is. The labels are tokenized as plain
    text where the model's answer starts: with a prompt of the caller's, give them the leading
    space the text before them calls for (``" positive"`` after ``"Sentiment:"``).

    ``step_tokens`` is the token budget of the engine's steps: the labels' tokens after their
    first, computed in the step of the text's last token, must be fewer. Labels beyond it, or
    listed in a prompt that leaves no room for a text in the context, raise
    :class:`InvalidArgumentError` (its message starts with ``labels``).
    """

    def __init__(
        self,
        prompts: Prompts,
        labels: object,
        prompt: object = None,
        *,
        step_tokens: int = EngineConfig.max_tokens_per_step,
    ) -> None:
        self._prompts = prompts
        self.labels = _labels(labels)
        model = prompts.model
        ids = [model.tokenize(label, False, False) for label in self.labels]
        for label, tokens in zip(self.labels, ids, strict=True):
            if not tokens:
                raise checks.invalid("labels", f"label {label!r} has no tokens")
        check_branches(ids, step_tokens)
        self.params = SamplingParams(
            max_tokens=None, continuations=tuple(tuple(t) for t in ids), relative_scores=True
        )
        listed = ", ".join(self.labels)
        if prompt is None:
            # The chat template renders the message with a mark where the text goes, a random
            # one that no label can spell: the text goes there and nowhere else.
            mark = f"\x00{secrets.token_hex(8)}\x00"
            before, after = _fill(DEFAULT_INSTRUCTION, listed)
            rendered = prompts.chat_template.render(
                [{"role": "user", "content": before + mark + after}], quote=model.quote_special
            )
            before, _, after = rendered.partition(mark)
            self._before = model.tokenize_quoted(before, False)
            self._after = model.tokenize_quoted(after, False)
            lists_labels = True
        else:
            template = checks.text("prompt", prompt)
            if template.count(_TEXT) != 1:
                raise checks.invalid("prompt", "prompt must hold '{text}' exactly once")
            before, after = _fill(template, listed)
            self._before = prompts.with_bos(model.tokenize(before, False, True))
            self._after = model.tokenize(after, False, True)
            lists_labels = _LABELS in template
        self._check_room(lists_labels)

    def _check_room(self, lists_labels: bool) -> None:
        """Refuse a prompt that leaves no room for a text in the context: the labels' fault
        where the prompt lists them, the prompt's otherwise."""
        n_ctx = self._prompts.n_ctx
        around = len(self._before) + len(self._after)
        if around + 1 < n_ctx:
            return
        whose = "labels: listed in the prompt, they make it" if lists_labels else "prompt: it is"
        raise checks.invalid(
            "labels" if lists_labels else "prompt",
            f"{whose} {around} tokens long without the text, which leaves no room for a text "
            f"in a context of {n_ctx} positions",
        )

    def prompt_ids(self, text: object) -> list[int]:
        """The token ids of the prompt for ``text`` (tokenized as plain text)."""
        text = checks.text("text", text)
        if not text.strip():
            raise InvalidArgumentError("a text to classify must not be empty")
        ids = self._before + self._prompts.model.tokenize(text, False, False) + self._after
        return self._prompts.check_fits(ids)

    def texts(self, texts: object) -> list[str]:
        """``texts`` (one string or a non-empty sequence of them), checked."""
        items = [texts] if isinstance(texts, str) else texts
        if isinstance(items, (bytes, bytearray)) or not isinstance(items, Sequence):
            raise InvalidArgumentError(
                f"texts must be a string or a list of strings, got {checks.describe(texts)}"
            )
        if not items:
            raise InvalidArgumentError("no texts to classify")
        return [checks.text("text", t) for t in items]

    def result(self, out: RequestOutput, prompt_tokens: int) -> Classification:
        """The classification from a request's last output. Labels whose branches the engine
        could never hold (its KV pool) raise :class:`InvalidArgumentError` naming them."""
        if isinstance(out.error, InvalidArgumentError):
            raise checks.invalid("labels", f"labels: {out.error}")
        if out.error is not None:
            raise out.error
        assert out.scores is not None, "a scoring request ends with scores"
        probs = label_probs(out.scores)
        best = max(range(len(probs)), key=probs.__getitem__)
        return Classification(
            label=self.labels[best],
            labels=list(self.labels),
            probs=probs,
            logprobs=list(out.scores),
            prompt_tokens=prompt_tokens,
            cached_tokens=out.cached_tokens,
        )


class ClassifyTasks:
    """The :class:`ClassifyTask` of each of the last few (labels, prompt) pairs asked for:
    a task renders the chat template and tokenizes its prompt and labels, work that a
    classification of a few tokens would otherwise repeat for every text."""

    def __init__(self, prompts: Prompts, size: int = 32) -> None:
        self._prompts = prompts
        self._size = size
        self._tasks: dict[tuple[tuple[str, ...], str | None, int], ClassifyTask] = {}

    def get(self, labels: object, prompt: object, step_tokens: int) -> ClassifyTask:
        """The task of ``labels`` and ``prompt`` (as :class:`ClassifyTask` takes them, which
        checks them), made once while it is among the last ``size`` used."""
        if not (
            isinstance(labels, (list, tuple))
            and all(isinstance(label, str) for label in labels)
            and (prompt is None or isinstance(prompt, str))
        ):
            return ClassifyTask(self._prompts, labels, prompt, step_tokens=step_tokens)
        key = (tuple(labels), prompt, step_tokens)
        task = self._tasks.pop(key, None)
        if task is None:
            task = ClassifyTask(self._prompts, labels, prompt, step_tokens=step_tokens)
            if len(self._tasks) >= self._size:
                del self._tasks[next(iter(self._tasks))]
        self._tasks[key] = task  # the most recent last
        return task


def label_probs(logprobs: Sequence[float]) -> list[float]:
    """The probability of each label among the labels: the softmax of their
    log-likelihoods."""
    top = max(logprobs)
    weights = [math.exp(s - top) for s in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def check_branches(ids: list[list[int]], step_tokens: int) -> None:
    """Refuse labels whose tokens after their first (each label's branch) could never be
    computed in one step of ``step_tokens`` tokens beside the text's last token."""
    branch_tokens = sum(len(tokens) - 1 for tokens in ids)
    if branch_tokens >= step_tokens:
        raise checks.invalid(
            "labels",
            f"labels: their tokens after the first of each total {branch_tokens}, more than "
            f"the {step_tokens - 1} that are scored in one step (give fewer or shorter labels)",
        )


def _fill(template: str, listed: str) -> tuple[str, str]:
    """The parts of ``template`` before and after its one ``{text}``, each ``{labels}`` in
    them replaced by ``listed``: the placeholders are filled in the template alone, never in
    the labels or the text."""
    before, after = template.split(_TEXT)
    return before.replace(_LABELS, listed), after.replace(_LABELS, listed)


def _labels(labels: object) -> list[str]:
    """At least two distinct, non-empty labels."""
    if isinstance(labels, (str, bytes, bytearray)) or not isinstance(labels, Sequence):
        raise checks.invalid(
            "labels", f"labels must be a list of strings, got {checks.describe(labels)}"
        )
    out = [checks.text("labels", label) for label in labels]
    if len(out) < 2:
        raise checks.invalid(
            "labels", f"a classification needs at least two labels, got {len(out)}"
        )
    if any(not label for label in out):
        raise checks.invalid("labels", "a label must not be empty")
    seen: set[str] = set()
    for label in out:
        if label in seen:
            raise checks.invalid("labels", f"label {label!r} is given twice")
        seen.add(label)
    return out
