"""Malformed GGUF files (llm_gym.policies.gguf_check, and the conversion and the CLI that run
it): each is one line naming the file and what is wrong, before transformers reads it.

================================  =====================================  ======================
case                              without a fix                          what holds
================================  =====================================  ======================
a header cut short (in the        ``struct.error`` from transformers'    refused, one line:
counts, the metadata, the tensor  reader, a traceback                    what runs past the end
table, the tensor data)                                                  of the file
a tensor or metadata count of     ``UnicodeDecodeError`` or "not a       refused: the count does
2**63, a string or an array of    valid JSON file" deep in the reader    not fit in the file
2**62 items
an end-of-sequence id past the    ``IndexError`` in the tokenizer        refused, naming the key
token list                        conversion                             and the token count
another magic, version 1, an      tracebacks of several kinds            refused, one line each
unknown value or tensor type,
0 or 9 dimensions, a key that is
not UTF-8
================================  =====================================  ======================
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.gguf_check import check_gguf
from tests.tiny_gguf import write_tiny_gguf

MAX = (1 << 63) - 1


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    return write_tiny_gguf(tmp_path_factory.mktemp("good") / "tiny.gguf").read_bytes()


def _refused(path: Path, *expected: str) -> str:
    with pytest.raises(InvalidArgumentError) as caught:
        check_gguf(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path.name}: not a GGUF file")
    for text in expected:
        assert text in message
    return message


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _header(kv: bytes, kv_count: int = 1, tensors: int = 0, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, kv_count) + kv


def test_the_tiny_file_passes_and_is_read(tmp_path, good) -> None:
    (tmp_path / "m.gguf").write_bytes(good)
    header = check_gguf(tmp_path / "m.gguf")
    assert header.version == 3 and len(header.tensors) == 20
    assert header.metadata["general.architecture"] == "llama"
    assert len(header.metadata["tokenizer.ggml.tokens"]) == 261
    assert header.metadata["tokenizer.ggml.merges"] == 2  # other arrays: their length
    assert header.tensors["token_embd.weight"] == ((64, 261), 8)  # ggml order, Q8_0


@pytest.mark.parametrize("cut", [0, 10, 23, 24, 40, 3000, 5000, -4000, -10])
def test_a_file_cut_short_is_refused(tmp_path, good, cut) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(good[:cut])
    message = _refused(path)
    assert any(
        text in message
        for text in ("shorter than a GGUF header", "past the end of the file", "does not fit")
    )


@pytest.mark.parametrize(
    ("offset", "what"), [(8, "the tensor count"), (16, "the metadata count"), (24, "length of")]
)
def test_counts_that_do_not_fit_the_file_are_refused(tmp_path, good, offset, what) -> None:
    data = bytearray(good)
    data[offset : offset + 8] = struct.pack("<Q", MAX)
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    _refused(tmp_path / "m.gguf", what, "does not fit in the file")


def test_an_array_too_long_for_the_file_is_refused(tmp_path) -> None:
    kv = _string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 1 << 62)
    (tmp_path / "m.gguf").write_bytes(_header(kv) + b"\0" * 64)
    _refused(tmp_path / "m.gguf", "the length of 'tokenizer.ggml.tokens'", "does not fit")


def test_an_eos_id_past_the_tokens_is_refused(tmp_path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", eos_token_id=1_000_000)
    _refused(path, "tokenizer.ggml.eos_token_id is 1000000, not an id of the 261 tokens")


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"GGML" + bytes(40), "does not start with GGUF"),
        (_header(b"", 0, version=1) + bytes(8), "version 1"),
        (_header(_string(b"k") + struct.pack("<I", 13)) + bytes(8), "unknown value type 13"),
        (_header(_string(b"k") + struct.pack("<III", 9, 9, 0)) + bytes(8), "array of arrays"),
        (_header(_string(b"\xff\xfe") + struct.pack("<IB", 0, 1)) + bytes(8), "not UTF-8"),
        (_header(_string(b"t") + struct.pack("<I", 0), 0, 1) + bytes(64), "0 dimensions"),
        (_header(_string(b"t") + struct.pack("<I", 9), 0, 1) + bytes(64), "9 dimensions"),
        (
            _header(_string(b"t") + struct.pack("<IQIQ", 1, 32, 99, 0), 0, 1) + bytes(64),
            "unknown type 99",
        ),
        (
            _header(_string(b"t") + struct.pack("<IQIQ", 1, 31, 8, 0), 0, 1) + bytes(64),
            "not rows of 32",
        ),
        (
            _header(_string(b"t") + struct.pack("<IQIQ", 1, 1 << 40, 0, 0), 0, 1) + bytes(64),
            "lies past the end",
        ),
    ],
)
def test_malformed_headers_are_refused_in_one_line(tmp_path, data, what) -> None:
    (tmp_path / "m.gguf").write_bytes(data)
    _refused(tmp_path / "m.gguf", what)


def test_the_conversion_and_the_cli_refuse_a_malformed_file(
    tmp_path, good, monkeypatch, capsys
) -> None:
    """The conversion checks the staged copy before transformers reads it, and leaves nothing in
    the cache; ``llm-gym fetch-model FILE.gguf`` ends in one line, exit 2."""
    pytest.importorskip("transformers")
    from llm_gym.cli import main
    from llm_gym.policies.gguf import convert_gguf

    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "m.gguf"
    data = bytearray(good)
    data[8:16] = struct.pack("<Q", MAX)
    path.write_bytes(bytes(data))
    with pytest.raises(InvalidArgumentError, match="the tensor count"):
        convert_gguf(path)
    left = [p.name for p in (tmp_path / "cache" / "models").iterdir()]
    assert len(left) == 1 and left[0].endswith(".lock")
    capsys.readouterr()
    assert main(["fetch-model", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("llm-gym fetch-model: error: m.gguf: not a GGUF file")
    assert not any("Traceback" in line for line in lines)
