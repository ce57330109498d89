"""Chat templates: turning a list of messages into the prompt text a chat model was trained on.

A GGUF chat model carries its template in ``tokenizer.chat_template``, a Jinja template written
for Hugging Face's ``apply_chat_template``. It is rendered here the same way: in a sandboxed
Jinja environment (templates come from model files, which are untrusted), with ``trim_blocks``
and ``lstrip_blocks``, the variables ``messages``, ``add_generation_prompt``, ``bos_token`` and
``eos_token``, the function ``raise_exception(message)`` and the ``tojson`` filter.

A model without a template gets :data:`DEFAULT_TEMPLATE`, the ChatML format
(``<|im_start|>role\\ncontent<|im_end|>``).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import jinja2
import jinja2.sandbox

from tallow import _core, checks
from tallow.errors import InvalidArgumentError
from tallow.tools import message_tool_fields

__all__ = ["DEFAULT_TEMPLATE", "ChatTemplate", "Message", "check_messages"]

DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The template used when a model has none: ChatML."""

Message = Mapping[str, Any]
"""One chat message: ``{"role": "user", "content": "..."}``. ``content`` may also be a list
of parts of which the ``{"type": "text", "text": ...}`` ones are kept (OpenAI's format)."""

_QUOTE_MARKS = ("\ufdd0", "\ufdd1")
"""What ``Model.quote_special`` puts around the control tokens written in a message."""

_ROLES = ("system", "developer", "user", "assistant", "tool")


class _TemplateRaised(Exception):
    """``raise_exception()`` called by a template."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRaised(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    # HF's filter: no ASCII escaping, so non-English text reaches the model as itself.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def check_messages(messages: object) -> list[dict[str, Any]]:
    """The messages as plain ``{"role", "content"}`` dicts with string content (and the
    tool fields of :func:`tallow.tools.message_tool_fields`), or :class:`InvalidArgumentError`
    naming what is wrong."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidArgumentError("messages must be a list of {'role', 'content'} objects")
    if not messages:
        raise InvalidArgumentError("messages must not be empty")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidArgumentError(f"messages[{i}] must be an object with role and content")
        role = m.get("role")
        if role not in _ROLES:
            raise InvalidArgumentError(
                f"messages[{i}].role must be one of {', '.join(_ROLES)}, got {role!r}"
            )
        out.append(
            {"role": role, "content": _content_text(m.get("content"), i), **message_tool_fields(m)}
        )
    return out


def _quoted(value: Any, quote: Callable[[str], str]) -> Any:
    """``value`` (strings, lists and dicts of them) with ``quote`` applied to every string,
    dict keys included."""
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, Mapping):
        return {quote(k) if isinstance(k, str) else k: _quoted(v, quote) for k, v in value.items()}
    if isinstance(value, list):
        return [_quoted(v, quote) for v in value]
    return value


def _content_text(content: object, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise InvalidArgumentError(
                    f"messages[{i}].content parts must be {{'type': 'text', 'text': ...}}"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidArgumentError(f"messages[{i}].content part text must be a string")
            texts.append(text)
        return "".join(texts)
    raise InvalidArgumentError(f"messages[{i}].content must be a string or a list of text parts")


_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "bos_token", "eos_token"})
"""The variables a template gets from tallow itself."""


@dataclass
class ChatTemplate:
    """A compiled chat template with the special-token strings it may use."""

    source: str
    bos_token: str = ""
    eos_token: str = ""

    def __post_init__(self) -> None:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols"],
            undefined=jinja2.Undefined,
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateError as e:
            raise InvalidArgumentError(f"the chat template does not compile: {e}") from None

    @classmethod
    def for_model(cls, model: _core.Model, source: str | None = None) -> ChatTemplate:
        """``source`` (a template that replaces the model's own), or the model's own template
        (``tokenizer.chat_template``), or :data:`DEFAULT_TEMPLATE`; with the model's BOS and EOS
        texts."""
        metadata = model.metadata()
        own = metadata.get("tokenizer.chat_template")
        if source is None and isinstance(own, str):
            source = own
        tokens = metadata.get("tokenizer.ggml.tokens")

        def token_text(token_id: int | None) -> str:
            if token_id is None or not isinstance(tokens, list) or token_id >= len(tokens):
                return ""
            return str(tokens[token_id])

        return cls(
            source if source is not None and source.strip() else DEFAULT_TEMPLATE,
            bos_token=token_text(model.bos_id),
            eos_token=token_text(model.eos_id),
        )

    def render(
        self,
        messages: object,
        add_generation_prompt: bool = True,
        *,
        quote: Callable[[str], str] | None = None,
        tools: list[dict[str, Any]] | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> str:
        """The prompt text of ``messages``, ending with the opening of the assistant's turn
        when ``add_generation_prompt``. ``quote`` is applied to every string of the messages and
        the tools first (``Model.quote_special``, which marks the control tokens they spell so
        that they are tokenized as text). Raises :class:`InvalidArgumentError` for malformed
        messages, or when the template itself refuses them (``raise_exception``). ``tools``
        (OpenAI's function tools, checked) reach the template as ``tools``; ``extra`` holds more
        variables (``chat_template_kwargs``: ``enable_thinking``, ...), which cannot replace
        those."""
        checked = check_messages(messages)
        taken = sorted(set(extra or ()) & _VARIABLES)
        if taken:
            raise checks.invalid(
                "chat_template_kwargs", f"chat_template_kwargs cannot set {taken[0]!r}"
            )
        if quote is not None:
            if any(mark in self.source for mark in _QUOTE_MARKS):
                raise InvalidArgumentError(
                    "the chat template holds U+FDD0 or U+FDD1, which mark message text"
                )
            # Every string a message or a tool brings, not only the content: a tool's
            # description or a call's arguments may spell a control token too.
            checked = [_quoted(m, quote) for m in checked]
            tools = None if tools is None else _quoted(tools, quote)
        try:
            text: str = self._template.render(
                **(extra or {}),
                messages=checked,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except _TemplateRaised as e:
            raise InvalidArgumentError(f"the chat template refused the messages: {e}") from None
        except Exception as e:  # the template is code from the model file: any failure is its
            raise InvalidArgumentError(f"the chat template failed: {e}") from None
        return text
