"""Stage 1 of the sandbox's child, continued: dropping root and the seccomp filter.

Not a module to import: ``sandbox.py`` joins this file's source between ``_child.py``'s and
``_child_harness.py``'s (see :mod:`llm_gym.envs.code._child`). Standard library only.

Both layers are enforced by the kernel, so they hold for any interpreter or native code the
candidate might reach (an extension module loaded under another name, a builtin module created
without an audit event, a fresh interpreter exec'd without the hook):

- **Dropping root.** Linux does not apply ``RLIMIT_NPROC`` to uid 0, so a grader running as root
  runs the candidate as ``nobody``: then the process limit holds, and the candidate has no
  capability (no ``CAP_KILL``, ``CAP_MKNOD``, ``CAP_SYS_ADMIN``, ``CAP_DAC_OVERRIDE``, ...). Where
  the interpreter lives in a folder ``nobody`` cannot enter (``/root/.pyenv``), the one capability
  ``CAP_DAC_READ_SEARCH`` is kept (ambient, so it survives the ``exec``): reads stay as wide as
  root's (Landlock and the audit hook narrow them), writes, signals and everything else are
  ``nobody``'s.
- **seccomp.** A BPF filter refuses process creation (``fork``, ``vfork``, ``clone`` without
  ``CLONE_THREAD``, ``clone3``), every ``exec`` but the launcher's own, sockets of every family
  (parent and child talk over inherited pipes only), ``mknod``, ``ptrace`` and other processes'
  memory, new namespaces and mounts, ``io_uring`` (whose operations seccomp cannot see), file
  handles, ``bpf``, ``userfaultfd``, ``perf_event_open``, the kernel keyring and process file
  descriptors (``pidfd_send_signal`` signals with no audit event, ``pidfd_getfd`` takes another
  process's descriptors: without a PID namespace, other runs as ``nobody`` are in reach).
  Threads are refused too unless ``SandboxLimits.processes`` allows some. Another ABI (32-bit or
  x32 calls on x86_64) kills the process.

Why a hand-written filter: the child runs ``python -I -S`` with site-packages neither importable
nor readable under Landlock, so a seccomp package (``pyseccomp``, a ctypes wrapper of
``libseccomp``, unmaintained since 2021; ``seccompy``, new) would have to be smuggled into it and
``libseccomp`` installed on every host. The launcher already talks to the kernel through ctypes
(``unshare``, Landlock); the filter below is about 50 classic BPF instructions and
``prctl(PR_SET_SECCOMP)``.
"""

import os

_PR_SET_KEEPCAPS = 8
_PR_SET_SECCOMP = 22
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE = 47, 2
_CAP_DAC_READ_SEARCH = 2
_CAPABILITY_VERSION_3 = 0x20080522
_SECCOMP_MODE_FILTER = 2
_CLONE_THREAD = 0x00010000
_EPERM, _ENOSYS = 1, 38
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_LD_ABS_W, _JEQ_K, _JSET_K, _JGE_K, _RET_K = 0x20, 0x15, 0x45, 0x35, 0x06

# Syscall numbers (x86_64: arch/x86/entry/syscalls/syscall_64.tbl; aarch64: the generic table,
# include/uapi/asm-generic/unistd.h, which has no fork, vfork or mknod).
_SECCOMP_ARCHES = {
    "x86_64": {
        "audit_arch": 0xC000003E,
        "x32_bit": 0x40000000,
        "clone": 56,
        "clone3": 435,
        "execve": 59,
        "denied": {
            "fork": 57,
            "vfork": 58,
            "execveat": 322,
            "socket": 41,
            "socketpair": 53,
            "mknod": 133,
            "mknodat": 259,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "unshare": 272,
            "setns": 308,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "open_by_handle_at": 304,
            "bpf": 321,
            "userfaultfd": 323,
            "perf_event_open": 298,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "pidfd_send_signal": 424,
            "pidfd_open": 434,
            "pidfd_getfd": 438,
        },
    },
    "aarch64": {
        "audit_arch": 0xC00000B7,
        "x32_bit": None,
        "clone": 220,
        "clone3": 435,
        "execve": 221,
        "denied": {
            "execveat": 281,
            "socket": 198,
            "socketpair": 199,
            "mknodat": 33,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "unshare": 97,
            "setns": 268,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "open_by_handle_at": 265,
            "bpf": 280,
            "userfaultfd": 282,
            "perf_event_open": 241,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "pidfd_send_signal": 424,
            "pidfd_open": 434,
            "pidfd_getfd": 438,
        },
    },
}


