"""The distillation teacher: HFTeacher against plain forwards, EndpointTeacher against our server
and a scripted stub, the server's ``/v1/completions``, and the reverse-KL math on golden values."""

from __future__ import annotations

import doctest
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from llm_gym.errors import InvalidArgumentError  # noqa: E402
from llm_gym.policies.http import EndpointError  # noqa: E402
from tests.scripted_endpoint import ScriptedEndpoint, scripted_endpoint  # noqa: E402
from trainers.distillation import endpoint as teacher_endpoint  # noqa: E402
from trainers.distillation import teacher as teacher_module  # noqa: E402
from trainers.distillation.teacher import (  # noqa: E402
    EndpointTeacher,
    HFTeacher,
    Teacher,
    mean_reverse_kl,
    parse_prompt_logprobs,
    reverse_kl_advantages,
    teacher_from_config,
)

VOCAB = 512  # tests/conftest.py SMALL_MODEL


def random_sequences(seed: int = 0) -> list[tuple[list[int], int]]:
    """Varied lengths and starts, so batches are padded and split into chunks."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 1), (9, 3), (2, 2), (7, 6), (12, 1), (3, 2), (16, 10)]
    return [(torch.randint(0, VOCAB, (n,), generator=g).tolist(), s) for n, s in shapes]


def plain_forward(model: Any, ids: list[int], start: int) -> list[float]:
    """The reference: one unpadded sequence, log_softmax in float32, read by hand."""
    with torch.no_grad():
        logps = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [logps[k - 1, ids[k]].item() for k in range(start, len(ids))]


def assert_close(got: list[list[float]], want: list[list[float]], tol: float) -> None:
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want, strict=True):
        assert all(abs(a - b) <= tol for a, b in zip(g, w, strict=True)), (g, w)


# --- HFTeacher -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_teacher(small_model_dir) -> HFTeacher:
    return HFTeacher(small_model_dir, device="cpu", batch_size=3)


def test_hf_teacher_matches_a_plain_forward(hf_teacher: HFTeacher) -> None:
    sequences = random_sequences()
    got = hf_teacher.logprobs(sequences)
    want = [plain_forward(hf_teacher.model, ids, start) for ids, start in sequences]
    assert_close(got, want, 1e-5)
    assert [len(v) for v in got] == [len(ids) - start for ids, start in sequences]
    assert all(v <= 0 for values in got for v in values)
    assert isinstance(hf_teacher, Teacher) and not hf_teacher.model.training
    assert hf_teacher.logprobs([]) == []


def test_hf_teacher_batching_does_not_change_the_answer(hf_teacher: HFTeacher) -> None:
    sequences = random_sequences(1)
    one_by_one = HFTeacher(hf_teacher.model, batch_size=1).logprobs(sequences)
    assert_close(HFTeacher(hf_teacher.model, batch_size=8).logprobs(sequences), one_by_one, 1e-5)


def test_hf_teacher_refuses_bad_sequences(hf_teacher: HFTeacher) -> None:
    with pytest.raises(InvalidArgumentError, match=r"token id 512.*vocab_size=512"):
        hf_teacher.logprobs([([1, 2, 3], 1), ([4, 512], 1)])
    with pytest.raises(InvalidArgumentError, match=r"token id -1"):
        hf_teacher.logprobs([([1, -1], 1)])
    with pytest.raises(InvalidArgumentError, match=r"start must be an int in \[1, "):
        hf_teacher.logprobs([([1, 2, 3], 0)])
    with pytest.raises(InvalidArgumentError, match=r"start must be"):
        hf_teacher.logprobs([([1, 2, 3], 4)])
    with pytest.raises(InvalidArgumentError, match=r"4097 tokens; the teacher's context is 4096"):
        hf_teacher.logprobs([([1] * 4097, 1)])
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        HFTeacher(hf_teacher.model, batch_size=0)
    with pytest.raises(InvalidArgumentError, match="dtype must name a torch dtype"):
        HFTeacher(hf_teacher.model, dtype="float17")


def test_hf_teacher_dtype(small_model_dir) -> None:
    teacher = HFTeacher(small_model_dir, device="cpu", dtype="float64")
    assert next(teacher.model.parameters()).dtype == torch.float64
    sequences = random_sequences(2)[:3]
    want = [plain_forward(teacher.model, ids, start) for ids, start in sequences]
    assert_close(teacher.logprobs(sequences), want, 1e-9)


# --- our server's /v1/completions ------------------------------------------------------------


@pytest.fixture(scope="module")
def served(small_model_dir) -> Iterator[Any]:
    from llm_gym.serving.openai_server import serve

    with serve(small_model_dir, model_name="tiny", device="cpu") as server:
        yield server


def post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_endpoint_teacher_on_our_server_equals_hf_teacher(
    served: Any, hf_teacher: HFTeacher
) -> None:
    sequences = random_sequences(3)
    teacher = EndpointTeacher(served.url, "tiny", max_concurrency=3)
    try:
        assert_close(teacher.logprobs(sequences), hf_teacher.logprobs(sequences), 1e-4)
    finally:
        teacher.close()


def test_completions_answer_like_openai_and_vllm(served: Any, hf_teacher: HFTeacher) -> None:
    ids = random_sequences(4)[4][0]
    body = {"model": "tiny", "prompt": ids, "max_tokens": 3, "temperature": 0, "echo": True}
    status, answer = post(
        served.url + "/completions", {**body, "logprobs": 2, "prompt_logprobs": 2}
    )
    assert status == 200, answer
    assert answer["object"] == "text_completion" and answer["model"] == "tiny"
    assert answer["id"].startswith("cmpl-") and isinstance(answer["created"], int)
    [choice] = answer["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length")
    usage = answer["usage"]
    assert usage["prompt_tokens"] == len(ids) and 1 <= usage["completion_tokens"] <= 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    [want] = hf_teacher.logprobs([(ids, 1)])
    # vLLM's prompt_logprobs: null, then the prompt's token (its rank) and the top 2.
    prompt_logprobs = choice["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    for k in range(1, len(ids)):
        entry = prompt_logprobs[k]
        own = entry[str(ids[k])]
        assert abs(own["logprob"] - want[k - 1]) < 1e-4 and own["rank"] >= 1
        assert isinstance(own["decoded_token"], str)
        best = [v for v in entry.values() if v["rank"] == 1]
        assert len(best) == 1 and best[0]["logprob"] >= own["logprob"]
        assert 2 <= len(entry) <= 3
    # The legacy echo form: the prompt's tokens first, then the generated ones.
    legacy = choice["logprobs"]
    n = len(ids) + usage["completion_tokens"]
    assert (
        len(legacy["tokens"]) == len(legacy["token_logprobs"]) == len(legacy["top_logprobs"]) == n
    )
    assert legacy["token_logprobs"][0] is None and legacy["top_logprobs"][0] is None
    assert all(
        abs(a - b) < 1e-4 for a, b in zip(legacy["token_logprobs"][1 : len(ids)], want, strict=True)
    )
    assert all(isinstance(t, dict) and 2 <= len(t) <= 3 for t in legacy["top_logprobs"][1:])
    assert choice["text"].startswith(served.tokenizer.decode(ids))
    # Greedy is deterministic; without echo only the generated tokens are shown.
    status, plain = post(served.url + "/completions", {**body, "echo": False, "logprobs": 0})
    assert status == 200 and "prompt_logprobs" not in plain["choices"][0]
    assert plain["choices"][0]["logprobs"]["token_logprobs"] == legacy["token_logprobs"][len(ids) :]
    assert plain["choices"][0]["logprobs"]["top_logprobs"] is None
    assert choice["text"].endswith(plain["choices"][0]["text"])


def test_completions_score_only_and_text_prompts(served: Any) -> None:
    text = "hello world"
    status, answer = post(
        served.url + "/completions",
        {"model": "tiny", "prompt": text, "max_tokens": 0, "echo": True, "prompt_logprobs": 0},
    )
    assert status == 200, answer
    [choice] = answer["choices"]
    ids = served.tokenizer.encode(text, add_special_tokens=False)
    assert choice["text"] == text and choice["finish_reason"] == "length"
    assert answer["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": 0,
        "total_tokens": len(ids),
    }
    assert [list(e) for e in choice["prompt_logprobs"][1:]] == [[str(t)] for t in ids[1:]]
    assert choice["logprobs"] is None
    status, one = post(
        served.url + "/completions",
        {"model": "tiny", "prompt": [7], "max_tokens": 0, "echo": True, "logprobs": 1},
    )
    assert status == 200 and "prompt_logprobs" not in one["choices"][0]
    assert one["choices"][0]["logprobs"]["token_logprobs"] == [None]


@pytest.mark.parametrize(
    ("change", "status", "param", "words"),
    [
        ({"prompt": [5, 512]}, 400, "prompt", "token id 512; the model's vocabulary is 512"),
        ({"prompt": [5] * 4097}, 400, "prompt", "context of 4096"),
        ({"prompt": [5] * 4096, "max_tokens": 1}, 400, "prompt", "room for one generated"),
        ({"prompt": [5, -1]}, 400, "prompt", ">= 0"),
        ({"prompt": []}, 400, "prompt", "non-empty"),
        ({"prompt": ""}, 400, "prompt", "non-empty"),
        ({"prompt": ["a", "b"]}, 400, "prompt", "batches are not supported"),
        ({"prompt": [[1, 2]]}, 400, "prompt", "token ids"),
        ({"prompt": 5}, 400, "prompt", "got int"),
        ({"prompt": [1, True]}, 400, "prompt", "token ids"),
        ({"max_tokens": 0, "echo": False}, 400, "max_tokens", "0 only with echo"),
        ({"max_tokens": -1}, 400, "max_tokens", ">= 0"),
        ({"max_tokens": "3"}, 400, "max_tokens", "integer"),
        ({"echo": "yes"}, 400, "echo", "true or false"),
        ({"logprobs": 6}, 400, "logprobs", "[0, 5]"),
        ({"logprobs": True}, 400, "logprobs", "[0, 5]"),
        ({"prompt_logprobs": -1}, 400, "prompt_logprobs", "[0, 5]"),
        ({"prompt_logprobs": 1.5}, 400, "prompt_logprobs", "[0, 5]"),
        ({"temperature": "hot"}, 400, "temperature", "number"),
        ({"stop": "\n"}, 400, "stop", "not supported"),
        ({"stream": True}, 400, "stream", "stream"),
        ({"n": 2}, 400, "n", "'n' must be 1"),
        ({"model": "other"}, 404, "model", "does not exist"),
        ({"model": None}, 400, "model", "required"),
    ],
)
def test_completions_refuse_bad_requests(
    served: Any, change: dict[str, Any], status: int, param: str, words: str
) -> None:
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 0, "echo": True, "logprobs": 0}
    code, answer = post(served.url + "/completions", {**body, **change})
    assert code == status, answer
    assert answer["error"]["param"] == param
    assert words in answer["error"]["message"]


# --- EndpointTeacher against a scripted stub -------------------------------------------------


@pytest.fixture
def stub() -> Iterator[ScriptedEndpoint]:
    with scripted_endpoint() as server:
        yield server


def lp(token: int, k: int) -> float:
    """The stub's made-up logprob of ``token`` at position ``k``."""
    return -(token % 7 + k) / 10


