"""Code-v0's escape suite, part two: escapes past the audit hook, and the kernel layers that hold.

Classes covered (issue 15, findings 1 and 5, and their siblings): an extension module loaded
under another name, from another file or from the work dir; a process created by a module the
hook never sees (a bounded fork bomb from every route, with each kernel layer on its own); a
fresh interpreter; sockets of every family, to a live Unix socket on the host; device nodes;
paths the hook could misread (``dir_fd`` after ``chdir``, climbing relative paths, descriptors
of folders outside, path objects that answer differently each time), with Landlock off so the
hook stands alone. Each attack goes through the grading path where a wrong answer could earn
reward, and the world is checked afterwards.
"""

from __future__ import annotations

import glob
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from llm_gym.envs.code import sandbox
from llm_gym.envs.code.grading import Verdict, grade
from llm_gym.envs.code.sandbox import SandboxLimits, SandboxResult, run_function
from tests.test_code_sandbox import SECRET, leftover_processes

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

IS_ROOT = os.geteuid() == 0
RULES = sandbox.read_rules()
EXTENSION_DIRS = [d for d in RULES["list_dirs"] if glob.glob(os.path.join(d, "_json*.so"))]


@pytest.fixture(scope="module")
def layers() -> tuple[str, ...]:
    return sandbox.sandbox_layers()


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
    assert not os.path.exists(verdict.sandbox.work_dir)
    assert leftover_processes(verdict.sandbox.work_dir) == []
    assert not verdict.all_passed
    return verdict


def detail(verdict: Verdict) -> str:
    return f"{verdict.error} {verdict.outcomes[0].detail}"


def value(result: SandboxResult) -> Any:
    call = result.calls[0]
    assert call is not None and call.error is None, (call, result.stderr[-2000:])
    return call.value


def run(code: str, **options: Any) -> SandboxResult:
    """``f()`` run directly with some layers off; checks nothing is left behind."""
    result = run_function(code, "f", [[]], **options)
    assert not os.path.exists(result.work_dir)
    assert leftover_processes(result.work_dir) == []
    return result


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


# --- extension modules under another name (finding 1) --------------------------------------------

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
def test_blocked_extension_modules_load_under_no_name(
    name: str, unix_server: Any, layers: tuple[str, ...]
) -> None:
    so = _posixsubprocess_file()
    if (name == "create_builtin") == (so is not None):
        pytest.skip("_posixsubprocess is " + ("a file here" if so else "built in here"))
    if name == "create_builtin" and "seccomp" not in layers and IS_ROOT:
        pytest.skip("as root without seccomp nothing but the PID namespace stops the fork")
    sock, accepted = unix_server
    python = sandbox.interpreter().encode()
    code = (
        f"import os\nSO, SOCK, PY = {so!r}, {sock!r}, {python!r}\n"
        f"def f():\n    {_LOADERS[name]}{_SPAWN}"
    )
    verdict = attempt(code)
    if name == "create_builtin":  # the fork is refused: EPERM (seccomp) or EAGAIN (NPROC)
        assert "Operation not permitted" in detail(verdict) or "unavailable" in detail(verdict)
    else:
        assert "sandbox: importing" in detail(verdict) or "sandbox: loading" in detail(verdict)
    assert not accepted()


def test_extension_modules_load_only_from_the_stdlib() -> None:
    """A module the hook allows (``_json``) loads from the stdlib, not from a copy in the work
    dir: crafted native code could be loaded the same way."""
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
    assert copied is not None and copied.error is not None and "sandbox: loading" in copied.error


# --- processes: the kernel refuses them, whatever module asks -------------------------------------

