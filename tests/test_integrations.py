"""The integration packages' public faces (``llm_gym/integrations/*/__init__.py``): one subpackage
per stack, each exporting its names (the stack itself imported under its own name), and the
light ones importing no stack until a name is used."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STACKS = {
    # package: the third-party module it bridges to
    "llm_gym.integrations.openenv": "openenv",
    "llm_gym.integrations.verifiers": "verifiers",
    "llm_gym.integrations.mcp": "mcp",
    "llm_gym.integrations.trl": "trl",
}


def test_integrations_holds_one_subpackage_per_stack() -> None:
    folder = ROOT / "llm_gym" / "integrations"
    modules = sorted(p.name for p in folder.glob("*.py"))
    packages = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
    assert modules == ["__init__.py"]
    assert packages == sorted(name.rpartition(".")[2] for name in STACKS)


@pytest.mark.parametrize("package", sorted(STACKS))
def test_every_exported_name_resolves(package: str) -> None:
    stack = pytest.importorskip(STACKS[package])
    module = importlib.import_module(package)
    assert [name for name in module.__all__ if not hasattr(module, name)] == []
    # the stack is the installed library, never the subpackage named like it
    assert sys.modules[STACKS[package]] is stack
    assert ROOT / "llm_gym" not in Path(stack.__file__).resolve().parents
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = module.not_a_name


def test_the_light_packages_import_no_stack_until_a_name_is_used() -> None:
    # llm_gym.cli builds the serve-mcp parser from llm_gym.integrations.mcp.cli; RemoteEnv's
    # pickled factories and MCPServerParams travel to processes that may lack the stacks.
    code = (
        "import sys\n"
        "import llm_gym.cli, llm_gym.integrations.mcp.cli, llm_gym.integrations.mcp.params\n"
        "import llm_gym.integrations.openenv, llm_gym.integrations.trl\n"
        "stacks = ('mcp', 'openenv', 'verifiers', 'trl', 'torch', 'transformers')\n"
        "print(sorted(m for m in stacks if m in sys.modules))\n"
        "from llm_gym.integrations.mcp import MCPToolEnv\n"
        "print('mcp' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split("\n")[0] == "[]"
    if importlib.util.find_spec("mcp") is not None:
        assert out.stdout.split("\n")[1] == "True"
