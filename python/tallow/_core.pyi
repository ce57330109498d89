"""Type stubs of ``tallow._core``, the Rust extension module (built from rust/tallow-py).

Everything that touches tensors lives here; the public API is :mod:`tallow` (``tallow.LLM``),
which wraps these classes. Calls that compute release the GIL.
"""

import os
from collections.abc import Sequence
from typing import Any, Literal, final, overload

import numpy
import numpy.typing
from typing_extensions import Self

__all__ = [
    "Context",
    "Constraint",
    "GgufError",
    "GrammarError",
    "InvalidArgumentError",
    "KvCache",
    "Model",
    "ModelError",
    "ModelNotFoundError",
    "ReadProbe",
    "Sampler",
    "StreamDecoder",
    "TallowError",
    "TokenizerError",
    "UnsupportedError",
    "convert_checkpoint",
    "dequantize",
    "devices",
    "isa",
    "read_bandwidth",
    "sample_batch",
]

class TallowError(Exception):
    """Base class of every error raised by tallow."""

class GgufError(TallowError):
    """A malformed GGUF file: bad magic, unsupported version, truncated data, an offset or size
    out of range."""

class ModelNotFoundError(TallowError, FileNotFoundError):
    """The model file does not exist."""

class UnsupportedError(TallowError):
    """Something valid but not supported by this build: a tensor type, an architecture."""

class TokenizerError(TallowError):
    """The tokenizer metadata is unusable, or text / ids cannot be converted."""

class ModelError(TallowError):
    """The model cannot run: a missing tensor, bad hyper-parameters, a context overflow, a token
    id out of range."""

class InvalidArgumentError(TallowError, ValueError):
    """An argument is out of range or of the wrong kind."""

class GrammarError(InvalidArgumentError):
    """A constraint on the output (JSON schema, regular expression, choice, grammar) cannot
    be compiled, is beyond the limits on its size and work, or failed while generating."""

def isa() -> str:
    """The instruction set whose kernels run: ``"avx512vnni"``, ``"avx512"``, ``"avx2"``,
    ``"neon"`` or ``"scalar"`` (the best this CPU has, capped by ``TALLOW_ISA``)."""

def read_bandwidth(bytes: int = 1073741824, passes: int = 3) -> float:
    """Bytes per second at which the compute threads read ``bytes`` of memory: the best of
    ``passes`` reads of a buffer made and touched first (the limit of a decode step on the
    CPU, which reads every weight once)."""

@final
class ReadProbe:
    """A buffer of ``bytes`` (rounded up to whole MiB), made and touched once, whose reads the
    compute threads time one at a time: a probe to take turns with decode steps, on a machine
    whose memory's rate moves from one second to the next."""

    def __new__(cls, bytes: int) -> Self: ...
    @property
    def bytes(self) -> int:
        """Bytes one read covers."""
    def seconds(self) -> float:
        """Seconds one read of the whole buffer takes, with the summing loop whose fastest
        read (at construction or since, see :meth:`calibrate`) was the fastest."""
    def calibrate(self) -> None:
        """Reads the buffer once with each summing loop, keeping each loop's fastest read:
        called from time to time, it settles the probe on the loop that reads fastest where
        the memory is fastest."""

def devices() -> list[tuple[str, str, str, int | None]]:
    """The CPU and every GPU found: ``(device, name, backend, memory)`` where ``device`` is what
    ``Model(..., device=...)`` takes (``"cpu"``, ``"wgpu:0"``, ...) and ``memory`` is in bytes
    where the driver says."""

def convert_checkpoint(
    folder: str | os.PathLike[str], out: str | os.PathLike[str], quantize: str | None = None
) -> None:
    """Write the GGUF of the Hugging Face checkpoint in ``folder`` to ``out``, as llama.cpp's
    ``convert_hf_to_gguf.py`` writes it, its matrices rounded as ``llama-quantize`` rounds
    them to the file type ``quantize`` (``"Q4_K_M"``, ``"q8_0"``, ...; ``None``: the
    checkpoint's precision). Written under ``out + ".partial"`` and moved into place once
    whole. Raises UnsupportedError (an architecture tallow does not convert), ModelError (a
    damaged checkpoint), ModelNotFoundError, InvalidArgumentError or TallowError (writing)."""

