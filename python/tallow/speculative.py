"""Speculative decoding: cheap guesses of the next tokens, checked by the model many at once.

Before each step the engine asks a proposer for up to ``num_tokens`` tokens to follow each
decoding request's last token. The scheduler puts them into that request's decode chunk, one
forward pass gives the model's logits at every proposed position, and the request's sampler
keeps the longest run the model agrees with plus one token of its own
(:meth:`tallow._core.Sampler.verify`: greedy requests keep draft tokens equal to the argmax;
sampled ones follow the rejection rule of Leviathan et al. and Chen et al. 2023, so the output
distribution is exactly the model's). The KV of rejected tokens is dropped by truncating the
sequence's page table. Speculative and plain requests share the engine's steps.

Proposers:

- :class:`NgramProposer` (``method="ngram"``, prompt lookup decoding): finds the latest earlier
  occurrence of the request's last few tokens in its own prompt and output (or goes on with
  the passage it copied from last), and proposes what followed it there. Free to compute;
  strong when the output repeats the input (editing code, extracting, summarizing with
  quotes).
- :class:`DraftModelProposer` (``method="draft"``): a smaller model with the same vocabulary
  (``draft_model=`` a GGUF path or catalog name) generates the guesses, with a KV cache of its
  own kept in step with each request.

Both implement :class:`Proposer`, so more can be added.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tallow import _core, checks
from tallow.errors import InvalidArgumentError

__all__ = [
    "DraftModelProposer",
    "DraftRequest",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "SpeculativeConfig",
    "speculative_config",
    "tree_path",
]

METHODS = ("ngram", "draft")
MAX_TOKENS = 64
"""Most tokens proposed per step, and the longest n-gram matched."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """How to speculate: ``method`` ``"ngram"`` or ``"draft"``, proposing ``num_tokens``
    tokens per step. ``ngram_max`` / ``ngram_min`` bound the length of the suffix that prompt
    lookup matches; a match of a single token, right less often, proposes at most
    ``short_match_tokens`` tokens (a forward of 3 tokens costs little more than one of 1, one
    of 5 about half as much again). ``draft_model`` is the draft model of ``method="draft"``
    (an engine-wide setting)."""

    method: str = "ngram"
    num_tokens: int = 4
    ngram_max: int = 3
    ngram_min: int = 1
    short_match_tokens: int = 2
    draft_model: str | os.PathLike[str] | None = None
    max_num_tokens: int = 16
    """Prompt lookup: while the output keeps every token proposed, the next proposal has twice
    as many, up to this many (at most ``num_tokens`` where it is smaller)."""
    num_branches: int = 0
    """Prompt lookup: most alternative guesses verified beside the main one in the same step
    (tree speculation), each where an earlier occurrence of the matched tokens went on
    otherwise; for greedy requests without penalties, bias or log probabilities."""
    adaptive: bool = True
    """Verify only the proposed tokens that pay for themselves (:mod:`tallow.draft_budget`):
    each draft cut to the length with the most expected tokens per second, from the step
    times and acceptance measured so far, and nothing proposed where speculation would lose.
    Greedy requests and sampled ones without a seed; a seeded request verifies every proposed
    token, so that its output does not depend on timing. False: every proposed token."""

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise InvalidArgumentError(
                f"speculative method must be one of {', '.join(METHODS)}, "
                f"got {checks.describe(self.method)}"
            )
        for name in (
            "num_tokens",
            "ngram_max",
            "ngram_min",
            "short_match_tokens",
            "max_num_tokens",
            "num_branches",
        ):
            checks.integer(name, getattr(self, name), 0, MAX_TOKENS)
        if not isinstance(self.adaptive, bool):
            raise InvalidArgumentError(
                f"adaptive must be a bool, got {checks.describe(self.adaptive)}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise InvalidArgumentError("need 1 <= ngram_min <= ngram_max")
        if self.method == "draft" and self.draft_model is None:
            raise InvalidArgumentError("method 'draft' needs a draft model (draft_model=...)")


def speculative_config(
    value: object, base: SpeculativeConfig | None = None
) -> SpeculativeConfig | None:
    """A :class:`SpeculativeConfig` from what a user may pass as ``speculative=``: None or
    False (off), True (the defaults), a method name, a number of tokens, a dict of fields, or a
    config. Fields the value leaves out come from ``base`` (an engine's setting), or else are
    the defaults (prompt lookup)."""
    if value is None or value is False:
        return None
    if isinstance(value, SpeculativeConfig):
        return value
    fields = {} if base is None else dict(base.__dict__)
    if isinstance(value, str):
        fields["method"] = value
    elif isinstance(value, int) and value is not True:
        fields["num_tokens"] = value
    elif isinstance(value, Mapping):
        fields.update(value)
    elif value is not True:
        raise InvalidArgumentError(
            f"speculative must be None, a bool, a method name, a token count, a dict or a "
            f"SpeculativeConfig, got {value!r}"
        )
    try:
        return SpeculativeConfig(**fields)
    except TypeError as e:
        raise InvalidArgumentError(f"speculative: {e}") from None


@dataclass
class DraftRequest:
    """What a proposer gets for one request."""

    request_id: str
    tokens: list[int]
    """The request's prompt and generated tokens, the last sampled one included."""
    num_tokens: int
    """Most tokens to propose."""
    max_tokens: int = 0
    """Most tokens to propose while the output keeps every token proposed (prompt lookup
    doubles its proposals up to this many)."""
    num_branches: int = 0
    """Most alternative guesses to propose beside the main one (see :class:`Proposal`)."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None


@dataclass
class Proposal:
    """Tokens proposed to follow a request's last token."""

    tokens: list[int]
    probs: npt.NDArray[np.float32] | None = None
    """The distribution each token was drawn from (one row of ``n_vocab`` per token), or None
    when they were chosen with certainty (lookup, greedy drafting)."""
    branches: list[tuple[int, list[int]]] = field(default_factory=list)
    """Alternative guesses, ``(depth, tokens)``: after the first ``depth`` of ``tokens``,
    these instead (their first differs from ``tokens[depth]``). With the main guess they make a
    tree whose every path is verified in one step (see :func:`tree_path`)."""
    kind: str = ""
    """Where the tokens come from, for the acceptance measured per kind: prompt lookup's
    ``"follow"`` (going on copying a passage) or ``"n1"``.. ``"n3"`` (a match of that many
    tokens), ``"draft"`` for a draft model."""


def tree_path(
    draft: Sequence[int],
    greedy: Sequence[int],
    branches: Sequence[tuple[int, Sequence[int], Sequence[int]]],
) -> tuple[int | None, int]:
    """The longest path of a tree of guesses that the model's greedy choices agree with.
    ``draft`` is the main guess and ``greedy`` the model's choice after each of its prefixes
    (``len(draft) + 1``); each branch is ``(depth, tokens, greedy)``: tokens after the first
    ``depth`` of ``draft``, and the model's choice after each prefix of them that holds one
    token or more. Returns the branch the path goes into (its index; None: the main guess) and
    how many of that guess's tokens it keeps (for a branch, past its depth)."""
    kept = _agreeing(draft, greedy)
    for i, (depth, tokens, along) in enumerate(branches):
        if depth == kept and tokens and tokens[0] == greedy[kept]:
            return i, 1 + _agreeing(tokens[1:], along)
    return None, kept


def _agreeing(a: Sequence[int], b: Sequence[int]) -> int:
    """How many first tokens of ``a`` equal those of ``b``."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class Proposer(Protocol):
    """Something that guesses the next tokens of requests."""

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, Proposal]:
        """Proposals for some of ``requests`` (none is a valid answer)."""
        ...

    def cut(self, request_id: str, n_tokens: int) -> None:
        """Only the first ``n_tokens`` of the request's last proposal are verified."""
        ...

    def finish(self, request_id: str) -> None:
        """Forget a request that ended."""
        ...


OCCURRENCES = 4
"""Most recent starts of an n-gram the lookup index keeps (for alternative guesses)."""


@dataclass
class _NgramIndex:
    """For each n, the latest starts (up to :data:`OCCURRENCES`, the latest last) of every
    n-gram of a request's tokens that has a token after it."""

    by_n: dict[int, dict[tuple[int, ...], list[int]]] = field(default_factory=dict)
    indexed: int = 0
    """Tokens whose n-grams (ending before the last token) are in the index."""
    source: int = -1
    """Where the last proposal was copied from (-1: none), when the request had
    ``source_len`` tokens."""
    source_len: int = 0
    proposed: int = 0
    """Tokens of the last proposal."""


class NgramProposer:
    """Prompt lookup decoding: the tokens that followed the latest earlier occurrence of the
    request's last ``n`` tokens (the longest ``n`` from ``ngram_max`` down to ``ngram_min``
    that occurs), in its prompt and output; at most ``short_match_tokens`` of them when only
    the last token matches. While the output keeps following the passage a proposal came
    from (its last ``ngram_max`` tokens match there), the next proposal goes on from there.
    With ``num_branches``, what followed other occurrences (of the longest n-gram, then of
    shorter ones, the latest first) and went on otherwise become alternative guesses. An
    index per request is updated with the new tokens of each step."""

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, short_match_tokens: int = 2) -> None:
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.short_match_tokens = short_match_tokens
        self._index: dict[str, _NgramIndex] = {}

    @classmethod
    def from_config(cls, spec: SpeculativeConfig) -> NgramProposer:
        """A proposer with the lookup settings of ``spec``."""
        return cls(spec.ngram_max, spec.ngram_min, spec.short_match_tokens)

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, Proposal]:
        out = {}
        for r in requests:
            found, kind = self._lookup(r)
            if found:
                branches = self._branches(r, found) if r.num_branches else []
                out[r.request_id] = Proposal(found, branches=branches, kind=kind)
        return out

    def _lookup(self, r: DraftRequest) -> tuple[list[int], str]:
        """The proposal and its kind (see :attr:`Proposal.kind`)."""
        tokens = r.tokens
        index = self._index.setdefault(r.request_id, _NgramIndex())
        # Index the n-grams that now have a following token: those ending before the end.
        for end in range(max(index.indexed, 1), len(tokens)):
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end >= n:
                    starts = index.by_n.setdefault(n, {}).setdefault(
                        tuple(tokens[end - n : end]), []
                    )
                    starts.append(end - n)
                    if len(starts) > OCCURRENCES:
                        del starts[0]
        index.indexed = len(tokens)
        # While the output keeps following the passage the last proposal came from, go on
        # copying from there: the latest occurrence of a short n-gram is often elsewhere.
        if index.source >= 0:
            follow = index.source + len(tokens) - index.source_len
            n = self.ngram_max
            if n <= follow < len(tokens) - 1 and tokens[follow - n : follow] == tokens[-n:]:
                # Every token of the last proposal was kept: twice as many, up to the most.
                whole = len(tokens) - index.source_len == index.proposed + 1
                k = min(2 * index.proposed, r.max_tokens) if whole else r.num_tokens
                return self._propose_from(index, tokens, follow, max(k, r.num_tokens)), "follow"
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if len(tokens) < n:
                continue
            latest = index.by_n.get(n, {}).get(tuple(tokens[-n:]))
            if latest:
                k = r.num_tokens if n > 1 else min(r.num_tokens, self.short_match_tokens)
                return self._propose_from(index, tokens, latest[-1] + n, k), f"n{n}"
        index.source = -1
        return [], ""

    def _branches(self, r: DraftRequest, draft: list[int]) -> list[tuple[int, list[int]]]:
        """Up to ``r.num_branches`` alternatives to ``draft``: what followed the other
        occurrences of the request's last tokens, from where it leaves ``draft``, each at a
        depth and first token of its own, as long as ``draft`` in all."""
        tokens, index = r.tokens, self._index[r.request_id]
        branches: list[tuple[int, list[int]]] = []
        taken: set[tuple[int, int]] = set()
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if len(tokens) < n:
                continue
            for start in reversed(index.by_n.get(n, {}).get(tuple(tokens[-n:]), [])):
                guess = tokens[start + n : start + n + len(draft)]
                depth = _agreeing(guess, draft)
                if depth == len(guess) or (depth, guess[depth]) in taken:
                    continue
                taken.add((depth, guess[depth]))
                branches.append((depth, guess[depth:]))
                if len(branches) == r.num_branches:
                    return branches
        return branches

    @staticmethod
    def _propose_from(index: _NgramIndex, tokens: list[int], follow: int, k: int) -> list[int]:
        index.source, index.source_len = follow, len(tokens)
        proposal = tokens[follow : follow + k]
        index.proposed = len(proposal)
        return proposal

    def cut(self, request_id: str, n_tokens: int) -> None:
        # A proposal grows from what was verified of the last.
        index = self._index.get(request_id)
        if index is not None:
            index.proposed = min(index.proposed, n_tokens)

    def finish(self, request_id: str) -> None:
        self._index.pop(request_id, None)


