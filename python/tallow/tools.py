"""Tool calls: functions an application offers the model, described to it by its chat template,
and the calls it writes parsed back out of its reply.

``tools`` follow OpenAI's format, ``[{"type": "function", "function": {"name", "description",
"parameters"}}]`` (``parameters`` a JSON schema), and reach the chat template as the ``tools``
variable, as Hugging Face's templates expect. ``tool_choice`` is ``"auto"`` (the model decides;
its calls are parsed out of the reply), ``"none"`` (the reply is text), ``"required"`` (the reply
is one or more calls) or ``{"type": "function", "function": {"name": ...}}`` (one call of that
function). A required or named call is constrained while it is generated (see
:mod:`tallow.structured`): the reply is the model's own call syntax, and each call's arguments
validate against its function's ``parameters``.

The syntax is the one the model's chat template teaches, told from the template's text:

- ``hermes`` (Qwen 2/2.5/3, Hermes, SmolLM3 and most others): ``<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>`` blocks, text allowed around them;
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
- ``llama3``: the whole reply a JSON object ``{"name": ..., "parameters": {...}}``, after an
  optional ``<|python_tag|>``;
- ``harmony`` (gpt-oss): a message addressed to the function, ``<|channel|>commentary
  to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``, its body the arguments. The
  reply is split into messages by :mod:`tallow.reasoning`, which hands the addressed ones to
  :func:`addressed_calls`.

``parallel`` false (OpenAI's ``parallel_tool_calls``) keeps a reply to one call: a required call
is constrained to one, and of the calls parsed out of a free reply the first is kept.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from tallow import checks
from tallow.errors import InvalidArgumentError
from tallow.structured import Structured, closed

__all__ = ["ToolCall", "ToolUse", "addressed_calls", "message_tool_fields", "tool_use"]

Syntax = Literal["hermes", "mistral", "llama3", "harmony"]

MAX_CALLS = 4
"""Most calls of a reply whose calls are required (the llama3 syntax has room for one): a
small model may otherwise repeat calls until it runs out of tokens."""

_JSON_LAYOUT = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "coerce_one_of": True,
}
"""How constrained calls lay out their JSON (as :mod:`tallow.structured` does)."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The call as OpenAI's ``tool_calls`` entries are."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class _NotJson(ValueError):
    """Text that is not JSON, or JSON beyond :data:`~tallow.checks.MAX_JSON_DEPTH` levels."""


_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """The JSON value that starts at ``pos`` (after whitespace) and the index where it ends;
    :class:`_NotJson` when there is none within the limits (an integer of more digits than
    Python reads, nesting deeper than the parser's recursion or than
    :data:`~tallow.checks.MAX_JSON_DEPTH`)."""
    start = _WHITESPACE.match(text, pos)
    assert start is not None  # the pattern matches the empty string
    try:
        value, end = _DECODER.raw_decode(text, start.end())
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise _NotJson(str(e)) from None
    _check_depth(value)
    return value, end


def _loads(text: str) -> Any:
    """The JSON value ``text`` holds, whitespace around it allowed (see :func:`_decode`)."""
    value, end = _decode(text)
    if text[end:].strip(" \t\n\r"):
        raise _NotJson(f"extra data after the JSON value (character {end})")
    return value


def _check_depth(value: object) -> None:
    """:class:`_NotJson` when lists and dicts in ``value`` nest more than
    :data:`~tallow.checks.MAX_JSON_DEPTH` levels."""
    if checks.nests_deeper(value):
        raise _NotJson(f"nested more than {checks.MAX_JSON_DEPTH} levels deep")


def _call_id(syntax: Syntax) -> str:
    """A fresh call id, in the form the syntax's templates accept (Mistral's refuse any but
    nine letters and digits)."""
    if syntax == "mistral":
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def syntax_of(template: str) -> Syntax:
    """The tool-call syntax a chat template teaches (``hermes`` where it says nothing)."""
    if "<|call|>" in template:
        return "harmony"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" not in template and (
        "<|python_tag|>" in template or '"parameters": ' in template
    ):
        return "llama3"
    return "hermes"


