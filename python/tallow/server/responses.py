"""OpenAI's Responses API (``POST /v1/responses``, ``GET /v1/responses/{id}``) on the same chat
path as chat completions.

A request is read into chat terms: ``instructions`` a system message, ``input`` (a text, or
message, ``function_call`` and ``function_call_output`` items) the conversation, appended to the
stored conversation of ``previous_response_id``; ``tools`` function tools; ``text.format`` the
constraint on the output. The reply is one engine request, turned into output items (a
``reasoning`` item, a ``message`` with ``output_text``, ``function_call`` items) whole or as the
typed stream events. Responses are kept in memory, the last :data:`STORE_SIZE` of them (``store:
false`` keeps one out), so that a later request can go on from one.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tallow.engine import SamplingParams
from tallow.errors import InvalidArgumentError
from tallow.output import RequestOutput
from tallow.server.protocol import APIError, Fields, flat_tools, invalid
from tallow.structured import Structured, closed, structured_output
from tallow.tools import ToolCall

__all__ = ["STORE_SIZE", "ResponseStore", "ResponsesRequest", "Response", "parse_responses"]

STORE_SIZE = 1024
"""Responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}`` (the oldest go
first)."""

Emit = Callable[[dict[str, Any]], Awaitable[None]]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass
class ResponsesRequest:
    """What a ``POST /v1/responses`` body asks for, in chat terms."""

    model: str
    messages: list[dict[str, Any]]
    """The conversation: the previous response's, then this request's input."""
    params: SamplingParams
    stream: bool
    store: bool
    tools: list[dict[str, Any]] | None
    tool_choice: object
    echo: dict[str, Any]
    """Fields the response repeats (instructions, tools, text, temperature, ...)."""


class ResponseStore:
    """The last responses, by id: each one's conversation (for ``previous_response_id``) and
    its response object (for ``GET``). Thread-safe (requests are prepared in worker threads)."""

    def __init__(self, size: int = STORE_SIZE) -> None:
        self._size = size
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[response["id"]] = (conversation, response)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def conversation(self, response_id: str) -> list[dict[str, Any]] | None:
        with self._lock:
            found = self._items.get(response_id)
        return None if found is None else list(found[0])

    def response(self, response_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._items.get(response_id)
        return None if found is None else found[1]


def parse_responses(
    body: object, n_vocab: int, n_ctx: int, store: ResponseStore
) -> ResponsesRequest:
    """A ``POST /v1/responses`` body, each problem a 400 naming its field."""
    f = Fields(body)
    model = f.string("model", required=True)
    assert model is not None
    instructions = f.string("instructions")
    previous = f.string("previous_response_id")
    messages: list[dict[str, Any]] = []
    if previous is not None:
        history = store.conversation(previous)
        if history is None:
            raise APIError(
                400,
                f"no stored response with id {previous!r} (this server keeps the last "
                f"{STORE_SIZE} responses it stored)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        messages = history
    messages += _input(f.body.get("input"))
    if instructions is not None:
        messages = [{"role": "system", "content": instructions}, *messages]
    tools = flat_tools(f.body.get("tools"), types=("function",), schema="parameters")
    choice = _tool_choice(f.body.get("tool_choice"))
    if choice == "none":
        tools, choice = None, None
    structured, text = _text_format(f.body.get("text"))
    temperature = f.number("temperature", 1.0, 0.0, 2.0)
    top_p = f.number("top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        temperature, top_p = 0.0, 1.0
    params = SamplingParams(
        max_tokens=f.integer("max_output_tokens", None, 1, n_ctx),
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        structured=structured,
        # Extensions, as on the chat route.
        logit_bias=f.logit_bias(n_vocab),
        chat_template_kwargs=f.template_kwargs(
            _effort(f.body.get("reasoning")), "reasoning.effort"
        ),
        reasoning_budget=f.integer("reasoning_budget", None, 0, 2**31),
        parallel_tool_calls=f.boolean("parallel_tool_calls", True),
    )
    echo = {
        "instructions": instructions,
        "previous_response_id": previous,
        "tools": f.body.get("tools") or [],
        "tool_choice": f.body.get("tool_choice") or "auto",
        "text": text,
        "temperature": temperature,
        "top_p": top_p,
        "max_output_tokens": params.max_tokens,
        "parallel_tool_calls": params.parallel_tool_calls,
        "reasoning": {"effort": _effort(f.body.get("reasoning")), "summary": None},
        "metadata": f.body.get("metadata") if isinstance(f.body.get("metadata"), dict) else {},
    }
    return ResponsesRequest(
        model,
        messages,
        params,
        stream=f.boolean("stream", False),
        store=f.boolean("store", True),
        tools=tools,
        tool_choice=choice,
        echo=echo,
    )


def _effort(reasoning: object) -> object:
    """``reasoning.effort``: how hard a model that reasons should think (given to its chat
    template as ``reasoning_effort``)."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise invalid("reasoning", "'reasoning' must be an object such as {'effort': 'low'}")
    return reasoning.get("effort")


