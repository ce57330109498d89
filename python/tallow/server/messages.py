"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) on the
same chat path as OpenAI's chat completions.

A request is read into the chat terms tallow already speaks: ``system`` and the ``messages``'
content blocks become chat messages (``tool_use`` blocks an assistant's ``tool_calls``,
``tool_result`` blocks ``"tool"`` messages), ``tools`` become function tools, ``thinking``
becomes the reasoning budget (or ``enable_thinking=False``), ``stop_sequences`` stop strings.
The reply is one engine request; its outputs are turned into a message (``thinking``, ``text``
and ``tool_use`` content blocks) or into Anthropic's stream events. Errors use Anthropic's shape,
``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tallow.engine import SamplingParams
from tallow.errors import InvalidArgumentError
from tallow.output import RequestOutput
from tallow.server.protocol import APIError, Fields, flat_tools, invalid
from tallow.structured import Structured, closed, structured_output
from tallow.tools import ToolCall

__all__ = ["MessagesRequest", "Reply", "error_body", "parse_messages"]

MAX_STOP_SEQUENCES = 16

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_body(error: APIError) -> dict[str, Any]:
    """``error`` in Anthropic's shape."""
    kind = _ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


@dataclass
class MessagesRequest:
    """What a ``POST /v1/messages`` body asks for, in chat terms."""

    model: str
    messages: list[dict[str, Any]]
    """Chat messages (system first, where there is one)."""
    params: SamplingParams
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    """Function tools in OpenAI's shape."""
    tool_choice: object = None


def parse_messages(
    body: object, n_vocab: int, n_ctx: int, *, counting: bool = False
) -> MessagesRequest:
    """A ``POST /v1/messages`` body (with ``counting``, a ``count_tokens`` body: no
    ``max_tokens``), each problem a 400 naming its field."""
    f = Fields(body)
    model = f.string("model", required=True)
    assert model is not None
    max_tokens = None
    if not counting:
        if f.body.get("max_tokens") is None:
            raise invalid("max_tokens", "'max_tokens' is required", "missing_required_parameter")
        max_tokens = f.integer("max_tokens", None, 1, n_ctx)
    messages = _system(f.body.get("system"))
    raw = f.body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "'messages' must be a non-empty list", "invalid_type")
    for i, message in enumerate(raw):
        messages += _message(i, message)
    tools = flat_tools(f.body.get("tools"), types=(None, "custom"), schema="input_schema")
    choice, parallel = _tool_choice(f.body.get("tool_choice"))
    if choice == "none":
        tools, choice = None, None
    kwargs, budget = _thinking(f.body.get("thinking"))
    top_k = f.integer("top_k", None, 0, n_vocab)
    top_p = f.number("top_p", 1.0, 0.0, 1.0)
    temperature = f.number("temperature", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        # The smallest nucleus holds only the most likely token.
        temperature, top_p = 0.0, 1.0
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k or 0,
        stop=f.stop("stop_sequences", MAX_STOP_SEQUENCES),
        # An extension, as on the OpenAI routes.
        logit_bias=f.logit_bias(n_vocab),
        structured=_output_format(f.body.get("output_config")),
        chat_template_kwargs=kwargs,
        reasoning_budget=budget,
        parallel_tool_calls=parallel,
    )
    return MessagesRequest(
        model, messages, params, stream=f.boolean("stream", False), tools=tools, tool_choice=choice
    )