_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def check_tools(tools: object) -> list[dict[str, Any]]:
    """The tools as plain dicts, or :class:`InvalidArgumentError` naming what is wrong."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise checks.invalid("tools", "tools must be a list of {'type': 'function', ...} objects")
    out = []
    names = set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not function:
            raise checks.invalid(
                "tools", f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}"
            )
        if not isinstance(function, Mapping):
            raise checks.invalid("tools", f"tools[{i}].function must be an object")
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", name):
            raise checks.invalid(
                "tools",
                f"tools[{i}].function.name must be 1 to 64 letters, digits, '_', '.', ':' or '-'",
            )
        if name in names:
            raise checks.invalid("tools", f"tools[{i}]: the function {name!r} is given twice")
        names.add(name)
        # Without parameters, a function takes none (as OpenAI reads it).
        parameters = function.get("parameters", _NO_PARAMETERS)
        if not isinstance(parameters, Mapping):
            raise checks.invalid("tools", f"tools[{i}].function.parameters must be a JSON schema")
        # The arguments are an object (a call writes them as one), whatever the schema leaves
        # open; a schema of anything else could never be met.
        if parameters.get("type", "object") != "object":
            raise checks.invalid(
                "tools",
                f"tools[{i}].function.parameters must be the schema of an object (type "
                f"'object'), not of type {parameters['type']!r}",
            )
        parameters = {"type": "object", **parameters}
        try:
            json.dumps(parameters, allow_nan=False)
            _check_depth(parameters)
        except (TypeError, ValueError, RecursionError) as e:
            raise checks.invalid(
                "tools", f"tools[{i}].function.parameters is not JSON: {e}"
            ) from None
        strict = function.get("strict", False)
        if not isinstance(strict, bool):
            raise checks.invalid("tools", f"tools[{i}].function.strict must be a boolean")
        if strict:
            # OpenAI's strict mode: objects that do not say otherwise take no other keys.
            parameters = closed(parameters)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise checks.invalid("tools", f"tools[{i}].function.description must be a string")
        checked: dict[str, Any] = {"name": name, "parameters": dict(parameters)}
        if description is not None:
            checked["description"] = description
        out.append({"type": "function", "function": checked})
    return out


def _check_choice(choice: object, names: list[str]) -> str | None:
    """``tool_choice`` as ``"auto"``, ``"none"``, ``"required"`` or ``None`` for a named
    function (whose name is returned second by :func:`tool_use`)."""
    if choice in ("auto", "none", "required"):
        return str(choice)
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(choice, Mapping) or choice.get("type") != "function" or name is None:
        raise checks.invalid(
            "tool_choice",
            "tool_choice must be 'auto', 'none', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
        )
    if name not in names:
        raise checks.invalid(
            "tool_choice", f"tool_choice names {name!r}, which is not one of the tools"
        )
    return None


@dataclass(frozen=True)
class ToolUse:
    """The tools of one chat request, how the model is to use them, and the syntax its calls
    take."""

    tools: list[dict[str, Any]]
    choice: Literal["auto", "none", "required", "named"]
    syntax: Syntax
    named: str | None = None
    """The function a named ``tool_choice`` calls."""
    parallel: bool = True
    """Whether a reply may make several calls (else the first is kept)."""

    @property
    def parses(self) -> bool:
        """Whether calls are parsed out of the reply (every choice but ``"none"``)."""
        return self.choice != "none"

    @property
    def constrained(self) -> bool:
        """Whether the reply is a call (required or named), constrained as it is generated."""
        return self.choice in ("required", "named")

    @property
    def markers(self) -> tuple[str, ...]:
        """The texts of the syntax that mark a call (a model's vocabulary may hold each as one
        token, often a control token)."""
        return _MARKERS[self.syntax]

    @property
    def most(self) -> int:
        """The most calls a constrained reply makes: one where a function is named, calls are
        not parallel or the syntax ends the turn at a call; else :data:`MAX_CALLS`."""
        single = self.choice == "named" or not self.parallel
        return 1 if single or self.syntax in ("llama3", "harmony") else MAX_CALLS

    def constraint(self, marker_ids: Mapping[str, int] | None = None) -> Structured | None:
        """The grammar of the reply where calls are required (one to :attr:`most`) or named
        (one): the model's syntax around JSON that validates against each allowed function
        (``None`` otherwise). ``marker_ids`` maps each of :attr:`markers` that is one token of
        the model's vocabulary to its id: the grammar asks for that token, as the model was
        trained to write it (a control token cannot be spelled as text at all). A harmony
        reply's grammar is that of what follows ``<|channel|>commentary`` (the reasoning
        before it is free, see :mod:`tallow.reasoning`)."""
        if not self.constrained:
            return None
        ids = marker_ids or {}

        def marker(text: str) -> str:
            return f"<[{ids[text]}]>" if text in ids else json.dumps(text)

        allowed = [
            t["function"]
            for t in self.tools
            if self.named is None or t["function"]["name"] == self.named
        ]
        if self.syntax == "harmony":
            return _harmony_constraint(allowed, marker, "<|constrain|>" in ids)
        key = "parameters" if self.syntax == "llama3" else "arguments"
        # One JSON rule per function: each its own schema root, where the references of its
        # parameters ("#/$defs/...") resolve.
        rules = [
            f"call_{i}: %json {json.dumps(_call_schema(f, key))}" for i, f in enumerate(allowed)
        ]
        call = "call: " + " | ".join(f"call_{i}" for i in range(len(allowed)))
        if self.syntax == "mistral":
            more = ' (", " call)?' * (self.most - 1)
            start = f'start: {marker("[TOOL_CALLS]")} "[" call{more} "]"'
        elif self.syntax == "llama3":
            start = "start: call"
        else:
            more = ' ("\\n" block)?' * (self.most - 1)
            block = f'{marker("<tool_call>")} "\\n" call "\\n" {marker("</tool_call>")}'
            start = f"start: block{more}\nblock: {block}"
        return Structured("grammar", "\n".join([start, call, *rules]))

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The reply's text outside its calls, and the calls (with fresh ids); a reply with no
        well-formed call, or one that calls a function not among the tools, is all text. A
        reply that ends inside a call's JSON (cut short by ``max_tokens``, the context or a
        stop string) keeps the calls before it; the cut one is dropped, markup and all. (A
        harmony reply's calls are its addressed messages: see :func:`addressed_calls`.)"""
        if not self.parses or self.syntax == "harmony":
            return text, []
        if self.syntax == "hermes":
            content, calls = _parse_hermes(text)
        elif self.syntax == "mistral":
            content, calls = _parse_mistral(text)
        else:
            content, calls = _parse_llama3(text)
        if any(c.name not in self._names for c in calls):
            # A call of a function the request did not offer: not a call the application can
            # make, so the reply stays text.
            return text, []
        return content, self._kept(calls)

    @property
    def _names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def _kept(self, calls: list[ToolCall]) -> list[ToolCall]:
        """The calls a reply keeps (the first alone unless :attr:`parallel`), with fresh ids."""
        kept = calls if self.parallel else calls[:1]
        return [replace(c, id=_call_id(self.syntax)) for c in kept]


