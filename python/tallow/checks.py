"""Checks of the arguments of the public API: each bad value raises
:class:`~tallow.errors.InvalidArgumentError` naming the argument, never another exception.

Every check takes the argument's name (for the message) and its value, and returns the value
in the form the engine uses.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence

from tallow.errors import InvalidArgumentError

__all__ = [
    "MAX_JSON_DEPTH",
    "argument_of",
    "boolean",
    "describe",
    "integer",
    "invalid",
    "number",
    "strings",
    "text",
    "nests_deeper",
    "token_ids",
]

MAX_JSON_DEPTH = 64
"""Most levels of nesting of the JSON tallow reads from a client: a request body, a tool's
parameters, a call's arguments (real ones need a few)."""


def invalid(argument: str, message: str) -> InvalidArgumentError:
    """An :class:`~tallow.errors.InvalidArgumentError` about ``argument`` (which
    :func:`argument_of` tells, so that the server names the field without reading the
    message)."""
    error = InvalidArgumentError(message)
    error.argument = argument  # type: ignore[attr-defined]
    return error


def argument_of(error: InvalidArgumentError, fields: Sequence[str], default: str) -> str:
    """The argument ``error`` is about, where it is one of ``fields``; else ``default``."""
    argument = getattr(error, "argument", None)
    return argument if isinstance(argument, str) and argument in fields else default


def nests_deeper(value: object, levels: int = MAX_JSON_DEPTH) -> bool:
    """Whether the dicts (mappings) and lists (tuples) of ``value`` nest more than ``levels``
    deep, walked without recursion."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (Mapping, list, tuple)):
            if depth > levels:
                return True
            children = item.values() if isinstance(item, Mapping) else item
            pending.extend((child, depth + 1) for child in children)
    return False


def integer(name: str, value: object, low: int, high: int | None = None) -> int:
    """An ``int`` (not a ``bool``) in ``[low, high]`` (no upper bound when ``high`` is None)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"{name} must be an integer, got {describe(value)}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise invalid(name, f"{name} must be {bounds}, got {describe(value)}")
    return value


def number(
    name: str,
    value: object,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
) -> float:
    """A finite ``int`` or ``float`` (not a ``bool``) in ``[low, high]`` (``(low, high]`` with
    ``low_open``), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(name, f"{name} must be a number, got {describe(value)}")
    try:
        as_float = float(value)
    except OverflowError:  # an int beyond the float range
        as_float = math.inf if value > 0 else -math.inf
    too_low = as_float <= low if low_open else as_float < low
    if not math.isfinite(as_float) or too_low or as_float > high:
        bracket = "(" if low_open else "["
        raise invalid(
            name,
            f"{name} must be a finite number in {bracket}{low}, {high}], got {describe(value)}",
        )
    return as_float


def boolean(name: str, value: object) -> bool:
    """A ``bool``."""
    if not isinstance(value, bool):
        raise invalid(name, f"{name} must be True or False, got {describe(value)}")
    return value


def text(name: str, value: object) -> str:
    """A ``str`` that is valid Unicode (no lone surrogates, which have no UTF-8 form)."""
    if not isinstance(value, str):
        raise invalid(name, f"{name} must be a string, got {describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise invalid(
            name, f"{name} is not valid Unicode: a lone surrogate at index {e.start}"
        ) from None
    return value


def strings(name: str, value: object) -> tuple[str, ...]:
    """One non-empty string or a sequence of them (``None``: none)."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Sequence):
        raise invalid(name, f"{name} must be a string or a list of strings, got {describe(value)}")
    out = tuple(text(name, s) for s in items)
    if not all(out):
        raise invalid(name, f"{name} must not hold empty strings")
    return out


def token_ids(name: str, value: object, n_vocab: int) -> list[int]:
    """A sequence of token ids of a vocabulary of ``n_vocab`` tokens, as a list."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise invalid(name, f"{name} must be a list of token ids, got {describe(value)}")
    ids = list(value)
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise invalid(name, f"{name}: {describe(t)} is not a token id")
        if not 0 <= t < n_vocab:
            raise invalid(
                name, f"{name}: token id {describe(t)} is out of range (0..{n_vocab - 1})"
            )
    return ids


_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60


def describe(value: object) -> str:
    """A short repr for messages: values may be huge (an int of 5000 digits, a long list)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    try:
        return _REPR.repr(value)
    except Exception:  # a hostile __repr__ must not replace the real error
        return f"a {type(value).__name__}"
