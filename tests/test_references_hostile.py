"""Hostile ``"module:attr"`` references (:mod:`llm_gym.core.references`, behind
``llm_gym.core.factories.resolve``): a config or command line that names ``os:system``, walks an
attribute path through a module's imported ``os``, reaches ``__globals__``, or names a re-exported
``system``; and the allow-list a user extends (``trust_modules``, ``LLM_GYM_TRUSTED_MODULES``,
``train.py --trust-module``), which never covers the refused modules."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from llm_gym.core.factories import (
    as_env_factory,
    as_task_source,
    resolve,
    trust_modules,
    trusted_modules,
    untrust_modules,
)
from llm_gym.core.references import REFUSED_MODULES, TRUSTED_MODULES_ENV
from llm_gym.environments.factory import MultiTurnEnvFactory
from llm_gym.environments.single_turn import SingleTurnLoader
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.registry import register_policy, unregister_policy
from tests.conftest import ROOT
from trainers.pipeline.sft import demonstrator

DANGEROUS = [
    "os:system",
    "subprocess:run",
    "builtins:eval",
    "builtins:exec",
    "sys:exit",
    "importlib:import_module",
    "shutil:rmtree",
    "pickle:loads",
    "_pickle:loads",
    "ctypes:CDLL",
    "socket:socket",
    "runpy:run_path",
    "code:interact",
    "os.path:join",
    "posix:system",
]


@pytest.fixture
def helper_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a module ``name`` with ``source`` on the path (its trust undone afterwards)."""
    monkeypatch.delenv(TRUSTED_MODULES_ENV, raising=False)
    made: list[str] = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        made.append(name)
        return name

    yield write
    untrust_modules(*made, "*")


