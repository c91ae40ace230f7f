"""A GGUF file's structure checked before transformers reads it: every length, count and offset
within the file, every string UTF-8, the special token ids within the vocabulary.

A GGUF file is untrusted input. transformers' reader trusts its counts: a truncated header ends
in ``struct.error``, a tensor count of 2**63 in a ``UnicodeDecodeError`` deep in the reader, an
end-of-sequence id past the vocabulary in an ``IndexError``. :func:`check_gguf` walks the header
(the key/value metadata and the tensor table) with each count bounded by the bytes left, and
refuses a malformed file with one :class:`~llm_gym.errors.InvalidArgumentError` that names the
file, the offset and what is wrong. It reads the header only: the tensor data is not read, only
its extent checked against the file's size.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (little-endian, versions 2
and 3).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = ["GGUF_VERSIONS", "MAX_DIMS", "GgufHeader", "check_gguf"]

GGUF_VERSIONS = (2, 3)
"""The GGUF versions read (version 1 used 32-bit counts; transformers reads 2 and 3)."""

MAX_DIMS = 4
"""The most dimensions a tensor has (ggml's ``GGML_MAX_DIMS``)."""

SPECIAL_TOKEN_KEYS = (
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
)
"""The metadata keys holding token ids, each checked to be an id of the vocabulary."""

# value type -> struct format of one scalar (8: string, 9: array are read apart)
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_KEPT_ARRAYS = frozenset(
    {"tokenizer.ggml.tokens"}
)  # arrays whose values are kept (the rest: counts)


@dataclass
class GgufHeader:
    """What :func:`check_gguf` read from a file's header."""

    version: int
    """The GGUF version (2 or 3)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Key -> value; arrays other than the token list are kept as their length."""
    tensors: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)
    """Tensor name -> (dimensions, ggml type)."""


class _Reader:
    """Bounded little-endian reads from a buffer: each read past the end is refused."""

    def __init__(self, data: memoryview | bytes, path: Path) -> None:
        self.data, self.path, self.pos = data, path, 0

    def fail(self, what: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self.path.name}: not a GGUF file transformers can read ({what}, at byte "
            f"{self.pos:,} of {len(self.data):,}); is the file complete and the right one?"
        )

    def take(self, size: int, what: str) -> memoryview | bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise self.fail(f"{what} runs past the end of the file")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, least_bytes_each: int) -> int:
        """A uint64 count whose items (at least ``least_bytes_each`` bytes each) fit the rest."""
        value = self.scalar("<Q", what)
        if value * least_bytes_each > len(self.data) - self.pos:
            raise self.fail(f"{what} {value:,} does not fit in the file")
        return value

    def string(self, what: str) -> str:
        size = self.count(f"the length of {what}", 1)
        raw = bytes(self.take(size, what))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


def _value(reader: _Reader, kind: int, key: str, keep: bool = True) -> Any:
    if kind in _SCALARS:
        return reader.scalar(_SCALARS[kind], f"the value of {key!r}")
    if kind == _STRING:
        return reader.string(f"the value of {key!r}")
    if kind != _ARRAY:
        raise reader.fail(f"{key!r} has the unknown value type {kind}")
    item = reader.scalar("<I", f"the item type of {key!r}")
    if item == _ARRAY:
        raise reader.fail(f"{key!r} is an array of arrays")
    size = 8 if item == _STRING else struct.calcsize(_SCALARS.get(item, "<B"))
    length = reader.count(f"the length of {key!r}", size)
    if item == _STRING:
        values = [reader.string(f"an item of {key!r}") for _ in range(length)]
        return values if keep else length
    if item not in _SCALARS:
        raise reader.fail(f"{key!r} holds the unknown value type {item}")
    reader.take(length * size, f"the items of {key!r}")
    return length


def check_gguf(path: Path) -> GgufHeader:
    """The header of the GGUF file at ``path``, checked: magic, version, every count and length
    within the file, strings UTF-8, each tensor's dimensions, type and data within the file,
    and the special token ids (:data:`SPECIAL_TOKEN_KEYS`) ids of the token list.

    Raises:
        InvalidArgumentError: One line naming the file, the byte offset and what is wrong.
    """
    import gguf

    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        if size < 24:
            raise InvalidArgumentError(
                f"{path.name}: not a GGUF file transformers can read ({size} bytes, shorter "
                "than a GGUF header); is the file complete and the right one?"
            )
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return _check(_Reader(view, path), gguf)
            finally:
                view.release()


def _check(reader: _Reader, gguf: Any) -> GgufHeader:
    if bytes(reader.take(4, "the magic")) != b"GGUF":
        reader.pos = 0
        raise reader.fail("it does not start with GGUF")
    header = GgufHeader(version=reader.scalar("<I", "the version"))
    if header.version not in GGUF_VERSIONS:
        raise reader.fail(f"version {header.version}, expected one of {GGUF_VERSIONS}")
    tensor_count = reader.count("the tensor count", 8 + 4 + 8 + 4 + 8)
    kv_count = reader.count("the metadata count", 8 + 4)
    extents: list[tuple[str, int, int]] = []
    for _ in range(kv_count):
        key = reader.string("a metadata key")
        kind = reader.scalar("<I", f"the value type of {key!r}")
        header.metadata[key] = _value(reader, kind, key, keep=key in _KEPT_ARRAYS)
    for _ in range(tensor_count):
        name = reader.string("a tensor name")
        dims = reader.scalar("<I", f"the dimension count of {name!r}")
        if not 1 <= dims <= MAX_DIMS:
            raise reader.fail(f"tensor {name!r} has {dims} dimensions, expected 1 to {MAX_DIMS}")
        shape = tuple(reader.scalar("<Q", f"a dimension of {name!r}") for _ in range(dims))
        kind = reader.scalar("<I", f"the type of {name!r}")
        offset = reader.scalar("<Q", f"the data offset of {name!r}")
        header.tensors[name] = (shape, kind)
        extents.append((name, offset, _tensor_bytes(reader, gguf, name, shape, kind)))
    start = _data_start(reader, header)
    for name, offset, size in extents:
        if start + offset + size > len(reader.data):
            raise reader.fail(f"the data of tensor {name!r} lies past the end of the file")
    _check_tokens(reader, header)
    return header


def _tensor_bytes(reader: _Reader, gguf: Any, name: str, shape: tuple, kind: int) -> int:
    """The bytes of a tensor's data; a tensor of an unknown type, or of a shape that its type's
    blocks do not tile, is refused."""
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise reader.fail(f"tensor {name!r} has the unknown type {kind}") from None
    elements = 1
    for dim in shape:
        elements *= dim
    if elements == 0 or shape[0] % block:
        raise reader.fail(f"tensor {name!r} has the shape {list(shape)}, not rows of {block}")
    return elements // block * size


def _data_start(reader: _Reader, header: GgufHeader) -> int:
    """Where the tensor data starts: the end of the header, aligned to ``general.alignment``."""
    alignment = header.metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise reader.fail(f"general.alignment is {alignment!r}, expected a power of two")
    start = -(-reader.pos // alignment) * alignment
    if start > len(reader.data):
        raise reader.fail("the tensor data starts past the end of the file")
    return start


def _check_tokens(reader: _Reader, header: GgufHeader) -> None:
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    count = len(tokens) if isinstance(tokens, list) else 0
    for key in SPECIAL_TOKEN_KEYS:
        value = header.metadata.get(key)
        if value is not None and not (isinstance(value, int) and 0 <= value < count):
            raise reader.fail(f"{key} is {value!r}, not an id of the {count:,} tokens")
