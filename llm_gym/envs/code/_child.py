"""The code that runs inside the sandbox's child process. Standard library only.

It is a program, not a library: :mod:`llm_gym.envs.code.sandbox` imports only ``TRAMPOLINE`` from
it, reads its source and hands that to a fresh interpreter
(``python -I -S -B -c TRAMPOLINE SOURCE MODE CONFIG``) twice:

1. ``launch``: trusted set-up in the new process, before any candidate code exists in it: new
   namespaces (user, network, IPC, PID) where the kernel allows them, resource limits,
   ``no_new_privs`` and a Landlock file-system / TCP / signal ruleset; then ``execv`` of the same
   interpreter in ``run`` mode. Limits, namespaces and Landlock survive the exec; ctypes and
   everything else the launcher loaded do not.
2. ``run``: the harness. It reads the payload (the candidate's code, the entry function's name and
   the argument lists; never an expected output) from stdin, installs the audit hook, executes
   the code, calls the entry function on every input and writes one JSON line per call to the
   results pipe. The parent compares those values with the expected outputs it kept to itself.

Both stages report what they put in place as the first records on the results pipe, so the
parent knows which protections were in force (``SandboxResult.layers``).

It is one self-contained file on purpose: its source text is the whole program the child runs
(where importing ``llm_gym`` is blocked), so it cannot import a sibling module and is not split.
"""

import marshal
import os
import sys

# --- shared --------------------------------------------------------------------------------------

TRAMPOLINE = "import sys;exec(sys.argv[1]);main(sys.argv[1:])"
"""The ``-c`` program of both stages: run the source passed as the first argument, then main."""


def _emit(fd, line, write=os.write):
    """Write one record line to the results pipe (whole, retrying on short writes)."""
    data = line.encode("utf-8", "replace")
    while data:
        data = data[write(fd, data) :]


# --- stage 1: the launcher -----------------------------------------------------------------------

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


def _unshare(libc, namespaces):
    """Enter new namespaces; try the strongest set first. Returns the names that took effect."""
    user, net, pid, ipc = _CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWPID, _CLONE_NEWIPC
    attempts = [
        (user | net | pid | ipc, ["userns", "netns", "pidns", "ipcns"]),
        (net | pid | ipc, ["netns", "pidns", "ipcns"]),
        (user | net | ipc, ["userns", "netns", "ipcns"]),
        (net, ["netns"]),
    ]
    if not namespaces:
        return []
    for flags, names in attempts:
        if libc.unshare(flags) == 0:
            return names
    return []


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
    layers = ["new_session", *_unshare(libc, config["namespaces"])]
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
    names = ",".join(f'"{x}"' for x in layers)
    _emit(results_fd, f'{{"kind":"layers","layers":[{names}]}}\n')
    python = config["python"]
    os.execv(python, [python, "-I", "-S", "-B", "-c", TRAMPOLINE, source, "run", config_text])


# --- stage 2: the harness ------------------------------------------------------------------------

_BLOCKED_EVENTS = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.exec",
        "os.spawn",
        "os.system",
        "os.kill",
        "os.killpg",
        "os.symlink",
        "os.link",
        "signal.pthread_kill",
        "subprocess.Popen",
        "pty.spawn",
        "sys.addaudithook",
        "code.__new__",
        "resource.setrlimit",
        "resource.prlimit",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "os.chroot",
        "sys.remote_exec",
    }
)
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "_winapi.", "winreg.", "webbrowser.", "urllib.")
_BLOCKED_IMPORTS = frozenset(
    {
        "ctypes",
        "_ctypes",
        "_posixsubprocess",
        "_testcapi",
        "_testinternalcapi",
        "_xxsubinterpreters",
        "_xxinterpchannels",
        "llm_gym",
    }
)
_WRITE_EVENTS = frozenset(
    {
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.truncate",
        "os.utime",
        "os.setxattr",
        "os.removexattr",
        "shutil.rmtree",
        "shutil.copyfile",
        "shutil.copymode",
        "shutil.copystat",
        "shutil.copytree",
        "shutil.move",
        "shutil.chown",
    }
)
_READ_EVENTS = frozenset({"os.listdir", "os.scandir", "os.getxattr", "os.listxattr", "glob.glob"})
_FUNCTION_ATTRIBUTES = frozenset({"__code__"})  # (namedtuple sets __defaults__: allowed)


