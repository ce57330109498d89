"""tallow: run GGUF language models fast from Python.

>>> import tallow
>>> llm = tallow.LLM()                     # the default model, smollm2-135m, pulled on first use
>>> llm.generate("Once upon a time", max_tokens=32).text

See :class:`LLM` for generation, streaming, tokenization and perplexity, :class:`AsyncLLM`
for many concurrent requests with continuous batching, :mod:`tallow.catalog`
for the model catalog and cache, and ``tallow --help`` for the command line.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from tallow.async_llm import AsyncLLM, Completion
from tallow.catalog import DEFAULT_MODEL, pull, resolve_model
from tallow.engine import SamplingParams
from tallow.errors import (
    CatalogError,
    GgufError,
    InvalidArgumentError,
    ModelError,
    ModelNotFoundError,
    TallowError,
    TokenizerError,
    UnsupportedError,
)
from tallow.llm import LLM, GenerationResult, TextStream

try:
    __version__: str = _metadata.version("tallow")
except _metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_MODEL",
    "LLM",
    "AsyncLLM",
    "CatalogError",
    "Completion",
    "GenerationResult",
    "GgufError",
    "InvalidArgumentError",
    "ModelError",
    "ModelNotFoundError",
    "SamplingParams",
    "TallowError",
    "TextStream",
    "TokenizerError",
    "UnsupportedError",
    "__version__",
    "pull",
    "resolve_model",
]
