"""The continuous batcher: which requests run in the next forward, and with which tokens.

Plain synchronous Python with explicit inputs and outputs and no I/O (the shape of vLLM's v1
``SchedulerInterface``), so it is tested without a model::

    sched = Scheduler(kv, max_num_seqs=16, max_tokens_per_step=512, eog_ids=model.eog_ids)
    sched.add(Request("a", prompt_ids, params))
    while sched.has_work():
        step = sched.schedule()                 # reserves the step's KV positions
        logits = model.forward(kv, step.batch())  # one row per step.sample_ids entry
        outputs = sched.update(step, sample(logits))  # appends tokens, checks stops, frees pages

**One step** (iteration-level scheduling, as in vLLM v1). A request's tokens are its prompt
followed by what it generated; ``num_computed`` of them have KV in the cache. Each step gives a
request the next tokens without KV: one token (the last sampled) when it is decoding, or a
chunk of its prompt (chunked prefill). Within ``max_tokens_per_step`` tokens:

1. running requests that need one token (decodes), oldest first;
2. running requests in the middle of their prompt, oldest first, a chunk each (shortened to the
   pages that are free);
3. waiting requests, strictly first come first served: the head of the queue is admitted while
   ``max_num_seqs`` allows and the pages for its whole first chunk are free; the first that
   cannot be admitted stops admission (so nothing overtakes it). Nothing is admitted in a step
   that preempted.

**Prefix caching** (on by default). A request is admitted with the KV of the longest prefix of
its tokens that the pool has cached, short of its last token: whole pages, then part of a cached
page that begins with its next tokens (copied before the request writes after them); its first
chunk starts after it. After each step, the tokens it computed are committed, so every page they
fill is cached, keyed by its content and everything before it. Cached pages outlive their
requests until the pool needs them (least recently freed first). A preempted request finds its
own pages again if they were not reused meanwhile.

A chunk's logits are needed only when it reaches the end of the request's tokens.

**Embeddings** (a request with ``pooling``) are prompts that produce final hidden states
instead of logits: every chunk's rows for mean pooling, the first chunk's for CLS pooling,
the last token's for last-token pooling. They are scheduled like any prompt, mixed with
generation in the same steps, and finish after their last chunk.

**Pages.** ``schedule()`` reserves every scheduled position with ``kv.reserve``. When a
running request cannot get a page, the *youngest* running request (latest arrival; possibly
itself) is preempted: its pages are freed, its tokens are kept, and it goes back to the front
of the waiting queue; when it is admitted again, its prompt and generated tokens are its new
prompt (recomputation), and the last chunk's logits give its next token. Requests keep arrival
order in the running list, so the oldest request always makes progress. A request that cannot
get a page while it is the only one running holds the whole pool: it finishes with
``"length"`` (the same as a full context in :meth:`tallow.LLM.generate`), and an ``error``
saying so. A prompt that needs more pages than the pool has (or that fills ``max_model_len``,
leaving no room for a token) finishes at once the same way, with no tokens. Pages of a request
are freed the moment it finishes or is aborted.

**Stops** (checked in ``update``): a stop token id, or an end-of-generation id unless
``ignore_eos``, ends with ``"stop"`` and is not part of the output; ``max_tokens`` or
``max_model_len`` end with ``"length"``. An aborted request ends with ``"abort"``. The scheduler
sees token ids only: text, and so stop strings, are the output processor's
(:mod:`tallow.output`), which ends a request whose stop string matched with :meth:`stop`.

The scheduler assumes it alone creates, grows and frees the sequences of ``kv``.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from tallow.errors import InvalidArgumentError, ModelError, TallowError
from tallow.stopping import StopParams

__all__ = [
    "FinishReason",
    "PagePool",
    "Pooling",
    "Request",
    "RequestStatus",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerOutput",
    "Step",
]

FinishReason = Literal["stop", "length", "abort"]

Pooling = Literal["mean", "last", "cls"]
"""How an embedding request's hidden states make one vector (see :attr:`Request.pooling`)."""


Sampled = int | Sequence[int]
"""What :meth:`Scheduler.update` takes per request: a token, or the tokens verification kept."""


