"""Code-v0's sandbox (:mod:`llm_gym.envs.code.sandbox`) against hostile candidate code: the work
dir bounded as a whole (bytes and inodes) and removed at any depth, process resources and
descriptors refused, the audit hook's own state out of the candidate's reach, and the parent's
side of the result channel ignoring fake, malformed or oversized records.

Every case is bounded (a sandbox run of a few seconds at most) and asserts containment: a
refusal inside the run, no verdict, or a clean work dir, never a change outside.
"""

from __future__ import annotations

import dis
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from llm_gym.envs.code import _process, sandbox
from llm_gym.envs.code.grading import grade
from llm_gym.envs.code.sandbox import run_function

LINUX = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")
HOOK_ONLY = dict(landlock=False, namespaces=False, seccomp=False)
"""The audit hook alone (the kernel layers off), to show the hook holds on its own."""


@pytest.fixture(scope="module")
def layers() -> tuple[str, ...]:
    return sandbox.sandbox_layers()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """An empty folder anyone may write to: only the sandbox's layers stand in the way."""
    tmp_path.chmod(0o755)
    folder = tmp_path / "outside"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


def run(code: str, **options: Any) -> Any:
    """Run ``f()`` of ``code`` once; its value (the call must have returned)."""
    result = run_function(code, "f", [[]], **options)
    assert not os.path.exists(result.work_dir)
    call = result.calls[0]
    assert call is not None and call.error is None, (result.definition_error, call, result.stderr)
    return call.value


# --- Code-v0: resources of the work dir -----------------------------------------------------------

FILL = """
import os
def f():
    made = 0
    try:
        while True:
            if KIND == 'files':
                with open(f'f{made}', 'wb') as out:
                    out.write(b'x' * ((1 << 20) - 1))
            elif KIND == 'folders':
                os.mkdir(f'd{made}')
            else:
                os.mkdir('d')
                os.chdir('d')
            made += 1
    except OSError as exc:
        return [made, exc.errno]
"""


@LINUX
@pytest.mark.parametrize("kind", ["files", "folders"])
def test_the_work_dir_is_bounded_as_a_whole(kind: str, layers: tuple[str, ...]) -> None:
    if "disk_quota" not in layers:
        pytest.skip("no tmpfs work dir here (a root grader mounts one)")
    start = time.monotonic()
    made, errno = run(f"KIND = {kind!r}\n" + FILL)
    took = time.monotonic() - start
    assert errno == 28  # ENOSPC: the tmpfs is full, long before the wall-clock limit
    assert made <= (16 if kind == "files" else 4096)
    assert took < 2.0, f"the run and its clean-up took {took:.1f} s"


@LINUX
def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path: Path) -> None:
    top = tmp_path / "work"
    top.mkdir()
    here = os.getcwd()
    try:
        os.chdir(top)
        for level in range(1500):  # deeper than shutil.rmtree's recursion
            os.mkdir("d")
            os.chdir("d")
            if level % 300 == 0:
                Path("f").write_text("x")
        os.chmod(".", 0)
    finally:
        os.chdir(here)
    _process.remove_tree(str(top))  # iterative: deeper than any recursion limit
    assert not top.exists()
    # And through a run: the grading returns, with no tree left behind.
    verdict = grade("KIND = 'deep'\n" + FILL, "f", [{"args": [], "expected": 0}])
    assert verdict.sandbox is not None and not os.path.exists(verdict.sandbox.work_dir)


RESOURCES = """
import os, sys
def attempt(action):
    try:
        return 'allowed: ' + repr(action())[:40]
    except BaseException as exc:
        return type(exc).__name__
def files():
    fds = []
    try:
        while len(fds) < 1000:
            fds.append(os.open('f%d' % len(fds), os.O_CREAT | os.O_WRONLY))
    finally:
        for fd in fds:
            os.close(fd)
def thread():
    import threading
    t = threading.Thread(target=print)
    t.start()
def watchdog():
    import faulthandler
    faulthandler.dump_traceback_later(5)
def huge_map():
    import mmap
    return len(mmap.mmap(-1, 1 << 40))
def raise_limit():
    import resource
    resource.setrlimit(resource.RLIMIT_CPU, (100, 100))
def shared_memory():
    import _posixshmem
    return _posixshmem.shm_open('/llm_gym_campaign', os.O_CREAT | os.O_RDWR, 0o600)
def shared_memory_module():
    from multiprocessing import shared_memory
    return shared_memory.SharedMemory(create=True, size=16)
def pidfd():
    return os.pidfd_open(os.getpid())
def f():
    names = ['files', 'thread', 'watchdog', 'huge_map', 'raise_limit', 'shared_memory',
             'shared_memory_module', 'pidfd']
    return {name: attempt(globals()[name]) for name in names}
"""


