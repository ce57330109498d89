"""Structured output: constraints on what a request generates.

A request may ask for at most one of:

- ``json_schema``: JSON that validates against a schema (a dict, its JSON text, or a class with
  ``model_json_schema()`` such as a pydantic model);
- ``json_object=True``: any JSON object;
- ``regex``: text that the regular expression matches whole;
- ``choice``: exactly one of a list of strings;
- ``grammar``: text in the language of a Lark grammar (llguidance's dialect).

The constraint is compiled by llguidance against the model's own tokenizer when the request
reaches an engine; while the request generates, only tokens that keep its output in the
language may be chosen (greedy, sampled and speculative decoding alike), and its
end-of-generation token only where the output is complete. JSON is generated with one space
after each ``,`` and ``:`` and no other whitespace between its tokens, unless the schema sets
llguidance's ``x-guidance`` options itself. Compiling (and each token) is bounded: a
constraint too large or too ambiguous raises :class:`~tallow.GrammarError` instead of slowing
its request down without end.

A schema is read as JSON Schema reads it: an object schema that does not say
``additionalProperties`` lets the output add keys of its own. Where a request asks for strict
schemas (OpenAI's ``"strict": true`` on a ``json_schema`` response format or on a tool), such
objects are closed instead (:func:`closed`), as OpenAI and vLLM read them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from tallow import _core, checks
from tallow.errors import GrammarError, InvalidArgumentError

__all__ = ["STRUCTURED_OPTIONS", "Structured", "structured_output"]

STRUCTURED_OPTIONS = ("json_schema", "json_object", "regex", "choice", "grammar")
"""The generation options that constrain the output (at most one per request)."""

Kind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class Structured:
    """A checked constraint: its kind and its source (the schema's JSON text, the regular
    expression, the strings of a choice, the grammar; ``None`` for any JSON object)."""

    kind: Kind
    spec: str | tuple[str, ...] | None = None

    def compile(self, model: _core.Model) -> _core.Constraint:
        """The constraint compiled against ``model``'s vocabulary, for one request's sampler.
        Raises :class:`~tallow.GrammarError` where it cannot be compiled."""
        return model.constraint(self.kind, self._spec())

    def check(self, model: _core.Model) -> None:
        """Raises what :meth:`compile` would raise, without making a constraint (it is compiled
        and kept for the requests, as :meth:`compile` keeps it)."""
        model.check_constraint(self.kind, self._spec())

    def _spec(self) -> str | list[str] | None:
        return list(self.spec) if isinstance(self.spec, tuple) else self.spec


def structured_output(
    json_schema: object = None,
    json_object: object = None,
    regex: object = None,
    choice: object = None,
    grammar: object = None,
) -> Structured | None:
    """The constraint the options ask for (``None``: none), after checking them; raises
    :class:`InvalidArgumentError` for more than one, or one of the wrong kind."""
    given = {
        name: value
        for name, value in zip(
            STRUCTURED_OPTIONS, (json_schema, json_object, regex, choice, grammar), strict=True
        )
        if value is not None and value is not False
    }
    if not given:
        return None
    if len(given) > 1:
        raise InvalidArgumentError(
            f"give at most one of {', '.join(STRUCTURED_OPTIONS)} (got {', '.join(given)})"
        )
    ((name, value),) = given.items()
    if name == "json_schema":
        return Structured("json_schema", _schema_text(value))
    if name == "json_object":
        checks.boolean("json_object", value)
        return Structured("json_object")
    if name == "choice":
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            raise InvalidArgumentError("choice must be a list of strings")
        choices = tuple(checks.text("a choice", c) for c in value)
        if not choices:
            raise InvalidArgumentError("choice needs at least one string")
        return Structured("choice", choices)
    kind: Kind = "regex" if name == "regex" else "grammar"
    return Structured(kind, checks.text(name, value))


# The keywords whose values are schemas: one, a map of them, or a list of them.
_ONE_SCHEMA = (
    "additionalProperties",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "additionalItems",
    "unevaluatedItems",
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def closed(schema: Mapping[str, object]) -> dict[str, object]:
    """``schema`` (a JSON schema) with each object schema that says neither
    ``additionalProperties`` nor ``unevaluatedProperties`` closed (``additionalProperties:
    false``), as OpenAI's strict mode reads a schema. The branches of an ``allOf`` are left
    open themselves (closing each would forbid the others' properties); what they hold is
    closed. Raises :class:`GrammarError` for a schema nested deeper than Python can walk."""
    try:
        return _closed(schema, close=True)
    except RecursionError:
        raise _too_deep() from None


def _closed(schema: Mapping[str, object], close: bool) -> dict[str, object]:
    out = dict(schema)
    kind = out.get("type")
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
    is_object |= kind is None and "properties" in out
    if close and is_object and not {"additionalProperties", "unevaluatedProperties"} & out.keys():
        out["additionalProperties"] = False
    for key in _ONE_SCHEMA:
        value = out.get(key)
        if isinstance(value, Mapping):
            out[key] = _closed(value, close=True)
    for key in _SCHEMA_MAPS:
        value = out.get(key)
        if isinstance(value, Mapping):
            out[key] = {name: _sub(sub, close=True) for name, sub in value.items()}
    for key in _SCHEMA_LISTS:
        value = out.get(key)
        if isinstance(value, list):
            out[key] = [_sub(sub, close=key != "allOf") for sub in value]
    return out


def _sub(schema: object, close: bool) -> object:
    """A subschema closed (a ``true``/``false`` schema, or anything else, as it is)."""
    return _closed(schema, close) if isinstance(schema, Mapping) else schema


def _schema_text(schema: object) -> str:
    """A JSON schema as JSON text: from a dict (or ``True``/``False``), from JSON text, or from
    a class that describes itself (``model_json_schema()``, as pydantic models do)."""
    describe = getattr(schema, "model_json_schema", None)
    if callable(describe):
        schema = describe()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise InvalidArgumentError(f"json_schema is not JSON: {e}") from None
        except RecursionError:
            raise _too_deep() from None
    if not isinstance(schema, (Mapping, bool)):
        raise InvalidArgumentError(
            "json_schema must be a JSON schema: a dict, its JSON text, or a class with "
            f"model_json_schema(), not {type(schema).__name__}"
        )
    try:
        return json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"json_schema is not JSON: {e}") from None
    except RecursionError:
        raise _too_deep() from None


def _too_deep() -> GrammarError:
    return GrammarError("cannot compile the JSON schema: it nests deeper than JSON can be read")