def _drop_root(ctypes, libc, ids):
    """Become ``nobody`` (``ids``: uid, gid, keep_read_search); returns the layers put in place.

    Called as root before the PID namespace's fork. Any failure (a container without
    ``CAP_SETUID``) leaves the process as it was and reports nothing.
    """
    uid, gid, keep_read_search = ids
    try:
        os.setgroups([])
        os.setgid(gid)
        if keep_read_search:
            libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
        os.setuid(uid)  # real, effective and saved: no way back
    except OSError:
        return []
    if not keep_read_search:
        return ["unprivileged_uid"]
    # Keep only CAP_DAC_READ_SEARCH, and make it ambient so the exec'd interpreter has it.
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    bit = 1 << _CAP_DAC_READ_SEARCH
    data = (ctypes.c_uint32 * 6)(bit, bit, bit, 0, 0, 0)  # effective, permitted, inheritable
    if libc.capset(header, data) != 0:
        os._exit(1)  # root's capabilities would be kept: refuse to run at all
    if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, _CAP_DAC_READ_SEARCH, 0, 0) != 0:
        os._exit(1)  # the interpreter could not read its own files
    return ["unprivileged_uid"]


def _seccomp_program(arch, exec_args, threads):
    """The filter as ``(code, jt, jf, k)`` tuples, or ``None`` on an unknown architecture.

    ``exec_args`` are the three pointers of the launcher's own ``execve``: that one call, and no
    other (the exec'd process has a new address space and cannot know them), is allowed.
    """
    table = _SECCOMP_ARCHES.get(arch)
    if table is None:
        return None
    deny = _RET_ERRNO | _EPERM
    program = [
        (_LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        (_JEQ_K, 1, 0, table["audit_arch"]),
        (_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
    ]
    if table["x32_bit"] is not None:
        program += [(_JGE_K, 0, 1, table["x32_bit"]), (_RET_K, 0, 0, _RET_KILL_PROCESS)]
    for number in table["denied"].values():
        program += [(_JEQ_K, 0, 1, number), (_RET_K, 0, 0, deny)]
    # clone3 takes its flags in memory, which seccomp cannot read: ENOSYS makes libc use clone.
    program += [(_JEQ_K, 0, 1, table["clone3"]), (_RET_K, 0, 0, _RET_ERRNO | _ENOSYS)]
    # clone: a thread (CLONE_THREAD in the low word of the flags) where threads are allowed.
    program += [
        (_JEQ_K, 0, 4, table["clone"]),
        (_LD_ABS_W, 0, 0, 16),  # args[0], low 32 bits (little-endian)
        (_JSET_K, 0, 1, _CLONE_THREAD),
        (_RET_K, 0, 0, _RET_ALLOW if threads else deny),
        (_RET_K, 0, 0, deny),
    ]
    # execve: only with the launcher's three pointers (both 32-bit halves of each).
    checks = []
    for index, pointer in enumerate(exec_args):
        checks += [(16 + 8 * index, pointer & 0xFFFFFFFF), (20 + 8 * index, pointer >> 32)]
    block = []
    for offset, value in checks:
        block += [(_LD_ABS_W, 0, 0, offset), [_JEQ_K, 0, None, value]]
    block += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, deny)]
    for position, instruction in enumerate(block):
        if isinstance(instruction, list):  # jump to the final deny when a half differs
            instruction[2] = len(block) - 1 - (position + 1)
    program += [(_LD_ABS_W, 0, 0, 0), (_JEQ_K, 0, len(block), table["execve"])]
    program += [tuple(instruction) for instruction in block]
    program.append((_RET_K, 0, 0, _RET_ALLOW))
    return program


def _exec_arguments(ctypes, argv):
    """``argv`` and the environment as C arrays, and the three pointers ``execve`` will get."""
    path = ctypes.create_string_buffer(os.fsencode(argv[0]))
    args = (ctypes.c_char_p * (len(argv) + 1))(*[os.fsencode(a) for a in argv], None)
    env = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in os.environ.items()]
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    arrays = (path, args, envp)
    return arrays, tuple(ctypes.addressof(a) for a in arrays)


def _install_seccomp(ctypes, libc, exec_pointers, threads):
    """Install the filter (needs ``no_new_privs``); returns the layers put in place."""
    machine = os.uname().machine
    # PR_GET_SECCOMP (21): 0 (no filter yet) or 2 (already filtered); -1: no seccomp here.
    if machine not in _SECCOMP_ARCHES or libc.prctl(21, 0, 0, 0, 0) not in (0, 2):
        return []
    program = _seccomp_program(machine, exec_pointers, threads)

    class SockFilter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_uint16),
            ("jt", ctypes.c_uint8),
            ("jf", ctypes.c_uint8),
            ("k", ctypes.c_uint32),
        ]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(program))(*[SockFilter(*i) for i in program])
    prog = SockFprog(len(program), filters)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        return []
    return ["seccomp"]


def _exec(ctypes, libc, argv, exec_arguments):
    """Replace this process by ``argv`` through the one ``execve`` the filter allows.

    ``exec_arguments`` is :func:`_exec_arguments`' answer (its arrays must live until here).
    """
    table = _SECCOMP_ARCHES.get(os.uname().machine)
    if table is None:
        os.execv(argv[0], argv)
    _arrays, pointers = exec_arguments
    libc.syscall(table["execve"], *[ctypes.c_void_p(p) for p in pointers])
    os._exit(1)  # refused or failed: the run reports no result
