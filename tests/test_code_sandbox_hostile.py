"""Code-v0's escape suite, part two (:mod:`llm_gym.envs.code.sandbox`): routes around the
interpreter, exhaustion of the work dir and the process, and hostile use of the channels.

Classes covered: an extension module loaded under another name, from another file or from the
work dir; a process created by a module Python never audits (a bounded fork bomb from every
route); a fresh interpreter; sockets of every family, to a live Unix socket on the host; device
nodes; paths that climb, ``dir_fd`` and path objects that answer differently each time; the full
power of the interpreter (``ctypes``, ``marshal``, patched builtins); the work dir's bytes and
inodes; descriptors, threads, memory maps, limits; fake and malformed result records, timers and
profilers inside the harness. Each attack goes through the grading path where a wrong answer
could earn reward, and the world is checked afterwards; where it says so, with the seccomp filter
off to show that the namespaces alone hold.
"""

from __future__ import annotations

import _json
import contextlib
import glob
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pyseccomp
import pytest

from llm_gym.envs.code import jail, sandbox
from llm_gym.envs.code.grading import Verdict, grade
from llm_gym.envs.code.sandbox import SandboxLimits, SandboxResult, run_function
from tests.test_code_sandbox import SECRET, leftover_processes

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

EXTENSION_DIRS = (
    [os.path.dirname(os.path.realpath(_json.__file__))] if hasattr(_json, "__file__") else []
)
"""The standard library's extension modules (empty where ``_json`` is built in)."""
FILTERS = {"filter": {}, "namespaces_alone": {"seccomp": False}}
"""Every layer, and the seccomp filter off (what the namespaces hold on their own)."""


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """A secret (the expected output of the attacks that read) and an empty folder outside."""
    tmp_path.chmod(0o755)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o777)
    outside.chmod(0o777)  # writable by anyone: only the sandbox's layers stand in the way
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    return {"secret": secret, "outside": outside}


def attempt(code: str, expected: Any = "pwned") -> Verdict:
    """Grade ``code`` (defining ``f()``) on one hidden test; check the run left nothing behind."""
    verdict = grade(code, "f", [{"args": [], "expected": expected}])
    assert verdict.sandbox is not None, verdict.error
    assert leftover_processes(verdict.sandbox) == []
    assert not verdict.all_passed
    return verdict


def detail(verdict: Verdict) -> str:
    return f"{verdict.error} {verdict.outcomes[0].detail}"


def value(result: SandboxResult) -> Any:
    call = result.calls[0]
    assert call is not None and call.error is None, (call, result.stderr[-2000:])
    return call.value


def run(code: str, **options: Any) -> SandboxResult:
    """``f()`` run directly (``seccomp=False``: the namespaces alone); nothing is left behind."""
    result = run_function(code, "f", [[]], **options)
    assert leftover_processes(result) == []
    return result


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """An empty folder anyone may write to: only the sandbox stands in the way."""
    tmp_path.chmod(0o755)
    folder = tmp_path / "outside"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