def vllm_answer(ids: list[int]) -> dict[str, Any]:
    prompt_logprobs: list[Any] = [None]
    for k in range(1, len(ids)):
        entry = {str(ids[k]): {"logprob": lp(ids[k], k), "rank": 2, "decoded_token": "x"}}
        entry.setdefault("0", {"logprob": -0.01, "rank": 1, "decoded_token": "y"})
        prompt_logprobs.append(entry)
    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
    return {
        "object": "text_completion",
        "choices": [{**choice, "prompt_logprobs": prompt_logprobs}],
    }


def legacy_answer(ids: list[int], extra: int = 1) -> dict[str, Any]:
    values = [None] + [lp(ids[k], k) for k in range(1, len(ids))] + [-0.5] * extra
    logprobs = {"tokens": ["t"] * len(values), "token_logprobs": values, "top_logprobs": None}
    return {"choices": [{"index": 0, "text": "", "logprobs": logprobs, "finish_reason": "length"}]}


SEQUENCES = [([3, 1, 4, 1, 5], 1), ([9, 2, 6], 2), ([5, 3, 5, 8, 9, 7], 4)]
EXPECTED = [[lp(ids[k], k) for k in range(start, len(ids))] for ids, start in SEQUENCES]


@pytest.mark.parametrize(
    "answer", [vllm_answer, legacy_answer, lambda ids: legacy_answer(ids, extra=0)]
)
def test_endpoint_teacher_reads_both_forms(
    stub: ScriptedEndpoint, answer: Callable[..., Any]
) -> None:
    stub.respond = lambda body: (200, answer(body["prompt"]))
    teacher = EndpointTeacher(stub.url + "/", "teacher-model", api_key="sk-test")
    assert teacher.logprobs(SEQUENCES) == EXPECTED
    assert len(stub.requests) == len(SEQUENCES)
    [first] = [r for r in stub.requests if r["body"]["prompt"] == SEQUENCES[0][0]]
    assert first["path"] == "/v1/completions"
    assert first["headers"]["Authorization"] == "Bearer sk-test"
    assert first["body"] == {
        "model": "teacher-model",
        "prompt": SEQUENCES[0][0],
        "max_tokens": 1,
        "temperature": 0,
        "echo": True,
        "logprobs": 0,
        "prompt_logprobs": 0,
    }