class PagePool(Protocol):
    """What the scheduler needs of a paged KV pool (``tallow._core.KvCache``)."""

    @property
    def page_size(self) -> int:
        """Token positions per page."""
        ...

    @property
    def n_pages(self) -> int:
        """Pages in the pool."""
        ...

    @property
    def n_groups(self) -> int:
        """Layer groups: page tables per sequence, a page for each per ``page_size``
        positions."""
        ...

    def pages_to_hold(self, n_tokens: int, chunk: int = 1) -> int:
        """The most pages a sequence of ``n_tokens`` positions holds at once."""
        ...

    def max_append(self, seq: int, want: int, free: int) -> int:
        """The most positions, up to ``want``, ``seq`` can reserve taking ``free`` pages."""
        ...

    def create(self) -> int:
        """A new, empty sequence."""
        ...

    def fork(self, seq: int) -> int:
        """A new sequence sharing every page of ``seq``."""
        ...

    def free(self, seq: int) -> list[int]:
        """End ``seq``; return the pages that became free."""
        ...

    def pages_needed(self, seq: int, n: int) -> int:
        """Pages that reserving ``n`` more positions of ``seq`` would take."""
        ...

    def reserve(self, seq: int, n: int) -> None:
        """Reserve the next ``n`` positions of ``seq``."""
        ...

    def truncate(self, seq: int, keep: int) -> list[int]:
        """Keep the first ``keep`` positions of ``seq``; return the pages that became free."""
        ...

    @property
    def n_free(self) -> int:
        """Free pages (cached ones waiting for reuse included)."""
        ...

    def match_prefix(self, tokens: list[int], max_tokens: int) -> tuple[int, int]:
        """Cached leading tokens of ``tokens`` (at most ``max_tokens``) and how many of their
        pages are free."""
        ...

    def attach_prefix(self, seq: int, tokens: list[int], max_tokens: int) -> int:
        """Give the empty ``seq`` the cached pages of a prefix of ``tokens``."""
        ...

    def commit(self, seq: int, tokens: list[int]) -> None:
        """Record the tokens whose KV was written at the next positions of ``seq``."""
        ...

    def stats(self) -> dict[str, float]:
        """Pool numbers."""
        ...


class RequestStatus(enum.Enum):
    """Where a request is."""

    WAITING = "waiting"
    """Queued, never run (or added and not yet admitted)."""
    RUNNING = "running"
    """Admitted: it has a KV sequence and is scheduled in steps."""
    PREEMPTED = "preempted"
    """Its pages were taken back; queued (at the front) to be recomputed."""
    FINISHED = "finished"
    """Done; see :attr:`Request.finish_reason`."""


