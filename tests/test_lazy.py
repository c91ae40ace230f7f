"""llm_gym.lazy: a package's names load their module on first use, once."""

from __future__ import annotations

import sys
import types

import pytest

from llm_gym.lazy import lazy_names


@pytest.fixture
def package(monkeypatch):
    pkg = types.ModuleType("lazy_pkg")
    sub = types.ModuleType("lazy_pkg.sub")
    sub.thing = object()
    monkeypatch.setitem(sys.modules, "lazy_pkg", pkg)
    monkeypatch.setitem(sys.modules, "lazy_pkg.sub", sub)
    monkeypatch.setitem(sys.modules, "lazy_top.inner", types.SimpleNamespace(other=42))
    names = {"thing": "sub", "other": "lazy_top.inner"}
    pkg.__getattr__, pkg.__dir__ = lazy_names("lazy_pkg", names, ["thing", "other"])
    return pkg, sub


def test_a_name_loads_its_submodule_or_full_path_once(package) -> None:
    pkg, sub = package
    assert "thing" not in vars(pkg)
    assert pkg.thing is sub.thing and vars(pkg)["thing"] is sub.thing  # stored: plain reads next
    assert pkg.other == 42


def test_an_unknown_name_is_an_attribute_error_naming_the_package(package) -> None:
    pkg, _ = package
    with pytest.raises(AttributeError, match="module 'lazy_pkg' has no attribute 'nope'"):
        pkg.nope  # noqa: B018


def test_dir_lists_the_lazy_names(package) -> None:
    pkg, _ = package
    assert {"thing", "other"} <= set(dir(pkg))
