"""Prompts to token ids, the same way for :class:`~tallow.LLM`, :class:`~tallow.AsyncLLM` and
the server: text, token ids or chat messages in, checked token ids out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tallow import _core, checks
from tallow.chat_template import ChatTemplate
from tallow.engine import SamplingParams
from tallow.errors import InvalidArgumentError, ModelError
from tallow.reasoning import block_of
from tallow.tools import tool_use

__all__ = ["ChatPrompt", "Prompts"]


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request ready for the engine: its prompt, and its parameters with its tools
    (constrained where a tool call is required)."""

    ids: list[int]
    params: SamplingParams


class Prompts:
    """The prompt processor of one model with a context of ``n_ctx`` positions."""

    def __init__(self, model: _core.Model, n_ctx: int, chat_template: object = None) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self._chat_template: ChatTemplate | None = None
        if chat_template is not None:
            self._chat_template = ChatTemplate.for_model(
                model, checks.text("chat_template", chat_template)
            )

    @property
    def chat_template(self) -> ChatTemplate:
        """The chat template: the one given, else the model's own (read from its metadata on
        first use)."""
        if self._chat_template is None:
            self._chat_template = ChatTemplate.for_model(self.model)
        return self._chat_template

    def tokenize(
        self, text: object, add_special: object = True, parse_special: object = False
    ) -> list[int]:
        """Token ids of ``text``: BOS (and EOS) where the model's metadata asks for them with
        ``add_special``; control-token text such as ``<|im_start|>`` as those tokens with
        ``parse_special`` (plain text otherwise)."""
        return self.model.tokenize(
            checks.text("text", text),
            checks.boolean("add_special", add_special),
            checks.boolean("parse_special", parse_special),
        )

    def detokenize(self, ids: object) -> str:
        """The text of token ids (the inverse of :meth:`tokenize` without special tokens)."""
        return self.model.detokenize(checks.token_ids("ids", ids, self.model.n_vocab))

    def ids(self, prompt: object, *, parse_special: object = True) -> list[int]:
        """The token ids ``prompt`` runs as. Text is tokenized (control-token text such as
        ``<|im_start|>`` parsed as those tokens when ``parse_special``) and starts with BOS when
        the model's metadata asks for it, or when it is empty (BOS is then the whole prompt);
        token ids are checked against the vocabulary and used as they are."""
        if isinstance(prompt, str):
            parse = checks.boolean("parse_special", parse_special)
            ids = self.with_bos(self.model.tokenize(checks.text("prompt", prompt), False, parse))
        else:
            if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
                raise InvalidArgumentError(
                    f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
                )
            ids = checks.token_ids("prompt", prompt, self.model.n_vocab)
        return self.check_fits(ids)

    def with_bos(self, ids: list[int]) -> list[int]:
        """The token ids of a text's start with BOS in front where the model's metadata asks for
        it, or where there are none (BOS is then all there is before what follows)."""
        bos = self.model.bos_id
        if bos is not None and (self.model.add_bos or not ids):
            return [bos, *ids]
        return ids

    def chat(
        self,
        messages: object,
        params: SamplingParams,
        *,
        parse_special: object = False,
        tools: object = None,
        tool_choice: object = None,
    ) -> ChatPrompt:
        """A chat request: the prompt of ``messages`` with ``tools`` described to the model
        (see :mod:`tallow.tools`) and ``params.chat_template_kwargs`` given to the template,
        and ``params`` with the tools whose calls the reply's text is parsed for, constrained
        to the model's call syntax where ``tool_choice`` requires or names a call (which no
        other constraint may join), and with the reasoning block the reply may have (see
        :mod:`tallow.reasoning`)."""
        use = tool_use(tools, tool_choice, self.chat_template.source, params.parallel_tool_calls)
        if use is not None:
            constraint = use.constraint(self._single_tokens(use.markers))
            if constraint is not None and params.structured is not None:
                raise checks.invalid(
                    "tool_choice",
                    f"tool_choice {use.choice!r} constrains the reply already: it cannot be "
                    f"combined with {params.structured.kind}",
                )
            params = replace(params, tools=use, structured=constraint or params.structured)
        ids = self.chat_ids(
            messages,
            parse_special=checks.boolean("parse_special", parse_special),
            tools=None if use is None else use.tools,
            template_kwargs=params.chat_template_kwargs,
        )
        call = use is not None and use.constrained
        block = block_of(self.model, ids, params.reasoning_budget, call)
        return ChatPrompt(ids, replace(params, reasoning=block))

    def _single_tokens(self, texts: Sequence[str]) -> dict[str, int]:
        """Each of ``texts`` that the vocabulary holds as one token, with its id."""
        ids = {text: self.model.tokenize(text, False, True) for text in texts}
        return {text: found[0] for text, found in ids.items() if len(found) == 1}

    def chat_ids(
        self,
        messages: object,
        *,
        parse_special: bool = False,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, object] | None = None,
    ) -> list[int]:
        """The token ids of a conversation rendered with :attr:`chat_template`, ending with the
        opening of the assistant's turn. Control tokens come only from the template: text in
        the messages that spells one (``<|im_end|>``) is tokenized as plain text, unless
        ``parse_special``. As Hugging Face's ``apply_chat_template``, the template writes any
        BOS itself."""
        template = self.chat_template
        if parse_special:
            text = template.render(messages, tools=tools, extra=template_kwargs)
            return self.check_fits(self.model.tokenize(text, False, True))
        text = template.render(
            messages, quote=self.model.quote_special, tools=tools, extra=template_kwargs
        )
        return self.check_fits(self.model.tokenize_quoted(text, False))

    def check_fits(self, ids: list[int]) -> list[int]:
        """``ids``, if they are a prompt that fits the context."""
        if not ids:
            raise InvalidArgumentError("the prompt has no tokens (and the model has no BOS)")
        if len(ids) >= self.n_ctx:
            raise ModelError(
                f"the prompt is {len(ids)} tokens long: a context of {self.n_ctx} positions "
                "(prompt and completion) leaves no room for a completion (pass a larger n_ctx)"
            )
        return ids