@dataclass(eq=False)
class Request:
    """One generation request.

    ``params`` is opaque to the scheduler except for the fields of
    :class:`~tallow.stopping.StopParams` (``max_tokens``, ``stop_token_ids``, ``ignore_eos``);
    the engine keeps its sampling settings there. The other fields are set by the scheduler
    (the engine's requests add their own state: see :class:`tallow.engine.EngineRequest`).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: StopParams
    output_token_ids: list[int] = field(default_factory=list)
    """Generated tokens (stop and end-of-generation token ids are not included)."""
    status: RequestStatus = RequestStatus.WAITING
    arrival: int = -1
    """Order of :meth:`Scheduler.add` calls (0, 1, 2, ...)."""
    seq: int | None = None
    """The KV sequence while running."""
    num_computed: int = 0
    """Tokens (prompt, then generated) whose KV positions are reserved in ``seq``."""
    num_preemptions: int = 0
    num_cached_tokens: int | None = None
    """Prompt tokens whose KV came from the prefix cache when the request was first admitted."""
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None
    """The stop token id that ended the request."""
    error: TallowError | None = None
    """Why the request could not run to a normal end (the pool or context is too small)."""
    branches: list[list[int]] | None = None
    """A scoring request: these token lists are computed after the prompt, each in a branch
    of the request's sequence (a fork) in the step that computes the prompt's last token, with
    a row of logits per token (an empty list takes no branch). It generates nothing and
    finishes (reason ``"stop"``) after that step; the engine reads the rows."""
    pooling: Pooling | None = None
    """An embedding request: the final hidden states of its prompt are pooled (``"mean"`` of
    every token's, the ``"last"`` token's or the first token's, ``"cls"``) instead of
    generating. Mean and CLS pooling compute every token (no cached prefix); it finishes
    (reason ``"stop"``) after the step of its last token; the engine reads the rows."""
    abort_pending: bool = field(default=False, repr=False)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_slice(self, start: int, stop: int) -> list[int]:
        """Tokens ``start:stop`` of prompt + generated."""
        p = len(self.prompt_token_ids)
        if stop <= p:
            return self.prompt_token_ids[start:stop]
        if start >= p:
            return self.output_token_ids[start - p : stop - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - p]

    @property
    def is_finished(self) -> bool:
        """Whether the request is done."""
        return self.status is RequestStatus.FINISHED


# Records built for every request in every step: not frozen, since a frozen dataclass sets
# each field through ``object.__setattr__`` (with 32 requests a step, schedule() and update()
# took a third longer with them frozen). Nothing changes them once built.
@dataclass(slots=True)
class ScheduledChunk:
    """One request's part of a step: what ``Model.forward`` takes for it."""

    request_id: str
    seq: int
    """The KV sequence; ``token_ids`` occupy its last ``len(token_ids)`` reserved positions."""
    token_ids: list[int]
    start_pos: int
    """Position of ``token_ids[0]`` in the sequence."""
    logits: bool
    """Whether the chunk ends the request's tokens, so its last row of logits is sampled."""
    draft: list[int] = field(default_factory=list)
    """Proposed tokens (speculative decoding): ``token_ids`` is the last sampled token then
    these; the chunk has one row of logits per token, and the tokens the model agrees with
    are kept."""
    scoring: bool = False
    """The last chunk of a scoring request (see :attr:`Request.branches`) or one of its
    branches: its rows are read, not sampled."""
    branch_of: int | None = None
    """For a branch: the sequence it was forked from (``seq`` is the fork); every token has a
    row of logits."""
    n_hidden: int = 0
    """Rows of final hidden states the chunk produces instead of logits (an embedding
    request's, see :attr:`Request.pooling`): all its tokens', or its last token's (1)."""
    pooled: bool = False
    """The last chunk of an embedding request: its embedding is complete after this step."""
    guess_depth: int | None = None
    """An alternative guess of a speculative chunk (tree speculation): a branch forked from
    it (``branch_of``) after its last sampled token and its first ``guess_depth`` draft tokens,
    whose rows are verified with the chunk's."""

    @property
    def n_rows(self) -> int:
        """Rows of logits the chunk produces."""
        if self.branch_of is not None:
            return len(self.token_ids)
        return len(self.draft) + 1 if self.logits else 0


@dataclass
class Step:
    """The output of :meth:`Scheduler.schedule`: one batched forward."""

    index: int
    chunks: list[ScheduledChunk] = field(default_factory=list)
    """Decodes first, then prompt chunks of running requests, then of admitted ones."""
    preempted: list[str] = field(default_factory=list)
    """Requests preempted while building this step, in order."""

    @property
    def num_tokens(self) -> int:
        """Tokens in the step (at most the scheduler's ``max_tokens_per_step``)."""
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def sample_ids(self) -> list[str]:
        """Requests to sample for, in the order of their rows of logits (a speculative chunk
        has several rows, see :attr:`ScheduledChunk.n_rows`; scoring chunks have rows but are
        not sampled)."""
        return [
            c.request_id
            for c in self.chunks
            if c.logits and not c.scoring and c.guess_depth is None
        ]

    @property
    def has_scoring(self) -> bool:
        """Whether a scoring request's rows are in the step."""
        return any(c.scoring for c in self.chunks)

    @property
    def has_embeddings(self) -> bool:
        """Whether a chunk of the step is an embedding request's (rows of hidden states, or
        the last chunk, whose embedding is then complete)."""
        return any(c.n_hidden or c.pooled for c in self.chunks)

    def batch(self) -> list[tuple[int, list[int], str] | tuple[int, list[int], str, int]]:
        """The step as ``Model.forward``'s ``batch`` argument."""
        return [
            (c.seq, c.token_ids, _rows(c))
            if c.branch_of is None
            else (c.seq, c.token_ids, "all", c.branch_of)
            for c in self.chunks
        ]

    def __bool__(self) -> bool:
        return bool(self.chunks)


def _rows(chunk: ScheduledChunk) -> str:
    """``Model.forward``'s name of the rows a chunk (not a branch) produces."""
    if chunk.n_hidden:
        return "hidden-last" if chunk.n_hidden == 1 else "hidden-all"
    return {0: "none", 1: "last"}.get(chunk.n_rows, "all")


@dataclass(slots=True)
class SchedulerOutput:
    """What one :meth:`Scheduler.update` produced for one request (token ids only: the output
    processor, :mod:`tallow.output`, turns them into text)."""

    request_id: str
    new_token_ids: list[int]
    """Tokens generated in this step (several when a draft was accepted)."""
    finished: bool
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None
    """The stop or end-of-generation token id that ended the request."""
    error: TallowError | None = None
    """Why the request failed (``"abort"``), or why it ended short (``"length"``: the pool or
    the context is too small)."""


@dataclass
class _Planned:
    req: Request
    n: int
    start_pos: int
    draft: list[int] = field(default_factory=list)


class Scheduler:
    """Continuous batching over a paged KV pool (see the module docstring for the policy).

    - ``kv``: the pool; the scheduler creates one sequence per admitted request.
    - ``max_num_seqs``: most running requests.
    - ``max_tokens_per_step``: the token budget of one step (decodes plus prompt chunks).
    - ``eog_ids``: the model's end-of-generation token ids (EOS, end of turn).
    - ``max_model_len``: most tokens per request, prompt plus generated (the model's
      context); ``None``: no limit.
    - ``prefix_caching``: admit a request with the KV of the longest cached prefix of its
      tokens (the last token always computed), and commit the tokens of every
      step so the pages they fill are cached (see :mod:`tallow._core`'s ``KvCache``).
    """

    def __init__(
        self,
        kv: PagePool,
        *,
        max_num_seqs: int = 64,
        max_tokens_per_step: int = 512,
        eog_ids: Iterable[int] = (),
        max_model_len: int | None = None,
        prefix_caching: bool = True,
    ) -> None:
        for name, value in (
            ("max_num_seqs", max_num_seqs),
            ("max_tokens_per_step", max_tokens_per_step),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
        if max_model_len is not None and (
            isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
        ):
            raise InvalidArgumentError(f"max_model_len must be an integer, got {max_model_len!r}")
        if max_model_len is not None and max_model_len < 1:
            raise InvalidArgumentError(f"max_model_len must be positive, got {max_model_len}")
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_tokens_per_step = max_tokens_per_step
        self.eog_ids = frozenset(eog_ids)
        self.max_model_len = max_model_len
        self.prefix_caching = prefix_caching
        self.num_preemptions = 0
        """Preemptions so far."""
        self.num_finished = 0
        """Requests finished so far (any reason)."""
        self.num_drafted = 0
        """Draft tokens scheduled (speculative decoding)."""
        self.num_accepted = 0
        """Of those, tokens the model agreed with."""
        self.num_draft_steps = 0
        """Request steps that carried a draft."""
        self._page_size = kv.page_size
        self._requests: dict[str, Request] = {}
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._pending: list[SchedulerOutput] = []
        self._inflight: Step | None = None
        self._arrivals = 0
        self._steps = 0

    # -- queries ------------------------------------------------------------------------------

    @property
    def running(self) -> list[str]:
        """Running requests, oldest first."""
        return [r.request_id for r in self._running]

    @property
    def waiting(self) -> list[str]:
        """Waiting (and preempted) requests, in the order they will be admitted."""
        return [r.request_id for r in self._waiting]

    def get(self, request_id: str) -> Request | None:
        """The unfinished request with this id."""
        return self._requests.get(request_id)

    def has_work(self) -> bool:
        """Whether there are unfinished requests or outputs not yet returned by update()."""
        return bool(self._requests) or bool(self._pending)

    def stats(self) -> dict[str, float]:
        """The pool's stats (``pages_total``, ``pages_used``, ...) with ``running``,
        ``waiting``, ``preemptions``, ``finished``, ``steps``, and for speculative decoding
        ``spec_drafted_tokens``, ``spec_accepted_tokens``, ``spec_acceptance_rate`` and
        ``spec_tokens_per_step`` (tokens a request gains per step that carries a draft)."""
        out = dict(self.kv.stats())
        out.update(
            running=len(self._running),
            waiting=len(self._waiting),
            preemptions=self.num_preemptions,
            finished=self.num_finished,
            steps=self._steps,
            spec_drafted_tokens=self.num_drafted,
            spec_accepted_tokens=self.num_accepted,
            spec_acceptance_rate=self.num_accepted / self.num_drafted if self.num_drafted else 0.0,
            spec_tokens_per_step=(
                (self.num_accepted + self.num_draft_steps) / self.num_draft_steps
                if self.num_draft_steps
                else 0.0
            ),
        )
        return out

    # -- requests -----------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue ``request`` (at the back). A request that can never run (``max_tokens`` 0, a
        prompt larger than the pool or ``max_model_len``) is finished at once; its output
        comes with the next :meth:`update`."""
        if request.request_id in self._requests:
            raise InvalidArgumentError(f"request {request.request_id!r} is already queued")
        if request.arrival >= 0 or request.status is not RequestStatus.WAITING:
            raise InvalidArgumentError(f"request {request.request_id!r} was added before")
        if not request.prompt_token_ids:
            raise InvalidArgumentError("the prompt has no tokens")
        params = request.params
        if params.max_tokens is not None and params.max_tokens < 0:
            raise InvalidArgumentError(f"max_tokens must be >= 0, got {params.max_tokens}")
        request.prompt_token_ids = list(request.prompt_token_ids)
        request.arrival = self._arrivals
        self._arrivals += 1
        self._requests[request.request_id] = request
        if params.max_tokens == 0:
            self._pending.append(self._finish(request, "length"))
            return
        error = self._never_fits(request)
        if error is not None:
            self._pending.append(self._finish(request, "length", error=error))
            return
        self._waiting.append(request)

    def abort(self, request_id: str) -> bool:
        """Abort an unfinished request; ``False`` if there is none with this id.

        Its pages are freed at once, unless it is part of the step returned by the last
        :meth:`schedule` whose :meth:`update` has not come yet: then they are freed in that
        update (its sampled token is dropped). Either way its output (``"abort"``) comes with
        the next :meth:`update`.
        """
        req = self._requests.get(request_id)
        if req is None or req.abort_pending:
            return False
        if self._inflight is not None and any(
            c.request_id == request_id for c in self._inflight.chunks
        ):
            req.abort_pending = True
            return True
        self._pending.append(self._finish(req, "abort"))
        return True

    # -- scheduling ---------------------------------------------------------------------------

    def decoding(self) -> list[Request]:
        """Running requests whose next chunk is one decode token (those that can take a draft
        of proposed tokens in the next :meth:`schedule`)."""
        return [r for r in self._running if r.num_tokens - r.num_computed == 1]

    def schedule(
        self,
        drafts: Mapping[str, Sequence[int]] | None = None,
        guesses: Mapping[str, Sequence[tuple[int, Sequence[int]]]] | None = None,
    ) -> Step:
        """The next step; reserves its KV positions. Call :meth:`update` with its result
        (also for an empty step) before the next schedule().

        ``drafts`` gives decoding requests tokens proposed after their last one (speculative
        decoding): a draft rides in the request's decode chunk, shortened to the pages, the
        token budget, ``max_tokens`` and ``max_model_len``. ``guesses`` gives such requests
        alternatives to their draft, ``(depth, tokens)``: after its first ``depth`` tokens,
        these instead; each is computed in a branch of the request's sequence with the tokens
        and pages the step leaves over, no deeper than the draft (see
        :attr:`ScheduledChunk.guess_depth`)."""
        drafts = drafts or {}
        if self._inflight is not None:
            raise RuntimeError("update() must be called with the previous step first")
        step = Step(index=self._steps)
        self._steps += 1
        planned: dict[str, _Planned] = {}
        budget = self.max_tokens_per_step
        free = self.kv.n_free

        for decode_pass in (True, False):
            i = 0
            while i < len(self._running) and budget > 0:
                req = self._running[i]
                remaining = req.num_tokens - req.num_computed
                if req.request_id in planned or (remaining == 1) != decode_pass:
                    i += 1
                    continue
                draft = self._draft_room(req, drafts.get(req.request_id, ())) if decode_pass else []
                want = min(remaining + len(draft), budget)
                n = self._fit(req, want, free, budget)
                while n == 0:
                    victim = self._running[-1]
                    if victim is req and len(self._running) == 1:
                        full = (
                            f"the KV pool ({self.kv.n_pages} pages of {self._page_size} tokens) "
                            f"is full with this request alone"
                        )
                        self._pending.append(self._finish(req, "length", error=ModelError(full)))
                        break
                    refund, freed = self._preempt(victim, planned, step)
                    budget += refund
                    free += freed
                    if victim is req:
                        break
                    n = self._fit(req, want, free, budget)
                if req.status is not RequestStatus.RUNNING:
                    continue  # it was the last of the running list
                assert req.seq is not None
                free -= self.kv.pages_needed(req.seq, n)
                self.kv.reserve(req.seq, n)
                planned[req.request_id] = _Planned(req, n, req.num_computed, draft[: n - 1])
                req.num_computed += n
                budget -= n
                i += 1

        while (
            self._waiting
            and budget > 0
            and not step.preempted
            and len(self._running) < self.max_num_seqs
        ):
            req = self._waiting[0]
            error = self._never_fits(req)
            if error is not None:
                self._waiting.popleft()
                self._pending.append(self._finish(req, "length", error=error))
                continue
            tokens = req.token_slice(0, req.num_tokens)
            # The last token is always computed: its logits give the next token. Mean and CLS
            # pooling need every token's hidden state, so they start from nothing.
            limit = 0 if req.pooling in ("mean", "cls") else req.num_tokens - 1
            hit, revived, n, need = self._admission(req, tokens, limit, budget, free)
            if need > free and hit % self._page_size:
                # Part of a cached page costs a copy of it: where that does not fit, whole
                # pages only.
                limit = hit - hit % self._page_size
                hit, revived, n, need = self._admission(req, tokens, limit, budget, free)
            if n == 0 or need > free:
                break
            self._waiting.popleft()
            req.seq = self.kv.create()
            if self.prefix_caching:  # also when nothing is cached: it counts the lookup
                self.kv.attach_prefix(req.seq, tokens, limit)
            self.kv.reserve(req.seq, n)
            free -= need
            req.status = RequestStatus.RUNNING
            self._running.append(req)
            planned[req.request_id] = _Planned(req, n, hit)
            req.num_computed = hit + n
            if req.num_cached_tokens is None:
                req.num_cached_tokens = hit
            budget -= n

        for p in planned.values():
            assert p.req.seq is not None
            end = p.start_pos + p.n
            known = end - len(p.draft)
            last = known == p.req.num_tokens
            scoring = last and p.req.branches is not None
            pooling = p.req.pooling
            step.chunks.append(
                ScheduledChunk(
                    request_id=p.req.request_id,
                    seq=p.req.seq,
                    token_ids=p.req.token_slice(p.start_pos, known) + p.draft,
                    start_pos=p.start_pos,
                    logits=last and pooling is None,
                    draft=p.draft,
                    scoring=scoring,
                    n_hidden=_hidden_rows(pooling, p.start_pos, p.n, last),
                    pooled=last and pooling is not None,
                )
            )
            if scoring:
                step.chunks += self._fork_branches(p.req)
        if guesses:
            self._fork_guesses(step, guesses, budget, free)
        self._inflight = step
        return step

    def _fork_guesses(
        self,
        step: Step,
        guesses: Mapping[str, Sequence[tuple[int, Sequence[int]]]],
        budget: int,
        free: int,
    ) -> None:
        """Add to ``step`` a branch for each guess of its speculative chunks that fits
        ``budget`` tokens and ``free`` pages."""
        for chunk in list(step.chunks):
            for depth, tokens in guesses.get(chunk.request_id, ()) if chunk.draft else ():
                if not 0 <= depth < len(chunk.draft):
                    continue  # the draft was cut shorter
                kept = [int(t) for t in tokens[: min(len(chunk.draft) - depth, budget)]]
                if not kept or kept[0] == chunk.draft[depth]:
                    continue
                fork = self.kv.fork(chunk.seq)
                self.kv.truncate(fork, chunk.start_pos + 1 + depth)
                need = self.kv.pages_needed(fork, len(kept))
                if need > free:
                    self.kv.free(fork)
                    continue
                self.kv.reserve(fork, len(kept))
                free -= need
                budget -= len(kept)
                step.chunks.append(
                    ScheduledChunk(
                        request_id=chunk.request_id,
                        seq=fork,
                        token_ids=kept,
                        start_pos=chunk.start_pos + 1 + depth,
                        logits=True,
                        branch_of=chunk.seq,
                        guess_depth=depth,
                    )
                )

    def _admission(
        self, req: Request, tokens: list[int], limit: int, budget: int, free: int
    ) -> tuple[int, int, int, int]:
        """For a waiting request: the cached tokens it would start with (at most ``limit``),
        the cached pages that would leave the free list, the tokens of its first chunk and the
        pages it would take from the free list in all."""
        hit, revived = self.kv.match_prefix(tokens, limit) if self.prefix_caching else (0, 0)
        n = min(req.num_tokens - hit, budget, self._first_chunk_room(hit, revived))
        need = revived + self._pages_from(hit, n)
        if hit + n == req.num_tokens and not self._branches_fit(req, budget - n, free - need):
            n -= 1  # the last token waits for a step with room for the branches
            need = revived + self._pages_from(hit, n)
        return hit, revived, n, need

    def _fork_branches(self, req: Request) -> list[ScheduledChunk]:
        """The branches of a scoring request whose last token is in this step, each a fork of
        its sequence with the branch's positions reserved."""
        assert req.seq is not None and req.branches is not None
        chunks = []
        for tokens in req.branches:
            if not tokens:
                continue
            fork = self.kv.fork(req.seq)
            self.kv.reserve(fork, len(tokens))
            chunks.append(
                ScheduledChunk(
                    request_id=req.request_id,
                    seq=fork,
                    token_ids=list(tokens),
                    start_pos=req.num_tokens,
                    logits=True,
                    scoring=True,
                    branch_of=req.seq,
                )
            )
        return chunks

    def _branch_cost(self, req: Request) -> tuple[int, int]:
        """(tokens, pages) the branches of a scoring request take beside its last chunk: for
        each, in every layer group, a copy of the last page where it is partly filled and
        pages for the positions past it."""
        if not req.branches:
            return 0, 0
        ps, n = self._page_size, req.num_tokens
        shared = 1 if n % ps else 0
        tokens = pages = 0
        for branch in req.branches:
            if branch:
                tokens += len(branch)
                pages += shared + math.ceil((n + len(branch)) / ps) - math.ceil(n / ps)
        return tokens, pages * self.kv.n_groups

    def _branches_fit(self, req: Request, budget: int, free: int) -> bool:
        """Whether the branches of ``req`` (if any) fit in ``budget`` tokens and ``free``
        pages beside its last chunk."""
        if not req.branches:
            return True
        tokens, pages = self._branch_cost(req)
        return tokens <= budget and pages <= free

    def update(
        self,
        step: Step,
        sampled: Mapping[str, Sampled] | Sequence[Sampled],
        failed: Mapping[str, TallowError] | None = None,
        adopted: Mapping[str, int] | None = None,
    ) -> list[SchedulerOutput]:
        """Take the tokens sampled for ``step`` (by request id, or aligned with the
        ``step.sample_ids`` not in ``failed``): one token per request, or for a chunk with a
        draft the accepted draft tokens then one more. The requests of ``failed`` could not
        take a token (their constraint failed): they end with reason ``"abort"`` and the error
        it maps them to. Return the outputs: first those of requests finished outside a step
        (aborted, rejected, out of pages), then one per sampled request, in step order. The KV
        of rejected draft tokens is dropped. ``adopted`` names the requests whose tokens follow
        one of their guesses (:attr:`ScheduledChunk.guess_depth`) rather than their draft: the
        sequence of that guess's branch, which becomes the request's.
        """
        if step is not self._inflight:
            raise RuntimeError("update() takes the step returned by the last schedule()")
        failed = failed or {}
        ids = [r for r in step.sample_ids if r not in failed]
        if isinstance(sampled, Mapping):
            missing = [r for r in ids if r not in sampled]
            if missing:
                raise InvalidArgumentError(f"no sampled token for {missing}")
            given = [sampled[r] for r in ids]
        else:
            if len(sampled) != len(ids):
                raise InvalidArgumentError(
                    f"{len(sampled)} sampled tokens for {len(ids)} rows of logits"
                )
            given = list(sampled)
        tokens = {
            r: [int(t)] if isinstance(t, int) else [int(x) for x in t]
            for r, t in zip(ids, given, strict=True)
        }
        adopted = adopted or {}
        guess_of = {
            c.request_id: c
            for c in step.chunks
            if c.guess_depth is not None and adopted.get(c.request_id) == c.seq
        }
        if set(guess_of) != set(adopted):
            raise InvalidArgumentError(f"no guess of the step has the sequences {adopted}")
        for chunk in step.chunks:
            got = tokens.get(chunk.request_id)
            if got is None or chunk.branch_of is not None:
                continue
            path = chunk.draft
            if (guess := guess_of.get(chunk.request_id)) is not None:
                assert guess.guess_depth is not None
                path = chunk.draft[: guess.guess_depth] + guess.token_ids
                if len(got) - 1 <= guess.guess_depth:
                    path = []  # a guess's path keeps one of its tokens or more
            if not (1 <= len(got) <= len(path) + 1 and got[:-1] == path[: len(got) - 1]):
                raise InvalidArgumentError(
                    f"{got} for {chunk.request_id!r} is not an accepted prefix of its draft "
                    f"{path} and one more token"
                )
        self._inflight = None
        self._free_branches(step, keep=set(adopted.values()))
        for chunk in step.chunks:
            if chunk.branch_of is not None:
                continue
            kept = len(chunk.token_ids)
            seq, written = chunk.seq, chunk.token_ids
            if chunk.draft:
                accepted = len(tokens.get(chunk.request_id, [0])) - 1
                kept -= len(chunk.draft) - accepted
                req = self._requests[chunk.request_id]
                if (guess := guess_of.get(chunk.request_id)) is not None:
                    # The path went into a guess: its branch holds the kept tokens' KV and
                    # becomes the request's sequence.
                    assert guess.guess_depth is not None
                    self.kv.free(chunk.seq)
                    seq = req.seq = guess.seq
                    taken = accepted - guess.guess_depth
                    written = chunk.token_ids[: 1 + guess.guess_depth] + guess.token_ids[:taken]
                # The KV of rejected draft tokens goes.
                self.kv.truncate(seq, chunk.start_pos + kept)
                req.num_computed = chunk.start_pos + kept
                self.num_drafted += len(chunk.draft)
                self.num_accepted += accepted
                self.num_draft_steps += 1
            if self.prefix_caching:
                # The step wrote these tokens' KV: the pages they fill become findable.
                self.kv.commit(seq, written[:kept])
        outputs, self._pending = self._pending, []
        for chunk in step.chunks:
            if chunk.branch_of is not None:
                continue
            req = self._requests[chunk.request_id]
            if req.abort_pending:
                outputs.append(self._finish(req, "abort"))
            elif chunk.request_id in failed:
                outputs.append(self._finish(req, "abort", error=failed[chunk.request_id]))
            elif chunk.scoring or chunk.pooled:
                outputs.append(self._finish(req, "stop"))
            elif chunk.logits:
                outputs.append(self._append_all(req, chunk, tokens[chunk.request_id]))
        return outputs

    def _free_branches(self, step: Step, keep: set[int] | None = None) -> None:
        """Free the forks of a step's branches (but those of ``keep``, guesses a request
        adopted): they live for one step."""
        for chunk in step.chunks:
            if chunk.branch_of is not None and chunk.seq not in (keep or ()):
                self.kv.free(chunk.seq)

    def _append_all(
        self, req: Request, chunk: ScheduledChunk, tokens: list[int]
    ) -> SchedulerOutput:
        """Append the tokens sampled for ``chunk`` one by one, stopping where one ends the
        request; one output for them all."""
        known = chunk.start_pos + len(chunk.token_ids) - len(chunk.draft)
        new: list[int] = []
        for j, token in enumerate(tokens):
            # Positions with KV before this token: the known ones and the accepted draft.
            req.num_computed = known + j
            out = self._append(req, token)
            new += out.new_token_ids
            if out.finished:
                return replace(out, new_token_ids=new)
        return SchedulerOutput(req.request_id, new, False)

    def fail(self, step: Step, error: TallowError) -> list[SchedulerOutput]:
        """Instead of :meth:`update`, when ``step`` could not be computed: end every request in
        it with reason ``"abort"`` and ``error``, freeing its pages (the positions the step
        reserved included). Requests outside the step are untouched. Returns the outputs, with
        those pending from outside a step first."""
        if step is not self._inflight:
            raise RuntimeError("fail() takes the step returned by the last schedule()")
        self._inflight = None
        self._free_branches(step)
        outputs, self._pending = self._pending, []
        for chunk in step.chunks:
            req = self._requests.get(chunk.request_id)
            if req is not None:
                outputs.append(self._finish(req, "abort", error=error))
        return outputs

    def stop(self, request_id: str) -> None:
        """End a request that its output processor stopped (a stop string matched in the
        tokens of the last :meth:`update`): its pages are freed now, and no output comes for
        it (the processor made its last one)."""
        if self._inflight is not None:
            raise RuntimeError("stop() comes between update() and the next schedule()")
        req = self._requests.get(request_id)
        if req is not None:
            self._finish(req, "stop")

    # -- internals ----------------------------------------------------------------------------

    def _draft_room(self, req: Request, draft: Sequence[int]) -> list[int]:
        """The part of ``draft`` that fits ``max_model_len`` and ``max_tokens``: the step may
        add every draft token and one more."""
        k = len(draft)
        if self.max_model_len is not None:
            k = min(k, self.max_model_len - req.num_tokens - 1)
        if req.params.max_tokens is not None:
            k = min(k, req.params.max_tokens - len(req.output_token_ids) - 1)
        return [int(t) for t in draft[: max(k, 0)]]

    def _never_fits(self, req: Request) -> TallowError | None:
        """Why ``req`` can never be scheduled, or None: continuations to score that no step
        or pool could hold are the request's own fault (:class:`InvalidArgumentError`), a
        prompt too long for the pool or the model's length is a :class:`ModelError`."""
        n = req.num_tokens
        branch_tokens, branch_pages = self._branch_cost(req)
        if branch_tokens >= self.max_tokens_per_step:
            return InvalidArgumentError(
                f"continuations to score: their branches of {branch_tokens} tokens leave no "
                f"room for the prompt's last token in a step of {self.max_tokens_per_step} tokens"
            )
        if branch_pages and self.kv.pages_to_hold(n) + branch_pages > self.kv.n_pages:
            return InvalidArgumentError(
                f"continuations to score: {n} tokens and their branches ({branch_pages} pages) "
                f"do not fit in the KV pool ({self.kv.n_pages} pages of {self._page_size} tokens)"
            )
        if req.pooling is not None:
            if self.max_model_len is not None and n > self.max_model_len:
                return ModelError(f"{n} tokens are more than max_model_len={self.max_model_len}")
        elif self.max_model_len is not None and n >= self.max_model_len:
            return ModelError(
                f"{n} tokens leave no room for a completion in max_model_len={self.max_model_len}"
            )
        if self.kv.pages_to_hold(n) > self.kv.n_pages:
            return ModelError(
                f"{n} tokens do not fit in the KV pool ({self.kv.n_pages} pages of "
                f"{self._page_size} tokens)"
            )
        return None

    def _fit(self, req: Request, want: int, free: int, budget: int) -> int:
        """Most tokens, up to ``want``, that ``req`` can reserve with ``free`` pages (and
        ``budget`` tokens, for the branches of a scoring request's last token)."""
        assert req.seq is not None
        n = self.kv.max_append(req.seq, want, free)
        if n and req.num_computed + n == req.num_tokens:
            room = free - self.kv.pages_needed(req.seq, n)
            if not self._branches_fit(req, budget - n, room):
                n -= 1  # the last token waits for a step with room for the branches
        return n

    def _pages_from(self, hit: int, n: int) -> int:
        """Pages a new sequence holding the ``hit`` cached tokens takes for its next ``n``: a
        page per ``page_size`` positions in each layer group (a cached page it holds in part is
        copied first)."""
        ps = self._page_size
        return self.kv.n_groups * (math.ceil((hit + n) / ps) - hit // ps)

    def _first_chunk_room(self, hit: int, revived: int) -> int:
        """The longest first chunk after ``hit`` cached tokens that fits the whole pool:
        with several layer groups a prompt that fits one token at a time may not fit in one
        chunk."""
        ps, groups = self._page_size, self.kv.n_groups
        pages = max(self.kv.n_pages - revived, 0) // groups + hit // ps
        return max(pages * ps - hit, 0)

    def _preempt(self, req: Request, planned: dict[str, _Planned], step: Step) -> tuple[int, int]:
        """Free ``req``'s pages and requeue it at the front; return (budget refunded, pages
        freed)."""
        # Defensive: with first-come-first-served admission, the victim (the youngest) is
        # not yet planned in this step; if it were, its chunk is dropped and refunded.
        p = planned.pop(req.request_id, None)
        assert req.seq is not None
        freed = self.kv.free(req.seq)
        self._running.remove(req)
        req.seq = None
        req.num_computed = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self._waiting.appendleft(req)
        self.num_preemptions += 1
        step.preempted.append(req.request_id)
        return (p.n if p is not None else 0), len(freed)

    def _finish(
        self,
        req: Request,
        reason: FinishReason,
        *,
        new: Sequence[int] = (),
        stop_reason: int | None = None,
        error: TallowError | None = None,
    ) -> SchedulerOutput:
        """End ``req`` now: free its pages, drop it from the queues; return its output."""
        if req.seq is not None:
            self.kv.free(req.seq)
            req.seq = None
        if req.status is RequestStatus.RUNNING:
            self._running.remove(req)
        elif req in self._waiting:
            self._waiting.remove(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.stop_reason = stop_reason
        req.error = error
        req.abort_pending = False
        del self._requests[req.request_id]
        self.num_finished += 1
        return SchedulerOutput(req.request_id, list(new), True, reason, stop_reason, error)

    def _append(self, req: Request, token: int) -> SchedulerOutput:
        """Add a sampled token to ``req`` and check its stop conditions."""
        params = req.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eog_ids):
            return self._finish(req, "stop", stop_reason=token)
        req.output_token_ids.append(token)
        if (params.max_tokens is not None and len(req.output_token_ids) >= params.max_tokens) or (
            self.max_model_len is not None and req.num_tokens >= self.max_model_len
        ):
            return self._finish(req, "length", new=[token])
        return SchedulerOutput(req.request_id, [token], False)


def _hidden_rows(pooling: Pooling | None, start: int, n: int, last: bool) -> int:
    """Rows of hidden states a chunk of ``n`` tokens from position ``start`` produces for an
    embedding request pooled with ``pooling`` (0 for any other request)."""
    if pooling == "mean" or (pooling == "cls" and start == 0):
        return n
    if pooling == "last" and last:
        return 1
    return 0
