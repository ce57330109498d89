"""Request bodies of the OpenAI-compatible API, checked field by field.

Every problem becomes an :class:`APIError` naming the offending field, which the app turns into
a 4xx response in OpenAI's error shape. Unknown fields are ignored, as OpenAI's clients send
fields a server may not know.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from tallow import checks
from tallow.checks import argument_of
from tallow.engine import SamplingParams, template_kwargs
from tallow.errors import GrammarError, InvalidArgumentError
from tallow.structured import Structured, closed, structured_output

MAX_N = 16
"""Most choices one request may ask for."""
MAX_TOP_LOGPROBS = 20
MAX_STOPS = 4


class APIError(Exception):
    """An error to answer with: HTTP ``status`` and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def json_bytes(self) -> bytes:
        """:meth:`body` as JSON."""
        return json.dumps(self.body()).encode()


def invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def parse_json(raw: bytes) -> object:
    """A request body: UTF-8 JSON, at most :data:`~tallow.checks.MAX_JSON_DEPTH` levels deep,
    every string valid Unicode (``"\\ud800"`` alone is not); anything else is an
    :class:`APIError` 400. (One walk checks both, not :func:`~tallow.checks.nests_deeper`.)"""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise APIError(
            400, f"the request body is not valid UTF-8 (byte {e.start})", code="invalid_json"
        ) from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError as e:  # malformed JSON, or an integer of more digits than Python reads
        raise APIError(
            400, f"the request body is not valid JSON: {e}", code="invalid_json"
        ) from None
    pending: list[tuple[object, int]] = [(body, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            _check_unicode(value)
        elif isinstance(value, (list, dict)):
            if depth > checks.MAX_JSON_DEPTH:
                raise _too_deep()
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    _check_unicode(key)
                pending.append((item, depth + 1))
    return body


def _too_deep() -> APIError:
    return APIError(
        400,
        f"the request body is nested more than {checks.MAX_JSON_DEPTH} levels deep",
        code="invalid_json",
    )


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(
            400,
            f"the request body holds a lone surrogate (\\u{ord(text[e.start]):04x}), which is not "
            "valid Unicode",
            code="invalid_json",
        ) from None


@dataclass
class GenerationRequest:
    """What a completions or chat request asks for, in the engine's terms."""

    model: str
    params: SamplingParams
    """Sampling and stopping; ``max_tokens`` None means up to the end of the context."""
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None
    """None: no log probabilities; k >= 0: the chosen token's and the k most likely ones."""
    echo: bool = False
    tools: object = None
    """Chat: the functions offered to the model, as sent (checked with its chat template)."""
    tool_choice: object = None
    structured_field: str | None = None
    """The field that constrains the output (``response_format`` or a ``guided_*``), if one
    does: a constraint that does not compile is a 400 naming it."""
    prompts: list[str | list[int]] = field(default_factory=list)
    """Completions: one or more prompts (text or token ids)."""
    messages: list[Mapping[str, Any]] | None = None
    """Chat: the conversation."""


def _is_token_ids(value: object) -> TypeGuard[list[int]]:
    """Whether ``value`` is a list of integers (booleans are not token ids)."""
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _in_vocab(name: str, ids: list[int], n_vocab: int) -> list[int]:
    """``ids``, if each is a token of a vocabulary of ``n_vocab`` (a 400 naming ``name``)."""
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise invalid(name, f"token id {bad} is out of range (0..{n_vocab - 1})")
    return list(ids)


class Fields:
    """Typed access to the fields of a JSON object, each failure an :class:`APIError`."""

    def __init__(self, body: object) -> None:
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object", code="invalid_body")
        self.body: dict[str, Any] = body

    def present(self, name: str) -> bool:
        return self.body.get(name) is not None

    def string(self, name: str, *, required: bool = False) -> str | None:
        value = self.body.get(name)
        if value is None:
            if required:
                raise invalid(name, f"'{name}' is required", "missing_required_parameter")
            return None
        if not isinstance(value, str):
            raise invalid(name, f"'{name}' must be a string", "invalid_type")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise invalid(name, f"'{name}' must be a boolean", "invalid_type")
        return value

    def integer(self, name: str, default: int | None, low: int, high: int) -> int | None:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(name, f"'{name}' must be an integer", "invalid_type")
        if not low <= value <= high:
            raise invalid(
                name, f"'{name}' must be between {low} and {high}, got {checks.describe(value)}"
            )
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid(name, f"'{name}' must be a number", "invalid_type")
        # Compared before any conversion: an int may be beyond the range of floats.
        if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
            raise invalid(
                name, f"'{name}' must be between {low} and {high}, got {checks.describe(value)}"
            )
        return float(value)

    def template_kwargs(
        self, effort: object = None, effort_field: str = "reasoning_effort"
    ) -> Mapping[str, Any] | None:
        """``chat_template_kwargs``: variables for the chat template (vLLM's field), with a
        ``reasoning_effort`` where ``effort`` (the field ``effort_field``) gives one (see
        :func:`tallow.engine.template_kwargs`)."""
        value = self.body.get("chat_template_kwargs")
        if value is not None and not isinstance(value, dict):
            raise invalid(
                "chat_template_kwargs", "'chat_template_kwargs' must be an object", "invalid_type"
            )
        try:
            return template_kwargs(value, reasoning_effort=effort)
        except InvalidArgumentError as e:
            effort_is_wrong = argument_of(e, ("reasoning_effort",), "")
            raise invalid(
                effort_field if effort_is_wrong else "chat_template_kwargs", str(e)
            ) from None

    def stop(self, name: str = "stop", most: int = MAX_STOPS) -> tuple[str, ...]:
        """Stop strings: a non-empty string, or a list of at most ``most`` of them."""
        value = self.body.get(name)
        if value is None:
            return ()
        stops = [value] if isinstance(value, str) else value
        if (
            not isinstance(stops, list)
            or not all(isinstance(s, str) and s for s in stops)
            or len(stops) > most
        ):
            raise invalid(
                name,
                f"'{name}' must be a non-empty string or a list of up to {most} of them",
                "invalid_type",
            )
        return tuple(stops)

    def token_ids(self, name: str, n_vocab: int) -> tuple[int, ...]:
        value = self.body.get(name, [])
        if not _is_token_ids(value):
            raise invalid(name, f"'{name}' must be a list of token ids", "invalid_type")
        return tuple(_in_vocab(name, value, n_vocab))

    def logit_bias(self, n_vocab: int) -> dict[int, float]:
        value = self.body.get("logit_bias")
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise invalid(
                "logit_bias", "'logit_bias' must map token ids to numbers", "invalid_type"
            )
        out = {}
        for key, bias in value.items():
            try:
                token = int(key)
            except ValueError:
                raise invalid("logit_bias", f"'logit_bias' key {key!r} is not a token id") from None
            if not 0 <= token < n_vocab:
                raise invalid("logit_bias", f"token id {token} is out of range (0..{n_vocab - 1})")
            if (
                isinstance(bias, bool)
                or not isinstance(bias, (int, float))
                or not -100 <= bias <= 100
            ):
                raise invalid("logit_bias", f"the bias of token {token} must be in [-100, 100]")
            out[token] = float(bias)
        return out


GUIDED_FIELDS = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
"""vLLM's fields that constrain the output, and the generation option each one is."""


def _structured(f: Fields) -> tuple[Structured | None, str | None]:
    """The constraint on the output that the request asks for (OpenAI's ``response_format``
    or one of vLLM's ``guided_*`` fields), and the field that asks."""
    given: list[tuple[str, str, object]] = []
    fmt = f.body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise invalid("response_format", "'response_format' must be an object", "invalid_type")
        kind = fmt.get("type")
        if kind == "json_object":
            given.append(("response_format", "json_object", True))
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, (dict, bool)):
                raise invalid(
                    "response_format",
                    "'response_format' of type 'json_schema' needs 'json_schema': "
                    "{'name': ..., 'schema': {...}}",
                )
            strict = spec.get("strict", False) if isinstance(spec, dict) else False
            if not isinstance(strict, bool):
                raise invalid(
                    "response_format", "'response_format.json_schema.strict' must be a boolean"
                )
            if strict and isinstance(schema, dict):
                # OpenAI's strict mode: objects that do not say otherwise take no other keys.
                try:
                    schema = closed(schema)
                except GrammarError as e:
                    raise invalid("response_format", str(e)) from None
            given.append(("response_format", "json_schema", schema))
        elif kind != "text":
            raise invalid(
                "response_format",
                "'response_format.type' must be 'text', 'json_object' or 'json_schema'",
            )
    for name, option in GUIDED_FIELDS.items():
        if f.present(name):
            given.append((name, option, f.body[name]))
    if not given:
        return None, None
    if len(given) > 1:
        raise invalid(given[1][0], f"'{given[0][0]}' and '{given[1][0]}' cannot be combined")
    ((name, option, value),) = given
    if option == "json_schema" and isinstance(value, bool):
        # As JSON text: the option takes False itself for "no constraint".
        value = json.dumps(value)
    try:
        return structured_output(**{option: value}), name
    except InvalidArgumentError as e:
        raise invalid(name, str(e)) from None


def _sampling(
    f: Fields,
    n_vocab: int,
    max_tokens: int | None,
    top_logprobs: int,
    structured: Structured | None,
) -> SamplingParams:
    temperature = f.number("temperature", 1.0, 0.0, 2.0)
    top_p = f.number("top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        # The smallest nucleus holds only the most likely token.
        temperature, top_p = 0.0, 1.0
    seed = f.integer("seed", None, -(2**63), 2**64 - 1)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        # Extensions that vLLM accepts too.
        top_k=f.integer("top_k", 0, 0, n_vocab) or 0,
        min_p=f.number("min_p", 0.0, 0.0, 1.0),
        repetition_penalty=f.number("repetition_penalty", 1.0, 0.01, 10.0),
        seed=None if seed is None else seed % 2**64,
        presence_penalty=f.number("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=f.number("frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=f.logit_bias(n_vocab),
        stop=f.stop(),
        stop_token_ids=f.token_ids("stop_token_ids", n_vocab),
        ignore_eos=f.boolean("ignore_eos", False),
        logprobs=top_logprobs >= 0,
        top_logprobs=max(top_logprobs, 0),
        structured=structured,
        chat_template_kwargs=f.template_kwargs(f.body.get("reasoning_effort")),
        reasoning_budget=f.integer("reasoning_budget", None, 0, 2**31),
        parallel_tool_calls=f.boolean("parallel_tool_calls", True),
    )


def _common(
    f: Fields, max_tokens_default: int | None, n_ctx: int
) -> tuple[str, int | None, int, bool, bool]:
    model = f.string("model", required=True)
    assert model is not None
    # max_completion_tokens is the newer name; either may be given.
    max_tokens = f.integer("max_completion_tokens", None, 1, n_ctx)
    if max_tokens is None:
        max_tokens = f.integer("max_tokens", max_tokens_default, 1, n_ctx)
    n = f.integer("n", 1, 1, MAX_N)
    assert n is not None
    stream = f.boolean("stream", False)
    options = f.body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("stream_options", "'stream_options' must be an object", "invalid_type")
        if not stream:
            raise invalid("stream_options", "'stream_options' is only allowed with 'stream'")
        usage = options.get("include_usage", False)
        if not isinstance(usage, bool):
            raise invalid("stream_options", "'include_usage' must be a boolean", "invalid_type")
        include_usage = usage
    f.string("user")
    return model, max_tokens, n, stream, include_usage


def parse_completion(body: object, n_vocab: int, n_ctx: int) -> GenerationRequest:
    """A ``POST /v1/completions`` body."""
    f = Fields(body)
    model, max_tokens, n, stream, include_usage = _common(f, 16, n_ctx)
    logprobs = f.integer("logprobs", None, 0, MAX_TOP_LOGPROBS)
    echo = f.boolean("echo", False)
    best_of = f.integer("best_of", None, 1, MAX_N)
    if best_of is not None and best_of != n:
        raise invalid("best_of", "'best_of' other than 'n' is not supported")
    if f.present("suffix"):
        raise invalid("suffix", "'suffix' is not supported")
    structured, structured_field = _structured(f)
    return GenerationRequest(
        model=model,
        params=_sampling(f, n_vocab, max_tokens, -1 if logprobs is None else logprobs, structured),
        n=n,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        echo=echo,
        structured_field=structured_field,
        prompts=_prompts(f.body.get("prompt"), n_vocab),
    )


def _prompts(value: object, n_vocab: int) -> list[str | list[int]]:
    """A prompt: a string, a list of token ids, or a non-empty list of either."""

    def tokens(v: object) -> list[int] | None:
        if v and _is_token_ids(v):
            return _in_vocab("prompt", v, n_vocab)
        return None

    if value is None:
        raise invalid("prompt", "'prompt' is required", "missing_required_parameter")
    if isinstance(value, str):
        return [value]
    single = tokens(value)
    if single is not None:
        return [single]
    if isinstance(value, list) and value:
        out: list[str | list[int]] = []
        for item in value:
            ids = tokens(item)
            if isinstance(item, str):
                out.append(item)
            elif ids is not None:
                out.append(ids)
            else:
                break
        else:
            if len(out) <= MAX_N:
                return out
    raise invalid(
        "prompt",
        f"'prompt' must be a string, a list of token ids, or a list of up to {MAX_N} of either",
        "invalid_type",
    )


def parse_chat(body: object, n_vocab: int, n_ctx: int) -> GenerationRequest:
    """A ``POST /v1/chat/completions`` body."""
    f = Fields(body)
    model, max_tokens, n, stream, include_usage = _common(f, None, n_ctx)
    want_logprobs = f.boolean("logprobs", False)
    top = f.integer("top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top is not None and not want_logprobs:
        raise invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    logprobs = (top or 0) if want_logprobs else None
    messages = f.body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "'messages' must be a non-empty list", "invalid_type")
    if f.body.get("functions"):
        raise invalid("functions", "'functions' is not supported: use 'tools'")
    tools = f.body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid("tools", "'tools' must be a list of function tools", "invalid_type")
    structured, structured_field = _structured(f)
    return GenerationRequest(
        model=model,
        params=_sampling(f, n_vocab, max_tokens, -1 if logprobs is None else logprobs, structured),
        n=n,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        structured_field=structured_field,
        messages=messages,
        tools=tools or None,
        tool_choice=f.body.get("tool_choice"),
    )


def choice_params(params: SamplingParams, choice: int) -> SamplingParams:
    """The parameters of choice ``choice`` of a request: with a seed, each choice gets its own
    (seed + choice), so choices differ but a request is reproducible."""
    if params.seed is None or choice == 0:
        return params
    return replace(params, seed=(params.seed + choice) % 2**64)


MAX_CLASSIFY_INPUTS = 256
"""Most texts one classify request may hold."""


@dataclass(frozen=True)
class ClassifyRequest:
    """What a ``POST /v1/classify`` body asks for."""

    model: str
    texts: list[str]
    labels: list[str]
    prompt: str | None


def parse_classify(body: object) -> ClassifyRequest:
    """A ``POST /v1/classify`` body: ``model``, ``input`` (a text or a list of them),
    ``labels`` (a list of strings) and optionally ``prompt`` (holding ``{text}``)."""
    f = Fields(body)
    model = f.string("model", required=True)
    assert model is not None
    value = f.body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise invalid("input", "'input' must be a string or a list of strings", "invalid_type")
    if not texts or len(texts) > MAX_CLASSIFY_INPUTS:
        raise invalid("input", f"'input' must hold 1 to {MAX_CLASSIFY_INPUTS} texts")
    labels = f.body.get("labels")
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise invalid("labels", "'labels' must be a list of strings", "invalid_type")
    return ClassifyRequest(model, texts, labels, f.string("prompt"))


MAX_EMBEDDING_INPUTS = 2048
"""Most inputs one ``POST /v1/embeddings`` may hold (OpenAI's limit)."""


@dataclass(frozen=True)
class EmbeddingRequest:
    """What a ``POST /v1/embeddings`` body asks for."""

    model: str
    inputs: list[str] | list[list[int]]
    base64: bool
    """``encoding_format`` ``"base64"``: each vector as the base64 of its little-endian
    float32 values (what OpenAI's Python client asks for and decodes)."""
    dimensions: int | None
    pooling: str | None
    normalize: bool


def parse_embeddings(body: object, n_vocab: int) -> EmbeddingRequest:
    """A ``POST /v1/embeddings`` body: ``model``, ``input`` (a text, a list of texts, a list
    of token ids or a list of lists of them), ``encoding_format`` (``"float"`` or
    ``"base64"``), ``dimensions``, and tallow's ``pooling`` (``"mean"``, ``"last"``,
    ``"cls"``) and ``normalize`` (default true)."""
    f = Fields(body)
    model = f.string("model", required=True)
    assert model is not None
    value = f.body.get("input")
    if value is None:
        raise invalid("input", "'input' is required", "missing_required_parameter")
    if isinstance(value, str):
        inputs: list[str] | list[list[int]] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        inputs = list(value)
    elif isinstance(value, list) and value and _is_token_ids(value):
        inputs = [_in_vocab("input", value, n_vocab)]
    elif isinstance(value, list) and value and all(_is_token_ids(v) and v for v in value):
        inputs = [_in_vocab("input", v, n_vocab) for v in value]
    else:
        raise invalid(
            "input",
            "'input' must be a string, a non-empty list of strings, a list of token ids or a "
            "list of non-empty lists of token ids",
            "invalid_type",
        )
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise invalid("input", f"'input' may hold at most {MAX_EMBEDDING_INPUTS} inputs")
    encoding = f.string("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise invalid("encoding_format", "'encoding_format' must be 'float' or 'base64'")
    return EmbeddingRequest(
        model,
        inputs,
        encoding == "base64",
        f.integer("dimensions", None, 1, 2**31),
        f.string("pooling"),
        f.boolean("normalize", True),
    )


MAX_RERANK_DOCUMENTS = 1000
"""Most documents one ``POST /v1/rerank`` may hold (Cohere's limit)."""


@dataclass(frozen=True)
class RerankRequest:
    """What a ``POST /v1/rerank`` body asks for."""

    model: str
    query: str
    documents: list[str]
    top_n: int | None
    return_documents: bool
    instruction: str | None


def parse_rerank(body: object) -> RerankRequest:
    """A ``POST /v1/rerank`` body (the Cohere and Jina shape llama.cpp's server takes):
    ``model``, ``query``, ``documents`` (strings, or objects with a ``text``), ``top_n``,
    ``return_documents`` (default false), and Qwen3-Reranker's ``instruction``."""
    f = Fields(body)
    model = f.string("model", required=True)
    query = f.string("query", required=True)
    assert model is not None and query is not None
    value = f.body.get("documents")
    if not isinstance(value, list) or not value:
        raise invalid("documents", "'documents' must be a non-empty list", "invalid_type")
    documents = []
    for item in value:
        text = item.get("text") if isinstance(item, dict) else item
        if not isinstance(text, str):
            raise invalid(
                "documents",
                "each document must be a string or an object with a string 'text'",
                "invalid_type",
            )
        documents.append(text)
    if len(documents) > MAX_RERANK_DOCUMENTS:
        raise invalid("documents", f"'documents' may hold at most {MAX_RERANK_DOCUMENTS}")
    return RerankRequest(
        model,
        query,
        documents,
        f.integer("top_n", None, 1, 2**31),
        f.boolean("return_documents", False),
        f.string("instruction"),
    )


def flat_tools(
    value: object, *, types: tuple[str | None, ...], schema: str
) -> list[dict[str, Any]] | None:
    """Tools given flat, ``{"name", "description", <schema>}`` (as the Responses and Messages
    APIs give them), as OpenAI's function tools; a tool's ``type`` must be one of ``types``
    (None: absent), and ``"strict": true`` closes the objects of its schema."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid("tools", "'tools' must be a list", "invalid_type")
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise invalid("tools", f"tools[{i}] must be an object with a string 'name'")
        if tool.get("type") not in types:
            raise invalid(
                "tools", f"tools[{i}]: tools of type {tool.get('type')!r} are not supported"
            )
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        parameters = tool.get(schema)
        if tool.get("strict") is True and isinstance(parameters, dict):
            try:
                parameters = closed(parameters)
            except GrammarError as e:
                raise invalid("tools", str(e)) from None
        if parameters is not None:
            function["parameters"] = parameters
        tools.append({"type": "function", "function": function})
    return tools or None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens`` are the prompt tokens served from the prefix
    cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def check_model(requested: str, served: Sequence[str]) -> None:
    if requested not in served:
        raise APIError(
            404,
            f"the model '{requested}' does not exist; this server serves '{served[0]}'",
            param="model",
            code="model_not_found",
        )