def test_endpoint_teacher_sends_no_key_and_limits_concurrency(stub: ScriptedEndpoint) -> None:
    def slow(body: dict[str, Any]) -> tuple[int, Any]:
        time.sleep(0.05)
        return 200, vllm_answer(body["prompt"])

    stub.respond = slow
    sequences = SEQUENCES * 3
    teacher = EndpointTeacher(stub.url, "m", max_concurrency=2)
    assert teacher.logprobs(sequences) == EXPECTED * 3  # the caller's order
    assert stub.max_active <= 2
    assert all("Authorization" not in r["headers"] for r in stub.requests)


def _bad(ids: list[int], mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    answer = vllm_answer(ids)
    mutate(answer["choices"][0])
    return answer


def _set_entry(choice: dict[str, Any], value: Any) -> None:
    [key] = [k for k in choice["prompt_logprobs"][2] if k != "0"]
    choice["prompt_logprobs"][2][key] = value


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (lambda ids: {"choices": []}, "no choices[0]"),
        (lambda ids: {"error": "x"}, "no choices[0]"),
        (
            lambda ids: _bad(ids, lambda c: c["prompt_logprobs"].pop()),
            "has 4 entries; the prompt has 5",
        ),
        (lambda ids: _bad(ids, lambda c: c.update(prompt_logprobs="x")), "has str entries"),
        (
            lambda ids: _bad(ids, lambda c: c["prompt_logprobs"].__setitem__(3, {"0": -1.0})),
            "no entry for the prompt's token id 1",
        ),
        (
            lambda ids: _bad(ids, lambda c: c["prompt_logprobs"].__setitem__(3, None)),
            "prompt_logprobs[3] has no entry",
        ),
        (
            lambda ids: _bad(ids, lambda c: _set_entry(c, {"logprob": 0.5})),
            "0.5, not a finite logprob <= 0",
        ),
        (
            lambda ids: _bad(ids, lambda c: _set_entry(c, {"logprob": float("nan")})),
            "nan, not a finite",
        ),
        (
            lambda ids: _bad(ids, lambda c: _set_entry(c, {"logprob": float("-inf")})),
            "-inf, not a finite",
        ),
        (lambda ids: _bad(ids, lambda c: _set_entry(c, {"logprob": "-1"})), "'-1', not a number"),
        (lambda ids: _bad(ids, lambda c: _set_entry(c, {"rank": 1})), "None, not a number"),
        (lambda ids: legacy_answer(ids, extra=2), "token_logprobs has 7 entries; the prompt has 5"),
        (lambda ids: legacy_answer(ids[:-1], extra=0), "has 4 entries"),
        (
            lambda ids: {"choices": [{"text": "hi", "logprobs": None}]},
            "neither choices[0].prompt_logprobs",
        ),
    ],
)
def test_endpoint_teacher_refuses_malformed_answers(
    stub: ScriptedEndpoint, answer: Callable[..., Any], words: str
) -> None:
    stub.respond = lambda body: (200, answer(body["prompt"]))
    with pytest.raises(EndpointError, match="answered a malformed completion") as info:
        EndpointTeacher(stub.url, "m").logprobs([([3, 1, 4, 1, 5], 1)])
    assert words in str(info.value) and stub.url in str(info.value)


