"""Stop conditions: those of text for the output processor (:mod:`tallow.output`), those of
token ids for the continuous batcher (:mod:`tallow.scheduler`).

- :class:`StopMatcher` finds stop strings in streamed text, across token boundaries, and holds
  back text that may be the start of one.
- :class:`TokenDecoder` is what turns token ids into text one at a time
  (``tallow._core.StreamDecoder`` is one); :class:`DetokenizeDecoder` builds one from a plain
  ``detokenize(ids) -> str`` function, which keeps tests model-free.
- :class:`StopParams` is the part of a request's sampling parameters the scheduler reads;
  :class:`StopConditions` is a plain implementation of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DetokenizeDecoder",
    "StopConditions",
    "StopMatcher",
    "StopParams",
    "TokenDecoder",
]


class StopMatcher:
    """Finds stop strings in streamed text, holding back text that may be the start of one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.pending = ""
        self.stopped = False
        self.matched: str | None = None
        """The stop string that matched (the earliest in the text; the first listed on a tie)."""

    def _held(self) -> int:
        """Length of the longest suffix of ``pending`` that is a proper prefix of a stop."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(s[:n]):
                    best = n
                    break
        return best

    def _earliest_match(self) -> int:
        """Start of the earliest complete stop string in ``pending`` (-1: none); sets
        ``matched``."""
        first = -1
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0 and (first < 0 or i < first):
                first = i
                self.matched = s
        return first

    def _stop_at(self, first: int) -> str:
        out, self.pending = self.pending[:first], ""
        self.stopped = True
        return out

    def push(self, text: str) -> str:
        """Add decoded text; return what can be emitted now. Sets ``stopped`` on a match."""
        if self.stopped:
            return ""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        first = self._earliest_match()
        # Text from `held` on may still become a stop string that starts before `first`.
        held = len(self.pending) - self._held()
        if first >= 0 and first <= held:
            return self._stop_at(first)
        out, self.pending = self.pending[:held], self.pending[held:]
        return out

    def flush(self) -> str:
        """End of text: a complete stop string still held back ends the text; the rest of what
        was held back is not a stop string after all."""
        if self.stopped:
            return ""
        first = self._earliest_match() if self.stops else -1
        if first >= 0:
            return self._stop_at(first)
        out, self.pending = self.pending, ""
        return out


class TokenDecoder(Protocol):
    """Turns token ids into text one token at a time (``tallow._core.StreamDecoder``)."""

    def push(self, token_id: int) -> str:
        """Add a token; return the text that is complete now (possibly empty)."""
        ...

    def finish(self) -> str:
        """End of the tokens: return whatever text was held back."""
        ...


class DetokenizeDecoder:
    """A :class:`TokenDecoder` over a whole-sequence ``detokenize(ids) -> str`` function.

    Each push detokenizes every token so far and returns the new suffix; text ending in
    U+FFFD (an incomplete UTF-8 character) is held back until a later token completes it or
    :meth:`finish` is called. Quadratic in the number of tokens: meant for tests and small
    tools; the engine uses the model's streaming decoder.
    """

    def __init__(self, detokenize: Callable[[list[int]], str]) -> None:
        self._detokenize = detokenize
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, token_id: int) -> str:
        """Add a token; return the new complete text."""
        self._ids.append(token_id)
        text = self._detokenize(self._ids)
        if text.endswith("\ufffd"):
            return ""
        out = text[self._emitted :]
        self._emitted = len(text)
        return out

    def finish(self) -> str:
        """Return the held-back text, incomplete characters included (as U+FFFD)."""
        text = self._detokenize(self._ids)
        out = text[self._emitted :]
        self._emitted = len(text)
        return out


class StopParams(Protocol):
    """The sampling parameters the scheduler reads; everything else is opaque to it."""

    @property
    def max_tokens(self) -> int | None:
        """Most tokens to generate (``None``: until another condition stops it)."""
        ...

    @property
    def stop_token_ids(self) -> Sequence[int]:
        """Token ids that end the generation (not included in the output)."""
        ...

    @property
    def ignore_eos(self) -> bool:
        """Keep generating past end-of-generation tokens (benchmarks)."""
        ...


@dataclass(frozen=True)
class StopConditions:
    """A plain :class:`StopParams`."""

    max_tokens: int | None = 16
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
