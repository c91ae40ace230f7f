"""Hostile sizes for the tiny model (:mod:`llm_gym.models.tiny`: ``llm-gym build-tiny-model``,
``train.py``'s ``tiny_model:``).

=========================  ==========================================  =========================
case                       without a fix                               what holds
=========================  ==========================================  =========================
``hidden_size`` 10**9      the corpus and tokenizer were built         refused before the
                           (a minute), then the embedding of 4 TB      corpus, naming
                           was allocated                               MAX_TINY_PARAMETERS
``num_layers`` 10**6       the same, 10**11 parameters                 the same
``num_heads`` 0            ZeroDivisionError after the checks          an integer >= 1, named
``hidden_size`` 0 or -4    passed the divisibility check; the          an integer >= 1, named
                           corpus was built, then transformers failed
``--num-layers 0`` on the  a traceback after the corpus                one line, exit code 2
command line
=========================  ==========================================  =========================
"""

from __future__ import annotations

import pytest

import llm_gym.models.tiny as tiny
from llm_gym.errors import InvalidArgumentError


@pytest.fixture
def no_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a build gets as far as reading its corpus."""

    def refuse(*args, **kwargs):
        raise AssertionError("the sizes were not checked before the corpus")

    monkeypatch.setattr(tiny, "default_corpus", refuse)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"hidden_size": 10**9}, "MAX_TINY_PARAMETERS"),
        ({"num_layers": 10**6}, "MAX_TINY_PARAMETERS"),
        ({"num_heads": 0}, "num_heads must be an integer >= 1"),
        ({"hidden_size": 0}, "hidden_size must be an integer >= 1"),
        ({"hidden_size": -4}, "hidden_size must be an integer >= 1"),
        ({"vocab_size": 2.5}, "vocab_size must be an integer >= 1"),
    ],
    ids=["hidden huge", "layers huge", "heads 0", "hidden 0", "hidden negative", "vocab float"],
)
def test_sizes_are_checked_before_any_work(no_corpus, tmp_path, sizes, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        tiny.build_tiny_model(tmp_path / "model", **sizes)
    assert not (tmp_path / "model").exists()


def test_the_cli_refuses_zero_layers_in_one_line(no_corpus, tmp_path, capsys) -> None:
    from llm_gym.cli import main

    argv = ["build-tiny-model", "--output", str(tmp_path / "m"), "--num-layers", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-gym build-tiny-model: error: num_layers must be an integer >= 1")
    assert err.count("\n") == 1