def test_a_tiny_positive_logprob_is_rounding() -> None:
    answer = {"choices": [{"prompt_logprobs": [None, {"4": 1e-6}]}]}
    assert parse_prompt_logprobs(answer, [3, 4]) == [None, 1e-6]


def test_endpoint_teacher_retries_a_server_error_once(stub: ScriptedEndpoint) -> None:
    calls: list[int] = []

    def flaky(body: dict[str, Any]) -> tuple[int, Any]:
        calls.append(1)
        if len(calls) == 1:
            return 503, {"error": {"message": "warming up"}}
        return 200, vllm_answer(body["prompt"])

    stub.respond = flaky
    assert EndpointTeacher(stub.url, "m").logprobs(SEQUENCES[:1]) == EXPECTED[:1]
    assert len(calls) == 2

    stub.respond = lambda body: (500, {"error": {"message": "out of memory"}})
    with pytest.raises(EndpointError, match="out of memory") as info:
        EndpointTeacher(stub.url, "m").logprobs(SEQUENCES[:1])
    assert stub.url + "/completions" in str(info.value) and "HTTP 500" in str(info.value)
    assert info.value.status == 500 and len(calls) + 2 == len(stub.requests)


def test_endpoint_teacher_names_a_refusal(stub: ScriptedEndpoint) -> None:
    stub.respond = lambda body: (400, {"error": {"message": "prompt_logprobs is not allowed"}})
    with pytest.raises(EndpointError, match=r"answered HTTP 400 for teacher model 'm'") as info:
        EndpointTeacher(stub.url, "m").logprobs(SEQUENCES[:1])
    assert "prompt_logprobs is not allowed" in str(info.value) and len(stub.requests) == 1


