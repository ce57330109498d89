"""Reasoning: models that think in a block (``<think>`` ... ``</think>``) before they answer.

A chat request on a model whose vocabulary holds both marks as single tokens (Qwen 3, QwQ,
DeepSeek-R1 distills) may reason: its output is split, token by token, into the reasoning
(inside the block, the marks left out) and the answer (after it). Where the block starts is read
from the rendered prompt: a prompt that ends with the opening mark (DeepSeek-R1's template)
starts the output inside the block; one that ends with a whole, empty block (Qwen 3's template
with ``enable_thinking=False``) leaves no block; otherwise the output opens one if its first
token is the opening mark.

The sampler knows the block too (:class:`Block`): a constraint on the output (a JSON schema, a
tool call's syntax) applies to the answer only, and ``reasoning_budget`` tokens into the block
the closing mark is chosen in place of the next token, so that the model answers.

gpt-oss writes its reply as messages on channels instead (OpenAI's harmony format:
``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...``):
a model whose vocabulary holds ``<|start|>``, ``<|channel|>``, ``<|message|>`` and ``<|end|>``
as single tokens has its reply split by channel (:class:`Channels`): the ``analysis`` channel's
messages are the reasoning, the others' the answer, the headers neither; a message addressed to
a recipient (``<|channel|>commentary to=functions.NAME ...<|message|>{...}<|call|>``) is a call,
kept apart (:attr:`ChannelSplit.addressed`) for :func:`tallow.tools.addressed_calls`. To the
sampler everything before ``<|channel|>final<|message|>`` is reasoning: a constraint applies
after it, and a spent budget closes with
``<|end|><|start|>assistant<|channel|>final<|message|>``. Where a call is required, what is
before ``<|channel|>commentary`` is reasoning instead, and the call's grammar follows it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tallow import _core

__all__ = [
    "END",
    "START",
    "Block",
    "Channels",
    "ChannelSplit",
    "ReasoningSplit",
    "block_of",
    "marks",
    "splitter",
]

START = "<think>"
END = "</think>"

_TAIL = 8
"""Tokens at the end of a prompt where a generation prompt opens or closes the block."""


@dataclass(frozen=True)
class Block:
    """The reasoning block a chat reply may have: the ids of its marks, whether the prompt
    opened it, and the most tokens it may hold (None: no limit)."""

    start: int
    end: int
    opened: bool
    budget: int | None = None

    def sampler_args(self) -> SamplerArgs | None:
        """What :class:`tallow._core.Sampler` takes as ``reasoning``."""
        return self.start, [self.end], [self.end], self.budget, self.opened


@dataclass(frozen=True)
class Channels:
    """A reply in harmony's channels: the ids of ``<|start|>``, ``<|channel|>``,
    ``<|message|>`` and ``<|end|>``, and where the prompt left the reply: the header tokens it
    began (``header``, after its last ``<|start|>``), or inside a message's body (``body``
    set) on that header's channel."""

    start: int
    channel: int
    message: int
    end: int
    header: tuple[int, ...] = ()
    body: bool = False
    answer: tuple[int, ...] = ()
    """What opens the answer: ``<|channel|>final<|message|>`` (``<|channel|>commentary``
    where a call is required)."""
    close: tuple[int, ...] = ()
    """What a spent budget closes the reasoning with: ``<|end|><|start|>assistant``, then
    :attr:`answer`."""
    budget: int | None = None
    answering: bool = False
    """Whether the prompt left the reply in a message of the final channel already."""

    def sampler_args(self) -> SamplerArgs | None:
        """What :class:`tallow._core.Sampler` takes as ``reasoning``: everything before the
        answer is reasoning to it (None where the prompt began the answer)."""
        if self.answering:
            return None
        return self.channel, list(self.answer), list(self.close), self.budget, True


SamplerArgs = tuple[int, list[int], list[int], int | None, bool]
"""``(start, end, close, budget, opened)``, as :class:`tallow._core.Sampler` takes them."""

_HARMONY = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")
_MAX_HEADER = 32
"""Tokens of a message header (``assistant<|channel|>analysis``) past which the reply is
taken as an answer that left the format."""


def _single_tokens(model: _core.Model, texts: tuple[str, ...]) -> list[int] | None:
    ids = [model.tokenize(text, False, True) for text in texts]
    if any(len(found) != 1 for found in ids) or len({found[0] for found in ids}) != len(ids):
        return None
    return [found[0] for found in ids]


def marks(model: _core.Model) -> tuple[int, int] | None:
    """The ids of ``<think>`` and ``</think>`` where ``model``'s vocabulary holds each as one
    token (a model that reasons), else None."""
    found = _single_tokens(model, (START, END))
    return None if found is None else (found[0], found[1])


