"""Stage 2 of the sandbox's child program: the harness (see :mod:`llm_gym.envs.code._child`).

Not a module to import: ``sandbox.py`` appends this file's source to ``_child.py``'s and hands the
joined text to a fresh interpreter, which runs ``main`` from ``_child.py``. Standard library only.
"""

# ruff: noqa: F821  (uses _emit and _decode from _child.py: the two are one program)
import marshal
import os
import sys

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
