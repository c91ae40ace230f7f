"""The engine's batched decode loop against the slow obvious decoder: one row at a time, the whole
context through a plain forward pass for every token, a full-vocabulary ``cumsum`` inverse CDF
drawn from the row's own stream. Same ids (greedy and seeded sampling) and the same logprobs
within float tolerance, on the small model (SmolLM2: tests/test_real_model.py)."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from llm_gym.policies.hf_engine import DecodeEngine  # noqa: E402
from llm_gym.policies.hf_sampling import row_stream  # noqa: E402
from tests.test_hf_sampling import reference_draw  # noqa: E402


def reference_turn(
    model, context: list[int], steps: int, temperature: float, stream: random.Random | None
) -> tuple[list[int], list[float]]:
    """``steps`` ids after ``context``, each from a plain forward pass over everything so far."""
    ids, logprobs = list(context), []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        if temperature == 0:
            token = int(logits.argmax())
            logprobs.append(float(torch.log_softmax(logits, dim=-1)[token]))
        else:
            scores = torch.log_softmax(logits / temperature, dim=-1)
            token = int(reference_draw(scores.exp()[None], [stream.random()])[0])
            logprobs.append(float(scores[token]))
        ids.append(token)
    return ids[len(context) :], logprobs


def engine_turns(model, prompts, steps: int, temperature: float, seed: int) -> dict:
    engine = DecodeEngine(
        model, eos_ids=[], pad_id=0, temperature=temperature, top_p=1.0, seed=seed
    )
    finished = {}
    work = [(key, ids, steps) for key, ids in enumerate(prompts)]
    while len(finished) < len(prompts):
        for turn in engine.step(work):
            finished[turn.key] = turn
        work = []
    engine.close()
    return finished


def check_against_reference(model, prompts, steps: int, tol: float) -> None:
    for temperature in (0.0, 1.0, 0.7):
        turns = engine_turns(model, prompts, steps, temperature, seed=3)
        for key, prompt in enumerate(prompts):
            stream = None if temperature == 0 else row_stream(3, key)
            ids, logprobs = reference_turn(model, prompt, steps, temperature, stream)
            assert turns[key].token_ids == ids, (temperature, key)
            assert turns[key].logprobs == pytest.approx(logprobs, abs=tol)


def test_the_small_model_decodes_what_the_obvious_decoder_does(small_model) -> None:
    model, _ = small_model
    rng = random.Random(0)
    shared = [rng.randrange(3, 512) for _ in range(20)]
    prompts = [shared + [rng.randrange(3, 512) for _ in range(n)] for n in (1, 9, 4)]
    prompts.append([rng.randrange(3, 512) for _ in range(7)])  # shares no prefix
    check_against_reference(model, prompts, steps=4, tol=1e-4)
