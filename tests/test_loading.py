"""Model loading's arguments (:mod:`llm_gym.policies.loading`): a dtype that is not one of the
model dtypes is refused before any file is read, on every entry point (``load_for_generation``,
``HFPolicy.from_pretrained``, ``serve`` and ``llm-gym serve``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from llm_gym import InvalidArgumentError
from llm_gym.serving.openai_server import serve


@pytest.mark.parametrize("dtype", ["manual_seed", "Tensor", "float64", "", 16, None])
def test_a_dtype_that_is_not_a_model_dtype_is_refused_before_loading(dtype, monkeypatch) -> None:
    import transformers

    from llm_gym.policies.hf import HFPolicy
    from llm_gym.policies.loading import load_for_generation

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", pytest.fail)
    for load in (load_for_generation, HFPolicy.from_pretrained):
        with pytest.raises(InvalidArgumentError, match=r"dtype must be one of \['float32'"):
            load("/nonexistent-model", dtype=dtype)
    with pytest.raises(InvalidArgumentError, match="dtype must be one of"):
        serve("/nonexistent-model", dtype=dtype)


def test_cli_serve_lists_the_dtypes(capsys) -> None:
    from llm_gym.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "/nonexistent-model", "--dtype", "manual_seed"])
    assert exit_info.value.code == 2
    assert "choose from 'float32', 'bfloat16', 'float16'" in capsys.readouterr().err