@pytest.fixture
def unix_server(tmp_path: Path):
    """A live Unix socket on the host that anyone may connect to; yields (path, accepted())."""
    folder = tmp_path / "sock"
    folder.mkdir()
    for path in (tmp_path, folder):
        path.chmod(0o777)
    path = str(folder / "host.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen()
    server.setblocking(False)

    def accepted() -> bool:
        try:
            server.accept()[0].close()
        except BlockingIOError:
            return False
        return True

    yield path, accepted
    server.close()


# --- extension modules under another name ---------------------------------------------------------

_SPAWN = (
    # what the loaded module is used for: a fresh interpreter that reports to the host's socket
    "    prog = ('import socket; s = socket.socket(socket.AF_UNIX); s.connect(%r); '\n"
    "            's.send(b\"escaped\")' % SOCK).encode()\n"
    "    r, w = os.pipe()\n"
    "    pid = mod.fork_exec([PY, b'-c', prog], [PY], True, (), None, None, -1, -1, -1, -1,\n"
    "                        -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)\n"
    "    os.waitpid(pid, 0)\n"
    "    return 'pwned'\n"
)


def _posixsubprocess_file() -> str | None:
    """Its file, or ``None`` where it is built into the interpreter (Debian's python3)."""
    found = [p for d in EXTENSION_DIRS for p in glob.glob(os.path.join(d, "_posixsubprocess*"))]
    return found[0] if found else None


_LOADERS = {
    "create_dynamic_dotted": (
        "import _imp, importlib.machinery as m\n"
        "    mod = _imp.create_dynamic(m.ModuleSpec('evil._posixsubprocess', None, origin=SO))\n"
    ),
    "extension_file_loader": (
        "import importlib.machinery as m, importlib.util as u\n"
        "    loader = m.ExtensionFileLoader('a.b._posixsubprocess', SO)\n"
        "    mod = u.module_from_spec(u.spec_from_file_location('a.b._posixsubprocess', SO,\n"
        "                                                       loader=loader))\n"
    ),
    "import_module": (
        "import importlib\n"
        "    import sys; sys.modules.pop('_posixsubprocess', None)\n"
        "    mod = importlib.import_module('_posixsubprocess')\n"
    ),
    # a copy in the work dir, loaded under the real name: the file is not the stdlib's
    "copy_in_work_dir": (
        "import _imp, importlib.machinery as m\n"
        "    open('_posixsubprocess.so', 'wb').write(open(SO, 'rb').read())\n"
        "    copy = os.path.abspath('_posixsubprocess.so')\n"
        "    mod = _imp.create_dynamic(m.ModuleSpec('_posixsubprocess', None, origin=copy))\n"
    ),
    # built into the interpreter: created without any audit event, so only the kernel is left
    "create_builtin": (
        "import _imp, importlib.machinery as m\n"
        "    mod = _imp.create_builtin(m.ModuleSpec('_posixsubprocess', None))\n"
    ),
}


@pytest.mark.parametrize("name", list(_LOADERS))
def test_process_modules_loaded_under_any_name_start_nothing(name: str, unix_server: Any) -> None:
    """Python never audits these loads; the filter refuses the fork whatever module asks."""
    so = _posixsubprocess_file()
    if (name == "create_builtin") == (so is not None):
        pytest.skip("_posixsubprocess is " + ("a file here" if so else "built in here"))
    sock, accepted = unix_server
    python = sandbox.interpreter().encode()
    code = (
        f"import os\nSO, SOCK, PY = {so!r}, {sock!r}, {python!r}\n"
        f"def f():\n    {_LOADERS[name]}{_SPAWN}"
    )
    verdict = attempt(code)
    if name == "copy_in_work_dir":  # the work dir is noexec: the copy cannot even be mapped
        assert "ImportError" in detail(verdict), detail(verdict)
    else:
        assert "PermissionError" in detail(verdict), detail(verdict)  # EPERM from the filter
    assert not accepted()


def test_extension_modules_load_only_from_the_stdlib() -> None:
    """``_json`` loads from the stdlib, not from a copy in the (``noexec``) work dir: crafted
    native code written there could not be loaded either."""
    if not EXTENSION_DIRS:
        pytest.skip("_json is built into this interpreter")
    (json_so,) = [p for d in EXTENSION_DIRS for p in glob.glob(os.path.join(d, "_json*.so"))]
    code = (
        "import _imp, importlib.machinery as m, os\n"
        "def f(copy):\n"
        f"    origin = {json_so!r}\n"
        "    if copy:\n"
        "        open('_json.so', 'wb').write(open(origin, 'rb').read())\n"
        "        origin = os.path.abspath('_json.so')\n"
        "    spec = m.ModuleSpec('_json', None, origin=origin)\n"
        "    return type(_imp.create_dynamic(spec)).__name__\n"
    )
    honest, copied = run_function(code, "f", [[False], [True]]).calls
    assert honest == sandbox.CallResult("module")
    assert copied is not None and copied.error is not None and "ImportError" in copied.error


# --- processes: the kernel refuses them, whatever module asks -------------------------------------

_FORK_BOMB = (
    "import os, threading, time\n"
    "def f():\n"
    "    routes = {'fork': os.fork,\n"
    "              'spawn': lambda: os.posix_spawn(PY, [PY, '-c', '0'], {}),\n"
    "              'thread': lambda: threading.Thread(target=lambda: None).start()}\n"
    "    try:\n"
    "        import _posixsubprocess as ps\n"
    "        routes['fork_exec'] = lambda: ps.fork_exec(\n"
    "            [PY.encode(), b'-c', b'0'], [PY.encode()], True, (), None, None, -1, -1, -1, -1,\n"
    "            -1, -1, *os.pipe(), True, False, -1, None, None, None, -1, None, False)\n"
    "    except ImportError:\n"
    "        pass\n"
    "    made, errors = 0, set()\n"
    "    for name, route in routes.items():\n"
    "        for _ in range(ATTEMPTS):  # bounded: a regression must not take the machine down\n"
    "            try:\n"
    "                if route() == 0:\n"
    "                    os._exit(0)  # a forked child leaves at once\n"
    "                made += 1\n"
    "            except Exception as exc:\n"
    "                errors.add(f'{name}: {type(exc).__name__}')\n"
    "    try:\n"
    "        if TRY_EXEC:  # a fresh interpreter, without the hook\n"
    "            os.execv(PY, [PY, '-c', '0'])\n"
    "    except OSError as exc:\n"
    "        errors.add(f'exec: errno {exc.errno}')\n"
    "    return [made, sorted(errors)]\n"
)


@pytest.mark.parametrize("threads", [False, True], ids=["no_threads", "threads_allowed"])
def test_a_bounded_fork_bomb_creates_no_process(threads: bool) -> None:
    """``os.fork``, ``posix_spawn``, ``_posixsubprocess.fork_exec`` and threads, 20 times each;
    then ``exec`` of a fresh interpreter that tries to fork once more."""
    code = f"PY, ATTEMPTS, TRY_EXEC = {sandbox.interpreter()!r}, 20, False\n" + _FORK_BOMB
    limits = SandboxLimits(processes=2**20 if threads else 0)
    made, errors = value(run(code, limits=limits))
    assert made == (20 if threads else 0), errors
    assert {"fork: PermissionError", "spawn: PermissionError"} <= set(errors), errors
    assert ("thread: RuntimeError" in errors) != threads, errors  # can't start new thread
    fresh = "import os\ndef f():\n    os.execv(PY, [PY, '-c', 'import os; os.fork()'])\n"
    result = run(f"PY = {sandbox.interpreter()!r}\n" + fresh, limits=limits)
    assert result.calls == (None,) and "PermissionError" in result.stderr


def test_without_the_filter_forked_processes_die_with_the_run() -> None:
    code = f"PY, ATTEMPTS, TRY_EXEC = {sandbox.interpreter()!r}, 5, False\n" + _FORK_BOMB
    made, _ = value(run(code.replace("os._exit(0)", "os.setsid(); time.sleep(60)"), seccomp=False))
    assert made > 0  # they ran, and run() found none of them left


def test_threads_are_allowed_when_the_limits_allow_them() -> None:
    """``processes > 0`` lets threads start; processes stay refused. (``RLIMIT_NPROC`` counts
    every process of the user, so the limit is high: the filter is under test.)"""
    code = (
        "import os, threading\n"
        "def f():\n"
        "    out = []\n"
        "    t = threading.Thread(target=lambda: out.append(sum(range(10))))\n"
        "    t.start()\n"
        "    t.join()\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os._exit(0)\n"
        "        out.append('forked')\n"
        "    except OSError:\n"
        "        out.append('refused')\n"
        "    return out\n"
    )
    result = run(code, limits=SandboxLimits(processes=2**20))
    assert value(result) == [45, "refused"]


# --- sockets: none, of any family -----------------------------------------------------------------

_SOCKETS = (
    "import socket\n"
    "def attempt(action):\n"
    "    try:\n"
    "        action()\n"
    "        return 'connected'\n"
    "    except Exception as exc:\n"
    "        return type(exc).__name__\n"
    "def unix(address):\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    s.connect(address)\n"
    "    s.send(b'escaped')\n"
    "def f():\n"
    "    return [attempt(lambda: unix(SOCK)), attempt(lambda: unix(ABSTRACT)),\n"
    "            attempt(socket.socketpair),\n"
    "            attempt(lambda: socket.create_connection(('127.0.0.1', 9), timeout=0.2)),\n"
    "            attempt(lambda: socket.socket(socket.AF_INET6)),\n"
    "            attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),\n"
    "            attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))]\n"
)


@pytest.mark.parametrize("layers", list(FILTERS))
def test_no_socket_of_any_family_reaches_the_host(layers: str, unix_server: Any) -> None:
    sock, accepted = unix_server
    abstract = socket.socket(socket.AF_UNIX)
    name = f"\0llm-gym-test-{os.getpid()}"
    abstract.bind(name)
    abstract.listen()
    abstract.setblocking(False)
    try:
        code = f"SOCK, ABSTRACT = {sock!r}, {name!r}\n" + _SOCKETS
        outcome = value(run(code, **FILTERS[layers]))
        if layers == "filter":
            assert outcome == ["PermissionError"] * 7
        else:  # sockets exist, in a network namespace of their own: nothing reaches the host
            assert outcome[:2] == ["FileNotFoundError", "ConnectionRefusedError"], outcome
        assert not accepted()
        with pytest.raises(BlockingIOError):
            abstract.accept()
    finally:
        abstract.close()


def test_device_nodes_cannot_be_made() -> None:
    """A device node in the work dir would read the raw disk."""
    code = (
        "import os\n"
        "def f():\n"
        "    out = []\n"
        "    for make in (lambda: os.mknod('mem', 0o20600, os.makedev(1, 1)),\n"
        "                 lambda: os.mkfifo('fifo')):\n"
        "        try:\n"
        "            make()\n"
        "            out.append('made')\n"
        "        except OSError as exc:\n"
        "            out.append(exc.errno)\n"
        "    return out\n"
    )
    assert value(run(code)) == [1, 1]  # EPERM


# --- paths that climb, descriptors, path objects --------------------------------------------------

_DEEP = "    for name in 'abcdefgh':\n        os.mkdir(name)\n        os.chdir(name)\n"


def _path_attacks(world: dict[str, Path]) -> dict[str, str]:
    secret, outside = str(world["secret"]), str(world["outside"])
    # a folder of the standard library, which the code may read
    stdlib = os.path.dirname(os.path.realpath(json.__file__))
    up_from_stdlib = "../" * stdlib.count("/") + secret.lstrip("/")
    up = "../" * 12  # from the deep current dir up to "/" (and no further)
    up_from_work = up + secret.lstrip("/")
    return {
        "dir_fd_of_stdlib": (
            f"{_DEEP}    fd = os.open({stdlib!r}, os.O_RDONLY)\n"
            f"    return os.read(os.open({up_from_stdlib!r}, 0, dir_fd=fd), 99).decode()\n"
        ),
        "o_path_of_stdlib": (
            f"{_DEEP}    fd = os.open({stdlib!r}, os.O_PATH)\n"
            f"    return os.read(os.open({up_from_stdlib!r}, 0, dir_fd=fd), 99).decode()\n"
        ),
        "dir_fd_of_work_dir": (
            "    fd = os.open('.', os.O_RDONLY)\n"
            f"{_DEEP}    return os.read(os.open({up_from_work!r}, 0, dir_fd=fd), 99).decode()\n"
        ),
        "chdir_outside": (
            f"    os.chdir({str(world['secret'].parent)!r})\n    return open('secret.txt').read()\n"
        ),
        "write_through_dir_fd": (
            "    fd = os.open('.', os.O_RDONLY)\n"
            f"{_DEEP}    out = os.open({up + outside.lstrip('/') + '/p'!r},\n"
            "                  os.O_WRONLY | os.O_CREAT, dir_fd=fd)\n"
            "    os.write(out, b'x')\n"
            f"    return open({secret!r}).read()\n"
        ),
        "mkdir_and_rename_through_dir_fd": (
            "    fd = os.open('.', os.O_RDONLY)\n"
            "    open('loot', 'w').close()\n"
            f"{_DEEP}    target = {up + outside.lstrip('/')!r}\n"
            "    try:\n"
            "        os.mkdir(target + '/d', dir_fd=fd)\n"
            "    finally:\n"
            "        os.rename('loot', target + '/loot', src_dir_fd=fd, dst_dir_fd=fd)\n"
        ),
        "path_object_that_changes": (
            "    class Shifty:\n"
            "        calls = 0\n"
            "        def __fspath__(self):\n"
            "            Shifty.calls += 1\n"
            f"            return {secret!r} if Shifty.calls % 2 else 'harmless.txt'\n"
            "    return os.read(os.open(Shifty(), os.O_RDONLY), 99).decode()\n"
        ),
    }


@pytest.mark.parametrize(
    "name",
    [
        "dir_fd_of_stdlib",
        "o_path_of_stdlib",
        "dir_fd_of_work_dir",
        "chdir_outside",
        "write_through_dir_fd",
        "mkdir_and_rename_through_dir_fd",
        "path_object_that_changes",
    ],
)
def test_paths_never_lead_out_of_the_sandbox(name: str, world: dict[str, Path]) -> None:
    """The secret (the expected output) and the outside folder (writable by anyone) are not in
    the sandbox's file system, however a path is spelled: the filter off, and every layer."""
    code = "import os\ndef f():\n" + _path_attacks(world)[name]
    call = run(code, seccomp=False).calls[0]
    assert call is not None and call.error is not None and "Error" in call.error, call
    assert world["secret"].read_text() == SECRET
    assert list(world["outside"].iterdir()) == []
    verdict = attempt(code, expected=SECRET)  # and with every layer: no reward either
    assert world["secret"].read_text() == SECRET and list(world["outside"].iterdir()) == []
    assert verdict.sandbox is not None


def test_honest_file_work_in_the_work_dir_still_works() -> None:
    code = (
        "import os, shutil, pathlib\n"
        "def f():\n"
        "    os.makedirs('a/b')\n"
        "    os.chdir('a/b')\n"
        "    open('x.txt', 'w').write('hi')\n"
        "    os.chdir('..')\n"  # climbing with chdir: resolved against the known current dir
        "    fd = os.open('b', os.O_RDONLY)\n"
        "    text = os.read(os.open('x.txt', os.O_RDONLY, dir_fd=fd), 9).decode()\n"
        "    os.rename('x.txt', 'y.txt', src_dir_fd=fd, dst_dir_fd=fd)\n"
        "    names = sorted(e.name for e in os.scandir('b'))\n"
        "    os.chdir('..')\n"
        "    shutil.rmtree('a')\n"
        "    folder = pathlib.Path('p')\n"
        "    folder.mkdir()\n"
        "    (folder / 'q.txt').write_text('z')\n"
        "    read = (folder / 'q.txt').read_text()\n"
        "    shutil.rmtree(folder)\n"
        "    return [text, names, read, os.listdir('.')]\n"
    )
    result = run(code)
    assert value(result) == ["hi", ["y.txt"], "z", []]


def test_the_view_holds_no_site_packages_and_no_project() -> None:
    code = (
        "import os, sysconfig\n"
        "def f():\n"
        "    site = sysconfig.get_paths()['purelib']\n"
        f"    return [os.listdir(site), os.path.exists({str(Path(__file__).parents[1])!r}),\n"
        "            os.path.exists('/proc/1'), sorted(os.listdir('/sandbox'))]\n"
    )
    assert value(run(code)) == [[], False, False, ["harness.py"]]


# --- the filter libseccomp compiled, read by a small BPF interpreter ------------------------------


def _bpf(program: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What the filter answers for one system call (classic BPF, the opcodes libseccomp emits)."""
    code = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    args = (*args, *[0] * (6 - len(args)))
    words = {0: nr, 4: arch}
    for index, arg in enumerate(args):
        words[16 + 8 * index], words[20 + 8 * index] = arg & 0xFFFFFFFF, arg >> 32
    a, pc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        pc += 1
        if op == 0x20:
            a = words[k]
        elif op == 0x54:
            a &= k
        elif op == 0x06:
            return k
        else:
            taken = {0x15: a == k, 0x45: a & k != 0, 0x35: a >= k, 0x25: a > k}[op]
            pc += jt if taken else jf


@pytest.mark.parametrize("threads", [False, True])
def test_the_filter_says_what_it_should(threads: bool) -> None:
    program = jail.seccomp_filter(threads)
    arch = pyseccomp.system_arch()
    allow, eperm = pyseccomp.ALLOW, pyseccomp.ERRNO(1)

    def number(name: str) -> int:
        return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)

    for name in ("read", "write", "openat", "mmap", "execve", "exit_group"):
        assert _bpf(program, arch, number(name)) == allow, name
    for name in jail.DENIED_SYSCALLS:
        with contextlib.suppress(OSError):  # a call this architecture lacks
            assert _bpf(program, arch, number(name)) == eperm, name
    assert _bpf(program, arch, number("clone3")) == pyseccomp.ERRNO(38)  # ENOSYS: libc falls back
    assert _bpf(program, arch, number("clone"), (0x11,)) == eperm  # fork: SIGCHLD only
    thread_flags = 0x3D0F00  # what glibc's pthread_create passes, CLONE_THREAD among them
    assert _bpf(program, arch, number("clone"), (thread_flags,)) == (allow if threads else eperm)
    assert _bpf(program, 0x40000003, 0) == pyseccomp.KILL_PROCESS  # another ABI (i386)


# --- the work dir and the process: exhaustion -----------------------------------------------------

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


@pytest.mark.parametrize("kind", ["files", "folders"])
def test_the_work_dir_is_bounded_as_a_whole(kind: str) -> None:
    start = time.monotonic()
    made, errno = value(run(f"KIND = {kind!r}\n" + FILL))
    took = time.monotonic() - start
    assert errno == 28  # ENOSPC: the tmpfs is full, long before the wall-clock limit
    assert made <= (16 if kind == "files" else 4096)
    assert took < 2.0, f"the run and its clean-up took {took:.1f} s"


def test_a_tree_deeper_than_the_recursion_limit_vanishes_with_the_run() -> None:
    """A chain of folders as deep as the inodes allow: the grader never walks it."""
    start = time.monotonic()
    verdict = attempt("KIND = 'deep'\n" + FILL, expected=0)
    made, errno = verdict.sandbox.calls[0].value  # type: ignore[union-attr]
    assert errno == 28 and made > 1000  # deeper than shutil.rmtree's recursion
    assert time.monotonic() - start < 2.0


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
    return _posixshmem.shm_open('/llm_gym_sandbox_probe', os.O_CREAT | os.O_RDWR, 0o600)
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


def test_resources_and_process_descriptors_are_refused() -> None:
    outcome = value(run(RESOURCES))
    assert outcome["files"] == "OSError"  # RLIMIT_NOFILE (EMFILE)
    assert outcome["thread"] == outcome["watchdog"] == "RuntimeError"
    assert outcome["huge_map"] == "OSError"  # RLIMIT_AS
    assert outcome["raise_limit"] == "ValueError"  # EPERM: only this process may raise them
    assert outcome["shared_memory"] == outcome["shared_memory_module"] == "OSError"  # EROFS
    assert outcome["pidfd"] == "PermissionError"  # the filter: no process descriptors


# --- the interpreter's full power reaches nothing outside -----------------------------------------

POWERS = """
import builtins, os, sys
OUT = OUTSIDE
def attempt(action):
    try:
        return 'allowed: ' + repr(action())[:60]
    except BaseException as exc:
        return type(exc).__name__
def by_libc():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    made = libc.mkdir((OUT + '/by_libc').encode(), 0o777)
    return [made, ctypes.get_errno(), libc.getpid(), libc.getuid()]
def code_from_bytes():
    import marshal
    return eval(marshal.loads(marshal.dumps(compile('6 * 7', 's', 'eval'))))
def f():
    outcome = {}
    real_len = builtins.len
    builtins.len = lambda *a: 0
    outcome['len'] = attempt(lambda: os.mkdir(OUT + '/by_len'))
    builtins.len = real_len
    outcome['libc'] = attempt(by_libc)
    outcome['marshal'] = attempt(code_from_bytes)
    outcome['kill'] = attempt(lambda: os.kill(PARENT, 9))
    outcome['chroot'] = attempt(lambda: os.chroot('/work'))
    return outcome
"""


@pytest.mark.parametrize("layers", list(FILTERS))
def test_the_interpreters_full_power_reaches_nothing_outside(layers: str, outside: Path) -> None:
    """ctypes, code objects from bytes and patched builtins all work; none reaches the host."""
    head = f"OUTSIDE, PARENT = {str(outside)!r}, {os.getpid()}\n"
    outcome = value(run(head + POWERS, **FILTERS[layers]))
    assert outcome["len"] == "FileNotFoundError"
    assert outcome["libc"] == "allowed: [-1, 2, 1, 65534]"  # ENOENT; PID 1, uid 65534
    assert outcome["marshal"] == "allowed: 42"
    assert outcome["kill"] == "ProcessLookupError"  # the grader is not in the PID namespace
    assert outcome["chroot"] == "PermissionError"
    assert list(outside.iterdir()) == []


def test_the_standard_library_still_imports() -> None:
    code = (
        "import collections, dataclasses, decimal, fractions, json, re, statistics, typing\n"
        "import argparse, datetime, email, importlib.util, pathlib, runpy, unittest, zipimport\n"
        "def f():\n    return statistics.mean([1, 2, 3])\n"
    )
    assert value(run(code)) == 2


# --- the parent's side of the channels ------------------------------------------------------------

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


@pytest.mark.parametrize("name", list(CHANNELS))
def test_hostile_use_of_the_channels_is_contained(name: str) -> None:
    body, detail = CHANNELS[name]
    # The results pipe's descriptor, from the harness's frame (the candidate can find it).
    find_fd = "def f():\n    FD = sys._getframe(1).f_locals['fd']\n"
    code = "import sys\n" + body.replace("def f():\n", find_fd)
    start = time.monotonic()
    verdict = attempt(code, expected=8)
    assert time.monotonic() - start < 4
    assert detail in verdict.outcomes[0].detail