def dequantize(type_name: str, data: bytes) -> numpy.typing.NDArray[numpy.float32]:
    """Dequantize ``data``, whole blocks of the GGML type ``type_name`` (e.g. ``"Q4_1"``), to a
    1-D float32 array."""

@final
class Model:
    """A GGUF model loaded from disk (memory-mapped): weights, hyper-parameters and tokenizer."""

    def __new__(
        cls,
        path: str | os.PathLike[str],
        *,
        n_ctx: int | None = None,
        device: str = "cpu",
        quantize: str | None = None,
        scratch_dir: str | os.PathLike[str] | None = None,
    ) -> Self:
        """Open and check the GGUF file at ``path`` and prepare the model on ``device``:
        ``"cpu"``, ``"gpu"`` (the first GPU), ``"wgpu:N"`` or ``"cuda:N"`` (see :func:`devices`).
        A Hugging Face checkpoint folder (``config.json``, ``*.safetensors``,
        ``tokenizer.model``) is converted as it loads, its matrices rounded to the
        ``llama-quantize`` file type ``quantize`` (``"q4_k_m"``, ``"q8_0"``, ``"f16"``, ...;
        ``None``: the checkpoint's precision; with a GGUF file, whose tensors are used as they
        are, ``quantize`` is refused), into a file without a name in ``scratch_dir`` (made if
        missing; ``None``: the system's temporary folder) that is gone once the model is: a
        folder on disk keeps the peak memory of the load
        near the model's size.

        ``n_ctx`` is the longest context it will run at: a model with long-context RoPE
        factors (Phi-3 128k) uses them when ``n_ctx`` exceeds its original training context,
        and its short ones otherwise (``None``: the original context).

        Raises ModelNotFoundError, GgufError, UnsupportedError, TokenizerError, ModelError (no
        such GPU, or it failed; a checkpoint that cannot be converted) or
        InvalidArgumentError (a malformed device name, a format ``quantize`` cannot name).
        """
    @property
    def device(self) -> str:
        """The device the model runs on: ``"cpu"``, ``"wgpu:N"`` or ``"cuda:N"``."""
    @property
    def device_info(self) -> tuple[str, str]:
        """``(name, backend)`` of the device the model runs on, as its driver names it."""
    @property
    def decode_weight_bytes(self) -> int:
        """Bytes of weights a decode step reads: every tensor but the token embedding (one row
        of which a step reads), unless the output layer is the embedding itself."""
    @property
    def device_memory(self) -> tuple[int, int] | None:
        """``(in_use, peak)`` bytes the model's backend holds in device memory (weights, KV
        pages, step buffers; the peak since the device was opened), or None on the CPU, whose
        memory is the process's."""
    def read_rate(self, bytes: int) -> float:
        """The rate, in bytes per second, at which the model's device reads ``bytes`` of its
        memory, measured on buffers made for the call (the CPU: the compute threads sum a
        buffer, as :func:`read_bandwidth` does; a GPU: copies between two buffers, counting the
        bytes read and written, up to 1 GiB): a decode step's limit."""
    @property
    def path(self) -> str:
        """The file the model was loaded from (the first part, for a model split into
        several files)."""
    @property
    def file_size(self) -> int:
        """Bytes of the model's GGUF file (of all its parts, for a model split into several)."""
    @property
    def architecture(self) -> str:
        """The GGUF ``general.architecture`` (e.g. ``"llama"``)."""
    @property
    def architecture_features(self) -> list[str]:
        """What the architecture does differently from the plain Llama shape (its RoPE
        style, fused tensors, Q/K norms), in words."""
    @property
    def n_vocab(self) -> int:
        """Vocabulary size (length of a logits row)."""
    @property
    def n_embd(self) -> int:
        """Width of the hidden states (the embedding length)."""
    @property
    def n_ctx_train(self) -> int:
        """The context length the model was trained with."""
    @property
    def n_ctx_max(self) -> int:
        """The most positions a sequence may hold: ``n_ctx_train``, or the original training
        context where the model has long-context RoPE factors and was loaded for a context
        within it."""
    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence token id, if the vocabulary has one."""
    @property
    def eos_id(self) -> int | None:
        """End-of-sequence token id, if the vocabulary has one."""
    @property
    def add_bos(self) -> bool:
        """Whether a BOS token is put in front of a prompt (from GGUF metadata)."""
    @property
    def eog_ids(self) -> list[int]:
        """End-of-generation token ids (EOS, end-of-turn, ...): sampling one ends generation."""
    def metadata(self) -> dict[str, object]:
        """Every GGUF metadata key with its value (lists for arrays)."""
    def metadata_value(self, key: str) -> object | None:
        """The value of one GGUF metadata key (lists for arrays), or None where the file has
        no such key."""
    def tensors(self) -> list[tuple[str, str, list[int]]]:
        """The tensor table: ``(name, type name, dims)`` with dims in GGML order."""
    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of ``text``.

        ``add_special`` adds BOS/EOS as the model's metadata asks; ``parse_special`` matches
        control tokens (e.g. ``<|im_start|>``) written in the text. Raises
        ``InvalidArgumentError`` for text that is not valid Unicode (lone surrogates).
        """
    def quote_special(self, text: str) -> str:
        """``text`` with the control tokens written in it quoted (between U+FDD0 and U+FDD1),
        so that :meth:`tokenize_quoted` keeps them plain text. Raises ``InvalidArgumentError``
        when ``text`` itself holds U+FDD0 or U+FDD1."""
    def tokenize_quoted(self, text: str, add_special: bool) -> list[int]:
        """Token ids of ``text`` with control tokens parsed, except between the quote marks of
        :meth:`quote_special` (which are dropped)."""
    def detokenize(self, ids: list[int]) -> str:
        """The text of ``ids`` (invalid UTF-8 is replaced by U+FFFD)."""
    def stream_decoder(self) -> StreamDecoder:
        """A decoder that turns token ids into text one at a time."""
    def new_context(self, n_ctx: int) -> Context:
        """A new sequence with its own KV cache of ``n_ctx`` positions."""
    def kv_page_bytes(self, page_size: int = 16, dtype: str = "f16") -> int:
        """Bytes of one KV page of ``page_size`` positions for this model (a page holds one
        layer group: every layer, unless sliding-window layers form groups of their own)."""
    def kv_pages_to_hold(self, n_tokens: int, *, page_size: int = 16, chunk: int = 1) -> int:
        """The most KV pages a sequence of ``n_tokens`` positions holds at once when it grows
        by at most ``chunk`` positions at a time (sliding-window layers keep their window)."""
    def new_kv_cache(
        self,
        *,
        page_size: int = 16,
        dtype: str = "f16",
        max_pages: int | None = None,
        max_bytes: int | None = None,
    ) -> KvCache:
        """A paged KV pool shaped for this model (see :class:`KvCache`)."""
    @overload
    def forward(
        self,
        cache: KvCache,
        batch: Sequence[tuple[int, list[int], str] | tuple[int, list[int], str, int]],
        output: Literal["logits"] = "logits",
        *,
        hidden: Literal[False] = False,
        vocab: Sequence[int] | None = None,
        draws: None = None,
    ) -> numpy.typing.NDArray[numpy.float32]:
        """Run one ragged batch of ``(seq, tokens, logits)`` chunks.

        Each chunk's ``tokens`` take the last ``len(tokens)`` positions reserved for ``seq``
        (:meth:`KvCache.reserve`); ``logits`` is ``"none"``, ``"last"`` or ``"all"``, or
        ``"hidden-last"`` / ``"hidden-all"`` for rows that give their final hidden states
        (after the output norm; no LM head runs for them) instead of logits. A chunk
        ``(seq, tokens, logits, parent)`` is a branch: ``seq`` was forked from ``parent``
        (:meth:`KvCache.fork`) after ``parent`` reserved the positions it computes in this
        batch, and takes them as ``parent`` writes them, so that one forward computes a text
        and continuations of it. Returns
        float32 logits of shape ``(rows, n_vocab)``, chunk by chunk; with
        ``output="argmax"`` only each row's greedy token (uint32, shape ``(rows,)``, the first
        largest logit, NaN never), chosen on the model's device; with ``output="draw"``,
        each row's token drawn on the device as ``draws`` says for it (one ``(temperature,
        top_k, top_p, min_p, seed)`` a row, as :meth:`Sampler.next_draw` gives it;
        temperature 0 is greedy), the draws :meth:`Sampler.sample` makes. With
        ``hidden=True`` (which a batch with hidden-state rows needs), returns that and the
        hidden states (float32, ``(rows, n_embd)``, chunk by chunk) as a pair. With
        ``vocab`` (token ids, each below ``n_vocab``), ``output="logits"`` returns only those
        tokens' logits, shape
        ``(rows, len(vocab))``, equal to their columns of the whole logits: the LM head
        computes only their rows.
        """
    @overload
    def forward(
        self,
        cache: KvCache,
        batch: Sequence[tuple[int, list[int], str] | tuple[int, list[int], str, int]],
        output: Literal["argmax"],
        *,
        hidden: Literal[False] = False,
        vocab: None = None,
        draws: None = None,
    ) -> numpy.typing.NDArray[numpy.uint32]: ...
    @overload
    def forward(
        self,
        cache: KvCache,
        batch: Sequence[tuple[int, list[int], str] | tuple[int, list[int], str, int]],
        output: Literal["draw"],
        *,
        hidden: Literal[False] = False,
        vocab: None = None,
        draws: Sequence[tuple[float, int, float, float, int]],
    ) -> numpy.typing.NDArray[numpy.uint32]: ...
    @overload
    def forward(
        self,
        cache: KvCache,
        batch: Sequence[tuple[int, list[int], str] | tuple[int, list[int], str, int]],
        output: Literal["logits", "argmax", "draw"] = "logits",
        *,
        hidden: Literal[False] = False,
        vocab: Sequence[int] | None = None,
        draws: Sequence[tuple[float, int, float, float, int]] | None = None,
    ) -> numpy.typing.NDArray[Any]: ...
    @overload
    def forward(
        self,
        cache: KvCache,
        batch: Sequence[tuple[int, list[int], str] | tuple[int, list[int], str, int]],
        output: Literal["logits", "argmax", "draw"] = "logits",
        *,
        hidden: Literal[True],
        vocab: Sequence[int] | None = None,
        draws: Sequence[tuple[float, int, float, float, int]] | None = None,
    ) -> tuple[numpy.typing.NDArray[Any], numpy.typing.NDArray[numpy.float32]]: ...
    def constraint(
        self,
        kind: Literal["json_schema", "json_object", "regex", "choice", "grammar"],
        spec: str | list[str] | None = None,
    ) -> Constraint:
        """Compile a constraint on an output of this model against its vocabulary: ``kind``
        ``"json_schema"`` (``spec``: the schema as JSON text), ``"json_object"`` (any JSON
        object), ``"regex"`` (the whole output matches it), ``"choice"`` (a list of strings,
        exactly one of them) or ``"grammar"`` (a Lark grammar, llguidance's dialect). Raises
        GrammarError where it cannot be compiled or exceeds the limits on its size and work."""
    def check_constraint(
        self,
        kind: Literal["json_schema", "json_object", "regex", "choice", "grammar"],
        spec: str | list[str] | None = None,
    ) -> None:
        """Raise what :meth:`constraint` would raise for ``kind`` and ``spec``, without making a
        constraint (a server checks a request's before it queues it)."""