@dataclass
class _DraftState:
    seq: int
    sampler: _core.Sampler
    synced: int = 0
    """Leading tokens of the request whose KV the draft sequence holds."""
    fed: list[int] = field(default_factory=list)
    """Proposed tokens written after those (kept next time if the request accepted them)."""


class DraftModelProposer:
    """Guesses from a draft model with the target's vocabulary: each step, every request's
    draft sequence catches up with the tokens the request now has (dropping proposals it
    rejected), then the draft model generates ``num_tokens`` tokens for all requests in
    batched forwards. Greedy requests draft greedily; sampled ones draw from the draft's
    distribution with their temperature, top-k, top-p and min-p, and that distribution goes
    with the proposal for verification."""

    def __init__(
        self, model: _core.Model, *, n_vocab: int, kv_pages: int, page_size: int = 16
    ) -> None:
        if model.n_vocab != n_vocab:
            raise InvalidArgumentError(
                f"the draft model has {model.n_vocab} tokens of vocabulary, the model "
                f"{n_vocab}: they must share one"
            )
        self.model = model
        self.kv = model.new_kv_cache(page_size=page_size, max_pages=kv_pages)
        self._states: dict[str, _DraftState] = {}

    def _state(self, r: DraftRequest) -> _DraftState:
        state = self._states.get(r.request_id)
        if state is None:
            seed = None if r.seed is None else (r.seed * 0x9E3779B97F4A7C15 + 1) % 2**64
            sampler = _core.Sampler(r.temperature, r.top_k, r.top_p, seed, min_p=r.min_p)
            state = _DraftState(self.kv.create(), sampler)
            self._states[r.request_id] = state
        return state

    def propose(self, requests: Sequence[DraftRequest]) -> dict[str, Proposal]:
        # (request, its draft state, the tokens to feed next)
        active: list[tuple[DraftRequest, _DraftState, list[int]]] = []
        for r in requests:
            state = self._state(r)
            keep = state.synced
            for fed, actual in zip(state.fed, r.tokens[state.synced :], strict=False):
                if fed != actual:
                    break
                keep += 1
            self.kv.truncate(state.seq, keep)
            # The draft's KV holds the tokens synced and those it fed that the request kept.
            state.fed = state.fed[: keep - state.synced]
            new = r.tokens[keep:]
            if not new or not self._reserve(state, len(new)):
                continue  # no room in the draft's pool: this request goes without a draft
            state.synced, state.fed = len(r.tokens), []
            active.append((r, state, new))
        drafted: dict[str, list[tuple[int, npt.NDArray[np.float32]]]] = {}
        while active:
            logits = self.model.forward(self.kv, [(s.seq, feed, "last") for _, s, feed in active])
            going_on = []
            for (r, state, _), row in zip(active, logits, strict=True):
                token, q = state.sampler.draft(row)
                mine = drafted.setdefault(r.request_id, [])
                mine.append((token, q))
                if len(mine) < r.num_tokens and self._reserve(state, 1):
                    state.fed.append(token)
                    going_on.append((r, state, [token]))
            active = going_on
        out = {}
        for r in requests:
            got = drafted.get(r.request_id)
            if got:
                probs = None if r.temperature == 0.0 else np.stack([q for _, q in got])
                out[r.request_id] = Proposal([t for t, _ in got], probs, kind="draft")
        return out

    def _reserve(self, state: _DraftState, n: int) -> bool:
        if self.kv.pages_needed(state.seq, n) > self.kv.n_free:
            return False
        self.kv.reserve(state.seq, n)
        return True

    def cut(self, request_id: str, n_tokens: int) -> None:
        pass  # the tokens it fed that the request did not keep go at its next proposal

    def finish(self, request_id: str) -> None:
        state = self._states.pop(request_id, None)
        if state is not None:
            self.kv.free(state.seq)
