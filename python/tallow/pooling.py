"""Pooling: an embedding request's final hidden states folded into one vector.

An embedding request is a prompt that generates nothing: it runs through the scheduler like any
other, in the same steps as generation, and each of its chunks returns the final hidden states
(after the model's output norm; no LM head runs) of the rows its pooling needs
(:attr:`tallow.scheduler.Request.pooling`). The engine folds them into one vector per request
with a :class:`Pooler`; :func:`finish` truncates and normalizes it as the caller asks (see
:mod:`tallow.embed` for the front ends' side).

The pooling comes from the model's GGUF metadata (``<arch>.pooling_type``, as llama.cpp writes
it: mean, CLS, last token) or is chosen per call; a model that does not say (a generative
model) pools its last token, as decoder embedding models such as Qwen3-Embedding do.
"""

from __future__ import annotations

import math
import re

import numpy as np
import numpy.typing as npt

from tallow import _core, checks
from tallow.scheduler import Pooling

__all__ = [
    "POOLINGS",
    "Pooler",
    "default_pooling",
    "dimensions",
    "finish",
    "is_embedding_model",
    "is_rank_model",
    "pooling",
    "truncatable",
]

POOLINGS: tuple[Pooling, ...] = ("mean", "last", "cls")
"""The poolings tallow runs."""

# llama.cpp's enum llama_pooling_type, as <arch>.pooling_type holds it.
_GGUF_POOLING: dict[int, Pooling | None] = {0: None, 1: "mean", 2: "cls", 3: "last", 4: None}
_RANK = 4


def _pooling_type(model: _core.Model) -> int | None:
    value = model.metadata_value(f"{model.architecture}.pooling_type")
    return value if isinstance(value, int) else None


def default_pooling(model: _core.Model) -> Pooling:
    """The pooling ``model``'s metadata names, else last-token pooling."""
    return _GGUF_POOLING.get(_pooling_type(model) or 0) or "last"


def is_embedding_model(model: _core.Model) -> bool:
    """Whether ``model``'s metadata says it is made for embeddings (it names a pooling)."""
    return _GGUF_POOLING.get(_pooling_type(model) or 0) is not None


def is_rank_model(model: _core.Model) -> bool:
    """Whether ``model``'s metadata says it is a reranker (``pooling_type`` rank)."""
    return _pooling_type(model) == _RANK


def pooling(value: object, model: _core.Model) -> Pooling:
    """``value`` checked as a pooling (``None``: the model's default)."""
    if value is None:
        return default_pooling(model)
    if value not in POOLINGS:
        raise checks.invalid(
            "pooling", f"pooling must be one of {', '.join(POOLINGS)}, got {checks.describe(value)}"
        )
    return value


_MATRYOSHKA = (
    "qwen3-embedding",
    "embeddinggemma",
    "nomic-embed-text-v1.5",
    "nomic-embed-text-v2",
    "mxbai-embed-large-v1",
    "jina-embeddings-v3",
    "snowflake-arctic-embed-m-v1.5",
    "snowflake-arctic-embed-l-v2.0",
)
"""Embedding models trained so that the first values of a vector are an embedding of their own
(Matryoshka representation learning), as their ``general.basename`` or ``general.name`` spells
them (lower case, words joined by ``-``)."""


def truncatable(model: _core.Model) -> bool:
    """Whether ``model`` was trained for embeddings cut to their first values: one of the
    Matryoshka families :data:`_MATRYOSHKA` lists, by its name in the metadata."""
    for key in ("general.basename", "general.name"):
        name = model.metadata_value(key)
        if isinstance(name, str):
            spelled = re.sub(r"[\s_]+", "-", name.strip().lower())
            if any(family in spelled for family in _MATRYOSHKA):
                return True
    return False


def dimensions(value: object, model: _core.Model) -> int | None:
    """``value`` checked as how many values of ``model``'s embeddings to keep (``None``: all):
    fewer than all only for a model trained for it (:func:`truncatable`), as OpenAI and vLLM
    refuse ``dimensions`` for other models (their vectors cut short lose what they say)."""
    if value is None:
        return None
    width = model.n_embd
    kept = checks.integer("dimensions", value, 1, width)
    if kept < width and not truncatable(model):
        raise checks.invalid(
            "dimensions",
            f"dimensions: this model's embeddings have {width} values and it was not trained "
            "for shorter ones (Matryoshka models such as Qwen3-Embedding are); leave "
            "dimensions out",
        )
    return kept


class Pooler:
    """Folds the hidden-state rows of one embedding request's chunks into its vector."""

    def __init__(self, pooling: Pooling, width: int) -> None:
        self.pooling = pooling
        self._sum = np.zeros(width, dtype=np.float64)
        self._count = 0
        self._vector: npt.NDArray[np.float32] | None = None

    def add(self, rows: npt.NDArray[np.float32], start_pos: int) -> None:
        """Take the rows a chunk starting at position ``start_pos`` produced. A chunk at
        position 0 starts the request over (it was preempted and is computed again)."""
        if start_pos == 0:
            self._sum[:] = 0.0
            self._count = 0
            self._vector = None
        if not len(rows):
            return
        if self.pooling == "mean":
            self._sum += rows.sum(axis=0, dtype=np.float64)
            self._count += len(rows)
        elif self.pooling == "cls":
            if start_pos == 0:
                self._vector = rows[0].copy()
        else:
            self._vector = rows[-1].copy()

    def result(self) -> npt.NDArray[np.float32]:
        """The pooled vector, once the last chunk was added."""
        if self.pooling == "mean":
            assert self._count, "mean pooling of no rows"
            return (self._sum / self._count).astype(np.float32)
        assert self._vector is not None, "no row was pooled"
        return self._vector


def finish(
    vector: npt.NDArray[np.float32], *, normalize: bool = True, dimensions: int | None = None
) -> npt.NDArray[np.float32]:
    """``vector`` cut to its first ``dimensions`` values (for models trained to allow it, as
    Matryoshka embeddings are) and, with ``normalize``, scaled to unit length (L2)."""
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        norm = math.sqrt(float(np.dot(vector.astype(np.float64), vector)))
        if norm > 0.0:
            vector = (vector / norm).astype(np.float32)
    return vector
