"""Run untrusted Python code in a separate, locked-down process and collect its return values.

:func:`run_function` executes a candidate's source, calls one function in it on a list of argument
tuples and returns what each call returned or raised. It never decides whether a value is right:
the caller compares the values with expected outputs that never leave the parent process, so
nothing the child prints, writes or exits with can forge a verdict.

## Threat model

The code is written by a model under training: assume it is adversarial. It may try to read or
write files outside its work directory (the grader's source, the expected outputs, other
episodes' records, secrets), open network connections, start processes (a fork bomb), exhaust CPU,
memory, disk or output, import the grader, kill or trace other processes, tamper with the harness
inside its own interpreter, or fake a passing verdict. Each attempt must fail safely: the episode
is graded as a failure and nothing outside the work directory changes.

## The layers (outermost first)

1. **Unforgeable protocol.** The child receives only the code, the function name and the inputs.
   It writes one JSON record per call to a dedicated pipe; the parent parses them strictly (first
   record per call wins, anything else is ignored) and compares them with the expected outputs
   itself. Exit codes and printed text are never trusted. Writing fake records can only report
   values, and a value the child cannot compute it cannot report.
2. **A fresh process** started with ``python -I -S -B`` (isolated mode, no ``site``: neither
   ``llm_gym`` nor any site-packages is importable, ``PYTHON*`` variables are ignored), the base
   interpreter rather than a virtualenv's, a minimal environment (``PATH``, ``LANG``, ``HOME`` and
   ``TMPDIR``: no inherited secrets, no proxies), a new temporary directory as its working
   directory (removed afterwards), its own session and process group, stdin closed after the
   payload is read and every other descriptor closed.
3. **No root.** A grader running as root runs the candidate as ``nobody`` with no capability
   (or only ``CAP_DAC_READ_SEARCH``, where root's interpreter lives in a folder ``nobody`` cannot
   read), so the process limit below holds and root's powers (devices, signals, other users'
   files, mounts) are gone.
4. **Resource limits** set in the child before the candidate's interpreter is exec'd:
   ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_NPROC`` (0: no
   fork, no thread) and ``RLIMIT_CORE`` (0); a root grader mounts a tmpfs of ``disk_bytes`` over
   the work dir in a private mount namespace, so the files together are bounded too. The parent
   adds a wall-clock deadline that SIGKILLs the whole process group, caps stdout + stderr (a flood
   kills the run) and caps the results.
5. **Namespaces** where the kernel allows them: network (no interface but a down loopback), IPC
   and PID (the candidate is the init: every process it could leave behind dies with it); a user
   namespace too when the grader is not root. ``unshare(2)`` is called directly; where the kernel
   or a container refuses, the run goes on without them.
6. **Landlock** (Linux >= 5.13): the process may read only the interpreter, its shared libraries
   and the standard library (``site-packages`` excluded), may read and write only its work
   directory, may execute nothing but the interpreter, and (ABI >= 4) may not bind or connect
   TCP sockets, (ABI >= 6) may not signal processes or reach abstract unix sockets outside itself.
7. **seccomp** (x86_64, aarch64): no process creation, no ``exec`` after the launcher's, no
   socket of any family, no ``mknod``, ``ptrace``, namespaces, mounts or ``io_uring``; threads
   only where ``SandboxLimits.processes`` allows them (see
   :mod:`llm_gym.envs.code._child_kernel`). Layers 3 to 7 are enforced by the kernel, inherited
   across ``exec`` and irreversible: they bind any interpreter or native code the candidate
   reaches.
8. **An audit hook** (:pep:`578`) in the candidate's interpreter refuses ``open`` outside the
   allowed paths (and the ``dir_fd``/``chdir`` tricks that would mislead a path check), writes
   outside the work directory, sockets, ``fork``/``exec``/``subprocess``, signals, ``ctypes``,
   ``_posixsubprocess`` under any name, extension modules from outside the standard library,
   symlinks, code-object construction (``code.__new__``, ``marshal.loads`` of anything but the
   standard library's ``.pyc`` files) and the like; its state is bound when it is installed and
   cannot be changed from the candidate's code. Defence in depth: code that escapes the
   interpreter is not bound by it; the kernel layers are the wall.

:func:`sandbox_layers` reports which layers this machine provides; every
:class:`SandboxResult` lists the layers that were in force for that run.

## Limits of this sandbox

It does not hide CPU timing or the existence of paths (``stat`` is not restricted), limits the
disk space of the work dir beyond ``RLIMIT_FSIZE`` per file only where it may mount a tmpfs (a
root grader), and trusts the Linux kernel. Without Landlock (an older kernel, another OS)
file-system isolation rests on the audit hook alone; run untrusted models on Linux >= 5.13.
Concurrent runs of a root grader share the uid ``nobody``: code that escaped the interpreter
on a machine without Landlock and PID namespaces could reach another run's work dir or
processes (not its expected outputs).
"""