def block_of(
    model: _core.Model, prompt_ids: list[int], budget: int | None, call: bool = False
) -> Block | Channels | None:
    """The reasoning block of a reply to the chat prompt ``prompt_ids`` (or its channels):
    None where the model does not reason or the prompt closed the block already. ``call``: the
    reply must be a tool call (on channels, its answer is then a commentary message)."""
    harmony = _single_tokens(model, _HARMONY)
    if harmony is not None:
        start, channel, message, end = harmony
        if call:
            answer: tuple[int, ...] = (channel, *model.tokenize("commentary", False, False))
        else:
            answer = (channel, *model.tokenize("final", False, False), message)
        close = (end, start, *model.tokenize("assistant", False, False), *answer)
        last = max((i for i, t in enumerate(prompt_ids) if t in (start, end)), default=-1)
        header = prompt_ids[last + 1 :] if last >= 0 and prompt_ids[last] == start else []
        body = message in header  # the prompt began the message's body
        if body:
            header = header[: header.index(message)]
        channels = Channels(
            start, channel, message, end, tuple(header), body, answer, close, budget
        )
        kind, _ = _header_kind(channels, header, model.detokenize)
        return replace(channels, answering=body and kind != "reasoning")
    found = marks(model)
    if found is None:
        return None
    opening, closing = found
    tail = prompt_ids[-_TAIL:]
    mark = max((i for i, t in enumerate(tail) if t in found), default=None)
    if mark is not None and tail[mark] == closing:
        return None  # the template wrote an empty block: no reasoning this turn
    return Block(opening, closing, opened=mark is not None, budget=budget)


class ReasoningSplit:
    """Splits a reply's tokens into its reasoning and its answer, as they come."""

    def __init__(self, block: Block) -> None:
        self._block = block
        self._state = "inside" if block.opened else "before"

    @property
    def reasoning(self) -> bool:
        """Whether the reply is inside its block (or may still open one)."""
        return self._state != "after"

    def push(self, token: int) -> tuple[bool, bool]:
        """Take the reply's next token: ``(is_reasoning, is_mark)``, whether it belongs to the
        reasoning and whether it is a mark (which is neither reasoning nor answer)."""
        if self._state == "before":
            if token == self._block.start:
                self._state = "inside"
                return True, True
            self._state = "after"
            return False, False
        if self._state == "inside":
            if token == self._block.end:
                self._state = "after"
                return True, True
            return True, False
        return False, False


class ChannelSplit:
    """Splits a reply in harmony's channels into its reasoning (the ``analysis`` channel), its
    answer (the other channels) and its addressed messages (calls), as its tokens come;
    ``detokenize`` reads a header's channel and recipient."""

    def __init__(self, channels: Channels, detokenize: Callable[[list[int]], str]) -> None:
        self._marks = channels
        self._detokenize = detokenize
        self._header: list[int] = list(channels.header)
        self._addressed: list[tuple[str, list[int]]] = []
        self._in_body, self._kind = False, "answer"
        if channels.body:
            self._open_body()

    @property
    def reasoning(self) -> bool:
        """Whether the reply is in a message of the analysis channel."""
        return self._in_body and self._kind == "reasoning"

    @property
    def addressed(self) -> list[tuple[str, str]]:
        """The reply's messages addressed to a recipient (``to=functions.NAME`` in their
        header), as ``(recipient, body)``, in order."""
        return [(to, self._detokenize(body)) for to, body in self._addressed]

    def _open_body(self) -> None:
        """Enters the body of the message whose header is :attr:`_header`; a call's body
        starts an entry of :attr:`_addressed`."""
        self._kind, recipient = _header_kind(self._marks, self._header, self._detokenize)
        self._in_body = True
        if recipient is not None:
            self._addressed.append((recipient, []))

    def push(self, token: int) -> tuple[bool, bool]:
        """Take the reply's next token: ``(is_reasoning, is_mark)``, as
        :meth:`ReasoningSplit.push` tells them; header tokens, and a call's, count as marks."""
        m = self._marks
        if self._in_body:
            if token == m.end:
                self._in_body, self._header = False, []
                return self._kind == "reasoning", True
            if self._kind == "call":
                self._addressed[-1][1].append(token)
                return False, True
            return self._kind == "reasoning", False
        if token == m.message:
            self._open_body()
            return self._kind == "reasoning", True
        if token == m.start:
            self._header = []
        elif len(self._header) >= _MAX_HEADER:
            # Not a header: a reply that left the format goes on as answer.
            self._in_body, self._kind = True, "answer"
            return False, False
        else:
            self._header.append(token)
        return False, True


_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
"""A message header's recipient: ``to=functions.get_weather``."""


def _header_kind(
    marks: Channels, header: Sequence[int], detokenize: Callable[[list[int]], str]
) -> tuple[str, str | None]:
    """What the message whose header is ``header`` is, and its recipient: ``"call"`` (it
    names one), ``"reasoning"`` (on the analysis channel) or ``"answer"``."""
    # Read apart, the parts of the header before and after <|channel|>: the recipient may be
    # in either (``assistant to=functions.f<|channel|>commentary json``, or
    # ``<|channel|>commentary to=functions.f <|constrain|>json``).
    at = header.index(marks.channel) if marks.channel in header else len(header)
    role = detokenize(list(header[:at]))
    channel = detokenize(list(header[at + 1 :]))
    recipient = _RECIPIENT.search(role) or _RECIPIENT.search(channel)
    if recipient is not None:
        return "call", recipient.group(1)
    if at < len(header) and channel.strip().split(" ")[0] == "analysis":
        return "reasoning", None
    return "answer", None


def splitter(
    block: Block | Channels, detokenize: Callable[[list[int]], str]
) -> ReasoningSplit | ChannelSplit:
    """The splitter of a reply with ``block``."""
    if isinstance(block, Channels):
        return ChannelSplit(block, detokenize)
    return ReasoningSplit(block)
