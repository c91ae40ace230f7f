"""The code that runs inside the sandbox's child process. Standard library only.

It is a program, not a library: :mod:`llm_gym.envs.code.sandbox` imports only ``TRAMPOLINE`` from
it, reads its source and hands that to a fresh interpreter
(``python -I -S -B -c TRAMPOLINE SOURCE MODE CONFIG``) twice:

1. ``launch``: trusted set-up in the new process, before any candidate code exists in it: new
   namespaces (user, network, IPC, PID) where the kernel allows them, ``nobody`` instead of root
   (:mod:`llm_gym.envs.code._child_kernel`), resource limits, ``no_new_privs``, a Landlock
   file-system / TCP / signal ruleset and a seccomp filter; then ``execve`` of the same
   interpreter in ``run`` mode (the last ``exec`` the filter allows). The uid, limits, namespaces,
   Landlock and seccomp survive the exec; ctypes and everything else the launcher loaded do not.
2. ``run``: the harness. It reads the payload (the candidate's code, the entry function's name and
   the argument lists; never an expected output) from stdin, installs the audit hook, executes
   the code, calls the entry function on every input and writes one JSON line per call to the
   results pipe. The parent compares those values with the expected outputs it kept to itself.

Both stages report what they put in place as the first records on the results pipe, so the
parent knows which protections were in force (``SandboxResult.layers``).

Its source text, followed by those of :mod:`llm_gym.envs.code._child_kernel` (the rest of stage 1)
and :mod:`llm_gym.envs.code._child_harness` (stage 2), is the whole program the child runs (where
importing ``llm_gym`` is blocked): the files are one program cut in three for reading, so none
imports another; :data:`CHILD_FILES` lists them in order.
"""

# ruff: noqa: F821  (main calls _run, defined in _child_harness.py: the three are one program)
import marshal
import os

# --- shared --------------------------------------------------------------------------------------

TRAMPOLINE = "import sys;exec(sys.argv[1]);main(sys.argv[1:])"
"""The ``-c`` program of both stages: run the source passed as the first argument, then main."""

CHILD_FILES = ("_child.py", "_child_kernel.py", "_child_harness.py")
"""The files whose sources, joined in this order, are the child's program."""


def _emit(fd, line, write=os.write):
    """Write one record line to the results pipe (whole, retrying on short writes)."""
    data = line.encode("utf-8", "replace")
    while data:
        data = data[write(fd, data) :]


# --- stage 1: the launcher -----------------------------------------------------------------------

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_SYS_LANDLOCK = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_REMOVE_DIR, _LL_REMOVE_FILE, _LL_MAKE_DIR, _LL_MAKE_REG = 16, 32, 128, 256
_LL_REFER, _LL_TRUNCATE = 1 << 13, 1 << 14


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _unshare(libc, namespaces, as_root):
    """Enter new namespaces; try the strongest set first. Returns the names that took effect.

    Root (about to become ``nobody``) needs no user namespace: it makes the others directly,
    then drops every capability, which a user namespace would hand back inside it.
    """
    user, net, pid, ipc = _CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWPID, _CLONE_NEWIPC
    attempts = [
        (user | net | pid | ipc, ["userns", "netns", "pidns", "ipcns"]),
        (net | pid | ipc, ["netns", "pidns", "ipcns"]),
        (user | net | ipc, ["userns", "netns", "ipcns"]),
        (net, ["netns"]),
    ]
    if as_root:
        attempts = [attempt for attempt in attempts if not attempt[0] & user]
    if not namespaces:
        return []
    for flags, names in attempts:
        if libc.unshare(flags) == 0:
            return names
    return []


def _work_dir_quota(libc, config, ids):
    """As root, in a new mount namespace: mount a tmpfs of ``disk_bytes`` (one inode per 4 KiB)
    owned by ``ids`` over the work dir, and enter it. A run then fills neither the host's disk
    (RLIMIT_FSIZE bounds one file, not their number) nor its inodes, and its files vanish with
    its namespace: the grader never walks them (100,000 empty folders took it 12 s to remove).
    Returns the layers put in place; nothing, and no mount, where the kernel refuses."""
    if not config["namespaces"] or libc.unshare(_CLONE_NEWNS) != 0:
        return []
    # Private first: a mount that propagated to the host's namespace would outlive the run.
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return []
    size = int(config["limits"]["disk_bytes"])
    options = f"size={size},nr_inodes={max(64, size // 4096)},mode=0700,uid={ids[0]},gid={ids[1]}"
    tmp = os.fsencode(config["tmp"])
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if libc.mount(b"tmpfs", tmp, b"tmpfs", flags, options.encode()) != 0:
        return []
    os.chdir(config["tmp"])  # the current dir was the folder under the mount
    return ["disk_quota"]