@final
class KvCache:
    """A pool of fixed-size KV pages shared by many sequences, with per-sequence page tables,
    reference counts and copy-on-write. Pages are handed out in a deterministic (FIFO) order."""

    def __new__(
        cls,
        n_layer: int,
        n_head_kv: int,
        head_dim: int,
        *,
        page_size: int = 16,
        dtype: str = "f16",
        max_pages: int | None = None,
        max_bytes: int | None = None,
        windows: list[int | None] | None = None,
    ) -> Self:
        """A pool of ``max_pages`` pages, or as many as ``max_bytes`` holds (give one).

        ``windows[layer]`` is each layer's sliding window (``None``: global attention); the
        layers are then grouped, each sequence has a page table per group, and windowed
        groups give back the pages no query sees any more."""
    @property
    def n_groups(self) -> int:
        """Layer groups (page tables per sequence)."""
    @property
    def page_size(self) -> int:
        """Tokens per page."""
    @property
    def n_pages(self) -> int:
        """Pages in the pool."""
    @property
    def n_free(self) -> int:
        """Free pages (cached ones waiting for reuse included)."""
    def create(self, salt: int = 0) -> int:
        """A new, empty sequence (ids are never reused); ``salt`` separates the cached
        prefixes of sequences whose KV differs for the same tokens."""
    def match_prefix(self, tokens: list[int], max_tokens: int, salt: int = 0) -> tuple[int, int]:
        """``(tokens, free_pages)``: the leading tokens of ``tokens`` (at most ``max_tokens``;
        whole pages, then part of one) whose KV is cached, and how many of their pages are
        free."""
    def attach_prefix(self, seq: int, tokens: list[int], max_tokens: int) -> int:
        """Give the empty ``seq`` the cached pages of the longest cached prefix of ``tokens``
        (at most ``max_tokens`` tokens); return the tokens attached."""
    def commit(self, seq: int, tokens: list[int]) -> None:
        """Record the token ids whose KV was written at the next positions of ``seq``,
        caching the pages they complete."""
    def is_cached(self, page: int) -> bool:
        """Whether ``page`` is in the prefix cache."""
    def fork(self, seq: int) -> int:
        """A new sequence sharing every page of ``seq``."""
    def free(self, seq: int) -> list[int]:
        """End ``seq``; return the pages that became free."""
    def truncate(self, seq: int, keep: int) -> list[int]:
        """Keep the first ``keep`` positions of ``seq``; return the pages that became free."""
    def pages_needed(self, seq: int, n: int) -> int:
        """Pages that reserving ``n`` more positions of ``seq`` would take from the free list
        (less those its windowed groups give back)."""
    def max_append(self, seq: int, want: int, free: int) -> int:
        """The most positions, up to ``want``, that ``seq`` can reserve taking at most
        ``free`` pages."""
    def pages_to_hold(self, n_tokens: int, chunk: int = 1) -> int:
        """The most pages a sequence of ``n_tokens`` positions holds at once (all layer
        groups) when it grows by at most ``chunk`` positions at a time."""
    def reserve(self, seq: int, n: int) -> None:
        """Reserve the next ``n`` positions of ``seq`` (all or nothing; ModelError when the
        pool runs out of pages)."""
    def seq_len(self, seq: int) -> int:
        """Positions reserved for ``seq``."""
    def page_table(self, seq: int, layer: int = 0) -> list[int]:
        """The pages of ``seq`` that hold ``layer``, in position order (``2**32 - 1`` where a
        sliding window gave the page back)."""
    def free_pages(self) -> list[int]:
        """The free pages, in the order they will be handed out."""
    def stats(self) -> dict[str, float]:
        """``pages_total``, ``pages_used``, ``pages_free``, ``pages_shared``,
        ``tokens_stored``, ``seq_tokens``, ``n_sequences``, ``page_size``, ``utilization``
        (tokens stored / slots of the pages in use), and the prefix cache's ``cached_pages``,
        ``prefix_queried_tokens``, ``prefix_hit_tokens`` and ``evicted_pages``."""