@LINUX
def test_resources_and_process_descriptors_are_refused(layers: tuple[str, ...]) -> None:
    outcome = run(RESOURCES)
    assert outcome["files"] == "OSError"  # RLIMIT_NOFILE (EMFILE)
    assert outcome["thread"] == outcome["watchdog"] == "RuntimeError"
    assert outcome["huge_map"] == "OSError"  # RLIMIT_AS
    assert outcome["raise_limit"] == outcome["shared_memory"] == "PermissionError"
    assert outcome["shared_memory_module"] == "PermissionError"
    if "seccomp" in layers:
        assert outcome["pidfd"] == "PermissionError"  # no pidfd_send_signal without an event


# --- Code-v0: the audit hook's own state ----------------------------------------------------------

HOOK_STATE = """
import builtins, os, sys
OUT = OUTSIDE
def attempt(action):
    try:
        action()
        return 'allowed'
    except BaseException as exc:
        return type(exc).__name__
def frames_of_a_refusal():
    try:
        import ctypes
    except PermissionError as exc:
        tb, frames = exc.__traceback__, []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        return frames
def f():
    outcome = {}
    real_len = builtins.len
    builtins.len = lambda *a: 0  # the hook read len() through the builtins
    outcome['len'] = attempt(lambda: os.mkdir(OUT + '/by_len'))
    builtins.len = real_len
    harness = sys._getframe(1).f_globals  # the harness's module globals
    outcome['table'] = attempt(lambda: harness['_WRITE_EVENTS'].clear())
    outcome['table write'] = attempt(lambda: os.mkdir(OUT + '/by_table'))
    hook = [fr.f_locals for fr in frames_of_a_refusal() if fr.f_code.co_name == 'hook'][0]
    helpers = [v for v in hook.values() if callable(v) and type(v).__name__ == 'function']
    outcome['helpers'] = len(helpers)
    outcome['cells'] = sum(h.__closure__ is not None for h in helpers)
    for helper in helpers:
        for name, value in (('__defaults__', ()), ('__kwdefaults__', {}),
                            ('__code__', (lambda: 0).__code__)):
            outcome[helper.__name__ + name] = attempt(lambda: setattr(helper, name, value))
        outcome[helper.__name__ + ' del'] = attempt(lambda: delattr(helper, '__defaults__'))
    hook['last_pyc'][0] = os.path.abspath('fake.pyc')  # the hint, pointed at the work dir
    def code_from_bytes():
        import marshal
        return marshal.loads(marshal.dumps((lambda: 1).__code__))
    outcome['marshal'] = attempt(code_from_bytes)
    def frozen():
        import _imp, marshal
        return _imp.get_frozen_object('x', marshal.dumps((lambda: 1).__code__))
    outcome['frozen'] = attempt(frozen)
    outcome['import'] = attempt(lambda: __import__('_posixsubprocess'))
    return outcome
"""


@LINUX
@pytest.mark.parametrize("alone", [True, False], ids=["hook alone", "every layer"])
def test_the_hook_state_is_out_of_the_candidates_reach(alone: bool, outside: Path) -> None:
    outcome = run(f"OUTSIDE = {str(outside)!r}\n" + HOOK_STATE, **(HOOK_ONLY if alone else {}))
    assert outcome.pop("len") == outcome.pop("table write") == "PermissionError", outcome
    assert outcome.pop("table") == "allowed"  # the harness's copy: the hook holds its own
    assert outcome.pop("helpers") >= 6 and outcome.pop("cells") == 0
    assert outcome.pop("marshal") == "PermissionError"
    assert outcome.pop("frozen") in ("PermissionError", "ImportError")
    assert outcome.pop("import") == "PermissionError"
    assert set(outcome.values()) == {"PermissionError"}, outcome  # every helper attribute
    assert list(outside.iterdir()) == []