_FORK_BOMB = (
    "import os, threading\n"
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


@pytest.mark.parametrize("kernel_layer", ["all", "seccomp", "unprivileged_uid"])
def test_a_bounded_fork_bomb_creates_no_process(kernel_layer: str, layers: tuple[str, ...]) -> None:
    """Hook off: ``os.fork``, ``posix_spawn``, ``_posixsubprocess.fork_exec`` (the route a module
    loaded past the hook takes) and threads, 20 times each, with every kernel layer or one."""
    only = {"namespaces": False, "landlock": False}
    if kernel_layer == "seccomp":
        only["drop_root"] = False
        if "seccomp" not in layers:
            pytest.skip("no seccomp on this machine")
    elif kernel_layer == "unprivileged_uid":
        only["seccomp"] = False
        if not IS_ROOT:
            pytest.skip("not root: RLIMIT_NPROC holds without a change of uid")
    else:
        only = {}
    with_seccomp = kernel_layer != "unprivileged_uid" and "seccomp" in layers
    code = f"PY, ATTEMPTS, TRY_EXEC = {sandbox.interpreter()!r}, 20, {with_seccomp}\n" + _FORK_BOMB
    result = run(code, audit_hook=False, **only)
    made, errors = value(result)
    assert made == 0, errors
    assert {"fork: PermissionError", "fork: BlockingIOError"} & set(errors), errors
    assert "thread: RuntimeError" in errors, errors  # can't start new thread
    if with_seccomp:
        assert "seccomp" in result.layers
        assert "exec: errno 1" in errors  # EPERM: the only exec allowed was the launcher's
    if kernel_layer == "unprivileged_uid":
        assert "unprivileged_uid" in result.layers and "seccomp" not in result.layers


def test_threads_are_allowed_when_the_limits_allow_them(layers: tuple[str, ...]) -> None:
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
    result = run(code, audit_hook=False, limits=SandboxLimits(processes=2**20))
    assert value(result) == [45, "refused"]


# --- sockets: none, of any family ----------------------------------------------------------------

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


@pytest.mark.parametrize("hook", [True, False], ids=["with_hook", "kernel_alone"])
def test_no_socket_of_any_family_reaches_the_host(
    hook: bool, unix_server: Any, layers: tuple[str, ...]
) -> None:
    if not hook and "seccomp" not in layers:
        pytest.skip("no seccomp on this machine")
    sock, accepted = unix_server
    abstract = socket.socket(socket.AF_UNIX)
    name = f"\0llm-gym-test-{os.getpid()}"
    abstract.bind(name)
    abstract.listen()
    abstract.setblocking(False)
    try:
        code = f"SOCK, ABSTRACT = {sock!r}, {name!r}\n" + _SOCKETS
        # the kernel alone: no namespaces, no Landlock, root kept; seccomp is what stands
        options = {} if hook else {"namespaces": False, "landlock": False, "drop_root": False}
        result = run(code, audit_hook=hook, **options)
        assert value(result) == ["PermissionError"] * 7
        assert not accepted()
        with pytest.raises(BlockingIOError):
            abstract.accept()
    finally:
        abstract.close()


def test_device_nodes_cannot_be_made(layers: tuple[str, ...]) -> None:
    """As root without Landlock, a device node in the work dir would read the raw disk."""
    if "seccomp" not in layers:
        pytest.skip("no seccomp on this machine")
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
    assert value(run(code, audit_hook=False, landlock=False)) == [1, 1]  # EPERM


# --- the hook alone: paths it could misread (finding 5) ------------------------------------------

_DEEP = "    for name in 'abcdefgh':\n        os.mkdir(name)\n        os.chdir(name)\n"


def _path_attacks(world: dict[str, Path]) -> dict[str, str]:
    secret, outside = str(world["secret"]), str(world["outside"])
    # a folder of the standard library, which the code may read
    stdlib = next(d for d in RULES["read_dirs"] if d.endswith("/json"))
    up_from_stdlib = "../" * stdlib.count("/") + secret.lstrip("/")
    # from the work dir up to "/" (the hook, reading from the deep current dir, stays inside)
    up = "../" * (os.path.realpath(tempfile.gettempdir()).count("/") + 1)
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
def test_the_hook_alone_keeps_paths_honest(name: str, world: dict[str, Path]) -> None:
    """Landlock off, root kept: nothing but the audit hook stands between the code and the
    secret (which is the expected output) or the outside folder (writable by anyone)."""
    code = "import os\ndef f():\n" + _path_attacks(world)[name]
    result = run_function(code, "f", [[]], landlock=False, drop_root=False, namespaces=False)
    assert "landlock_fs" not in result.layers and result.layers[-1] == "audit_hook"
    call = result.calls[0]
    assert call is not None and call.error is not None and "sandbox: " in call.error, call
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


def test_links_to_folders_elsewhere_are_not_readable_roots(tmp_path: Path) -> None:
    """The hook compares paths as text: a stdlib entry linking elsewhere would let
    ``link/secret`` pass as inside, so such an entry is left out of the read rules."""
    from llm_gym.envs.code import _host

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "inner").mkdir()
    (tmp_path / "lib" / "out").symlink_to(tmp_path)
    (tmp_path / "lib" / "in").symlink_to(tmp_path / "lib" / "inner")
    assert _host._leads_elsewhere(str(tmp_path / "lib" / "out"))
    assert not _host._leads_elsewhere(str(tmp_path / "lib" / "in"))
    assert not _host._leads_elsewhere(str(tmp_path / "lib" / "inner"))
    assert not any(os.path.islink(p) and os.path.isdir(p) for p in RULES["read_dirs"])