def _text(content: object, where: str) -> str:
    """The text of a message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text", "text") or not isinstance(
                part.get("text"), str
            ):
                raise invalid(
                    "input", f"{where}: only text parts are supported (input_text, output_text)"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise invalid("input", f"{where}: content must be a string or a list of parts", "invalid_type")


def _input(value: object) -> list[dict[str, Any]]:
    """``input`` as chat messages: messages, function calls (an assistant's ``tool_calls``)
    and their outputs (``"tool"`` messages); reasoning items are left out."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid(
            "input", "'input' must be a string or a non-empty list of items", "invalid_type"
        )
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid("input", f"{where} must be an object", "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid("input", f"{where}.role must be user, assistant, system or developer")
            role = "system" if role == "developer" else role
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments")
            if not all(isinstance(x, str) for x in (name, call_id, arguments)):
                raise invalid(
                    "input", f"{where}: a function_call needs string name, call_id, arguments"
                )
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise invalid("input", f"{where}: a function_call_output needs a string call_id")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(output, where)})
        elif kind == "reasoning":
            continue
        else:
            raise invalid("input", f"{where}: items of type {kind!r} are not supported")
    return out


def _tool_choice(value: object) -> object:
    if value is None or value in ("auto", "none", "required"):
        return value
    if (
        isinstance(value, dict)
        and value.get("type") == "function"
        and isinstance(value.get("name"), str)
    ):
        return {"type": "function", "function": {"name": value["name"]}}
    raise invalid("tool_choice", "'tool_choice' must be auto, none, required or a named function")