def _install_audit_hook(tmp, read_roots, list_dirs):
    """Refuse, inside this interpreter, what the candidate has no business doing.

    Defence in depth: a hook cannot stop code that escapes the interpreter, the kernel layers
    (Landlock, namespaces, resource limits) are the wall. Hooks cannot be removed once added,
    and this one reaches nothing the candidate can patch: every name it uses is bound here
    (C functions, frozensets, str methods), and paths are normalised with str operations only.
    """
    getcwd, fspath = os.getcwd, os.fspath  # C functions, bound now
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    tmp_prefix = tmp.rstrip("/") + "/"
    write_prefixes = (tmp_prefix,)
    read_prefixes = (*(r.rstrip("/") + "/" for r in read_roots), tmp_prefix)
    listable = frozenset(d.rstrip("/") + "/" for d in list_dirs)
    blocked, blocked_prefixes, blocked_imports = (
        _BLOCKED_EVENTS,
        _BLOCKED_PREFIXES,
        _BLOCKED_IMPORTS,
    )
    write_events, read_events, function_attributes = (
        _WRITE_EVENTS,
        _READ_EVENTS,
        _FUNCTION_ATTRIBUTES,
    )
    type_, str_, bytes_, int_, denied = type, str, bytes, int, PermissionError

    def normalise(path):
        """``path`` made absolute, ``.`` and ``..`` resolved lexically, plus a trailing "/"."""
        kind = type_(path)
        if kind is not str_ and kind is not bytes_:
            path = fspath(path)  # a PathLike; whatever it returns is checked again
            kind = type_(path)
        if kind is bytes_:
            path = bytes_.decode(path, "utf-8", "surrogateescape")
        elif kind is not str_:
            return None
        if not str_.startswith(path, "/"):
            path = getcwd() + "/" + path
        parts = []
        for part in str_.split(path, "/"):
            if part == ".." and parts:
                parts.pop()
            elif part not in ("", ".", ".."):
                parts.append(part)
        return "/" + "/".join(parts) + "/"

    def inside(path, prefixes):
        if type_(path) is int_:
            return True  # an already open descriptor (the pipes, or one opened legitimately)
        full = normalise(path)
        return full is not None and str_.startswith(full, prefixes)

    def hook(event, args):
        if event in blocked or str_.startswith(event, blocked_prefixes):
            raise denied(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            if mode is None:
                writing = (flags & write_flags) != 0
            else:
                writing = "w" in mode or "a" in mode or "x" in mode or "+" in mode
            if not inside(path, write_prefixes if writing else read_prefixes):
                raise denied(f"sandbox: opening {path!r} is not allowed")
        elif event == "import":
            if str_.partition(args[0], ".")[0] in blocked_imports:
                raise denied(f"sandbox: importing {args[0]} is not allowed")
        elif event in write_events:
            for arg in args[:2]:
                if type_(arg) is not int_ and arg is not None and not inside(arg, write_prefixes):
                    raise denied(f"sandbox: {event} outside the work dir is not allowed")
        elif event in read_events:
            path = args[0] if args else None
            if path is None or type_(path) is int_ or normalise(path) in listable:
                return
            if not inside(path, read_prefixes):
                raise denied(f"sandbox: {event} of {path!r} is not allowed")
        elif event == "object.__setattr__" and len(args) > 1 and args[1] in function_attributes:
            raise denied(f"sandbox: setting {args[1]} is not allowed")

    sys.addaudithook(hook)


def _describe(  # builtins bound as defaults: patching them later is moot
    exc,
    type_name=type.__dict__["__name__"].__get__,
    type=type,
    str=str,
    len=len,
    isinstance=isinstance,
    getattr=getattr,
    SyntaxError=SyntaxError,
    BaseException=BaseException,
    Exception=Exception,
):
    """``"ValueError: message (line 3)"``, robust against hostile exception classes."""
    try:
        name = type_name(type(exc))
    except Exception:
        name = "Exception"
    line = None
    try:
        if isinstance(exc, SyntaxError):
            message, line = str(exc.msg), exc.lineno
        else:
            message = str(exc)
    except BaseException:
        message = "<unprintable>"
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<solution>":
            line = tb.tb_lineno
        tb = tb.tb_next
    text = f"{name}: {message}" if message else name
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{text} (line {line})" if line else text


def _quote_function():
    """JSON string quoting: the C accelerator, else the pure-Python one (slower to import)."""
    try:
        from _json import encode_basestring_ascii
    except ImportError:
        from json.encoder import py_encode_basestring_ascii as encode_basestring_ascii
    return encode_basestring_ascii


class _Unsupported(Exception):
    pass


def _make_encoder(max_chars):
    """A JSON encoder for plain values that holds its own references (monkeypatching is moot)."""
    quote = _quote_function()

    int_repr, float_repr, join = int.__repr__, float.__repr__, ",".join
    type_name = type.__dict__["__name__"].__get__
    type_, len_, dict_items, unsupported = type, len, dict.items, _Unsupported
    special_floats = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

    def encode(value, depth=0, budget=None):
        budget = budget if budget is not None else [max_chars]
        if depth > 100:
            raise unsupported("the return value is nested more than 100 levels deep")
        kind = type_(value)
        if value is None:
            text = "null"
        elif kind is bool:
            text = "true" if value else "false"
        elif kind is int:
            try:
                text = int_repr(value)
            except ValueError:
                raise unsupported("the returned int has too many digits") from None
        elif kind is float:
            text = float_repr(value)
            text = special_floats.get(text, text)
        elif kind is str:
            text = quote(value)
        elif kind is list or kind is tuple:
            budget[0] -= len_(value)
            if budget[0] < 0:
                raise unsupported("the return value is too large")
            text = "[" + join([encode(item, depth + 1, budget) for item in value]) + "]"
        elif kind is dict:
            budget[0] -= len_(value)
            parts = []
            for key, item in dict_items(value):
                if type_(key) is not str:
                    raise unsupported("dict keys must be str")
                parts.append(quote(key) + ":" + encode(item, depth + 1, budget))
            text = "{" + join(parts) + "}"
        else:
            raise unsupported(f"unsupported return type {type_name(kind)}")
        budget[0] -= len_(text)
        if budget[0] < 0:
            raise unsupported("the return value is too large")
        return text

    return encode


def _copy(value, type=type, list=list, dict=dict, items=dict.items):
    """A fresh deep copy of a decoded input, so one call cannot change the next one's input."""
    if type(value) is list:
        return [_copy(v) for v in value]
    if type(value) is dict:
        return {k: _copy(v) for k, v in items(value)}
    return value


def _run(config_text):
    import builtins

    quote = _quote_function()
    config = _decode(config_text)
    fd = config["results_fd"]
    payload = marshal.loads(sys.stdin.buffer.read())
    os.close(0)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(write_through=True, line_buffering=True)
    code, entry, inputs = payload["code"], payload["entry"], payload["inputs"]
    encode = _make_encoder(config["max_value_chars"])
    emit, describe, copy, exit_now = _emit, _describe, _copy, os._exit
    base_exception, callable_, enumerate_ = BaseException, callable, enumerate
    if config["hooks"]:
        _install_audit_hook(config["tmp"], config["read_dirs"], config["list_dirs"])
        emit(fd, '{"kind":"layers","layers":["audit_hook"]}\n')
    namespace = {"__name__": "__solution__", "__builtins__": builtins}
    emit(fd, '{"kind":"started"}\n')  # from here on, the candidate's code can write too
    try:
        exec(compile(code, "<solution>", "exec"), namespace)
        function = namespace.get(entry)
        if not callable_(function):
            emit(fd, f'{{"kind":"defined","error":{quote(f"no function named {entry}")}}}\n')
            exit_now(0)
    except base_exception as exc:
        emit(fd, f'{{"kind":"defined","error":{quote(describe(exc))}}}\n')
        exit_now(0)
    emit(fd, '{"kind":"defined"}\n')
    for index, args in enumerate_(inputs):
        try:
            value = function(*copy(args))
            line = f'{{"kind":"call","i":{index},"value":{encode(value)}}}\n'
        except base_exception as exc:
            line = f'{{"kind":"call","i":{index},"error":{quote(describe(exc))}}}\n'
        try:
            emit(fd, line)
        except base_exception:
            exit_now(1)
    emit(fd, '{"kind":"done"}\n')
    exit_now(0)


def main(argv):
    """Entry point: ``argv`` is ``[source, mode, config_json]``."""
    source, mode, config_text = argv
    if mode == "launch":
        _launch(source, config_text)
    elif mode == "run":
        _run(config_text)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