def addressed_calls(
    use: ToolUse | None, messages: Sequence[tuple[str, str]]
) -> tuple[str, list[ToolCall]]:
    """The calls among a harmony reply's addressed messages (``(recipient, body)``, such as
    ``("functions.get_weather", '{"city": "Paris"}')``): those to a function of ``use``'s
    tools whose body is a JSON object. The others (no tools, ``tool_choice="none"``, a
    recipient not among the tools, such as a built-in ``browser.search``, or a body that is
    no object) are text: their bodies, returned first."""
    text: list[str] = []
    calls: list[ToolCall] = []
    for recipient, body in messages:
        name = recipient.removeprefix("functions.")
        call = None
        if use is not None and use.parses and name in use._names:
            call = _call({"name": name, "arguments": body})
        if call is None:
            text.append(body)
        else:
            calls.append(call)
    return "".join(text), [] if use is None else use._kept(calls)


def _harmony_constraint(
    allowed: list[Mapping[str, Any]], marker: Callable[[str], str], constrains: bool
) -> Structured:
    """The grammar of a harmony call of one of ``allowed``, from after
    ``<|channel|>commentary``: its recipient, ``<|constrain|>json`` where the vocabulary has
    that token (``constrains``; else ``json`` alone, as gpt-oss's template writes past calls),
    ``<|message|>``, the arguments and ``<|call|>``; ``marker`` spells a marker."""
    constrain = f" {marker('<|constrain|>')}" if constrains else ""
    message, end = marker("<|message|>"), marker("<|call|>")
    rules = ["start: " + " | ".join(f"call_{i}" for i in range(len(allowed)))]
    for i, function in enumerate(allowed):
        header = json.dumps(f" to=functions.{function['name']} ")
        rules.append(f'call_{i}: {header}{constrain} "json" {message} args_{i} {end}')
        schema = {**function["parameters"], "x-guidance": _JSON_LAYOUT}
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
    return Structured("grammar", "\n".join(rules))


