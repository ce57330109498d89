"""How many proposed tokens a speculative step verifies: those that pay for themselves.

A proposed token costs the time its verification adds to the step, and gains a token where the
model keeps it. Both are measured as the engine runs: :class:`StepTimes` holds how long steps
of each size took, :class:`Acceptance` how often each kind of proposal was kept (per request,
beside the engine's average). :func:`plan` cuts each request's draft to the length whose
expected tokens per second are highest, and gives alternative guesses tokens only while they
add more than they cost; where nothing pays, nothing is proposed, so that a request whose
proposals are seldom kept decodes as fast as without speculation.

Proposals are modelled as kept token by token with one probability per kind (``alpha``): a
draft of ``k`` tokens gains ``alpha + alpha**2 + ... + alpha**k`` tokens on average. A guess
that leaves the draft at depth ``d`` is needed where the draft is rejected there (probability
``alpha**d * (1 - alpha)``), and keeps its tokens with a probability of its own (``beta``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

PRIOR_SLOPE = 0.1
"""A step's time per token beyond the first, relative to a one-token step, until two sizes of
step have been measured: optimistic, so that drafts are tried and their cost measured."""

PRIOR_ACCEPTANCE = 0.6
"""The chance a proposed token is kept, before any of its kind has been verified."""

PRIOR_WEIGHT = 4.0
"""Verified tokens the engine's average counts for in a request's own estimate."""

DECAY = 0.98
"""The weight an engine-wide count keeps per update: recent requests count most."""

PROBE_EVERY = 16
"""A request whose proposals were all cut proposes one token anyway after this many: its
acceptance is measured again (the output may have come to something it can copy)."""

TIME_WEIGHT = 0.1
"""Weight of a new measurement in a step size's moving average."""

MAX_RISE = 1.25
"""The most a measurement counts for, relative to the estimate it updates. A size judged
dearer than it is is seldom chosen again, so nothing would correct it: one step slowed by
something else (the host busy elsewhere) must not make it so. An estimate that is too low
corrects itself, since the plan goes on choosing that size."""


class StepTimes:
    """Seconds a step takes by its number of tokens, for steps whose every token produces
    logits (decoding and verification): a moving average per size, interpolated between
    measured sizes and extended past them along the slope between the smallest and the
    largest. The first step of each size is not counted (it grows the step's buffers, which
    can take several times what the step does), and a later one counts for at most
    :data:`MAX_RISE` times the estimate it updates."""

    def __init__(self) -> None:
        self._mean: dict[int, float] = {}
        self._seen: set[int] = set()

    def observe(self, n_tokens: int, seconds: float) -> None:
        """Counts one step of ``n_tokens`` that took ``seconds``."""
        if n_tokens < 1 or not seconds > 0:
            return
        if n_tokens not in self._seen:
            self._seen.add(n_tokens)
            return
        old = self._mean.get(n_tokens)
        if old is None:
            self._mean[n_tokens] = seconds
        else:
            self._mean[n_tokens] = old + TIME_WEIGHT * (min(seconds, MAX_RISE * old) - old)

    def cost(self, n_tokens: int) -> float:
        """The expected seconds of a step of ``n_tokens`` (1.0 per one-token step before any
        measurement: only ratios of costs matter)."""
        known = sorted(self._mean)
        if not known:
            return 1.0 + PRIOR_SLOPE * (n_tokens - 1)
        if n_tokens in self._mean:
            return self._mean[n_tokens]
        if len(known) == 1:
            (at,) = known
            per_token = self._mean[at] / (1.0 + PRIOR_SLOPE * (at - 1))
            return per_token * (1.0 + PRIOR_SLOPE * (n_tokens - 1))
        below = [n for n in known if n < n_tokens]
        above = [n for n in known if n > n_tokens]
        lo, hi = (below[-1], above[0]) if below and above else (known[0], known[-1])
        slope = max(0.0, (self._mean[hi] - self._mean[lo]) / (hi - lo))
        return max(1e-9, self._mean[lo] + slope * (n_tokens - lo))


@dataclass
class _Counts:
    """Proposed tokens kept, and steps whose proposal was rejected somewhere."""

    kept: float = 0.0
    rejected: float = 0.0

    def rate(self, prior: float, weight: float) -> float:
        return (self.kept + weight * prior) / (self.kept + self.rejected + weight)


