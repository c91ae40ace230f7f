"""The architecture's rules, checked on the source: the import graph and module sizes.

* No module under ``llm_gym/`` or ``trainers/`` imports an underscore name from another module (a
  helper two modules share is public and lives in the lowest layer that needs it).
* The import graph of ``llm_gym`` and ``trainers`` has no cycle, counting imports inside functions
  (deferred) as well as module-level ones. Importing ``a.b.c`` also runs the ``__init__`` of every
  package on the way that the importer is not already inside, so those count as edges too.
* ``llm_gym`` imports neither ``trainers`` nor ``benchmarks``.
* Packages import only from the layers above them (:data:`LAYERS`, as docs/architecture.md
  draws them).
* No source module is over :data:`MAX_LINES` lines, data tables aside.

The checks are plain functions over a source tree, tested on small made-up trees first, so a
broken checker cannot pass silently.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llm_gym", "trainers")
MAX_LINES = 450
LAYERS = [
    {"llm_gym.errors", "llm_gym.aio", "llm_gym.lazy"},
    {"llm_gym.core", "llm_gym.types"},
    {"llm_gym.actions", "llm_gym.tools"},
    {"llm_gym.policies"},
    {"llm_gym.rollout"},
    {"llm_gym.gym"},
    {"llm_gym.environments", "llm_gym.datasets", "llm_gym.judge"},
    {"llm_gym.envs"},
    {"llm_gym.eval"},
    {"llm_gym.models", "llm_gym.serving", "llm_gym.scaffold", "llm_gym.integrations"},
    # the root package imports the layers to re-export them; the start-up hook (installed as a
    # top-level module, it imports llm_gym to register the envs) belongs with it
    {"llm_gym.cli", "llm_gym", "llm_gym.gym.startup_hook"},
    {"trainers"},
]
"""Top to bottom: a package may import from its own layer's modules and the layers above."""
DATA_TABLES = {
    # module: why it may be longer (constants only, no logic to split)
    "llm_gym/envs/code/problems_lists.py": "problem definitions (a data table)",
    "llm_gym/envs/code/problems_numbers.py": "problem definitions (a data table)",
}


# --- the checker ---------------------------------------------------------------------------------


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """``{"pkg.mod": path}`` for every Python file of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING:`` (never executed)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for inner in ast.walk(child):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        lines.add(inner.lineno)
    return lines


def imports_of(name: str, path: Path) -> Iterator[tuple[str, str | None, int]]:
    """``(module, imported name or None, line)`` for every executed import of a module, at any
    depth of the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield base, alias.name, node.lineno


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Edges between the given modules (see the module docstring for package ``__init__`` s)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        own = set(_ancestors(name)) | {name}
        for module, imported, _ in imports_of(name, path):
            target = f"{module}.{imported}" if f"{module}.{imported}" in modules else module
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if not target:
                continue
            for node in [*_ancestors(target), target]:
                if node in modules and node not in own:
                    graph[name].add(node)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def private_imports(modules: dict[str, Path], packages: tuple[str, ...]) -> list[str]:
    """Imports of an underscore name, or of an underscore module outside its own package."""
    found = []
    for name, path in modules.items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for module, imported, line in imports_of(name, path):
            if module.split(".")[0] not in packages:
                continue
            if imported and imported.startswith("_") and not imported.startswith("__"):
                found.append(f"{name}:{line} imports {imported} from {module}")
            parts = module.split(".")
            for i, part in enumerate(parts):
                home = ".".join(parts[:i])  # the package the private module belongs to
                private = part.startswith("_") and not part.startswith("__")
                if private and own_package != home and not own_package.startswith(home + "."):
                    found.append(f"{name}:{line} imports the private module {module}")
    return found