def tool_use(
    tools: object, tool_choice: object, template: str, parallel: bool = True
) -> ToolUse | None:
    """The checked tools of a request whose model has chat template ``template`` (``None``
    when it gives none); ``tool_choice`` ``None`` means ``"auto"``; ``parallel`` false keeps a
    reply to one call. Raises
    :class:`InvalidArgumentError` for malformed tools or a choice that names none of them."""
    if tools is None:
        if tool_choice not in (None, "none", "auto"):
            raise checks.invalid("tool_choice", "tool_choice needs tools")
        return None
    checked = check_tools(tools)
    if not checked:
        if tool_choice not in (None, "none", "auto"):
            raise checks.invalid("tool_choice", "tool_choice needs tools")
        return None
    names = [t["function"]["name"] for t in checked]
    choice = _check_choice("auto" if tool_choice is None else tool_choice, names)
    named = None
    if choice is None:
        assert isinstance(tool_choice, Mapping)
        named = str(tool_choice["function"]["name"])
    return ToolUse(
        checked,
        "named" if choice is None else choice,  # type: ignore[arg-type]
        syntax_of(template),
        named,
        parallel,
    )


def _call_schema(function: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The JSON schema of a call of ``function``: its name, and its parameters under ``key``
    (with their definitions lifted to the root, where their references point)."""
    parameters = dict(function["parameters"])
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, key: parameters},
        "required": ["name", key],
        "additionalProperties": False,
        "x-guidance": _JSON_LAYOUT,
    }
    for defs in ("$defs", "definitions"):
        if defs in parameters:
            schema[defs] = parameters.pop(defs)
    return schema


def _call(value: object, key: str = "arguments") -> ToolCall | None:
    """A call from its JSON object form, ``{"name": ..., key: {...}}``."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(key, value.get("arguments", value.get("parameters", {})))
    if isinstance(arguments, str):
        # Some models write the arguments as JSON text.
        try:
            arguments = _loads(arguments)
        except _NotJson:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _call_text(text: str, key: str = "arguments") -> ToolCall | None:
    """A call from its JSON text (see :func:`_call`)."""
    try:
        return _call(_loads(text), key)
    except _NotJson:
        return None


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(</tool_call>|$)", re.DOTALL)


def _parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    blocks = list(_HERMES.finditer(text))
    if not blocks:
        return text, []
    calls = []
    for block in blocks:
        body, closed = block.group(1), block.group(2)
        call = _call_text(body)
        if call is not None:
            calls.append(call)
        elif closed or body[:1] not in ("", "{"):
            return text, []  # a closed block, or one of words, that is no call: the reply is text
        # Else the reply ends inside this call's JSON: a call cut short, dropped.
    return _HERMES.sub("", text).rstrip(), calls


def _parse_mistral(text: str) -> tuple[str, list[ToolCall]]:
    head, marker, tail = text.partition("[TOOL_CALLS]")
    if not marker:
        return text, []
    try:
        value, _ = _decode(tail)
        values: list[Any] | None = value if isinstance(value, list) else [value]
    except _NotJson:
        values = _complete_items(tail)
    if values is None:
        return text, []
    calls = [_call(v) for v in values]
    if any(c is None for c in calls):
        return text, []
    return head.rstrip(), [c for c in calls if c is not None]


_COMMA = re.compile(r"[ \t\n\r]*,")


def _complete_items(text: str) -> list[Any] | None:
    """The items of JSON calls cut short: of a list (``[{...}, {...``), those before the first
    that is not complete (dropped with the rest); of one object, none. ``None`` when ``text``
    opens neither."""
    start = _WHITESPACE.match(text)
    assert start is not None
    pos = start.end()
    if text.startswith("{", pos):
        return []
    if not text.startswith("[", pos):
        return None
    items = []
    pos += 1
    try:
        while True:
            item, pos = _decode(text, pos)
            items.append(item)
            comma = _COMMA.match(text, pos)
            if comma is None:
                return items
            pos = comma.end()
    except _NotJson:
        return items


def _parse_llama3(text: str) -> tuple[str, list[ToolCall]]:
    body = text.strip().removeprefix("<|python_tag|>")
    call = _call_text(body, "parameters")
    return ("", [call]) if call is not None else (text, [])


def message_tool_fields(message: Mapping[str, Any]) -> dict[str, Any]:
    """The tool fields of a chat message, as Hugging Face's templates read them: an
    assistant's ``tool_calls`` with their arguments as objects (OpenAI sends JSON text), a tool
    reply's ``tool_call_id`` and ``name``."""
    out: dict[str, Any] = {}
    calls = message.get("tool_calls")
    if calls:
        if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
            raise InvalidArgumentError("an assistant's tool_calls must be a list")
        out["tool_calls"] = [_template_call(c) for c in calls]
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    return out


def _template_call(call: object) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InvalidArgumentError(
            "an assistant's tool_calls must be {'type': 'function', 'function': "
            "{'name': ..., 'arguments': ...}} objects"
        )
    arguments = function.get("arguments", {})
    try:
        # OpenAI sends the arguments as JSON text; the Python API may give them as objects.
        if isinstance(arguments, str):
            arguments = _loads(arguments)
        else:
            _check_depth(arguments)
    except _NotJson as e:
        raise InvalidArgumentError(
            f"the arguments of a call of {function['name']!r} are not JSON: {e}"
        ) from None
    out = {
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }
    if isinstance(call, Mapping) and isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


_MARKERS: dict[Syntax, tuple[str, ...]] = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "mistral": ("[TOOL_CALLS]",),
    "llama3": (),
    "harmony": ("<|constrain|>", "<|message|>", "<|call|>"),
}

