"""The GGUF conversion itself (llm_gym.policies.gguf) on a tiny Llama GGUF written with
``gguf.GGUFWriter`` (tests/tiny_gguf.py): transformers' own dequantizing path, the folder it
writes, a forward pass on it, and what the conversion reads.

================================  =====================================  ======================
case                              without a fix                          what holds
================================  =====================================  ======================
a ``tokenizer.json`` and a        read into the result (14 ids past      the file is staged
``config.json`` planted beside    the embedding: the forward pass        alone; neither is read
the GGUF                          raised), cached under the GGUF's hash
a file that changes while it is   the cache keyed on bytes other than    refused: the copy's
read                              the ones converted                     digest is checked
a tokenizer with more tokens      converted; the first such id fails     refused, one line
than the model's embedding rows   the forward pass
``kernels`` installed             the loader asks the model hub for a    no hub kernel asked
                                  GGUF kernel                            for while converting
================================  =====================================  ======================
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from llm_gym.errors import InvalidArgumentError, LlmGymError  # noqa: E402
from llm_gym.policies import gguf as gguf_mod  # noqa: E402
from tests.tiny_gguf import CHAT_TEMPLATE, write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def _gguf(tmp_path: Path, **kwargs) -> Path:
    folder = tmp_path / "files"
    folder.mkdir(exist_ok=True)
    return write_tiny_gguf(folder / "tiny.gguf", **kwargs)


def _logits(folder: Path, text: str = "hello") -> tuple[torch.Tensor, list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(text)["input_ids"]
    with torch.no_grad():
        return model(torch.tensor([ids])).logits, ids


def test_a_tiny_llama_gguf_converts_to_a_dense_folder_that_runs(
    tmp_path, cache, monkeypatch
) -> None:
    """The real conversion, on transformers' dequantizing path (one load, asked for dense
    weights): a folder of dense fp32 safetensors, no quantization config, the file's chat
    template; its forward pass equals transformers' own dequantized GGUF model."""
    loads: list[dict] = []
    real = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def recorded(cls, *args, **kwargs):
        loads.append(kwargs)
        return real(cls, *args, **kwargs)

    file = _gguf(tmp_path)
    with monkeypatch.context() as patch:
        patch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(recorded))
        folder = gguf_mod.convert_gguf(file)
    assert len(loads) == 1 and loads[0]["quantization_config"].dequantize is True
    assert folder == cache / f"gguf-{hashlib.sha256(file.read_bytes()).hexdigest()[:16]}"
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["vocab_size"] == 261
    assert not any(key.endswith("name_or_path") for key in config)  # not the staging folder
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        dtypes = {weights.get_slice(k).get_dtype() for k in weights.keys()}  # noqa: SIM118
    assert dtypes == {"F32"}
    logits, ids = _logits(folder)
    assert ids == [256, 257, ord("o")] and logits.shape == (1, 3, 261)
    direct = transformers.AutoModelForCausalLM.from_pretrained(
        str(file.parent),
        gguf_file=file.name,
        quantization_config=transformers.GgufConfig(dequantize=True),
        dtype=torch.float32,
    ).eval()
    with torch.no_grad():
        assert torch.equal(direct(torch.tensor([ids])).logits, logits)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == CHAT_TEMPLATE and tokenizer.eos_token == "<|im_end|>"
    info = json.loads((folder / "build_info.json").read_text())
    assert info["gguf_sha256"] == info["source"]["gguf_sha256"]
    leftovers = sorted(p.name for p in cache.iterdir() if p.name.startswith("."))
    assert leftovers == [f".{folder.name}.lock"]  # no staging or build folder left


def test_files_planted_beside_the_gguf_are_not_read(tmp_path, cache) -> None:
    """A tokenizer.json of 14 more tokens and a config.json of another model lie beside the
    GGUF: the conversion stages the file alone, so its result is the GGUF's own."""
    file = _gguf(tmp_path)
    reference = gguf_mod.convert_gguf(file, str(tmp_path / "reference"))
    planted = transformers.AutoTokenizer.from_pretrained(reference)
    planted.add_tokens([f"<planted{i}>" for i in range(14)])
    planted.save_pretrained(file.parent)
    config = json.loads((reference / "config.json").read_text())
    (file.parent / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 7}))
    assert (file.parent / "tokenizer.json").exists()
    folder = gguf_mod.convert_gguf(file, str(tmp_path / "converted"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == 261 and "<planted0>" not in tokenizer.get_vocab()
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 2
    logits, _ = _logits(folder, "<planted13> hello")
    assert logits.shape[-1] == 261


def test_a_file_that_changes_while_read_is_refused(tmp_path, cache) -> None:
    file = _gguf(tmp_path)
    target = tmp_path / "out"
    with pytest.raises(LlmGymError, match="changed while it was read"):
        gguf_mod.ensure_converted(file, target, {"gguf_sha256": "x"}, sha256="0" * 64)
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "files"]


def test_a_tokenizer_past_the_embedding_is_refused(tmp_path, cache, monkeypatch) -> None:
    """The conversion checks the tokenizer against the model it loaded: ids past the embedding
    would fail the first forward pass that meets one."""
    real = transformers.AutoTokenizer.from_pretrained

    def more_tokens(*args, **kwargs):
        tokenizer = real(*args, **kwargs)
        tokenizer.add_tokens(["<extra-a>", "<extra-b>"])
        return tokenizer

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", more_tokens)
    with pytest.raises(InvalidArgumentError, match="263 tokens and its model 261 embedding"):
        gguf_mod.convert_gguf(_gguf(tmp_path))


def test_transformers_gguf_kernel_hooks_exist() -> None:
    """The contract :func:`no_hub_kernels` relies on: transformers' GGUF kernel lookup and
    layer grafting, which ask the model hub where ``kernels`` is installed."""
    from transformers.integrations.gguf import kernels

    assert hasattr(kernels, "_gguf_kernel") and callable(kernels.kernelize_ggml_layers)
    assert callable(kernels.get_gguf_kernel)


def test_no_hub_kernel_is_asked_for_while_converting(tmp_path, cache, monkeypatch) -> None:
    """With a hub that fails the test when asked, the conversion still runs: the kernel lookup
    answers "none" and no layer is grafted; the hooks are as they were afterwards."""
    from transformers.integrations import hub_kernels
    from transformers.integrations.gguf import kernels

    def asked(*args, **kwargs):
        pytest.fail("the model hub was asked for a kernel")

    monkeypatch.setattr(hub_kernels, "get_kernel", asked)
    monkeypatch.setattr(kernels, "_gguf_kernel", None)
    before = kernels.kernelize_ggml_layers
    with gguf_mod.no_hub_kernels():
        assert kernels.get_gguf_kernel() is False
        kernels.kernelize_ggml_layers(torch.nn.Linear(1, 1))  # does nothing
    assert kernels._gguf_kernel is None and kernels.kernelize_ggml_layers is before
    gguf_mod.convert_gguf(_gguf(tmp_path))


def test_a_file_transformers_cannot_read_is_one_line(tmp_path, cache) -> None:
    """A well-formed file of an architecture transformers does not read from GGUF: its
    ``ValueError`` becomes one line naming the file, and the cache keeps nothing."""
    with pytest.raises(InvalidArgumentError) as caught:
        gguf_mod.convert_gguf(_gguf(tmp_path, architecture="nonesuch"))
    message = str(caught.value)
    assert message.startswith("tiny.gguf: transformers could not read the GGUF file (")
    assert "\n" not in message and "nonesuch" in message
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