def test_endpoint_teacher_connection_refused() -> None:
    stub = ScriptedEndpoint()
    stub.close()  # nothing listens there any more
    with pytest.raises(EndpointError, match=r"failed after 2 attempts") as info:
        EndpointTeacher(stub.url, "m", timeout_s=5).logprobs(SEQUENCES[:1])
    assert stub.url in str(info.value)


def test_endpoint_teacher_checks_its_arguments(stub: ScriptedEndpoint) -> None:
    with pytest.raises(InvalidArgumentError, match="max_concurrency"):
        EndpointTeacher(stub.url, "m", max_concurrency=0)
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        EndpointTeacher(stub.url, "m", timeout_s=0)
    with pytest.raises(InvalidArgumentError, match="model"):
        EndpointTeacher(stub.url, "")
    with pytest.raises(InvalidArgumentError, match="http"):
        EndpointTeacher("ftp://x", "m")
    with pytest.raises(InvalidArgumentError, match="start must be"):
        EndpointTeacher(stub.url, "m").logprobs([([1, 2], 0)])
    assert stub.requests == []


# --- teacher_from_config ---------------------------------------------------------------------


def test_teacher_from_config(small_model_dir, hf_teacher: HFTeacher) -> None:
    local = teacher_from_config(str(small_model_dir))
    assert isinstance(local, HFTeacher) and local.batch_size == 8
    local = teacher_from_config({"model": small_model_dir, "batch_size": 2, "device": "cpu"})
    assert isinstance(local, HFTeacher) and local.batch_size == 2
    remote = teacher_from_config(
        {"model": "m", "base_url": "http://h:1/v1", "api_key": "k", "max_concurrency": 2}
    )
    assert isinstance(remote, EndpointTeacher) and remote.url == "http://h:1/v1/completions"
    assert teacher_from_config(hf_teacher) is hf_teacher
    with pytest.raises(
        InvalidArgumentError, match=r"\['batch_size'\].*allowed keys: \['model', 'base_url'"
    ):
        teacher_from_config({"model": "m", "base_url": "http://h:1/v1", "batch_size": 2})
    with pytest.raises(InvalidArgumentError, match=r"\['api_key', 'bogus'\].*add base_url"):
        teacher_from_config({"model": "m", "api_key": "k", "bogus": 1})
    with pytest.raises(InvalidArgumentError, match="needs 'model'"):
        teacher_from_config({"base_url": "http://h:1/v1"})
    with pytest.raises(InvalidArgumentError, match="Expected a teacher model path"):
        teacher_from_config(3)