@pytest.mark.parametrize("reference", DANGEROUS)
def test_a_reference_to_a_module_that_runs_code_is_refused(reference: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        resolve(reference)
    message = str(info.value)
    assert f"Refused the reference {reference!r}" in message
    for remedy in ("llm_gym and trainers", "trust_modules", TRUSTED_MODULES_ENV, "--trust-module"):
        assert remedy in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("prefix", ["", "*", "o", "s"])
@pytest.mark.parametrize("reference", ["os:system", "subprocess:run", "sys:exit", "builtins:eval"])
def test_refused_modules_stay_refused_under_a_prefix_that_covers_them(
    prefix: str, reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRUSTED_MODULES_ENV, raising=False)
    trust_modules(prefix)
    try:
        with pytest.raises(InvalidArgumentError, match="is never trusted"):
            resolve(reference)
    finally:
        untrust_modules(prefix)
    monkeypatch.setenv(TRUSTED_MODULES_ENV, f"{prefix or '*'},tests")
    with pytest.raises(InvalidArgumentError, match="is never trusted"):
        resolve(reference)


@pytest.mark.parametrize("prefix", ["os", "subprocess", "importlib.util", "_pickle", "builtins"])
def test_trusting_a_refused_module_is_itself_an_error(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidArgumentError, match=f"{prefix!r} is never trusted"):
        trust_modules(prefix)
    monkeypatch.setenv(TRUSTED_MODULES_ENV, f"tests,{prefix}")
    with pytest.raises(InvalidArgumentError, match=f"{TRUSTED_MODULES_ENV}: {prefix!r} is never"):
        resolve("llm_gym.core.task:Task")
    monkeypatch.setenv(TRUSTED_MODULES_ENV, "tests,my pkg")
    with pytest.raises(InvalidArgumentError, match="expected a dotted module name"):
        resolve("llm_gym.core.task:Task")


def test_an_untrusted_module_resolves_once_trusted(helper_module, monkeypatch) -> None:
    name = helper_module("refs_user_pkg", "def oracle(task, messages):\n    return 'ok'\n")
    helper_module("refs_user_pkg_extra", "def oracle(task, messages):\n    return 'no'\n")
    with pytest.raises(InvalidArgumentError, match="module 'refs_user_pkg' is not trusted"):
        resolve(f"{name}:oracle")
    trust_modules(name)
    assert resolve(f"{name}:oracle")(None, []) == "ok"
    assert name in trusted_modules()
    # a prefix covers its submodules, not another package that starts with the same letters
    with pytest.raises(InvalidArgumentError, match="'refs_user_pkg_extra' is not trusted"):
        resolve("refs_user_pkg_extra:oracle")
    untrust_modules(name)
    with pytest.raises(InvalidArgumentError, match="is not trusted"):
        resolve(f"{name}:oracle")
    monkeypatch.setenv(TRUSTED_MODULES_ENV, f" tests , {name} ")  # the variable works as well
    assert resolve(f"{name}:oracle")(None, []) == "ok"
    # a third-party package is not trusted either until named
    if importlib.util.find_spec("numpy") is not None:
        with pytest.raises(InvalidArgumentError, match="module 'numpy' is not trusted"):
            resolve("numpy:load")


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        # an attribute path through a module's own imports
        ("llm_gym.core.references:os.system", "steps into the module 'os'"),
        ("llm_gym.core.references:importlib.import_module", "steps into the module 'importlib'"),
        ("llm_gym.core.references:threading.Thread", "steps into the module 'threading'"),
        # dunder attributes: the way out to a function's globals and the builtins
        ("llm_gym.core.task:Task.__init__.__globals__", "dunder name '__init__'"),
        ("llm_gym.core.references:resolve_reference.__globals__", "dunder name '__globals__'"),
        ("llm_gym.core.task:Task.__class__", "dunder name '__class__'"),
        ("llm_gym.core.references:__builtins__", "dunder name '__builtins__'"),
        # malformed: relative imports, empty names, something that is not a name
        ("..core:Task", "dotted names on both sides of one colon"),
        ("llm_gym.core.task:", "dotted names on both sides of one colon"),
        ("llm_gym.core.task:Task()", "dotted names on both sides of one colon"),
        ("llm_gym.core.task:Task:Task", "dotted names on both sides of one colon"),
        # missing pieces are named, not tracebacks
        ("llm_gym.no_such_module:x", "no module named 'llm_gym.no_such_module'"),
        ("llm_gym.core.task:NoSuchThing", "has no attribute 'NoSuchThing'"),
    ],
)
def test_an_attribute_path_stays_in_trusted_code(reference: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(")):
        resolve(reference)


def test_re_exported_functions_of_refused_modules_are_refused(helper_module) -> None:
    name = helper_module(
        "refs_reexports",
        """
        import pickle as serial
        from builtins import eval as evaluate
        from os import system
        from subprocess import run
        from pickle import loads
        from shutil import rmtree
        from pathlib import Path


        def fine(task, messages):
            return "fine"
        """,
    )
    trust_modules(name)
    assert resolve(f"{name}:fine")(None, []) == "fine"
    homes = {"system": "posix", "run": "subprocess", "evaluate": "builtins", "loads": "_pickle",
             "rmtree": "shutil", "Path": "pathlib"}  # fmt: skip
    for attr, home in homes.items():
        with pytest.raises(InvalidArgumentError, match=f"defined in {home!r}"):
            resolve(f"{name}:{attr}")
    with pytest.raises(InvalidArgumentError, match="steps into the module 'pickle'"):
        resolve(f"{name}:serial.loads")


def test_a_registered_reference_resolves_without_trusting_its_module(helper_module) -> None:
    name = helper_module(
        "refs_registered",
        """
        from llm_gym.policies.scripted import RandomPolicy


        class MyPolicy(RandomPolicy):
            pass


        class Other(RandomPolicy):
            pass
        """,
    )
    register_policy("refs-mine", f"{name}:MyPolicy")
    try:
        assert resolve(f"{name}:MyPolicy").__name__ == "MyPolicy"
        with pytest.raises(InvalidArgumentError, match="is not trusted"):
            resolve(f"{name}:Other")  # only the reference registered, not its module
    finally:
        unregister_policy("refs-mine")
    register_policy("refs-os", "os:system")  # registering does not lift the refused modules
    try:
        with pytest.raises(InvalidArgumentError, match="'os' is never trusted"):
            resolve("os:system")
    finally:
        unregister_policy("refs-os")


def test_every_place_a_string_becomes_an_object_applies_the_rules(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    command = f"touch {marker}"
    with pytest.raises(InvalidArgumentError, match="Refused the reference 'os:system'"):
        demonstrator("os:system", {"command": command}, resolve)  # sft.oracle + oracle_options
    with pytest.raises(InvalidArgumentError, match="Refused"):
        as_env_factory("os:system")
    with pytest.raises(InvalidArgumentError, match="Refused"):
        as_task_source("subprocess:getoutput")
    with pytest.raises(InvalidArgumentError, match="Refused"):
        MultiTurnEnvFactory("os:system", environment_kwargs={"command": command}).environment_for()
    with pytest.raises(InvalidArgumentError, match="Refused"):
        SingleTurnLoader("os:system")(command=command)
    import gymnasium as gym

    for key in ("env", "tasks", "oracle"):
        with pytest.raises(InvalidArgumentError, match="Refused"):
            gym.make("ToolUseGame-v0", **{key: "os:system"})
    assert not marker.exists()
    # objects from Python code are not references: they pass through untouched
    assert resolve(os.system) is os.system and resolve(subprocess.run) is subprocess.run


def _train_script():
    spec = importlib.util.spec_from_file_location("train_script", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_py_refuses_a_config_that_names_os_system(tmp_path: Path, capsys) -> None:
    marker = tmp_path / "ran"
    config = ROOT / "configs" / "tool_use_game_tiny.yaml"
    sets = ["sft.oracle=os:system", f"sft.oracle_options={{command: 'touch {marker}'}}"]
    with pytest.raises(SystemExit) as info:
        _train_script().main(["--config", str(config), *[f"--set={s}" for s in sets]])
    text = capsys.readouterr().err
    assert info.value.code == 2
    assert text.startswith("train.py: error: Refused the reference 'os:system'"), text
    assert "--trust-module" in text and text.count("\n") == 1 and not marker.exists()
    with pytest.raises(SystemExit) as info:
        _train_script().main(["--config", str(config), "--trust-module", "subprocess"])
    text = capsys.readouterr().err
    assert text.startswith("train.py: error: trust_modules: 'subprocess' is never"), text


def test_train_py_trust_module_reaches_the_config_and_child_processes(
    helper_module, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainers.pipeline.config import load_config
    from trainers.pipeline.run import check_pipeline

    name = helper_module(
        "refs_demonstrators",
        "from llm_gym.envs.tool_use_game import oracle_action as my_oracle\n",
    )
    config = load_config(
        ROOT / "configs" / "tool_use_game_tiny.yaml", {"sft.oracle": f"{name}:my_oracle"}
    )
    with pytest.raises(InvalidArgumentError, match=f"module {name!r} is not trusted"):
        check_pipeline(config)  # before any model work
    train = _train_script()
    assert train.parse_args(["--config", "c.yaml", "--trust-module", name]).trust_module == [name]
    monkeypatch.setenv(TRUSTED_MODULES_ENV, "tests")
    train.trust([name])
    assert os.environ[TRUSTED_MODULES_ENV] == f"tests,{name}"  # what child processes inherit
    check_pipeline(config)


def test_the_refused_modules_include_the_named_ones() -> None:
    named = {"builtins", "os", "subprocess", "sys", "importlib", "shutil", "pickle", "ctypes",
             "socket", "runpy", "code"}  # fmt: skip
    assert named <= REFUSED_MODULES