# --- the seccomp program itself (a pure function), read by a small BPF interpreter --------------


def _bpf(program: list, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What the filter answers for one system call (classic BPF, the opcodes it uses)."""
    args = (*args, *[0] * (6 - len(args)))
    words = {0: nr, 4: arch}
    for index, arg in enumerate(args):
        words[16 + 8 * index], words[20 + 8 * index] = arg & 0xFFFFFFFF, arg >> 32
    a, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        pc += 1
        if code == 0x20:
            a = words[k]
        elif code == 0x06:
            return k
        else:
            taken = {0x15: a == k, 0x45: a & k != 0, 0x35: a >= k}[code]
            pc += jt if taken else jf


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_seccomp_program_says_what_it_should(machine: str) -> None:
    from llm_gym.envs.code import _child_kernel as kernel

    table = kernel._SECCOMP_ARCHES[machine]
    pointers = (0x7F00_1234_5678, 0x7F00_0000_1000, 0x5555_AAAA_0008)
    allow, eperm, kill = 0x7FFF0000, 0x00050001, 0x80000000
    for threads in (False, True):
        program = kernel._seccomp_program(machine, pointers, threads)
        arch = table["audit_arch"]
        assert _bpf(program, arch, 0) == allow  # read (x86_64) / io_setup (aarch64)
        assert _bpf(program, arch, 63) == allow  # uname / read
        for number in table["denied"].values():
            assert _bpf(program, arch, number) == eperm
        assert _bpf(program, arch, table["clone3"]) == 0x00050026  # ENOSYS: libc falls back
        assert _bpf(program, arch, table["clone"], (0x11,)) == eperm  # fork: SIGCHLD only
        thread_flags = 0x3D0F00  # what glibc's pthread_create passes, CLONE_THREAD among them
        assert _bpf(program, arch, table["clone"], (thread_flags,)) == (allow if threads else eperm)
        assert _bpf(program, arch, table["execve"], pointers) == allow
        for which in range(3):
            for flip in (1, 1 << 40):
                other = list(pointers)
                other[which] ^= flip
                assert _bpf(program, arch, table["execve"], tuple(other)) == eperm
        assert _bpf(program, 0x40000003, 0) == kill  # another ABI (i386)
        if table["x32_bit"]:
            assert _bpf(program, arch, table["x32_bit"] | 0) == kill
    assert kernel._seccomp_program("riscv64", pointers, False) is None
