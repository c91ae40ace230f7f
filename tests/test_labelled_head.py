"""The SFT head over labelled positions: TRL's fused head's outputs and gradients; its limits."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from trainers.sft import labelled_head  # noqa: E402
from trainers.sft.labelled_head import labelled_head_forward, unsupported_reason  # noqa: E402


@pytest.fixture
def fused_model(small_model_dir):
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    model = AutoModelForCausalLM.from_pretrained(small_model_dir)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    return model.train()


def _batch(vocab: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # right padding
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :5] = -100  # an untrained prompt
    labels[2, 7] = -100  # and a hole inside a row
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _run(model, forward, inputs):
    model.zero_grad()
    out = forward(**inputs)
    out.loss.backward()
    return out, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("pre_shifted", [False, True])
def test_same_outputs_and_gradients_as_trls_fused_head(fused_model, pre_shifted) -> None:
    inputs = _batch(fused_model.config.vocab_size)
    if pre_shifted:  # as trainers.grpo.shared_prefix passes them
        labels = inputs.pop("labels")
        inputs["shift_labels"] = torch.cat([labels[:, 1:], labels[:, :1].fill_(-100)], dim=1)
    inputs["num_items_in_batch"] = torch.tensor(11)
    theirs, their_grads = _run(fused_model, lambda **kw: fused_model(**kw, fused_lm_head=True),
                               inputs)  # fmt: skip
    ours, our_grads = _run(fused_model, lambda **kw: labelled_head_forward(fused_model, **kw),
                           inputs)  # fmt: skip
    torch.testing.assert_close(ours.loss, theirs.loss)
    assert torch.equal(ours.label_mask, theirs.label_mask)
    for name in ("log_probs", "entropy", "is_top1"):
        mine, trl_value = getattr(ours, name), getattr(theirs, name)
        assert mine.shape == trl_value.shape and mine.dtype == trl_value.dtype, name
        torch.testing.assert_close(mine.float(), trl_value.float(), rtol=1e-5, atol=1e-5)
    assert float(ours.entropy[~ours.label_mask].abs().sum()) == 0.0
    for a, b in zip(our_grads, their_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_batch_without_labels_is_a_differentiable_zero(fused_model) -> None:
    inputs = _batch(fused_model.config.vocab_size)
    inputs["labels"].fill_(-100)
    out = labelled_head_forward(fused_model, **inputs)
    assert float(out.loss) == 0.0 and out.loss.requires_grad
    out.loss.backward()


def test_too_many_logits_leave_the_batch_to_trl(fused_model, monkeypatch) -> None:
    inputs = _batch(fused_model.config.vocab_size)
    labelled = int((inputs["labels"][:, 1:] != -100).sum())
    monkeypatch.setattr(labelled_head, "MAX_LOGITS", labelled * fused_model.config.vocab_size - 1)
    assert labelled_head_forward(fused_model, **inputs) is None
    monkeypatch.setattr(labelled_head, "MAX_LOGITS", labelled * fused_model.config.vocab_size)
    assert labelled_head_forward(fused_model, **inputs) is not None
    with pytest.raises(ValueError, match="fused_lm_head=True"):
        labelled_head_forward(fused_model, fused_lm_head=False, **inputs)


def test_models_it_cannot_stand_in_for(fused_model) -> None:
    assert unsupported_reason(fused_model) is None
    capped = copy.deepcopy(fused_model)
    capped.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in unsupported_reason(capped)
    capped.config.final_logit_softcapping = None
    capped.config.output_router_logits = True
    assert "router" in unsupported_reason(capped)
    mixed = copy.deepcopy(fused_model)  # what Accelerator(mixed_precision=...).prepare does (a
    mixed._original_forward = mixed.forward  # second Accelerator in one process cannot)
    assert "mixed precision" in unsupported_reason(mixed)
    headless = copy.deepcopy(fused_model)
    headless.lm_head = torch.nn.Identity()
    assert "nn.Linear" in unsupported_reason(headless)
    headless.peft_config = {}
    assert "PEFT" in unsupported_reason(headless)
