"""HF ``tokenizers`` as the oracle of SmolLM2's tokenizer, shared by the tokenizer tests and
``benches/tokenizer_bench.py``."""

from __future__ import annotations

from pathlib import Path

import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def _gguf_strings(reader: gguf.GGUFReader, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def build_hf_tokenizer(path: Path) -> Tokenizer:
    """HF's byte-level BPE over a GGUF's vocabulary and merges, with the pre-tokenizer SmolLM2
    declares (``smollm``: every digit alone, then the GPT-2 regex)."""
    reader = gguf.GGUFReader(path)
    assert bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode() == "smollm"
    tokens = _gguf_strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _gguf_strings(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok
