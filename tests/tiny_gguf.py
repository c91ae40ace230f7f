"""A tiny Llama GGUF file written with ``gguf.GGUFWriter`` (tests of the conversion): two layers,
a 64-wide model whose weights are Q8_0 blocks, a byte-level vocabulary of 256 bytes, two merges
and ChatML's control tokens, and a chat template."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
FFN = 128
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (the alphabet of a byte-level vocabulary)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): the bytes, two merged pairs and the control tokens."""
    tokens = [*byte_alphabet(), "he", "ll", *SPECIALS]
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)  # 1 normal, 3 control
    return tokens, types, ["h e", "l l"]


def write_tiny_gguf(
    path: Path,
    *,
    eos_token_id: int | None = None,
    architecture: str = "llama",
    seed: int = 0,
) -> Path:
    """Write the tiny model to ``path``; ``eos_token_id`` defaults to ``<|im_end|>``'s id,
    ``architecture`` names what ``general.architecture`` says (and prefixes its keys)."""
    import gguf

    tokens, types, merges = tiny_vocab()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    eos = tokens.index("<|im_end|>") if eos_token_id is None else eos_token_id
    writer.add_eos_token_id(eos)
    writer.add_chat_template(CHAT_TEMPLATE)

    def tensor(name: str, *shape: int, quantize: bool = True) -> None:
        data = rng.normal(0.0, 0.05, size=shape).astype(np.float32)
        if quantize:
            kind = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, np.ones(shape, dtype=np.float32))

    head_dim = HIDDEN // HEADS
    tensor("token_embd.weight", len(tokens), HIDDEN)
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        tensor(f"{block}.attn_norm.weight", HIDDEN, quantize=False)
        tensor(f"{block}.attn_q.weight", HIDDEN, HIDDEN)
        tensor(f"{block}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"{block}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"{block}.attn_output.weight", HIDDEN, HIDDEN)
        tensor(f"{block}.ffn_norm.weight", HIDDEN, quantize=False)
        tensor(f"{block}.ffn_gate.weight", FFN, HIDDEN)
        tensor(f"{block}.ffn_up.weight", FFN, HIDDEN)
        tensor(f"{block}.ffn_down.weight", HIDDEN, FFN)
    tensor("output_norm.weight", HIDDEN, quantize=False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
