"""Stage 2 of the sandbox's child program: the harness (see :mod:`llm_gym.envs.code._child`).

Not a module to import: ``sandbox.py`` appends this file's source to those of ``_child.py`` and
``_child_kernel.py`` and hands the joined text to a fresh interpreter, which runs ``main`` from
``_child.py``. Standard library only.
"""

# ruff: noqa: F821  (uses _emit and _decode from _child.py: the three are one program)
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
        "marshal.load",
    }
)
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "_winapi.", "winreg.", "webbrowser.", "urllib.")
_BLOCKED_IMPORTS = frozenset(
    {
        "ctypes",
        "_ctypes",
        "_posixsubprocess",
        "_posixshmem",
        "_testcapi",
        "_testinternalcapi",
        "_xxsubinterpreters",
        "_xxinterpchannels",
        "llm_gym",
    }
)
_WRITE_EVENTS = {  # event: (positions of the paths written to, positions of their dir_fds)
    "os.remove": ((0,), (1,)),
    "os.rename": ((0, 1), (2, 3)),
    "os.rmdir": ((0,), (1,)),
    "os.mkdir": ((0,), (2,)),
    "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)),
    "os.truncate": ((0,), ()),
    "os.utime": ((0,), (3,)),
    "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()),
    "shutil.rmtree": ((0,), (1,)),
    "shutil.copyfile": ((0, 1), ()),
    "shutil.copymode": ((0, 1), ()),
    "shutil.copystat": ((0, 1), ()),
    "shutil.copytree": ((0, 1), ()),
    "shutil.move": ((0, 1), ()),
    "shutil.chown": ((0,), ()),
}
_READ_EVENTS = frozenset({"os.listdir", "os.scandir", "os.getxattr", "os.listxattr", "glob.glob"})