@dataclass
class _RequestState:
    counts: dict[str, _Counts] = field(default_factory=dict)
    cut: int = 0
    """Proposals cut to nothing in a row."""


class Acceptance:
    """How often proposed tokens are kept, by kind of proposal (``"n3"``, ``"follow"``,
    ``"draft"``, ... and ``"guess"`` for alternative guesses): each request's own counts,
    beside the engine's decayed average as their prior."""

    def __init__(self) -> None:
        self._engine: dict[str, _Counts] = {}
        self._requests: dict[str, _RequestState] = {}

    def rate(self, request_id: str, kind: str) -> float:
        """The chance that a token of ``kind`` proposed for ``request_id`` is kept."""
        prior = self._engine.get(kind, _Counts()).rate(PRIOR_ACCEPTANCE, 1.0)
        own = self._requests.get(request_id, _RequestState()).counts.get(kind, _Counts())
        return own.rate(prior, PRIOR_WEIGHT)

    def observe(self, request_id: str, kind: str, proposed: int, kept: int) -> None:
        """Counts a verified proposal of ``kind``: ``kept`` of its ``proposed`` tokens."""
        if proposed <= 0:
            return
        rejected = 1.0 if kept < proposed else 0.0
        state = self._requests.setdefault(request_id, _RequestState())
        own = state.counts.setdefault(kind, _Counts())
        own.kept += kept
        own.rejected += rejected
        engine = self._engine.setdefault(kind, _Counts())
        engine.kept = engine.kept * DECAY + kept
        engine.rejected = engine.rejected * DECAY + rejected

    def probe(self, request_id: str, cut: bool) -> bool:
        """Records whether the plan cut a request's proposal to nothing; True where it is time
        to verify one token anyway."""
        state = self._requests.setdefault(request_id, _RequestState())
        if not cut:
            state.cut = 0
            return False
        state.cut += 1
        if state.cut >= PROBE_EVERY:
            state.cut = 0
            return True
        return False

    def finish(self, request_id: str) -> None:
        """Forgets a finished request's counts."""
        self._requests.pop(request_id, None)


@dataclass(frozen=True)
class Draft:
    """One request's proposal as :func:`plan` sees it: its tokens' chance of being kept
    (``alpha``), its draft's length, and each guess's depth and length with their chance
    (``beta``)."""

    alpha: float
    length: int
    guesses: Sequence[tuple[int, int]] = ()
    beta: float = 0.0


def expected_kept(alpha: float, k: int) -> float:
    """Tokens of a draft of ``k`` kept on average: ``alpha + ... + alpha**k``."""
    return sum(alpha**j for j in range(1, k + 1))


def plan(drafts: Sequence[Draft], n_requests: int, times: StepTimes) -> list[tuple[int, list[int]]]:
    """For each draft, in order, the tokens worth verifying: its draft's length and each
    guess's (0: none), in a step that takes one token for each of ``n_requests`` decoding
    requests besides the drafts. Each draft's length maximizes the step's expected tokens per
    second given the drafts before it; then its guesses take tokens, the likeliest first, as
    many as raise that rate most."""
    tokens = n_requests
    gained = float(n_requests)
    out = []
    for d in drafts:
        # kept: expected_kept(d.alpha, k), one term added per length.
        best_k, best_kept, best = 0, 0.0, gained / times.cost(tokens)
        kept = 0.0
        for k in range(1, d.length + 1):
            kept += d.alpha**k
            rate = (gained + kept) / times.cost(tokens + k)
            if rate > best:
                best_k, best_kept, best = k, kept, rate
        tokens += best_k
        gained += best_kept
        # Guess tokens by what each adds: needed where the draft is rejected at its depth.
        candidates = sorted(
            (
                (d.alpha**depth * (1 - d.alpha) * d.beta**j, i)
                for i, (depth, length) in enumerate(d.guesses)
                if depth < best_k
                for j in range(1, length + 1)
            ),
            reverse=True,
        )
        lengths = [0] * len(d.guesses)
        taken, extra = 0, 0.0
        for m, (gain, _) in enumerate(candidates, start=1):
            extra += gain
            rate = (gained + extra) / times.cost(tokens + m)
            if rate > best:
                best, taken = rate, m
        for _, i in candidates[:taken]:
            lengths[i] += 1
        tokens += taken
        gained += sum(gain for gain, _ in candidates[:taken])
        out.append((best_k, lengths))
    return out
