"""The output processor: what the engine's steps give each request, turned into what callers
read, the same for :class:`~tallow.LLM`, :class:`~tallow.AsyncLLM` and the server.

The scheduler batches and ends requests on conditions it can see in token ids (an
end-of-generation or stop token, ``max_tokens``, the context). Everything about text happens
here, per request (:class:`OutputState`), as vLLM v1 splits its engine core from its output
processor:

- incremental detokenization, whole UTF-8 characters at a time;
- stop strings, found across token boundaries; text that may be the start of one is held back,
  and a request whose stop string completes ends in the same step (its later tokens dropped);
- log probabilities, one per generated token;
- tool calls (chat with tools): their text is held back from what is shown and parsed into
  :class:`~tallow.tools.ToolCall` objects when the reply ends (``finish_reason="tool_calls"``).

:class:`ResultBuilder` gathers a request's outputs into one :class:`GenerationResult`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from tallow.errors import TallowError
from tallow.reasoning import Block, Channels, ChannelSplit, splitter
from tallow.scheduler import SchedulerOutput
from tallow.stopping import StopMatcher, TokenDecoder
from tallow.tools import ToolCall, ToolStream, ToolUse, addressed_calls

__all__ = [
    "FinishReason",
    "GenerationResult",
    "OutputState",
    "RequestOutput",
    "ResultBuilder",
    "SampledRow",
    "TokenLogprob",
]

FinishReason = Literal["stop", "length", "abort", "tool_calls"]

SampledRow = tuple[int, float, list[tuple[int, float]]]
"""A sampled token, its log probability and the most likely tokens with theirs."""


@dataclass(frozen=True)
class TokenLogprob:
    """The log probability of a generated token, and the ``top_logprobs`` most likely tokens
    at its position with theirs (most likely first)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    """Tokens generated in this step (several when speculative decoding kept a draft)."""
    text: str
    """New text that may be shown: held-back text (a possible stop string, a tool call) comes
    out later or not at all."""
    finished: bool
    finish_reason: FinishReason | None = None
    """``"stop"`` (an end-of-generation or stop token, or a stop string), ``"length"``
    (``max_tokens`` or the context), ``"tool_calls"`` (the reply ended with calls, in
    :attr:`tool_calls`) or ``"abort"`` (aborted, or failed: see :attr:`error`)."""
    stop_reason: str | int | None = None
    """The stop string or token id that ended the request."""
    error: TallowError | None = None
    """Why the request failed (its constraint could not go on, the step could not be
    computed, its prompt does not fit); the front ends raise it."""
    logprobs: list[TokenLogprob] | None = None
    """For each new token (when the request asks for log probabilities): its log probability
    and the most likely alternatives."""
    tool_calls: list[ToolCall] | None = None
    """With the last output of a chat reply that called tools: the calls."""
    cached_tokens: int = 0
    """With the last output: prompt tokens whose KV came from the prefix cache."""
    scores: list[float] | None = None
    """With the output of a scoring request (``SamplingParams.continuations``): the
    log-likelihood of each continuation after the prompt, the sum over its tokens."""
    reasoning_tokens: int = 0
    """Of :attr:`new_token_ids`, those of the reasoning block (its marks included)."""
    reasoning: str = ""
    """New reasoning text (a reply of a model that reasons, see :mod:`tallow.reasoning`): what
    it wrote inside its reasoning block, apart from :attr:`text`."""
    embedding: npt.NDArray[np.float32] | None = None
    """With the output of an embedding request (``SamplingParams.pooling``): the pooled final
    hidden states of its prompt (not normalized)."""