# --- the reverse-KL signal -------------------------------------------------------------------


def test_reverse_kl_advantages_golden() -> None:
    student = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -4.0]])
    teacher = torch.tensor([[-0.5, -2.5, -0.5], [-1.0, -0.3, -9.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    # teacher - student = [[0.5, -0.5, 0.0], [2.0, -0.2, -5.0]], masked, times 2
    advantages = reverse_kl_advantages(student, teacher, mask, kl_coef=2.0)
    assert torch.allclose(advantages, torch.tensor([[1.0, -1.0, 0.0], [0.0, -0.4, -10.0]]))
    assert advantages.shape == (2, 3) and advantages.dtype == torch.float32
    bool_mask = reverse_kl_advantages(student, teacher, mask.bool())
    assert torch.allclose(bool_mask, torch.tensor([[0.5, -0.5, 0.0], [0.0, -0.2, -5.0]]))
    # masked mean of student - teacher over (-0.5, 0.5, 0.2, 5.0)
    assert math.isclose(mean_reverse_kl(student, teacher, mask), 5.2 / 4, rel_tol=1e-6)
    assert mean_reverse_kl(student, teacher, torch.zeros_like(mask)) == 0.0
    assert mean_reverse_kl(student, student, mask) == 0.0
    # Advantages are constants of the loss, even from logps that carry a gradient.
    assert not reverse_kl_advantages(student.requires_grad_(True), teacher, mask).requires_grad


def test_reverse_kl_refuses_mismatched_shapes() -> None:
    a = torch.zeros(2, 3)
    with pytest.raises(InvalidArgumentError, match=r"\(2, 3\), \(2, 4\), \(2, 3\)"):
        reverse_kl_advantages(a, torch.zeros(2, 4), a)
    with pytest.raises(InvalidArgumentError, match="one shape"):
        mean_reverse_kl(a, a, torch.ones(3))


@pytest.mark.parametrize("module", [teacher_module, teacher_endpoint])
def test_docstring_examples(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0
