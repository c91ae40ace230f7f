"""W&B on by default, as the cookbook's ``GRPOConfig``; a run without a W&B set-up stops before
any model loads, with an error naming the three remedies."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from llm_gym.errors import InvalidArgumentError
from trainers import GRPOConfig
from trainers.wandb_setup import DEFAULT_PROJECT, wandb_setup_problem

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_setup(monkeypatch, tmp_path):
    """An environment with no W&B set-up: no key, no mode, an empty ~/.netrc."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DISABLED", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    return tmp_path


def config(tmp_path, **fields):
    return GRPOConfig(output_dir=str(tmp_path / "out"), episodes_per_task=2, **fields)


def test_the_default_logs_to_wandb_and_without_a_setup_stops_naming_the_remedies(
    no_setup,
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        config(no_setup)
    message = str(caught.value)
    assert f"wandb_project={DEFAULT_PROJECT!r} (the default)" in message
    for remedy in ("WANDB_API_KEY", "WANDB_MODE=offline", "wandb_project=None"):
        assert remedy in message


@pytest.mark.parametrize(
    ("env", "fields", "report_to"),
    [
        ({"WANDB_API_KEY": "k"}, {}, ["wandb"]),
        ({"WANDB_MODE": "offline"}, {}, ["wandb"]),
        ({}, {"wandb_project": None}, []),
        ({}, {"report_to": "none"}, []),  # TRL's own way to turn reporting off
        ({"WANDB_MODE": "disabled"}, {}, []),
        ({}, {"report_to": ["tensorboard"]}, ["tensorboard"]),  # an explicit list is kept
    ],
)
def test_each_remedy_lets_the_run_start(no_setup, monkeypatch, env, fields, report_to) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert config(no_setup, **fields).report_to == report_to


def test_a_wandb_login_in_netrc_is_a_setup(no_setup, monkeypatch) -> None:
    netrc = no_setup / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret-key\n")
    netrc.chmod(0o600)
    assert wandb_setup_problem({"NETRC": str(netrc)}) is None
    assert config(no_setup).report_to == ["wandb"]


def test_an_unknown_wandb_mode_is_named(no_setup) -> None:
    problem = wandb_setup_problem({"WANDB_MODE": "sometimes"}, no_setup / "netrc")
    assert problem is not None and "'sometimes'" in problem and "offline" in problem


def test_train_py_stops_before_any_model_loads(no_setup, monkeypatch, capsys) -> None:
    import train

    built = []
    monkeypatch.setattr("llm_gym.models.build_tiny_model", lambda *a, **k: built.append(1))
    with pytest.raises(SystemExit) as caught:
        train.main(
            [
                "--config",
                str(ROOT / "configs" / "tool_use_game_tiny.yaml"),
                "--set",
                "grpo.wandb_project=my-runs",
            ]
        )
    text = capsys.readouterr().err
    assert caught.value.code == 2 and text.startswith("train.py: error: This run logs to W&B")
    assert "wandb_project='my-runs'" in text and "WANDB_MODE=offline" in text
    assert built == []  # nothing was built or loaded
