"""The exception hierarchy of tallow.

Every error tallow raises on purpose is a :class:`TallowError`. The classes are defined in
:mod:`tallow._core` (the Rust core raises them) and re-exported here; the Python layer adds
:class:`CatalogError`.
"""

from __future__ import annotations

from tallow._core import (
    GgufError,
    GrammarError,
    InvalidArgumentError,
    ModelError,
    ModelNotFoundError,
    TallowError,
    TokenizerError,
    UnsupportedError,
)

__all__ = [
    "CatalogError",
    "GgufError",
    "GrammarError",
    "InvalidArgumentError",
    "ModelError",
    "ModelNotFoundError",
    "TallowError",
    "TokenizerError",
    "UnsupportedError",
]


class CatalogError(TallowError):
    """A problem with the model catalog: an unknown model name, a failed download, a file whose
    size or sha256 does not match the catalog."""