class OutputState:
    """The text side of one request: its decoder, stop strings, log probabilities and tools."""

    def __init__(
        self,
        decoder: TokenDecoder,
        stop: Sequence[str] = (),
        *,
        logprobs: bool = False,
        tools: ToolUse | None = None,
        reasoning: tuple[Block | Channels, TokenDecoder, Callable[[list[int]], str]] | None = None,
    ) -> None:
        self._decoder = decoder
        self._matcher = StopMatcher(tuple(stop))
        self._logprobs = logprobs
        self._tools = None if tools is None else ToolStream(tools)
        self._tokens = 0
        # A reply that may reason: its tokens split into the reasoning (decoded apart) and
        # the answer; the whitespace that opens either is dropped.
        self._reasoning = (
            None if reasoning is None else (splitter(reasoning[0], reasoning[2]), reasoning[1])
        )
        self._trim = {"reasoning": True, "answer": reasoning is not None}

    def process(self, out: SchedulerOutput, rows: Sequence[SampledRow] = ()) -> RequestOutput:
        """The output of a step from the scheduler's (``out``) and the rows the sampler drew
        for its tokens (``rows``, aligned with them; needed for log probabilities). When a
        stop string completes, the output is finished (``"stop"``) although ``out`` is not:
        the caller ends the request in the scheduler."""
        new: list[int] = []
        pieces: list[str] = []
        thoughts: list[str] = []
        reasoning_tokens = 0
        for token in out.new_token_ids:
            new.append(token)
            if self._reasoning is not None:
                split, thinking = self._reasoning
                reasoning, mark = split.push(token)
                reasoning_tokens += reasoning
                if mark:
                    continue
                if reasoning:
                    thoughts.append(self._trimmed("reasoning", thinking.push(token)))
                    continue
            pieces.append(self._matcher.push(self._trimmed("answer", self._decoder.push(token))))
            if self._matcher.stopped:
                break
        self._tokens += len(new)
        finished = out.finished
        reason: FinishReason | None = out.finish_reason
        stop_reason: str | int | None = out.stop_reason
        if self._matcher.stopped:
            finished, reason, stop_reason = True, "stop", self._matcher.matched
        elif finished and reason in ("stop", "length"):
            # The end of the text: what was held back comes out, unless it completes a stop.
            tail = self._trimmed("answer", self._decoder.finish())
            pieces.append(self._matcher.push(tail) + self._matcher.flush())
            if self._reasoning is not None:
                thoughts.append(self._trimmed("reasoning", self._reasoning[1].finish()))
            if self._matcher.stopped and stop_reason is None:
                reason, stop_reason = "stop", self._matcher.matched
        text = "".join(pieces)
        calls = None
        if self._tools is not None:
            text = self._tools.feed(text)
        if finished and reason in ("stop", "length"):
            rest, found = self._tools.finish() if self._tools is not None else ("", [])
            channels = None if self._reasoning is None else self._reasoning[0]
            messages = channels.addressed if isinstance(channels, ChannelSplit) else []
            if messages:
                use = None if self._tools is None else self._tools.use
                other, addressed = addressed_calls(use, messages)
                rest, found = rest + other, found + addressed
            text += rest
            if found:
                # The calls of a reply cut short (max_tokens, the context) keep "length".
                calls = found
                if reason == "stop":
                    reason = "tool_calls"
        logprobs = None
        if self._logprobs and new:
            logprobs = [TokenLogprob(*row) for row in rows[: len(new)]]
        # A request that ran out of room after some tokens ended normally (as at the end of
        # the context); one that failed, or ran out before its first token, did not.
        error = None
        if out.error is not None and (reason == "abort" or not self._tokens):
            reason, error = "abort", out.error
        return RequestOutput(
            out.request_id,
            new,
            text,
            finished,
            reason,
            stop_reason,
            error,
            logprobs,
            calls,
            reasoning_tokens=reasoning_tokens,
            reasoning="".join(thoughts),
        )

    def _trimmed(self, part: str, text: str) -> str:
        """``text`` of the reasoning or the answer, without the whitespace that opens it."""
        if self._trim[part]:
            text = text.lstrip()
            self._trim[part] = not text
        return text


@dataclass(frozen=True)
class GenerationResult:
    """The outcome of one generation (:meth:`tallow.LLM.generate`,
    :meth:`tallow.AsyncLLM.generate`, their chat methods, and a finished stream)."""

    text: str
    """The generated text, without the prompt and without the stop string (if one matched);
    with tool calls, the reply's text outside them."""
    token_ids: list[int] = field(default_factory=list)
    """Every sampled token, in order. An end-of-generation token is not included; when a stop
    string matched, the tokens that spelled it are included although its text is not."""
    finish_reason: FinishReason = "length"
    """``"stop"``: an end-of-generation token was sampled or a stop string matched;
    ``"length"``: ``max_tokens`` was reached or the context is full; ``"tool_calls"``: the
    reply ended with calls of the tools (:attr:`tool_calls`)."""
    prompt_tokens: int = 0
    """Number of prompt tokens (including BOS when the model adds one)."""
    completion_tokens: int = 0
    """Number of generated tokens (``len(token_ids)``)."""
    prompt_seconds: float = 0.0
    """Wall time from the request to its first output (queueing and the prompt)."""
    completion_seconds: float = 0.0
    """Wall time spent generating after the first output."""
    logprobs: list[TokenLogprob] | None = None
    """With the ``logprobs`` option: each generated token's log probability (and the most
    likely tokens with theirs, with ``top_logprobs``), one per token of :attr:`token_ids`."""
    tool_calls: list[ToolCall] | None = None
    """The calls of the tools the reply made (chat with ``tools``)."""
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache instead of being computed."""
    reasoning: str | None = None
    """What a model that reasons wrote in its reasoning block, apart from :attr:`text` (None
    where it wrote nothing there, or had no block; see :mod:`tallow.reasoning`)."""


class ResultBuilder:
    """Gathers the outputs of one request into its :class:`GenerationResult`."""

    def __init__(self, prompt_tokens: int, logprobs: bool) -> None:
        self._prompt_tokens = prompt_tokens
        self._tokens: list[int] = []
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._logprobs: list[TokenLogprob] | None = [] if logprobs else None
        self._last: RequestOutput | None = None
        self._start = time.perf_counter()
        self._first: float | None = None

    def add(self, out: RequestOutput) -> str:
        """Take the next output; return its text. Raises the request's error if it failed."""
        if out.error is not None:
            raise out.error
        self._first = self._first or time.perf_counter()
        self._tokens += out.new_token_ids
        self._text.append(out.text)
        self._reasoning.append(out.reasoning)
        if self._logprobs is not None and out.logprobs:
            self._logprobs += out.logprobs
        self._last = out
        return out.text

    def result(self) -> GenerationResult:
        """The result, once the last output (``finished``) was added."""
        last = self._last
        assert last is not None and last.finished and last.finish_reason != "abort"
        end = time.perf_counter()
        first = self._first or end
        return GenerationResult(
            text="".join(self._text),
            token_ids=self._tokens,
            finish_reason=last.finish_reason or "stop",
            prompt_tokens=self._prompt_tokens,
            completion_tokens=len(self._tokens),
            prompt_seconds=first - self._start,
            completion_seconds=end - first,
            logprobs=self._logprobs,
            tool_calls=last.tool_calls,
            cached_tokens=last.cached_tokens,
            reasoning="".join(self._reasoning) or None,
        )
