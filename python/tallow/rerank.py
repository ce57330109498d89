"""Reranking: how relevant each document is to a query, as a reranker language model judges it.

Rerankers such as Qwen3-Reranker are language models asked whether a document meets a query,
answering ``yes`` or ``no``: a document's relevance is the probability of the first answer
among the answers, from the LM head's logits after the prompt. Each document is a scoring
request (:attr:`tallow.engine.SamplingParams.continuations`) on the classification path. The
prompt is tokenized whole, as llama.cpp's server does; its part before the document (the
instruction and the query) is then the same token ids for every document up to where it
meets the document, so with prefix caching its KV is computed once per query.

The prompt is, in order of precedence: one given by the caller, holding ``{query}`` and
``{document}`` once each; the model's own (``tokenizer.chat_template.rerank``, which
llama.cpp's converter writes for Qwen3-Reranker); else Qwen3-Reranker's instruction rendered
with the model's chat template. The answers are the model's
``<arch>.classifier.output_labels``, else ``yes`` and ``no``. Control-token text in the query
and the documents stays plain text.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from tallow import _core, checks
from tallow.classify import check_branches, label_probs
from tallow.engine import EngineConfig, SamplingParams
from tallow.errors import InvalidArgumentError
from tallow.output import RequestOutput
from tallow.prompt import Prompts

__all__ = ["DEFAULT_INSTRUCTION", "RerankTask", "Reranked", "has_rerank_prompt", "ranked"]

SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
"""The system message of Qwen3-Reranker's prompt."""
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
"""Qwen3-Reranker's default task."""
_USER = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
_THINK = "<think>\n\n</think>\n\n"
"""What Qwen3-Reranker's prompt puts after the opening of the assistant's turn (an empty
reasoning block)."""
_QUERY = "{query}"
_DOCUMENT = "{document}"
_TEMPLATE_KEY = "tokenizer.chat_template.rerank"


@dataclass(frozen=True)
class Reranked:
    """One document's place in a reranking."""

    index: int
    """Its position in the documents given."""
    document: str
    relevance_score: float
    """The probability of the relevant answer (``yes``) among the answers, in [0, 1]."""
    prompt_tokens: int
    cached_tokens: int = 0


def has_rerank_prompt(model: _core.Model) -> bool:
    """Whether ``model``'s metadata holds a reranking prompt."""
    return isinstance(model.metadata_value(_TEMPLATE_KEY), str)


def _answers(model: _core.Model) -> list[str]:
    labels = model.metadata_value(f"{model.architecture}.classifier.output_labels")
    if isinstance(labels, list) and len(labels) >= 2 and all(isinstance(x, str) for x in labels):
        return [str(x) for x in labels]
    return ["yes", "no"]