def _text_of(value: object, where: str) -> str:
    """The text of a string or a list of text blocks."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for block in value:
            if not isinstance(block, dict) or block.get("type") != "text":
                raise invalid(where, f"'{where}' may hold text blocks only", "invalid_type")
            text = block.get("text")
            if not isinstance(text, str):
                raise invalid(where, f"a text block of '{where}' needs a string 'text'")
            texts.append(text)
        return "".join(texts)
    raise invalid(where, f"'{where}' must be a string or a list of text blocks", "invalid_type")


def _system(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    return [{"role": "system", "content": _text_of(value, "system")}]


def _message(i: int, message: object) -> list[dict[str, Any]]:
    """The chat messages of ``messages[i]``: a ``tool_result`` block becomes a ``"tool"``
    message (before the user's text), ``tool_use`` blocks an assistant's ``tool_calls``;
    ``thinking`` blocks (earlier reasoning) are left out, as chat templates leave it."""
    where = "messages"
    if not isinstance(message, dict):
        raise invalid(where, f"messages[{i}] must be an object", "invalid_type")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise invalid(where, f"messages[{i}].role must be 'user' or 'assistant'")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(where, f"messages[{i}].content must be a string or a list of blocks")
    texts: list[str] = []
    results: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"messages[{i}].content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        elif kind == "tool_use" and role == "assistant":
            name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise invalid(where, f"{at}: a tool_use block needs a string 'id' and 'name'")
            if not isinstance(arguments, dict):
                raise invalid(where, f"{at}: a tool_use block's 'input' must be an object")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            )
        elif kind == "tool_result" and role == "user":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise invalid(where, f"{at}: a tool_result block needs a string 'tool_use_id'")
            text = _text_of(block.get("content", ""), "messages")
            if block.get("is_error") is True:
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            raise invalid(
                where,
                f"{at}: a {kind!r} block is not supported in a {role} message (text, tool_use "
                "and thinking from the assistant, text and tool_result from the user)",
            )
    out = list(results)
    if calls:
        out.append({"role": "assistant", "content": "".join(texts) or None, "tool_calls": calls})
    elif texts or not results:
        out.append({"role": role, "content": "".join(texts)})
    return out


def _tool_choice(value: object) -> tuple[object, bool]:
    """Anthropic's ``tool_choice`` as OpenAI's (auto, any: required, a named tool, none), and
    whether the reply may make several calls (not where ``disable_parallel_tool_use``)."""
    if value is None:
        return None, True
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(value, dict) or kind not in ("auto", "any", "none", "tool"):
        raise invalid(
            "tool_choice",
            "'tool_choice' must be {'type': 'auto' | 'any' | 'none'} or a named tool",
        )
    single = value.get("disable_parallel_tool_use", False)
    if not isinstance(single, bool):
        raise invalid("tool_choice", "'tool_choice.disable_parallel_tool_use' must be a boolean")
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str):
            raise invalid("tool_choice", "a named 'tool_choice' must give the tool's 'name'")
        return {"type": "function", "function": {"name": name}}, not single
    return {"auto": "auto", "any": "required", "none": "none"}[kind], not single


def _output_format(value: object) -> Structured | None:
    """``output_config.format``: a JSON schema the answer must match (Anthropic's structured
    outputs), its objects closed as strict schemas are."""
    if value is None:
        return None
    fmt = value.get("format") if isinstance(value, dict) else None
    if fmt is None:
        return None
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(schema, dict)
    ):
        raise invalid(
            "output_config",
            "'output_config.format' must be {'type': 'json_schema', 'schema': {...}}",
        )
    try:
        return structured_output(json_schema=closed(schema))
    except InvalidArgumentError as e:
        raise invalid("output_config", str(e)) from None


def _thinking(value: object) -> tuple[dict[str, Any] | None, int | None]:
    """``thinking`` as template variables and a reasoning budget."""
    if value is None:
        return None, None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return {"enable_thinking": False}, None
    if kind == "enabled" and isinstance(value, dict):
        budget = value.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise invalid("thinking", "'thinking.budget_tokens' must be a positive integer")
        return {"enable_thinking": True}, budget
    raise invalid(
        "thinking", "'thinking' must be {'type': 'enabled', 'budget_tokens': N} or disabled"
    )


Emit = Callable[[dict[str, Any]], Awaitable[None]]

_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


@dataclass
class Reply:
    """One Messages reply as its outputs come: the content blocks it has, and, streamed, the
    events that tell them."""

    model: str
    input_tokens: int
    id: str = field(default_factory=lambda: f"msg_{secrets.token_hex(12)}")
    thinking: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    output_tokens: int = 0
    cached_tokens: int = 0
    stop_reason: str | None = None
    stop_sequence: str | None = None
    _open: str | None = None
    """The kind of the content block a stream has open (``"thinking"``, ``"text"``)."""
    _index: int = -1

    def add(self, out: RequestOutput) -> None:
        """Take the request's next output."""
        self.output_tokens += len(out.new_token_ids)
        if out.reasoning:
            self.thinking.append(out.reasoning)
        if out.text:
            self.text.append(out.text)
        if out.finished:
            self.calls = out.tool_calls or []
            self.cached_tokens = out.cached_tokens
            reason = out.finish_reason or "stop"
            if reason == "stop" and isinstance(out.stop_reason, str):
                self.stop_reason, self.stop_sequence = "stop_sequence", out.stop_reason
            else:
                self.stop_reason = _STOP_REASONS.get(reason, "end_turn")

    def usage(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens - self.cached_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": self.cached_tokens,
            "cache_creation_input_tokens": 0,
        }

    def body(self) -> dict[str, Any]:
        """The message, whole once its last output was added."""
        content: list[dict[str, Any]] = []
        if self.thinking:
            content.append(
                {"type": "thinking", "thinking": "".join(self.thinking), "signature": ""}
            )
        text = "".join(self.text)
        if text or not self.calls:
            content.append({"type": "text", "text": text})
        content += [_tool_use(call) for call in self.calls]
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": self.usage(),
        }

    # -- streaming --------------------------------------------------------------------------

    async def start(self, emit: Emit) -> None:
        """The ``message_start`` event."""
        message = {**self.body(), "content": [], "stop_reason": None, "stop_sequence": None}
        message["usage"] = {**self.usage(), "output_tokens": 0}
        await emit({"type": "message_start", "message": message})

    async def fail(self, emit: Emit, error: APIError) -> None:
        """The event of a reply whose generation failed."""
        await emit(error_body(error))

    @staticmethod
    def error_body(error: APIError) -> dict[str, Any]:
        return error_body(error)

    async def stream(self, out: RequestOutput, emit: Emit) -> None:
        """Take the request's next output and emit the events it makes."""
        self.add(out)
        if out.reasoning:
            await self._delta(
                emit, "thinking", {"type": "thinking_delta", "thinking": out.reasoning}
            )
        if out.text:
            await self._delta(emit, "text", {"type": "text_delta", "text": out.text})
        if not out.finished:
            return
        await self._close(emit)
        for call in self.calls:
            self._index += 1
            block = {**_tool_use(call), "input": {}}
            await emit(
                {"type": "content_block_start", "index": self._index, "content_block": block}
            )
            delta = {"type": "input_json_delta", "partial_json": json.dumps(_input(call))}
            await emit({"type": "content_block_delta", "index": self._index, "delta": delta})
            await emit({"type": "content_block_stop", "index": self._index})
        await emit(
            {
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
                "usage": {"output_tokens": self.output_tokens},
            }
        )
        await emit({"type": "message_stop"})

    async def _delta(self, emit: Emit, kind: str, delta: dict[str, Any]) -> None:
        if self._open != kind:
            await self._close(emit)
            self._index += 1
            self._open = kind
            block = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            await emit(
                {"type": "content_block_start", "index": self._index, "content_block": block}
            )
        await emit({"type": "content_block_delta", "index": self._index, "delta": delta})

    async def _close(self, emit: Emit) -> None:
        if self._open is not None:
            await emit({"type": "content_block_stop", "index": self._index})
            self._open = None


def _input(call: ToolCall) -> object:
    """A call's arguments as a JSON value (an object, as Anthropic's ``input`` is)."""
    try:
        return json.loads(call.arguments)
    except ValueError:
        return {}


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call)}
