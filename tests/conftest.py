"""Shared fixtures: scripted policies and small helpers; no model is needed here."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401  (registers the environments)
from llm_gym.core.factories import trust_modules
from llm_gym.gym import registered_envs

# The suite turns W&B off (trainers log to W&B by default); a test of W&B sets its own mode.
os.environ["WANDB_MODE"] = "disabled"

# Tests name their helpers by "module:attr" references ("tests.seeds.agent_env:load_environment"):
# they are trusted the way a user trusts a package of their own.
trust_modules("tests")


def _fp32_probe(hidden: int, width: int) -> Any:
    """A probe's times where bf16 is twice fp32's: ``dtype="auto"`` decides float32."""
    from trainers.grpo.precision import DECODE_ROWS, TRAIN_TOKENS, ProbeTimes

    return ProbeTimes(
        decode_shape=(DECODE_ROWS, hidden, width), train_shape=(TRAIN_TOKENS, hidden, width),
        decode_fp32_s=1e-3, decode_bf16_s=2e-3, train_fp32_s=1e-2, train_bf16_s=2e-2, threads=1,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _auto_precision_is_float32(request: pytest.FixtureRequest, monkeypatch) -> None:
    """``dtype="auto"`` decides float32 in the tests, on every CPU: trainer tests compare the
    sampler's tokens and logprobs with the trainer's, which a bf16 sampler (the choice on a CPU
    with AMX or AVX-512 BF16) would move. Tests of the probe and the choice are marked
    ``cpu_precision`` and measure this CPU."""
    if request.node.get_closest_marker("cpu_precision") is not None:
        return
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("trl") is None:
        return
    monkeypatch.setattr("trainers.grpo.precision.probe_matmuls", _fp32_probe)


class LoopbackServer:
    """An asyncio server on 127.0.0.1 (a free port) in a thread of its own, for the hostile
    servers of the tests: a subclass sets its attributes, calls ``super().__init__()`` and
    defines ``async _serve(reader, writer)``. ``url`` is ``http://127.0.0.1:PORT`` plus
    :attr:`path`; :meth:`stop` closes it and cancels its connections."""

    path = ""
    """What ``url`` adds after the port (``"/v1"`` for an OpenAI-style endpoint)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(5)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}{self.path}"
        ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        def shutdown() -> None:
            self.server.close()
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.call_later(0.1, self.loop.stop)

        self.loop.call_soon_threadsafe(shutdown)


def play_text_episode(
    env: gym.Env, act: Callable[[gym.Env, str, dict[str, Any]], str], **reset
) -> tuple[float, dict[str, Any]]:
    """Run one TextEnv episode with a text policy ``act(env, observation, info) -> action``."""
    observation, info = env.reset(**reset)
    while True:
        observation, reward, terminated, truncated, info = env.step(act(env, observation, info))
        if terminated or truncated:
            return reward, info


ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback port nothing listens on now (for a server or launcher a test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def subprocess_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a training run in a subprocess: offline, this checkout first on the
    path, one torch thread per process."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path),
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
    )
    return env


class StopAfter:
    """A ``TrainerCallback`` that stops training after N optimizer steps (the seeds' examples
    ask for hundreds)."""

    def __new__(cls, steps: int):
        from transformers import TrainerCallback

        class _Stop(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step >= steps:
                    control.should_training_stop = True
                return control

        return _Stop()


@pytest.fixture
def run_async() -> Callable[[Any], Any]:
    return asyncio.run


ENV_IDS = [entry.id for entry in registered_envs()]


SMALL_MODEL = dict(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    vocab_size=512,
    max_tasks_per_env=40,
)
"""A model small enough to build in a second, for tests of the model path."""


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("torch")
    from llm_gym.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", **SMALL_MODEL)


@pytest.fixture(scope="session")
def small_model(small_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(small_model_dir).eval()
    return model, AutoTokenizer.from_pretrained(small_model_dir)
