"""The tokenizer against its oracles, through the public Python API.

- llama.cpp: the ids in ``shared/reference/tokenizer`` (``TEXT.smollm2.ids.json`` for ``TEXT.*``).
- HF ``tokenizers``: a byte-level BPE built from the GGUF's own vocabulary and merges, with the
  pre-tokenizer SmolLM2 declares (``smollm``: every digit alone, then the GPT-2 regex), on a few
  MB of the Python standard library's sources and on seeded random Unicode text.
"""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

import pytest
from hf_reference import build_hf_tokenizer
from tokenizers import Tokenizer

import tallow

# Standard-library packages whose sources make the corpus (about 5 MB of Python).
STDLIB_PACKAGES = (
    "email",
    "json",
    "asyncio",
    "unittest",
    "xml",
    "http",
    "importlib",
    "logging",
    "concurrent",
    "multiprocessing",
    "idlelib",
    "tkinter",
)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_path: Path) -> Tokenizer:
    """HF's byte-level BPE over SmolLM2's GGUF vocabulary and merges."""
    return build_hf_tokenizer(smollm2_path)


def _stdlib_corpus() -> list[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    corpus = []
    for package in STDLIB_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            try:
                corpus.append((str(path.relative_to(root)), path.read_bytes().decode("utf-8")))
            except UnicodeDecodeError:
                continue  # a source declaring another encoding is not text for this test
    return corpus


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


def _first_difference(a: list[int], b: list[int]) -> int:
    differ = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return next(differ, min(len(a), len(b)))


def _assert_same_ids(
    llm: tallow.LLM, hf: Tokenizer, corpus: list[tuple[str, str]]
) -> tuple[int, int]:
    """Every text: tallow's ids == HF's, and both decode them back to the text."""
    mismatches = []
    n_tokens = 0
    for name, text in corpus:
        ours = llm.tokenize(text, add_special=False)
        theirs = hf.encode(text, add_special_tokens=False).ids
        n_tokens += len(theirs)
        if ours != theirs:
            i = _first_difference(ours, theirs)
            mismatches.append(f"{name}: id #{i}: {ours[i : i + 5]} vs HF {theirs[i : i + 5]}")
        elif llm.detokenize(ours) != text or hf.decode(theirs) != text:
            mismatches.append(f"{name}: does not decode back to the text")
    assert not mismatches, f"{len(mismatches)} of {len(corpus)} texts differ:\n" + "\n".join(
        mismatches[:10]
    )
    return len(corpus), n_tokens


def test_matches_llama_cpp_reference_ids(smollm2: tallow.LLM, reference_dir: Path) -> None:
    tokenizer_dir = reference_dir / "tokenizer"
    cases = sorted(tokenizer_dir.glob("*.smollm2.ids.json"))
    assert len(cases) >= 3, cases
    for ids_path in cases:
        stem = ids_path.name.removesuffix(".smollm2.ids.json")
        (text_path,) = [
            p
            for p in tokenizer_dir.iterdir()
            if p.name.split(".", 1)[0] == stem and not p.name.endswith(".ids.json")
        ]
        # Raw bytes: no newline translation.
        text = text_path.read_bytes().decode("utf-8")
        expected = json.loads(ids_path.read_text())
        ids = smollm2.tokenize(text, add_special=False)
        assert ids == expected, (text_path.name, _first_difference(ids, expected))
        assert smollm2.detokenize(ids) == text


def test_matches_hf_tokenizers_on_stdlib_sources(
    smollm2: tallow.LLM, hf_tokenizer: Tokenizer
) -> None:
    corpus = _stdlib_corpus()
    size = sum(len(text.encode()) for _, text in corpus)
    assert size > 3_000_000, f"corpus too small: {size} bytes in {len(corpus)} files"
    _, n_tokens = _assert_same_ids(smollm2, hf_tokenizer, corpus)
    assert n_tokens > size // 8  # the comparison really covered the corpus


def test_matches_hf_tokenizers_on_random_unicode(
    smollm2: tallow.LLM, hf_tokenizer: Tokenizer
) -> None:
    # SmolLM2 has no token for a few bytes (0x04, 0xF1, ...). Both llama.cpp and HF drop such
    # bytes, but differently (HF lets their neighbours merge), so they are left out here.
    vocab = hf_tokenizer.get_vocab()
    has_token = {b for b, c in _byte_level_chars().items() if c in vocab}
    assert 0x04 not in has_token and ord("a") in has_token

    def representable(c: str) -> bool:
        return all(b in has_token for b in c.encode())

    rng = random.Random(20240611)
    pools = [
        "abcXYZ sStTmMdDlLrReEvV 0123456789 \n\t\r.,;:!?()[]{}<>-_=+*/\\|@#$%^&`~'\"",
        "\x85\xa0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000\x1c\x1f\u180e\u200b\x0b\x0c",
        "٠٣۳०௧０Ⅻ½²𝟎𐄇",
    ]

    def char() -> str:
        kind = rng.randrange(6)
        if kind < 3:
            return rng.choice(pools[kind])
        lo, hi = [(0x80, 0x2FFF), (0x3000, 0xD7FF), (0x10000, 0x10FFFF)][kind - 3]
        return chr(rng.randint(lo, hi))

    corpus = []
    for i in range(600):
        text = "".join(char() for _ in range(rng.randint(1, 300)))
        corpus.append((f"random #{i}", "".join(c for c in text if representable(c))))
    _assert_same_ids(smollm2, hf_tokenizer, corpus)
