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
"""

from __future__ import annotations

from dataclasses import dataclass

from tallow import _core

__all__ = ["START", "END", "Block", "ReasoningSplit", "block_of", "marks"]

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

    def sampler_args(self) -> tuple[int, int, int | None, bool]:
        """What :class:`tallow._core.Sampler` takes as ``reasoning``."""
        return self.start, self.end, self.budget, self.opened


def marks(model: _core.Model) -> tuple[int, int] | None:
    """The ids of ``<think>`` and ``</think>`` where ``model``'s vocabulary holds each as one
    token (a model that reasons), else None."""
    start = model.tokenize(START, False, True)
    end = model.tokenize(END, False, True)
    if len(start) != 1 or len(end) != 1 or start == end:
        return None
    return start[0], end[0]


def block_of(model: _core.Model, prompt_ids: list[int], budget: int | None) -> Block | None:
    """The reasoning block of a reply to the chat prompt ``prompt_ids``: None where the model
    does not reason or the prompt closed the block already."""
    found = marks(model)
    if found is None:
        return None
    start, end = found
    tail = prompt_ids[-_TAIL:]
    last = max((i for i, t in enumerate(tail) if t in (start, end)), default=None)
    if last is not None and tail[last] == end:
        return None  # the template wrote an empty block: no reasoning this turn
    return Block(start, end, opened=last is not None, budget=budget)


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