def _set_limits(limits):
    import resource

    cpu = int(limits["cpu_seconds"])
    pairs = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, limits["memory_bytes"], limits["memory_bytes"]),
        (resource.RLIMIT_FSIZE, limits["file_bytes"], limits["file_bytes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        (resource.RLIMIT_NPROC, limits["processes"], limits["processes"]),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    for which, soft, hard in pairs:
        _, old_hard = resource.getrlimit(which)
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))


def _landlock(ctypes, libc, config):
    """Restrict this process (and its exec'd successor) to the allowed paths. Returns layers."""
    import stat

    numbers = _SYS_LANDLOCK.get(os.uname().machine)
    if numbers is None or not config["landlock"]:
        return []
    create, add_rule, restrict = numbers
    abi = libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return []
    handled_fs = (1 << 13) - 1
    if abi >= 2:
        handled_fs |= _LL_REFER
    if abi >= 3:
        handled_fs |= _LL_TRUNCATE
    if abi >= 5:
        handled_fs |= 1 << 15
    handled_net = 3 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP: no rule allows either
    scoped = 3 if abi >= 6 else 0  # abstract unix sockets, signals outside the sandbox
    attr = (ctypes.c_uint64 * 3)(handled_fs, handled_net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return []

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def allow(path, access):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                access &= file_rights  # a rule on a file may only hold file rights
            rule = PathBeneath(access & handled_fs, fd)
            libc.syscall(add_rule, ruleset, 1, ctypes.byref(rule), ctypes.c_uint32(0))
        finally:
            os.close(fd)

    file_rights = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | (1 << 15)
    read = _LL_READ_FILE | _LL_READ_DIR
    for path in config["read_dirs"]:
        allow(path, read)
    for path in config["list_dirs"]:
        allow(path, _LL_READ_DIR)
    for path in config["read_files"]:
        allow(path, _LL_READ_FILE | _LL_EXECUTE)
    write = (
        read
        | _LL_WRITE_FILE
        | _LL_REMOVE_DIR
        | _LL_REMOVE_FILE
        | _LL_MAKE_DIR
        | _LL_MAKE_REG
        | _LL_REFER
        | _LL_TRUNCATE
    )
    allow(config["tmp"], write)
    if libc.syscall(restrict, ruleset, ctypes.c_uint32(0)) != 0:
        return []
    layers = ["landlock_fs"]
    if handled_net:
        layers.append("landlock_tcp")
    if scoped:
        layers.append("landlock_scope")
    return layers


def _decode(text):
    """The parent's config or payload: ``marshal`` data as hex (fast: no ``json`` import)."""
    return marshal.loads(bytes.fromhex(text))


def _launch(source, config_text):
    config = _decode(config_text)
    results_fd = config["results_fd"]
    ctypes, libc = _libc()
    # If the grading process dies, so does the run (the CPU limit alone would spare a sleeper).
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != config["parent_pid"]:
        os._exit(1)
    drop = config["drop_root"]  # (uid, gid, keep_read_search) when root, else None
    layers = ["new_session", *_unshare(libc, config["namespaces"], drop is not None)]
    if drop is not None:
        layers += _work_dir_quota(libc, config, drop)
        layers += _drop_root(ctypes, libc, drop)
        libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # a change of uid clears it
        if os.getppid() != config["parent_pid"]:
            os._exit(1)
    if "pidns" in layers:
        # The first child of a new PID namespace is its init: when it dies, the kernel kills
        # every process left in the namespace. This process stays outside as a plain reaper.
        # SIGTERM asks the reaper to SIGKILL its child and reap it (no orphaned zombie).
        import signal

        children = []
        signal.signal(signal.SIGTERM, lambda *_: [os.kill(c, signal.SIGKILL) for c in children])
        child = os.fork()
        if child:
            children.append(child)
            for fd in (0, 1, 2, results_fd):
                os.close(fd)
            _, status = os.waitpid(child, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # die with the reaper
    _set_limits(config["limits"])
    layers.append("rlimits")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        layers.append("no_new_privs")
    layers += _landlock(ctypes, libc, config)
    python = config["python"]
    argv = [python, "-I", "-S", "-B", "-c", TRAMPOLINE, source, "run", config_text]
    exec_arguments = _exec_arguments(ctypes, argv)
    if config["seccomp"] and "no_new_privs" in layers:
        threads = config["limits"]["processes"] > 0
        layers += _install_seccomp(ctypes, libc, exec_arguments[1], threads)
    names = ",".join(f'"{x}"' for x in layers)
    _emit(results_fd, f'{{"kind":"layers","layers":[{names}]}}\n')
    _exec(ctypes, libc, argv, exec_arguments)


def main(argv):
    """Entry point: ``argv`` is ``[source, mode, config_json]``."""
    source, mode, config_text = argv
    if mode == "launch":
        _launch(source, config_text)
    elif mode == "run":
        _run(config_text)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
