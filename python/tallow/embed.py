"""Embeddings as the front ends ask for them: what to embed, checked, turned into requests,
and their vectors finished (:class:`EmbedTask`). :class:`tallow.LLM`, :class:`tallow.AsyncLLM`
and the server's ``/v1/embeddings`` all go through it; the pooling itself is
:mod:`tallow.pooling`'s.

Texts are tokenized with the special tokens the model's metadata asks for (BOS, and EOS where
the model appends it, as Qwen3-Embedding does); control-token text in them stays plain text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from tallow import _core, checks, pooling
from tallow.engine import SamplingParams
from tallow.errors import InvalidArgumentError, ModelError
from tallow.output import RequestOutput
from tallow.prompt import Prompts

__all__ = ["EmbedTask", "inputs"]


def inputs(value: object) -> list[str] | list[list[int]]:
    """What to embed, checked: a text, a list of texts, a list of token ids (one input) or a
    list of lists of token ids; never empty."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Sequence) or isinstance(value, (bytes, bytearray)) or not value:
        raise InvalidArgumentError(
            "input must be a text, a non-empty list of texts, a list of token ids or a list of "
            "token id lists"
        )
    items = list(value)
    if all(isinstance(v, str) for v in items):
        return cast(list[str], items)
    if all(_is_id(v) for v in items):
        return [cast(list[int], items)]
    if all(isinstance(v, Sequence) and not isinstance(v, (str, bytes, bytearray)) for v in items):
        lists = [list(cast(Sequence[object], v)) for v in items]
        if all(ids and all(_is_id(t) for t in ids) for ids in lists):
            return cast(list[list[int]], lists)
    raise InvalidArgumentError(
        "input must be a text, a list of texts, a list of token ids or a list of non-empty "
        "token id lists (not a mix)"
    )


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class EmbedTask:
    """Embeddings of one kind for one model: ``pooling`` (``None``: the model's, see
    :func:`tallow.pooling.default_pooling`), ``normalize`` (scale each vector to unit length)
    and ``dimensions`` (keep the first so many values, for models trained to allow it, see
    :func:`tallow.pooling.dimensions`; ``None``: all of them). Checked when made
    (:class:`InvalidArgumentError`)."""

    def __init__(
        self,
        prompts: Prompts,
        pooling_name: object = None,
        normalize: object = True,
        dimensions: object = None,
    ) -> None:
        model = prompts.model
        self._prompts = prompts
        self.pooling = pooling.pooling(pooling_name, model)
        self.normalize = checks.boolean("normalize", normalize)
        self.dimensions = pooling.dimensions(dimensions, model)
        self.params = SamplingParams(max_tokens=None, pooling=self.pooling)

    @property
    def model(self) -> _core.Model:
        return self._prompts.model

    def prompt_ids(self, item: str | list[int]) -> list[int]:
        """The token ids that embed ``item`` (a text, or token ids checked against the
        vocabulary); :class:`ModelError` where they are longer than the context."""
        model = self.model
        if isinstance(item, str):
            ids = model.tokenize(checks.text("input", item), True, False)
            ids = ids or self._prompts.with_bos([])
            if not ids:
                raise InvalidArgumentError("an empty text has no tokens to embed with this model")
        else:
            ids = checks.token_ids("input", item, model.n_vocab)
        n_ctx = self._prompts.n_ctx
        if len(ids) > n_ctx:
            raise ModelError(
                f"an input of {len(ids)} tokens is longer than the context ({n_ctx} tokens)"
            )
        return ids

    def result(self, out: RequestOutput) -> npt.NDArray[np.float32]:
        """The vector of a finished embedding request."""
        if out.error is not None:
            raise out.error
        assert out.embedding is not None, "an embedding request ends with its embedding"
        return pooling.finish(out.embedding, normalize=self.normalize, dimensions=self.dimensions)