@final
class StreamDecoder:
    """Incremental detokenizer: never returns half of a UTF-8 character."""

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now complete (possibly ``""``)."""
    def finish(self) -> str:
        """Return whatever is still buffered (incomplete bytes become U+FFFD)."""

@final
class Context:
    """One sequence being evaluated, with its KV cache."""

    @property
    def n_ctx(self) -> int:
        """Capacity of the KV cache, in positions."""
    @property
    def n_past(self) -> int:
        """Number of positions already evaluated."""
    def eval(
        self, tokens: list[int], all_logits: bool = False
    ) -> numpy.typing.NDArray[numpy.float32]:
        """Evaluate ``tokens`` at positions ``n_past..`` and return float32 logits.

        The shape is ``(n_vocab,)`` for the last token, or ``(len(tokens), n_vocab)`` when
        ``all_logits``. Raises ModelError when the tokens would not fit in ``n_ctx``.
        """
    def reset(self) -> None:
        """Forget every position (``n_past`` becomes 0)."""
    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` positions."""

@final
class Sampler:
    """Picks the next token from a logits row for one request."""

    def __new__(
        cls,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int | None = None,
        *,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        logit_bias: dict[int, float] | None = None,
        top_logprobs: int = 0,
        logprobs: bool = False,
        constraint: Constraint | None = None,
        reasoning: tuple[int, list[int], list[int], int | None, bool] | None = None,
    ) -> Self:
        """``temperature`` 0 means greedy (argmax); ``top_k`` 0, ``top_p`` 1.0 and ``min_p``
        0 are off; ``seed`` None draws a random seed. Penalties apply to tokens this sampler
        has produced or been given with :meth:`accept`; ``logit_bias`` is added to the logits
        of its tokens (``-inf`` bans one). Log probabilities of the chosen tokens are computed
        only with ``logprobs`` or ``top_logprobs`` > 0 (NaN otherwise). With ``constraint``
        (which it takes over: one sampler per constraint) only the tokens it allows are
        chosen, and each chosen token advances it. ``reasoning`` is ``(start, end, close, budget,
        opened)``: the output may reason in a block that the token ``start`` opens (already
        open when ``opened``; else opened by a first token ``start``) and that ends once the
        output ends with the tokens ``end``, free of the constraint, which applies after the
        block; after ``budget`` tokens (None: no limit) the tokens ``close`` are chosen, one
        by one."""
    @property
    def is_reasoning(self) -> bool:
        """Whether the output is inside its reasoning block (or may still open one)."""
    def sample(self, logits: numpy.typing.NDArray[numpy.float32]) -> int:
        """The sampled token id (remembered for the penalties)."""
    def accept(self, tokens: list[int]) -> None:
        """Remember tokens for the penalties without sampling (e.g. the prompt)."""
    def verify(
        self,
        logits: numpy.typing.NDArray[numpy.float32],
        draft: list[int],
        draft_probs: numpy.typing.NDArray[numpy.float32] | None = None,
    ) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """Speculative verification: ``logits`` has ``len(draft) + 1`` rows (row ``i``
        predicts the token after the first ``i`` draft tokens), ``draft_probs`` the
        distribution each draft token was drawn from (None: proposed with certainty). Returns
        ``(token, logprob, top_logprobs)`` for the accepted draft tokens and one more, with the
        distribution :meth:`sample` gives."""
    @property
    def is_plain_greedy(self) -> bool:
        """Whether the choice is a row's argmax and nothing more (greedy, no penalties, bias
        or log probabilities): ``Model.forward(..., output="argmax")`` then serves it."""
    @property
    def draws_on_device(self) -> bool:
        """Whether the choice is drawn from the raw logits and nothing more (no penalties,
        bias, constraint or log probabilities): the model's device can then draw it,
        ``Model.forward(..., output="draw", draws=[sampler.next_draw()])``."""
    def next_draw(self) -> tuple[float, int, float, float, int]:
        """How the next token is drawn, ``(temperature, top_k, top_p, min_p, seed)``, its
        seed taken from the random state as :meth:`sample` takes it."""
    def take_drawn(
        self, drawn: list[int], draft: list[int]
    ) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """:meth:`verify` (or :meth:`sample` with no draft) given only the tokens the device
        drew from each row (``len(draft) + 1`` of them; a draft only for a greedy sampler):
        the draft tokens kept while they equal the argmax, then one more; log probabilities
        NaN. Only for a sampler that :attr:`draws_on_device`."""
    def draft(
        self, logits: numpy.typing.NDArray[numpy.float32]
    ) -> tuple[int, numpy.typing.NDArray[numpy.float32]]:
        """Draw a token to propose from a draft model's logits row (not remembered); return
        it with the distribution it was drawn from."""

def sample_batch(
    samplers: list[Sampler], logits: numpy.typing.NDArray[numpy.float32]
) -> list[tuple[int, float, list[tuple[int, float]]] | TallowError]:
    """Sample row ``i`` of ``logits`` (shape ``(len(samplers), n_vocab)``) with
    ``samplers[i]``, all rows in parallel. Returns ``(token, logprob, top_logprobs)`` per row:
    log probabilities of the raw logits, the most likely tokens first; for a row that could
    not be sampled (its constraint failed, every token banned) the exception, unraised."""

@final
class Constraint:
    """A compiled constraint on one request's output (:meth:`Model.constraint`), for the
    :class:`Sampler` that takes it over."""
