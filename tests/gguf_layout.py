"""A minimal GGUF header walker for the tests: where each field sits in the file.

Written from the GGUF specification, independently of the reader under test, so that the tests
can damage one field of a real model file in place.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

# Fixed sizes of the scalar metadata value types, by type id.
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass
class TensorRecord:
    name: str
    dims: list[int]
    type_id: int
    offset: int
    type_pos: int
    """File position of the u32 type id."""
    offset_pos: int
    """File position of the u64 data offset."""


@dataclass
class Layout:
    version: int
    version_pos: int
    values: dict[str, tuple[int, int, int]]
    """key -> (value type id, file position of the value, value size in bytes)."""
    tensors: list[TensorRecord]
    alignment: int
    data_start: int


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return int(value)

    def string(self) -> str:
        n = self.take("Q")
        text = self.data[self.pos : self.pos + n].decode("utf-8")
        self.pos += n
        return text

    def skip_value(self, type_id: int) -> None:
        if type_id == _STRING:
            n = self.take("Q")
            self.pos += n
        elif type_id == _ARRAY:
            item_type = self.take("I")
            count = self.take("Q")
            if item_type in _SCALAR_SIZES:
                self.pos += count * _SCALAR_SIZES[item_type]
            else:
                for _ in range(count):
                    self.skip_value(item_type)
        else:
            self.pos += _SCALAR_SIZES[type_id]


def read_layout(path: Path, header_bytes: int = 8 << 20) -> Layout:
    """Walk the header (assumed to fit in the first ``header_bytes`` of the file)."""
    with open(path, "rb") as f:
        data = f.read(header_bytes)
    cur = _Cursor(data)
    assert data[:4] == b"GGUF"
    cur.pos = 4
    version_pos = cur.pos
    version = cur.take("I")
    n_tensors = cur.take("Q")
    n_kv = cur.take("Q")
    values: dict[str, tuple[int, int, int]] = {}
    alignment = 32
    for _ in range(n_kv):
        key = cur.string()
        type_id = cur.take("I")
        start = cur.pos
        if key == "general.alignment":
            alignment = struct.unpack_from("<I", data, start)[0]
        cur.skip_value(type_id)
        values[key] = (type_id, start, cur.pos - start)
    tensors = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("I")
        dims = [cur.take("Q") for _ in range(n_dims)]
        type_pos = cur.pos
        type_id = cur.take("I")
        offset_pos = cur.pos
        offset = cur.take("Q")
        tensors.append(TensorRecord(name, dims, type_id, offset, type_pos, offset_pos))
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    return Layout(version, version_pos, values, tensors, alignment, data_start)


def patched_copy(
    src: Path, dst: Path, patches: dict[int, bytes], length: int | None = None
) -> Path:
    """Copy ``src`` to ``dst`` (its first ``length`` bytes if given) and overwrite bytes at the
    given positions."""
    data = bytearray(src.read_bytes() if length is None else src.read_bytes()[:length])
    for pos, new in patches.items():
        data[pos : pos + len(new)] = new
    dst.write_bytes(bytes(data))
    return dst