def layer_of(module: str, layers: list[set[str]]) -> int | None:
    """The index of the layer that holds ``module`` (its longest listed prefix), or None."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        for index, layer in enumerate(layers):
            if prefix in layer:
                return index
    return None


def upward_imports(modules: dict[str, Path], layers: list[set[str]]) -> list[str]:
    """Imports from a lower layer's package (one listed after the importer's)."""
    found = []
    for name, path in modules.items():
        own = layer_of(name, layers)
        for module, imported, line in imports_of(name, path):
            target = layer_of(f"{module}.{imported}" if imported else module, layers)
            if own is not None and target is not None and target > own:
                found.append(f"{name}:{line} imports {module} (a lower layer)")
    return found


def forbidden_imports(
    modules: dict[str, Path], owner: str, forbidden: tuple[str, ...]
) -> list[str]:
    """Imports of ``forbidden`` top-level packages by modules of ``owner``."""
    return [
        f"{name}:{line} imports {module}"
        for name, path in modules.items()
        if name.split(".")[0] == owner
        for module, _, line in imports_of(name, path)
        if module.split(".")[0] in forbidden
    ]


# --- the checker on made-up trees ---------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_files(root, ("pkg",))


def test_the_checker_finds_a_deferred_cycle_through_a_package_init(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a/__init__.py": "from pkg.a.x import X\n",
            "pkg/a/x.py": "X = 1\ndef f():\n    from pkg.b.y import Y\n",
            "pkg/b/__init__.py": "",
            "pkg/b/y.py": "from pkg.a.z import Z\nY = 2\n",  # runs pkg/a/__init__ -> x
            "pkg/a/z.py": "Z = 3\n",
        },
    )
    graph = import_graph(modules)
    assert "pkg.a" in graph["pkg.b.y"]  # the package __init__ on the way
    assert find_cycles(graph) == [["pkg.a", "pkg.a.x", "pkg.b.y"]]
    del graph["pkg.a.x"]  # no deferred import of y: no cycle
    graph = {k: v - {"pkg.a.x"} for k, v in graph.items()}
    assert find_cycles(graph) == []


def test_the_checker_finds_private_and_forbidden_imports(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def _helper():\n    pass\n",
            "pkg/b.py": "def g():\n    from pkg.a import _helper\n",
            "pkg/c/__init__.py": "from pkg.c._impl import thing\n",  # its own private module
            "pkg/c/_impl.py": "thing = 1\n",
            "pkg/d.py": "from pkg.c._impl import thing\nimport trainers.x\n",  # another package's
            "pkg/e.py": "import typing\nif typing.TYPE_CHECKING:\n    import trainers\n",
        },
    )
    found = private_imports(modules, ("pkg",))
    assert len(found) == 2
    assert "imports _helper from pkg.a" in found[0] and "private module pkg.c._impl" in found[1]
    assert forbidden_imports(modules, "pkg", ("trainers",)) == ["pkg.d:2 imports trainers.x"]


# --- the rules on this project ------------------------------------------------------------------


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return module_files(ROOT, PACKAGES)


def test_no_underscore_name_is_imported_from_another_module(modules: dict[str, Path]) -> None:
    assert private_imports(modules, PACKAGES) == []


def test_the_import_graph_has_no_cycle(modules: dict[str, Path]) -> None:
    assert find_cycles(import_graph(modules)) == []


def test_the_checker_finds_an_upward_import(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/low.py": "from pkg.high import x\n", "pkg/high.py": "x = 1\n"},
    )
    assert upward_imports(modules, [{"pkg.high"}, {"pkg.low"}]) == []
    found = upward_imports(modules, [{"pkg.low"}, {"pkg.high"}])
    assert found == ["pkg.low:1 imports pkg.high (a lower layer)"]


def test_packages_import_only_from_the_layers_above(modules: dict[str, Path]) -> None:
    assert upward_imports(modules, LAYERS) == []


def test_llm_gym_imports_neither_trainers_nor_benchmarks(modules: dict[str, Path]) -> None:
    assert forbidden_imports(modules, "llm_gym", ("trainers", "benchmarks")) == []


def test_no_source_module_is_over_the_size_limit() -> None:
    too_long = {}
    for folder in (*PACKAGES, "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES and relative not in DATA_TABLES:
                too_long[relative] = lines
    assert too_long == {}
    for relative in DATA_TABLES:  # the exceptions still exist (and still need to be)
        assert len((ROOT / relative).read_text().splitlines()) > MAX_LINES, relative
