"""The sandbox's process plumbing: its environment, feeding and draining it, stopping it."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Streams", "minimal_env", "pump", "remove_tree", "stop"]


def minimal_env(home: str) -> dict[str, str]:
    """The child's whole environment: no inherited secrets, no proxies."""
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
    }


def _exited(pid: int, timeout: float) -> bool:
    """Whether ``pid`` (our child) exits within ``timeout``; it is left unreaped."""
    end = time.monotonic() + timeout
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is not None:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.001)


def stop(proc: subprocess.Popen[bytes], pid_namespace: bool) -> None:
    """End the run and leave no process behind.

    The launcher is our child and the leader of the run's process group; it stays unreaped (so
    its pid and group id cannot be reused) until every process of the group is SIGKILLed. With a
    PID namespace the launcher is the namespace's reaper: SIGTERM makes it SIGKILL the
    namespace's init (the candidate), which takes every other process of the namespace with it,
    and reap it, so no zombie is left to the host's init.
    """
    pid = proc.pid
    if not _exited(pid, 0.05) and pid_namespace:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        _exited(pid, 0.5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    proc.wait()


def remove_tree(path: str) -> None:
    """Remove the work dir, whatever the child left there: permissions taken away, or folders
    nested deeper than Python's recursion limit and ``PATH_MAX`` (``shutil.rmtree`` raised
    ``RecursionError`` on 1,000 levels, failing the grading and leaving the tree behind).
    Never raises; what cannot be removed stays."""

    def retry(function: Any, target: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            function(target)
        except OSError:
            pass

    try:
        shutil.rmtree(path, onerror=retry)
    except (RecursionError, OSError):
        _remove_flat(path)


def _remove_flat(top: str) -> None:
    """Remove ``top`` without recursion and with two descriptors at most: each folder's files
    are unlinked and its subfolders moved up into ``top``, so a chain of any depth is undone
    one level per round."""
    moved = 0
    for _ in range(1_000_000):  # a bound, far above any tree a run can make in its time
        with contextlib.suppress(OSError):
            os.chmod(top, 0o700)
        try:
            names = os.listdir(top)
        except OSError:
            break
        for name in names:
            full = os.path.join(top, name)
            with contextlib.suppress(OSError):
                if not os.path.isdir(full) or os.path.islink(full):
                    os.unlink(full)
                    continue
                os.chmod(full, 0o700)
                fd = os.open(full, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    for entry in os.scandir(fd):
                        if entry.is_dir(follow_symlinks=False):
                            moved += 1
                            target = os.path.join(top, f".up{moved}")
                            os.rename(entry.name, target, src_dir_fd=fd)
                        else:
                            os.unlink(entry.name, dir_fd=fd)
                finally:
                    os.close(fd)
                os.rmdir(full)
        if not names:
            break
    with contextlib.suppress(OSError):
        os.rmdir(top)


@dataclass
class Streams:
    """What came out of the child, and why reading stopped."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    results: bytearray = field(default_factory=bytearray)
    timed_out: bool = False
    output_exceeded: bool = False


def pump(
    proc: subprocess.Popen[bytes],
    results_fd: int,
    payload: bytes,
    output_bytes: int,
    result_bytes: int,
    deadline: float,
) -> Streams:
    """Feed stdin and drain stdout, stderr and the results pipe until EOF, a cap or the deadline."""
    assert proc.stdin and proc.stdout and proc.stderr
    streams = Streams()
    buffers = {
        proc.stdout.fileno(): streams.stdout,
        proc.stderr.fileno(): streams.stderr,
        results_fd: streams.results,
    }
    stdin_fd = proc.stdin.fileno()
    with selectors.DefaultSelector() as selector:
        for fd in (stdin_fd, *buffers):
            os.set_blocking(fd, False)
        selector.register(stdin_fd, selectors.EVENT_WRITE)
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        view = memoryview(payload)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                streams.timed_out = True
                break
            for key, _ in selector.select(remaining):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        view = view[os.write(fd, view[:65536]) :]
                    except (BrokenPipeError, BlockingIOError, OSError):
                        view = view[:0]
                    if not view:
                        selector.unregister(fd)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(fd)
                    continue
                buffers[fd] += chunk
            if len(streams.stdout) + len(streams.stderr) > output_bytes:
                streams.output_exceeded = True
                break
            if len(streams.results) > result_bytes:
                streams.output_exceeded = True
                break
    return streams