def _text_format(value: object) -> tuple[Structured | None, dict[str, Any]]:
    """``text.format``: the constraint on the output, and the ``text`` the response repeats."""
    if value is None:
        return None, {"format": {"type": "text"}}
    fmt = value.get("format") if isinstance(value, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None, {"format": {"type": "text"}}
    assert isinstance(fmt, dict)
    try:
        if kind == "json_object":
            return structured_output(json_object=True), {"format": fmt}
        schema = fmt.get("schema")
        if kind == "json_schema" and isinstance(schema, dict):
            if fmt.get("strict") is True:
                schema = closed(schema)
            return structured_output(json_schema=schema), {"format": fmt}
    except InvalidArgumentError as e:
        raise invalid("text", str(e)) from None
    raise invalid(
        "text", "'text.format' must be text, json_object or {'type': 'json_schema', 'schema': ...}"
    )


@dataclass
class Response:
    """One response as its request's outputs come: its output items, and, streamed, the
    events that tell them."""

    request: ResponsesRequest
    input_tokens: int
    id: str = field(default_factory=lambda: _new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    reasoning: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    status: str = "in_progress"
    error: dict[str, Any] | None = None
    _ids: dict[str, str] = field(default_factory=dict)
    _open: str | None = None
    _order: list[str] = field(default_factory=list)
    _sequence: int = 0

    def add(self, out: RequestOutput) -> None:
        """Take the request's next output."""
        self.output_tokens += len(out.new_token_ids)
        self.reasoning_tokens += out.reasoning_tokens
        if out.reasoning:
            self.reasoning.append(out.reasoning)
        if out.text:
            self.text.append(out.text)
        if out.finished:
            self.calls = out.tool_calls or []
            self.cached_tokens = out.cached_tokens
            self.status = "incomplete" if out.finish_reason == "length" else "completed"

    def _item_id(self, kind: str) -> str:
        if kind not in self._ids:
            self._ids[kind] = _new_id({"reasoning": "rs", "message": "msg"}[kind])
        return self._ids[kind]

    def _reasoning_item(self) -> dict[str, Any]:
        text = "".join(self.reasoning)
        return {
            "type": "reasoning",
            "id": self._item_id("reasoning"),
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
        }

    def _message_item(self, status: str = "completed") -> dict[str, Any]:
        part = {"type": "output_text", "text": "".join(self.text), "annotations": []}
        return {
            "type": "message",
            "id": self._item_id("message"),
            "status": status,
            "role": "assistant",
            "content": [part],
        }

    @staticmethod
    def _call_item(call: ToolCall) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": f"fc_{call.id}",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        }

    def output(self) -> list[dict[str, Any]]:
        items = []
        if self.reasoning:
            items.append(self._reasoning_item())
        if self.text or not self.calls:
            items.append(self._message_item())
        items += [self._call_item(call) for call in self.calls]
        return items

    def body(self) -> dict[str, Any]:
        """The response object."""
        done = self.status != "in_progress"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.request.model,
            "output": self.output() if done else [],
            "error": self.error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if self.status == "incomplete"
            else None,
            **self.request.echo,
            "store": self.request.store,
            "usage": {
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": self.input_tokens + self.output_tokens,
            }
            if done
            else None,
        }

    @staticmethod
    def error_body(error: APIError) -> dict[str, Any]:
        return error.body()

    def conversation(self) -> list[dict[str, Any]]:
        """The request's conversation with this response's answer after it (instructions
        left out, as ``previous_response_id`` does not carry them)."""
        messages = [m for m in self.request.messages]
        if self.request.echo["instructions"] is not None:
            messages = messages[1:]
        text = "".join(self.text)
        if self.calls:
            calls = [call.to_openai() for call in self.calls]
            messages.append({"role": "assistant", "content": text or None, "tool_calls": calls})
        else:
            messages.append({"role": "assistant", "content": text})
        return messages

    # -- streaming --------------------------------------------------------------------------

    async def _emit(self, emit: Emit, kind: str, **fields: Any) -> None:
        await emit({"type": kind, "sequence_number": self._sequence, **fields})
        self._sequence += 1

    async def start(self, emit: Emit) -> None:
        await self._emit(emit, "response.created", response=self.body())
        await self._emit(emit, "response.in_progress", response=self.body())

    async def stream(self, out: RequestOutput, emit: Emit) -> None:
        """Take the request's next output and emit the events it makes."""
        self.add(out)
        if out.reasoning:
            await self._delta(emit, "reasoning", out.reasoning)
        if out.text:
            await self._delta(emit, "message", out.text)
        if not out.finished:
            return
        await self._close(emit)
        for call in self.calls:
            index = len(self._order)
            self._order.append(call.id)
            item = self._call_item(call)
            await self._emit(
                emit,
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            await self._emit(
                emit,
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=call.arguments,
            )
            await self._emit(
                emit,
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=call.arguments,
            )
            await self._emit(emit, "response.output_item.done", output_index=index, item=item)
        kind = "response.incomplete" if self.status == "incomplete" else "response.completed"
        await self._emit(emit, kind, response=self.body())

    async def fail(self, emit: Emit, error: APIError) -> None:
        """The events of a response whose generation failed."""
        await self._close(emit)
        self.status = "failed"
        self.error = {"code": error.code or error.type, "message": error.message}
        await self._emit(emit, "response.failed", response=self.body())

    async def _delta(self, emit: Emit, kind: str, delta: str) -> None:
        item_id = self._item_id(kind)
        if self._open != kind:
            await self._close(emit)
            self._open = kind
            index = len(self._order)
            self._order.append(kind)
            item: dict[str, Any]
            part: dict[str, Any]
            if kind == "reasoning":
                item = {"type": "reasoning", "id": item_id, "summary": [], "content": []}
                part = {"type": "reasoning_text", "text": ""}
            else:
                item = {**self._message_item("in_progress"), "content": []}
                part = {"type": "output_text", "text": "", "annotations": []}
            await self._emit(emit, "response.output_item.added", output_index=index, item=item)
            await self._emit(
                emit,
                "response.content_part.added",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=part,
            )
        index = self._order.index(kind)
        event = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        await self._emit(
            emit, event, item_id=item_id, output_index=index, content_index=0, delta=delta
        )

    async def _close(self, emit: Emit) -> None:
        kind = self._open
        if kind is None:
            return
        self._open = None
        index = self._order.index(kind)
        item = self._reasoning_item() if kind == "reasoning" else self._message_item()
        part = item["content"][0]
        done = (
            "response.reasoning_text.done" if kind == "reasoning" else "response.output_text.done"
        )
        await self._emit(
            emit, done, item_id=item["id"], output_index=index, content_index=0, text=part["text"]
        )
        await self._emit(
            emit,
            "response.content_part.done",
            item_id=item["id"],
            output_index=index,
            content_index=0,
            part=part,
        )
        await self._emit(emit, "response.output_item.done", output_index=index, item=item)