def _install_audit_hook(tmp, read_roots, list_dirs):
    """Refuse, inside this interpreter, what the candidate has no business doing.

    Defence in depth: a hook cannot stop code that escapes the interpreter, the kernel layers
    (seccomp, Landlock, namespaces, ``nobody``, resource limits) are the wall. Hooks cannot be
    removed once added, and this one's state cannot be changed: the candidate reaches the hook's
    helpers and their state through the frames of a traceback (a refusal raised in the hook), and
    the harness's globals through ``sys._getframe``, so nothing the hook reads is global, a
    closure cell or mutable. Every helper gets what it uses as default arguments, bound here
    (C functions, types, frozensets, tuples, str methods: a builtin patched later is moot), and
    the hook refuses any attribute change of its helpers (``__defaults__``). Paths are normalised
    with str operations only.

    Paths are checked as text, against the current directory. Three rules keep that text honest
    where the kernel would resolve it elsewhere (``dir_fd``, which the ``open`` event does not
    carry): the current directory stays inside the work dir (``chdir`` elsewhere is refused), a
    relative path may not climb above where it starts (``..``), and no folder outside the work
    dir may be opened (so every descriptor usable as ``dir_fd`` is a folder of the work dir).

    Extension modules load only from the standard library's own folders, under names none of
    whose parts is blocked (``evil._posixsubprocess`` is ``_posixsubprocess``), and from files
    whose name is not a blocked module's. ``marshal.loads`` (which builds code objects, as
    ``_imp.get_frozen_object`` does through it, without ``code.__new__``) may only load what the
    standard library's ``.pyc`` file just opened holds: the imports' own use of it.
    """
    tmp_prefix = tmp.rstrip("/") + "/"
    stdlib_prefixes = tuple(r.rstrip("/") + "/" for r in read_roots)
    module_prefixes = tuple(d.rstrip("/") + "/" for d in list_dirs)  # the stdlib's sys.path
    # (where a path may lead, what to say when it leads elsewhere)
    writable = ((tmp_prefix,), "only the work dir may be written to")
    readable = ((*stdlib_prefixes, tmp_prefix), "only the work dir and the stdlib may be read")
    loadable = (stdlib_prefixes, "only the standard library's extension modules may be loaded")
    current = ((tmp_prefix,), "the current dir must stay inside the work dir")
    denied = PermissionError
    folder_flags = os.O_DIRECTORY | getattr(os, "O_PATH", 0)
    read_flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)

    def text(path, any_pathlike, type_=type, str_=str, bytes_=bytes, entry=os.DirEntry,
             fspath=os.fspath):  # fmt: skip
        """``path`` as a str; ``None`` for a type but str, bytes and ``os.DirEntry``, unless
        ``any_pathlike`` (an event raised by Python code, whose own calls are checked again).

        A C function raises its event after calling a PathLike's ``__fspath__``; a second
        call here could answer differently (a counter, a ``__del__`` run by the garbage
        collector in between), and what is checked would not be what is opened.
        """
        kind = type_(path)
        if kind is entry or (any_pathlike and kind is not str_ and kind is not bytes_):
            path = fspath(path)  # (DirEntry: a C type whose path is fixed)
            kind = type_(path)
        if kind is bytes_:
            return bytes_.decode(path, "utf-8", "surrogateescape")
        return path if kind is str_ else None

    def climbs(path, split=str.split):
        """Whether a relative ``path`` goes above its start (``..``), wherever it starts."""
        depth = 0
        for part in split(path, "/"):
            if part == "..":
                depth -= 1
                if depth < 0:
                    return True
            elif part not in ("", "."):
                depth += 1
        return False

    def normalise(path, starts=str.startswith, split=str.split, join="/".join, cwd=os.getcwd):
        """``path`` made absolute, ``.`` and ``..`` resolved lexically, plus a trailing "/"."""
        if not starts(path, "/"):
            path = cwd() + "/" + path
        parts = []
        for part in split(path, "/"):
            if part == ".." and parts:
                parts.pop()
            elif part not in ("", ".", ".."):
                parts.append(part)
        return "/" + join(parts) + "/"

    def checked(path, rule, event, anchored=True, starts=str.startswith, text=text,
                climbs=climbs, normalise=normalise, denied=denied):  # fmt: skip
        """The normalised ``path``; refuses one that leads outside ``rule``, or that climbs when
        it may be relative to another folder than the current one (not ``anchored``)."""
        path = text(path, starts(event, ("shutil.", "glob.")))  # Python code's own events
        if path is None:
            raise denied(
                f"sandbox: {event}: a path must be a str or bytes (os.fspath(path) gives one)"
            )
        if not anchored and not starts(path, "/") and climbs(path):
            raise denied(
                f"sandbox: {event} {path!r} is not allowed (a relative path may not climb above "
                "where it starts, '..': it may be relative to a dir_fd; name a path inside the "
                "work dir)"
            )
        full = normalise(path)
        if not starts(full, rule[0]):
            raise denied(f"sandbox: {event} {path!r} is not allowed ({rule[1]})")
        return full

    def check_open(path, mode, flags, checked=checked, starts=str.startswith, stat=os.stat,
                   writable=writable, readable=readable, tmp_prefix=tmp_prefix,
                   write_flags=os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
                   folder_flags=folder_flags, oserror=OSError, denied=denied):  # fmt: skip
        """The normalised path of an allowed ``open``, else a refusal."""
        if mode is None:
            writing = (flags & write_flags) != 0
        else:
            writing = "w" in mode or "a" in mode or "x" in mode or "+" in mode
        full = checked(path, writable if writing else readable, "opening", False)
        if starts(full, tmp_prefix):
            return full
        try:
            is_folder = (
                flags & folder_flags or stat(full[:-1] or "/").st_mode & 0o170000 == 0o040000
            )
        except oserror:
            return full  # nothing there: the open fails on its own
        if is_folder:
            raise denied(
                f"sandbox: opening {path!r} is not allowed (a folder or an O_PATH descriptor, "
                "usable as a dir_fd, may be opened only inside the work dir)"
            )
        return full

    def check_import(name, path, type_=type, str_=str, checked=checked, loadable=loadable,
                     modules=module_prefixes, blocked=_BLOCKED_IMPORTS, denied=denied):  # fmt: skip
        names = str_.split(name, ".") if type_(name) is str_ else [None]
        if path is not None:  # an extension module: a file the dynamic loader maps
            full = checked(path, loadable, "loading")
            if not str_.startswith(full, modules):
                raise denied(f"sandbox: loading {path!r} is not allowed ({loadable[1]})")
            names.append(str_.split(str_.split(full[:-1], "/")[-1], ".")[0])
        for part in names:
            if part is None or part in blocked:
                raise denied(f"sandbox: importing {name} is not allowed")

    def pyc_holds(data, path, type_=type, str_=str, bytes_=bytes, modules=module_prefixes,
                  normalise=normalise, open_=os.open, read=os.read, close=os.close,
                  flags=read_flags):  # fmt: skip
        """Whether ``data`` is what the stdlib's ``.pyc`` at ``path`` holds after its header
        (``path`` is only a hint: it is checked, and the file read again)."""
        if type_(path) is not str_ or type_(data) is not bytes_ or not str_.endswith(path, ".pyc"):
            return False
        if not str_.startswith(normalise(path), modules):
            return False
        fd, chunks = open_(path, flags), []
        try:
            while chunk := read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            close(fd)
        return bytes_().join(chunks)[16:] == data

    write_names, write_rules = frozenset(_WRITE_EVENTS), tuple(_WRITE_EVENTS.items())
    own = (text, climbs, normalise, checked, check_open, check_import, pyc_holds)
    last_pyc = [None]  # the .pyc just opened: a hint only (pyc_holds checks it)

    def hook(event, args, blocked=_BLOCKED_EVENTS, blocked_prefixes=_BLOCKED_PREFIXES,
             read_events=_READ_EVENTS, write_names=write_names, write_rules=write_rules,
             listable=frozenset(module_prefixes), own=own, last_pyc=last_pyc,
             type_=type, str_=str, int_=int, len_=len,
             check_open=check_open, check_import=check_import, checked=checked, text=text,
             normalise=normalise, pyc_holds=pyc_holds, writable=writable, readable=readable,
             current=current, denied=denied):  # fmt: skip
        if event in blocked or str_.startswith(event, blocked_prefixes):
            raise denied(f"sandbox: {event} is not allowed")
        if event == "open":
            if type_(args[0]) is not int_:  # an int: an already open descriptor
                full = check_open(*args)
                last_pyc[0] = full[:-1] if str_.endswith(full, ".pyc/") else None
        elif event == "import":
            check_import(args[0], args[1])
        elif event == "marshal.loads":
            if not pyc_holds(args[0], last_pyc[0]):
                raise denied(
                    "sandbox: marshal.loads is not allowed (it builds code objects); "
                    "only the imports of the standard library use it"
                )
        elif event == "os.chdir":
            if type_(args[0]) is not int_:  # a descriptor: a folder of the work dir
                checked(args[0], current, "os.chdir")
        elif event in write_names:
            for name, (paths, dir_fds) in write_rules:
                if name != event:
                    continue
                anchored = True
                for index in dir_fds:
                    if index < len_(args) and type_(args[index]) is int_ and args[index] >= 0:
                        anchored = False
                for index in paths:
                    arg = args[index] if index < len_(args) else None
                    if arg is not None and type_(arg) is not int_:
                        checked(arg, writable, event, anchored)
        elif event in read_events:
            path = args[0] if args else None
            if path is None or type_(path) is int_:
                return
            full = text(path, False)
            if full is not None and normalise(full) in listable:
                return
            checked(path, readable, event)
        elif (event == "object.__setattr__" or event == "object.__delattr__") and len_(args) > 1:
            target = args[0]
            for function in own:  # (not a generator: it would close over args)
                if target is function:
                    raise denied(f"sandbox: changing the sandbox's {args[1]} is not allowed")
            if args[1] == "__code__":
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