_OPENERS: dict[Syntax, str] = {
    "hermes": "<tool_call>",
    "mistral": "[TOOL_CALLS]",
    "llama3": "<|python_tag|>",
}


class ToolStream:
    """The text of a streamed reply that may hold calls: :meth:`feed` gives back what may be
    shown as it comes (text before a call; what could be the start of one is held back),
    :meth:`finish` the rest of the text and the calls once the reply is complete."""

    def __init__(self, use: ToolUse) -> None:
        self.use = use
        self._text: list[str] = []
        self._shown = 0
        self._held = False
        """A call has started: nothing more is shown until the end."""
        self._plain = not use.parses or use.syntax == "harmony"
        """The reply is text alone (no calls parsed, a llama3 reply that is no call, or a
        harmony reply, whose calls are not in its text)."""

    def feed(self, piece: str) -> str:
        """Take the next piece of the reply; return the text that can be shown now."""
        self._text.append(piece)
        text = self._whole()
        if self._plain:
            return self._show(len(text))
        if self._held:
            return ""
        opener = _OPENERS[self.use.syntax]
        if self.use.syntax == "llama3":
            # A call is the whole reply: hold the reply while it may still be one.
            body = text.lstrip()
            if body.startswith(("{", opener)):
                self._held = True
            elif not opener.startswith(body):
                self._plain = True
                return self._show(len(text))
            return ""
        start = text.find(opener, self._shown)
        if start >= 0:
            self._held = True
            return self._show(len(text[:start].rstrip()))
        # Hold back a tail that could be the beginning of the opener.
        keep = next(
            (
                n
                for n in range(min(len(opener) - 1, len(text)), 0, -1)
                if opener.startswith(text[-n:])
            ),
            0,
        )
        # And whitespace, which the text before a call does not keep.
        return self._show(len(text[: len(text) - keep].rstrip()))

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The text not shown yet and the calls, once the reply is complete."""
        text = self._whole()
        content, calls = (text, []) if self._plain else self.use.parse(text)
        shown = text[: self._shown]
        rest = content[len(shown) :] if content.startswith(shown) else ""
        return rest, calls

    def _whole(self) -> str:
        if len(self._text) > 1:
            self._text = ["".join(self._text)]
        return self._text[0] if self._text else ""

    def _show(self, end: int) -> str:
        text = self._whole()
        end = max(end, self._shown)
        piece = text[self._shown : end]
        self._shown = max(self._shown, end)
        return piece