class RerankTask:
    """Documents to rank against ``query``: their token ids and the result of their requests.

    ``prompt`` is ``None`` (the model's reranking prompt, or Qwen3-Reranker's instruction in
    its chat template) or a prompt holding ``{query}`` and ``{document}`` once each;
    ``instruction`` replaces Qwen3-Reranker's default task where the prompt is built here.
    ``step_tokens`` is the engine's token budget per step (see
    :class:`tallow.classify.ClassifyTask`). Checked when made (:class:`InvalidArgumentError`).
    """

    def __init__(
        self,
        prompts: Prompts,
        query: object,
        prompt: object = None,
        instruction: object = None,
        *,
        step_tokens: int = EngineConfig.max_tokens_per_step,
    ) -> None:
        self._prompts = prompts
        model = prompts.model
        query = checks.text("query", query)
        if not query.strip():
            raise InvalidArgumentError("the query must not be empty")
        quoted = model.quote_special(query)
        if prompt is None and instruction is None:
            prompt = model.metadata_value(_TEMPLATE_KEY)
        if prompt is not None:
            if instruction is not None:
                raise InvalidArgumentError("give a prompt or an instruction, not both")
            template = checks.text("prompt", prompt)
            if template.count(_QUERY) != 1 or template.count(_DOCUMENT) != 1:
                raise InvalidArgumentError(
                    "a reranking prompt must hold '{query}' and '{document}' once each"
                )
            before, after = template.split(_DOCUMENT)
            # The query goes in the template alone: a query that spells a placeholder stays.
            before, after = before.replace(_QUERY, quoted), after.replace(_QUERY, quoted)
            bos = model.bos_id
            self._bos = [bos] if bos is not None and model.add_bos else []
        else:
            task = (
                DEFAULT_INSTRUCTION
                if instruction is None
                else checks.text("instruction", instruction)
            )
            # The chat template renders the messages with a mark where the document goes, a
            # random one that nothing given can spell.
            mark = f"\x00{secrets.token_hex(8)}\x00"
            user = _USER.format(instruction=task, query=query, document=mark)
            rendered = prompts.chat_template.render(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
                quote=model.quote_special,
            )
            before, _, after = rendered.partition(mark)
            if len(model.tokenize("<think>", False, True)) == 1:
                # A model that reasons: Qwen3-Reranker's answer follows an empty reasoning block.
                after += _THINK
            self._bos = []
        self._before, self._after = before, after
        self._check_room()
        self.labels = _answers(model)
        ids = [model.tokenize(label, False, False) for label in self.labels]
        if not all(ids):
            raise InvalidArgumentError(f"the answers {self.labels} must each have tokens")
        check_branches(ids, step_tokens)
        self.params = SamplingParams(
            max_tokens=None, continuations=tuple(tuple(t) for t in ids), relative_scores=True
        )

    def _check_room(self) -> None:
        """Refuse a prompt that leaves no room for a document in the context."""
        around = len(self.prompt_ids_unchecked(""))
        n_ctx = self._prompts.n_ctx
        if around + 1 >= n_ctx:
            raise InvalidArgumentError(
                f"the reranking prompt is {around} tokens long without the document, which "
                f"leaves no room for one in a context of {n_ctx} positions"
            )

    def prompt_ids_unchecked(self, document: str) -> list[int]:
        """The token ids of the prompt for ``document``: the whole prompt tokenized at once (as
        llama.cpp's server does), the document's control-token text kept as text. The part
        before the document is the same token ids for every document, bar where it meets the
        document (the prefix cache serves it)."""
        model = self._prompts.model
        text = self._before + model.quote_special(document) + self._after
        return self._bos + model.tokenize_quoted(text, False)

    def prompt_ids(self, document: object) -> list[int]:
        """The token ids of the prompt for ``document``, checked (a text that fits the
        context)."""
        return self._prompts.check_fits(
            self.prompt_ids_unchecked(checks.text("document", document))
        )

    def documents(self, documents: object) -> list[str]:
        """``documents`` (a non-empty sequence of strings), checked."""
        if isinstance(documents, (str, bytes, bytearray)) or not isinstance(documents, Sequence):
            raise InvalidArgumentError(
                f"documents must be a list of strings, got {checks.describe(documents)}"
            )
        if not documents:
            raise InvalidArgumentError("no documents to rerank")
        return [checks.text("document", d) for d in documents]

    def results(
        self,
        documents: Sequence[str],
        prompts: Sequence[list[int]],
        outputs: Sequence[RequestOutput],
    ) -> list[Reranked]:
        """Each document's relevance, in their order, from its prompt (``prompt_ids``) and its
        request's last output."""
        results = []
        for i, (document, ids, out) in enumerate(zip(documents, prompts, outputs, strict=True)):
            if out.error is not None:
                raise out.error
            assert out.scores is not None, "a scoring request ends with scores"
            probability = label_probs(out.scores)[0]
            results.append(Reranked(i, document, probability, len(ids), out.cached_tokens))
        return results


def ranked(results: Sequence[Reranked], top_n: int | None = None) -> list[Reranked]:
    """``results`` most relevant first (ties in the documents' order), the first ``top_n``
    (``None``: all)."""
    return sorted(results, key=lambda r: (-r.relevance_score, r.index))[:top_n]