def _code_objects(code: Any) -> list[Any]:
    found = [code]
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            found += _code_objects(const)
    return found


def test_the_hook_reads_no_global_and_shares_no_cell() -> None:
    """The invariant behind the test above, checked on the source: every function the hook is
    made of binds what it uses as arguments (no global name, no closure cell)."""
    path = Path(sandbox.__file__).with_name("_child_harness.py")
    module = compile(path.read_text(), str(path), "exec")
    (installer,) = [
        c for c in module.co_consts if getattr(c, "co_name", "") == "_install_audit_hook"
    ]
    assert installer.co_cellvars == ()
    nested = _code_objects(installer)[1:]
    assert {c.co_name for c in nested} >= {"hook", "checked", "check_open", "pyc_holds"}
    for code in nested:
        assert code.co_freevars == (), code.co_name
        loads = {i.opname for i in dis.get_instructions(code)}
        assert not loads & {"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLOSURE"}, code.co_name
        assert code.co_kwonlyargcount == 0, code.co_name  # __kwdefaults__ is a mutable dict


@LINUX
def test_the_standard_library_still_imports_under_the_pyc_rule() -> None:
    code = (
        "import collections, dataclasses, decimal, fractions, json, re, statistics, typing\n"
        "import argparse, datetime, email, importlib.util, pathlib, runpy, unittest, zipimport\n"
        "def f():\n    return statistics.mean([1, 2, 3])\n"
    )
    assert run(code) == 2


# --- Code-v0: the parent's side of the channels ---------------------------------------------------

CHANNELS = {
    # Records the parent must ignore: out-of-range or non-int indices, bad JSON, bad UTF-8.
    "fake records": (
        "import os\n"
        "def f():\n"
        "    for i in (True, -1, 10**30, '0', 1.0, None):\n"
        "        os.write(FD, (repr({'kind': 'call', 'i': i, 'value': 7}) + '\\n').encode())\n"
        "    os.write(FD, b'\\xff\\xfe{\"kind\": \"call\", \"i\": 0\\n' + b'[' * 5000 + b'\\n')\n"
        "    return 6\n",
        "returned 6",
    ),
    # One 4 MB line without a newline: the results cap stops the run.
    "a line past the results cap": (
        "import os\ndef f():\n    os.write(FD, b'x' * (5 << 20))\n    return 7\n",
        "no result",
    ),
    # A value nested just under the JSON decoder's limit reaches the parent's comparison.
    "deep value": (
        "import os\n"
        "def f():\n"
        "    deep = b'[' * 900 + b'0' + b']' * 900\n"
        '    os.write(FD, b\'{"kind": "call", "i": 0, "value": \' + deep + b\'}\\n\')\n'
        "    return 6\n",
        "returned [[[",
    ),
    # A timer whose handler raises inside the harness, at any bytecode: no verdict, bounded.
    "signal timer": (
        "import signal\n"
        "def boom(*_):\n    raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGALRM, boom)\n"
        "def f():\n    signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)\n    return 6\n",
        "",
    ),
    # A profiler that raises when the harness calls os._exit: the interpreter exits normally.
    "profiler": (
        "import sys\n"
        "def prof(frame, event, arg):\n"
        "    if event == 'c_call' and getattr(arg, '__name__', '') == '_exit':\n"
        "        raise SystemExit(0)\n"
        "def f():\n    sys.setprofile(prof)\n    return 6\n",
        "returned 6",
    ),
}


@LINUX
@pytest.mark.parametrize("name", list(CHANNELS))
def test_hostile_use_of_the_channels_is_contained(name: str) -> None:
    body, detail = CHANNELS[name]
    # The results pipe's descriptor, from the harness's frame (the candidate can find it).
    find_fd = "def f():\n    FD = sys._getframe(1).f_locals['fd']\n"
    code = "import sys\n" + body.replace("def f():\n", find_fd)
    start = time.monotonic()
    verdict = grade(code, "f", [{"args": [], "expected": 8}])
    assert time.monotonic() - start < 4
    assert verdict.sandbox is not None and not os.path.exists(verdict.sandbox.work_dir)
    assert not verdict.all_passed
    assert detail in verdict.outcomes[0].detail