from __future__ import annotations

import functools
import json
import marshal
import os
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_gym.envs.code._child import CHILD_FILES, TRAMPOLINE
from llm_gym.envs.code._host import interpreter, read_rules, unprivileged_ids
from llm_gym.envs.code._process import Streams, minimal_env, pump, remove_tree, stop
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "CallResult",
    "SandboxLimits",
    "SandboxResult",
    "run_function",
    "sandbox_layers",
]

_CHILD_SOURCE = "\n".join(
    Path(__file__).with_name(name).read_text(encoding="utf-8") for name in CHILD_FILES
)
_MAX_RECORDS = 100_000
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
    """All the files of the work dir together (a tmpfs of this size, one inode per 4 KiB; where
    a root grader may mount one, else only ``file_bytes`` per file holds)."""
    open_files: int = 32
    """``RLIMIT_NOFILE``."""
    processes: int = 0
    """``RLIMIT_NPROC``: 0 forbids threads too; above 0, threads may start (seccomp refuses
    new processes either way)."""
    output_bytes: int = 64 * 2**10
    """stdout + stderr above this kills the run."""
    result_bytes: int = 4 * 2**20
    """Results above this kill the run."""

    def __post_init__(self) -> None:
        names = ("cpu_seconds", "memory_bytes", "file_bytes", "disk_bytes", "open_files")
        for name in (*names, "output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, actual value: {value!r}.")
        if not isinstance(self.processes, int) or self.processes < 0:
            raise InvalidArgumentError(
                f"processes must be an int >= 0, actual value: {self.processes!r}."
            )
        if not isinstance(self.wall_seconds, int | float) or not 0 < self.wall_seconds <= 600:
            raise InvalidArgumentError(
                f"wall_seconds must be a number in (0, 600], actual value: {self.wall_seconds!r}."
            )
        if not isinstance(self.result_bytes, int) or self.result_bytes < 1024:
            raise InvalidArgumentError(
                f"result_bytes must be an int >= 1024, actual value: {self.result_bytes!r}."
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
    layers: tuple[str, ...] = field(default_factory=tuple)
    """The protections reported in force before the candidate's code ran."""
    wall_seconds: float = 0.0
    """Seconds from start to the end of clean-up."""
    work_dir: str = ""
    """The temporary working directory the run had (already removed)."""
    started: bool = True
    """False when the process could not be started (out of processes or memory): an
    infrastructure failure, not the code's."""

    @property
    def completed(self) -> bool:
        """Every call produced a result."""
        return self.definition_error is None and all(c is not None for c in self.calls)


_CANARY = "import json, math\ndef f():\n    return json.loads(str(math.factorial(5)))\n"


@dataclass(frozen=True)
class _Options:
    """Which layers one run tries to put in place (each is skipped where the machine lacks it)."""

    audit_hook: bool = True
    landlock: bool = True
    namespaces: bool = True
    seccomp: bool = True
    drop_root: bool = True


def _canary_passes(options: _Options) -> bool:
    result = _run(_CANARY, "f", [[]], SandboxLimits(wall_seconds=30), options)
    return result.calls == (CallResult(value=120),)


@functools.cache
def _working_options() -> tuple[bool, bool]:
    """``(landlock, drop_root)``: whether runs work under each here (checked once).

    Landlock rules come from probing the interpreter, and ``nobody`` may lack access to what
    root's interpreter needs; should either break every run, it is left out (with a warning)
    rather than failing every episode.
    """
    if _canary_passes(_Options()):
        return True, True
    for landlock, drop_root in ((False, True), (True, False), (False, False)):
        if _canary_passes(_Options(landlock=landlock, drop_root=drop_root)):
            off = ["Landlock is off (file isolation rests on the audit hook)"] * (not landlock)
            off += ["the code runs as root, not as nobody"] * (not drop_root)
            message = f"Code-v0 sandbox: runs fail with every layer on, so {' and '.join(off)}."
            warnings.warn(message, RuntimeWarning, stacklevel=3)
            return landlock, drop_root
    return True, True  # the sandbox fails either way: not these layers' doing


def sandbox_layers() -> tuple[str, ...]:
    """The protections this machine puts in place, found by a trivial sandboxed run.

    Example: ``("new_session", "netns", "pidns", "ipcns", "disk_quota", "unprivileged_uid",
    "rlimits", "no_new_privs", "landlock_fs", "landlock_tcp", "landlock_scope", "seccomp",
    "audit_hook")`` on Linux 6.x as root (``"userns"`` instead of ``"unprivileged_uid"`` and no
    ``"disk_quota"`` as another user).
    """
    result = run_function("def f():\n    return 1\n", "f", [[]])
    return result.layers


# --- running -------------------------------------------------------------------------------------


@dataclass
class _Records:
    layers: list[str] = field(default_factory=list)
    definition_error: str | None = _NOT_DEFINED
    calls: list[CallResult | None] = field(default_factory=list)


def _parse_records(data: bytes, n_calls: int) -> _Records:
    """Read the results pipe strictly: one JSON object per line, the first record of each wins.

    ``layers`` count only before ``started`` (written by the harness right before the
    candidate's code runs, so the candidate cannot fake them); anything malformed is ignored.
    """
    records = _Records(calls=[None] * n_calls)
    started = defined = seen_defined = False
    for raw in data.split(b"\n")[:_MAX_RECORDS]:
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if not isinstance(record, dict):
            continue
        kind = record.get("kind")
        if kind == "layers" and not started:
            records.layers += [x for x in record.get("layers", []) if isinstance(x, str)]
        elif kind == "started":
            started = True
        elif kind == "defined" and started and not seen_defined:
            seen_defined = True
            error = record.get("error")
            defined = error is None
            records.definition_error = None if defined else str(error)[:500]
        elif kind == "call" and defined:
            index = record.get("i")
            if type(index) is int and 0 <= index < n_calls and records.calls[index] is None:
                if "error" in record:
                    records.calls[index] = CallResult(error=str(record["error"])[:500])
                elif "value" in record:
                    records.calls[index] = CallResult(value=record["value"])
    return records


def run_function(
    code: str,
    entry: str,
    inputs: Sequence[Sequence[Any]],
    *,
    limits: SandboxLimits | None = None,
    audit_hook: bool = True,
    landlock: bool = True,
    namespaces: bool = True,
    seccomp: bool = True,
    drop_root: bool = True,
) -> SandboxResult:
    """Run ``code`` in the sandbox and call ``entry(*args)`` for each ``args`` in ``inputs``.

    Args:
        code: Python source that defines ``entry``.
        entry: The function's name.
        inputs: Argument lists, JSON-serialisable (tuples travel as lists).
        limits: The run's limits (default :class:`SandboxLimits`).
        audit_hook: Install the audit hook (turned off only by tests of the kernel layers).
        landlock: Apply Landlock where the kernel supports it (tests only turn it off).
        namespaces: Enter new namespaces where allowed (tests only turn them off).
        seccomp: Install the seccomp filter where the kernel supports it (tests only turn it off).
        drop_root: Run as ``nobody`` when this process is root (tests only turn it off).

    Returns:
        What each call returned or raised; see :class:`SandboxResult`. Never raises for any
        ``code``: a failure to start is reported as ``definition_error``.

    Raises:
        InvalidArgumentError: ``code``/``entry`` are not strings or ``inputs`` is not a list of
            JSON-serialisable argument lists.
    """
    if not isinstance(code, str) or not isinstance(entry, str) or not entry.isidentifier():
        raise InvalidArgumentError(
            f"Expected code as a str and entry as an identifier, actual values: "
            f"{type(code).__name__}, {entry!r}."
        )
    limits = limits or SandboxLimits()
    landlock_works, drop_root_works = _working_options()
    options = _Options(
        audit_hook=audit_hook,
        landlock=landlock and landlock_works,
        namespaces=namespaces,
        seccomp=seccomp,
        drop_root=drop_root and drop_root_works,
    )
    return _run(code, entry, inputs, limits, options)


def _run(
    code: str,
    entry: str,
    inputs: Sequence[Sequence[Any]],
    limits: SandboxLimits,
    options: _Options,
) -> SandboxResult:
    """One run with every option decided (see :func:`run_function`)."""
    try:
        plain_inputs = json.loads(json.dumps([list(args) for args in inputs]))
        payload = marshal.dumps({"code": code, "entry": entry, "inputs": plain_inputs})
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"inputs must be a list of JSON-serialisable argument lists: {exc}"
        ) from None
    n_calls = len(inputs)
    start = time.monotonic()
    tmp = os.path.realpath(tempfile.mkdtemp(prefix="llm_gym_code_"))
    drop_root = unprivileged_ids() if options.drop_root else None
    if drop_root is not None:
        os.chown(tmp, drop_root[0], drop_root[1])  # the work dir is the only place it may write
    results_r, results_w = os.pipe()
    config = {
        "python": interpreter(),
        "parent_pid": os.getpid(),
        "tmp": tmp,
        "results_fd": results_w,
        "limits": {
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": limits.memory_bytes,
            "file_bytes": limits.file_bytes,
            "disk_bytes": limits.disk_bytes,
            "open_files": limits.open_files,
            "processes": limits.processes,
        },
        "max_value_chars": limits.result_bytes // 2,
        "hooks": options.audit_hook,
        "landlock": options.landlock,
        "namespaces": options.namespaces,
        "seccomp": options.seccomp,
        "drop_root": drop_root,
        **read_rules(),
    }
    argv = [config["python"], "-I", "-S", "-B", "-c", TRAMPOLINE, _CHILD_SOURCE, "launch"]
    streams = Streams()
    proc: subprocess.Popen[bytes] | None = None
    start_error: OSError | None = None
    try:
        proc = subprocess.Popen(
            [*argv, marshal.dumps(config).hex()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp,
            env=minimal_env(tmp),
            start_new_session=True,
            close_fds=True,
            pass_fds=(results_w,),
        )
        os.close(results_w)
        results_w = -1
        streams = pump(
            proc,
            results_r,
            payload,
            limits.output_bytes,
            limits.result_bytes,
            start + limits.wall_seconds,
        )
    except OSError as exc:  # could not start (out of processes or memory): not the model's doing
        start_error = exc
    finally:
        if results_w >= 0:
            os.close(results_w)
        records = _parse_records(bytes(streams.results), n_calls)
        if proc is not None:
            stop(proc, "pidns" in records.layers)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        os.close(results_r)
        remove_tree(tmp)
    if start_error is not None:
        records.definition_error = f"sandbox error: could not run the code: {start_error}"
    elif records.definition_error == _NOT_DEFINED and streams.timed_out:
        records.definition_error = (
            "the run was stopped at its time limit before the function was defined"
        )
    elif records.definition_error == _NOT_DEFINED and streams.output_exceeded:
        records.definition_error = "the run was stopped for printing too much"
    return SandboxResult(
        calls=tuple(records.calls),
        definition_error=records.definition_error,
        stdout=streams.stdout[: limits.output_bytes].decode("utf-8", "replace"),
        stderr=streams.stderr[: limits.output_bytes].decode("utf-8", "replace"),
        timed_out=streams.timed_out,
        output_exceeded=streams.output_exceeded,
        exit_code=proc.returncode if proc is not None else None,
        started=start_error is None,
        layers=tuple(records.layers),
        wall_seconds=time.monotonic() - start,
        work_dir=tmp,
    )
