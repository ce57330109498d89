"""tallow: run GGUF language models fast from Python.

>>> import tallow
>>> llm = tallow.LLM()                     # the default model, smollm2-135m, pulled on first use
>>> llm.generate("Once upon a time", max_tokens=32).text

See :class:`LLM` for generation, streaming, tokenization and perplexity, :class:`AsyncLLM`
for many concurrent requests with continuous batching, :mod:`tallow.catalog`
for the model catalog and cache, :mod:`tallow.hub` for models by Hugging Face Hub name
(``tallow.LLM("user/repo:Q4_K_M")``), and ``tallow --help`` for the command line.

The names below are imported on first use, so that ``import tallow`` (and the command line's
start) stays fast.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at startup
if TYPE_CHECKING:
    from tallow.async_llm import AsyncLLM
    from tallow.catalog import DEFAULT_MODEL, pull, resolve_model
    from tallow.classify import Classification
    from tallow.engine import SamplingParams
    from tallow.errors import (
        CatalogError,
        GgufError,
        GrammarError,
        InvalidArgumentError,
        ModelError,
        ModelNotFoundError,
        TallowError,
        TokenizerError,
        UnsupportedError,
    )
    from tallow.llm import LLM, TextStream
    from tallow.output import GenerationResult
    from tallow.rerank import Reranked

    __version__: str

# Each public name and the module that defines it.
_WHERE = {
    "AsyncLLM": "tallow.async_llm",
    "DEFAULT_MODEL": "tallow.catalog",
    "pull": "tallow.catalog",
    "resolve_model": "tallow.catalog",
    "Classification": "tallow.classify",
    "SamplingParams": "tallow.engine",
    "CatalogError": "tallow.errors",
    "GgufError": "tallow.errors",
    "GrammarError": "tallow.errors",
    "InvalidArgumentError": "tallow.errors",
    "ModelError": "tallow.errors",
    "ModelNotFoundError": "tallow.errors",
    "TallowError": "tallow.errors",
    "TokenizerError": "tallow.errors",
    "UnsupportedError": "tallow.errors",
    "LLM": "tallow.llm",
    "GenerationResult": "tallow.output",
    "Reranked": "tallow.rerank",
    "TextStream": "tallow.llm",
}

__all__ = [
    "DEFAULT_MODEL",
    "LLM",
    "AsyncLLM",
    "CatalogError",
    "Classification",
    "GenerationResult",
    "GgufError",
    "GrammarError",
    "InvalidArgumentError",
    "ModelError",
    "ModelNotFoundError",
    "Reranked",
    "SamplingParams",
    "TallowError",
    "TextStream",
    "TokenizerError",
    "UnsupportedError",
    "__version__",
    "pull",
    "resolve_model",
]


def __getattr__(name: str) -> object:
    if name == "__version__":
        from importlib import metadata

        try:
            version: str = metadata.version("tallow")
        except metadata.PackageNotFoundError:  # a source tree, not installed
            version = "0+unknown"
        globals()[name] = version
        return version
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tallow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE, "__version__"])
