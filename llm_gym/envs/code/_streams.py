"""Feeding and draining a sandboxed run: its payload in, stdout, stderr and results out."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Streams", "pump"]


@dataclass
class Streams:
    """What came out of the child, and why reading stopped."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    results: bytearray = field(default_factory=bytearray)
    timed_out: bool = False
    output_exceeded: bool = False


def pump(proc: subprocess.Popen[bytes], results_fd: int, payload: bytes, limits: Any,
         deadline: float) -> Streams:  # fmt: skip
    """Feed stdin and drain stdout, stderr and the results pipe until EOF, a cap
    (``limits.output_bytes`` for stdout + stderr, ``limits.result_bytes``) or the deadline."""
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
                    except OSError:  # the child closed stdin or is gone
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
            if len(streams.stdout) + len(streams.stderr) > limits.output_bytes:
                streams.output_exceeded = True
                break
            if len(streams.results) > limits.result_bytes:
                streams.output_exceeded = True
                break
    return streams
