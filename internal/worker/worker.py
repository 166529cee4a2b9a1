"""pysandbox worker: runs user Python code on behalf of the Go server.

Started as `python3 -I -B worker.py [--oneshot]` with fd 3 a connected Unix
stream socket (the control channel), fd 1/2 the user's stdout/stderr and
stdin /dev/null. Messages are one JSON object per line; the protocol is
documented in protocol.go next to this file.

Security: user code runs in this very process, so it can reach everything
the worker can, including the control socket. This file is therefore not a
security boundary: the sandbox around the process is, and the Go side treats
every message from here as untrusted. The worker only avoids *accidental*
leaks: the control socket is close-on-exec, so programs started by user code
do not inherit it, and the worker's directory is not importable.

Must run unchanged on CPython 3.8 through 3.13 using only the stdlib.
"""

import sys

# The Go side streams output to the caller as it arrives; the default block
# buffering on pipes would hold it back until the run ends.
for _stream in (sys.stdout, sys.stderr):
    try:
        _stream.reconfigure(line_buffering=True)
    except Exception:
        pass
del _stream

import ast
import builtins
import io
import json
import keyword
import linecache
import os
import socket
import traceback
import types
import warnings

CONTROL_FD = 3
DEFAULT_MAX_RETURN_BYTES = 64 * 1024
# Cap on the exception text echoed in a reply; the full traceback is on
# stderr anyway, and the Go side rejects oversized lines.
MAX_ERROR_CHARS = 256 * 1024
TRUNCATED = "\u2026 (truncated)"
CO_COROUTINE = 0x0080  # inspect.CO_COROUTINE, without importing inspect
COMPILE_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT

# User code replaces sys.modules["__main__"]; keep this module referenced.
_THIS_MODULE = sys.modules[__name__]
# Frames from this file are hidden from user tracebacks.
_WORKER_FILE = sys._getframe().f_code.co_filename
# A forked child of user code must never answer on the control channel.
_PID = os.getpid()

# Released when user code runs out of memory, so that formatting and sending
# the reply has room to allocate.
_RESERVE_BYTES = 1 << 20
_reserve = None


def _take_reserve():
    global _reserve
    if _reserve is None:
        try:
            _reserve = bytearray(_RESERVE_BYTES)
        except MemoryError:
            pass


def _release_reserve():
    global _reserve
    _reserve = None


# Bound at import so user code that monkeypatches json cannot break replies
# by accident.
_dumps = json.dumps
_loads = json.loads
_JSONEncoder = json.JSONEncoder


def _send(sock, msg):
    sock.sendall((_dumps(msg, separators=(",", ":")) + "\n").encode("ascii"))


def _flush_output():
    # Everything user code printed must reach fd 1/2 before the reply does, so
    # the Go side can treat the reply as the end of the run's output.
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            s.flush()
        except Exception:
            pass


def _write_stderr(text):
    try:
        sys.stderr.write(text)
    except Exception:
        pass


# ---------------------------------------------------------------- run


def _register_source(source, filename):
    # Tracebacks read source lines through linecache; mtime None keeps
    # checkcache() from evicting the entry. Universal newlines split lines the
    # way the tokenizer numbers them; like linecache itself we end the last
    # line with a newline, which traceback's caret placement relies on.
    lines = io.StringIO(source, newline=None).readlines()
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(source), None, lines, filename)


def _compile_user_code(source, filename):
    """Compile source into one or two code objects.

    If the last statement is an expression it is compiled separately (like a
    REPL cell) so that its value can become the return value without being
    printed. Line numbers are unchanged since both parts come from one AST.
    """
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop().value
    codes = [compile(tree, filename, "exec", flags=COMPILE_FLAGS, dont_inherit=True)]
    if last is not None:
        expr = ast.Expression(body=last)
        codes.append(compile(expr, filename, "eval", flags=COMPILE_FLAGS, dont_inherit=True))
    return codes


async def _drive(codes, g):
    # Runs both parts in one event loop so objects created by the body
    # (tasks, queues, ...) still work in the final expression.
    value = None
    for code in codes:
        value = eval(code, g)
        if code.co_flags & CO_COROUTINE:
            value = await value
    return value


def _execute(source, filename, inputs, codes):
    """Run user code; return (value, exception). Appends to codes."""
    # A fresh module registered as __main__ so pickle, dataclasses and
    # `import __main__` see the user's namespace, not the worker's.
    main = types.ModuleType("__main__")
    g = main.__dict__
    g["__builtins__"] = builtins
    g.update(inputs)
    sys.modules["__main__"] = main
    sys.argv = [filename]
    _register_source(source, filename)
    try:
        codes.extend(_compile_user_code(source, filename))
        if any(c.co_flags & CO_COROUTINE for c in codes):
            import asyncio  # slow to import; only top-level await needs it

            return asyncio.run(_drive(codes, g)), None
        value = None
        for code in codes:
            value = eval(code, g)
        return value, None
    except BaseException as e:  # includes SystemExit and KeyboardInterrupt
        return None, e


def _user_traceback(tb, codes):
    """Drop the worker's (and asyncio's) frames above the user's code."""
    t = tb
    while t is not None:
        if any(t.tb_frame.f_code is c for c in codes):
            return t
        t = t.tb_next
    # The error did not come from user code (e.g. a SyntaxError from
    # compiling it): like Python for a script, show no frames at all.
    return None


def _clear_frames(tb):
    # Frees the locals of the finished user frames (often what filled the
    # memory) while keeping what a traceback needs: code and line numbers.
    while tb is not None:
        try:
            tb.tb_frame.clear()
        except RuntimeError:  # still executing: not a user frame
            pass
        tb = tb.tb_next


def _format_exception(exc, tb):
    """The text Python prints for an uncaught exception.

    The traceback module reads source lines through linecache, where the
    user's code is registered; before 3.13 the interpreter's own hook only
    reads files from disk. Its output equals the hook's except that before
    3.11 the hook spells classes from __main__ as "__main__.MyError".
    """
    try:
        return "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:  # MemoryError, or a pathological exception object
        return _type_name(type(exc)) + "\n"


def _type_name(cls):
    name = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "?")
    mod = getattr(cls, "__module__", None)
    if isinstance(mod, str) and mod != "builtins":
        return mod + "." + name
    return name


def _clip(text):
    if len(text) > MAX_ERROR_CHARS:
        return text[:MAX_ERROR_CHARS] + TRUNCATED
    return text


def _safe_str(obj):
    try:
        return str(obj)
    except BaseException:
        return "<exception str() failed>"


def _describe_exception(exc, codes):
    """Print exc like Python would and return (exit_code, error dict)."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0, None
        if isinstance(code, int):
            # What the process exit status will be.
            status = code & 0xFF
            if status == 0:
                return 0, None
            return status, {"type": "SystemExit", "message": str(status), "traceback": ""}
        text = _safe_str(code)
        _write_stderr(text + "\n")
        return 1, {"type": "SystemExit", "message": _clip(text), "traceback": ""}

    tb = _user_traceback(exc.__traceback__, codes)
    exc.__traceback__ = tb
    if isinstance(exc, MemoryError):
        _clear_frames(tb)
    text = _format_exception(exc, tb)
    del tb
    _write_stderr(text)
    return 1, {
        "type": _type_name(type(exc)),
        "message": _clip(_safe_str(exc)),
        "traceback": _clip(text),
    }


def _bounded_json(value, limit):
    """JSON text of value, or None if it is longer than limit.

    iterencode lets us stop early instead of building a huge string first.
    Raises if value is not JSON-able (or is NaN/inf).
    """
    enc = _JSONEncoder(allow_nan=False, separators=(",", ":"))
    parts = []
    size = 0
    for chunk in enc.iterencode(value):
        size += len(chunk)  # ensure_ascii: characters are bytes
        if size > limit:
            return None
        parts.append(chunk)
    return "".join(parts)


def _repr_json(value, limit, truncate):
    """repr(value) as a JSON string of at most limit bytes."""
    try:
        text = repr(value)
    except BaseException:
        text = object.__repr__(value)
    if not truncate and len(text) <= limit:
        s = _dumps(text)
        if len(s) <= limit:
            return s
    # Escapes can make the JSON longer than the text, so shrink until it fits.
    n = min(len(text), limit)
    while True:
        s = _dumps(text[:n] + TRUNCATED)
        if len(s) <= limit or n == 0:
            return s
        n = min(n - 1, n * limit // len(s))


def _encode_return(value, limit):
    """Return (json text, is_repr)."""
    if value is None:
        return "null", False
    try:
        s = _bounded_json(value, limit)
        if s is not None:
            return s, False
        truncate = True
    except BaseException:  # dict/list subclasses can run arbitrary code
        truncate = False
    return _repr_json(value, limit, truncate), True


def _memory_fallback(rid):
    # Pre-encoded before user code runs: sending it needs no allocation
    # beyond the system call, for when even a small reply cannot be built.
    return (
        '{"op":"result","id":%s,"status":"error","exit_code":1,"return_value":null,'
        '"error":{"type":"MemoryError","message":"","traceback":""}}\n' % _dumps(rid)
    ).encode("ascii")


def _check_inputs(inputs):
    if not isinstance(inputs, dict):
        return "inputs must be a JSON object"
    for name in inputs:
        if not name.isidentifier() or keyword.iskeyword(name):
            return "invalid input name: %r" % (name,)
    return None


def _run(sock, req, rid):
    """Handle a "run" request; returns the exit code."""
    fallback = _memory_fallback(rid)
    source = req.get("code", "")
    filename = req.get("filename") or "<code>"
    inputs = req.get("inputs") or {}
    limit = req.get("max_return_bytes")
    if not isinstance(limit, int) or limit <= 0:
        limit = DEFAULT_MAX_RETURN_BYTES
    if not isinstance(source, str) or not isinstance(filename, str):
        _send_error(sock, rid, "code and filename must be strings")
        return 1

    problem = _check_inputs(inputs)
    if problem is not None:
        text = "ValueError: " + problem + "\n"
        _write_stderr(text)
        _flush_output()
        _send(sock, {"op": "result", "id": rid, "status": "error", "exit_code": 1,
                     "return_value": None,
                     "error": {"type": "ValueError", "message": problem, "traceback": text}})
        return 1

    codes = []
    value, exc = _execute(source, filename, inputs, codes)

    try:
        if isinstance(exc, MemoryError):
            _release_reserve()
        reply = {"op": "result", "id": rid, "status": "success", "exit_code": 0}
        if exc is not None:
            exit_code, error = _describe_exception(exc, codes)
            del exc
            reply["exit_code"] = exit_code
            if error is not None:
                reply["status"] = "error"
                reply["error"] = error
            ret, is_repr = "null", False
        else:
            ret, is_repr = _encode_return(value, limit)
        del value
        if is_repr:
            reply["return_repr"] = True
        head = _dumps(reply, separators=(",", ":"))
        data = (head[:-1] + ',"return_value":' + ret + "}\n").encode("ascii")
        exit_code = reply["exit_code"]
    except MemoryError:
        data, exit_code = fallback, 1
    _flush_output()
    if os.getpid() != _PID:
        # User code forked and the child fell through to here: end it the way
        # a script would end, without a word on the control channel.
        os._exit(exit_code)
    sock.sendall(data)
    return exit_code


# ---------------------------------------------------------------- validate


def _validate(req):
    source = req.get("code", "")
    filename = req.get("filename") or "<code>"
    try:
        # Warnings would land in the user's stderr, unrelated to any run.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, filename, "exec", flags=COMPILE_FLAGS, dont_inherit=True)
    except SyntaxError as e:  # also IndentationError, TabError
        text = e.text if isinstance(e.text, str) else ""
        return False, {
            "line": e.lineno or 0,
            "column": e.offset or 0,
            "message": _safe_str(e.msg),
            "text": text.rstrip("\r\n"),
        }
    except Exception as e:  # ValueError for NUL bytes; MemoryError, RecursionError
        return False, {"line": 0, "column": 0, "message": _safe_str(e)}
    return True, None


# ---------------------------------------------------------------- probe


def _read_text(path):
    try:
        with open(path, "r", errors="replace") as f:
            return f.read()
    except Exception:
        return ""


_STATUS_KEYS = ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb", "NoNewPrivs", "Seccomp")
_RLIMITS = ("NOFILE", "NPROC", "FSIZE", "CORE", "AS", "CPU", "STACK")


def _can_write(directory):
    try:
        import tempfile

        fd, path = tempfile.mkstemp(prefix=".pysandbox-probe-", dir=directory)
        os.close(fd)
        os.unlink(path)
        return True
    except Exception:
        return False


def _probe():
    """Isolation facts as seen from inside; never raises."""
    p = {
        "uid": -1, "gid": -1, "status": {}, "namespaces": {}, "interfaces": [],
        "rlimits": {}, "hostname": "", "cwd": "", "processes_seen": 0,
        "root_writable": False, "tmp_writable": False,
    }
    try:
        p["uid"], p["gid"] = os.getuid(), os.getgid()
    except Exception:
        pass
    for line in _read_text("/proc/self/status").splitlines():
        key, sep, val = line.partition(":")
        if sep and key in _STATUS_KEYS:
            p["status"][key] = val.strip()
    try:
        for name in sorted(os.listdir("/proc/self/ns")):
            try:
                p["namespaces"][name] = os.readlink("/proc/self/ns/" + name)
            except Exception:
                pass
    except Exception:
        pass
    for line in _read_text("/proc/net/dev").splitlines()[2:]:
        name, sep, _ = line.partition(":")
        if sep and name.strip():
            p["interfaces"].append(name.strip())
    try:
        import resource

        for name in _RLIMITS:
            try:
                lim = resource.getrlimit(getattr(resource, "RLIMIT_" + name))
                p["rlimits"][name] = [-1 if v == resource.RLIM_INFINITY else v for v in lim]
            except Exception:
                pass
    except Exception:
        pass
    try:
        p["hostname"] = socket.gethostname()
    except Exception:
        pass
    try:
        p["cwd"] = os.getcwd()
    except Exception:
        pass
    try:
        p["processes_seen"] = sum(1 for n in os.listdir("/proc") if n.isdigit())
    except Exception:
        pass
    p["root_writable"] = _can_write("/")
    p["tmp_writable"] = _can_write("/tmp")
    return p


# ---------------------------------------------------------------- main loop


def _send_error(sock, rid, message):
    _send(sock, {"op": "error", "id": rid, "message": message})


def _setup():
    # -I already leaves the script's directory off sys.path; make sure, so
    # user code cannot import this file's neighbours by accident.
    here = os.path.dirname(os.path.abspath(_WORKER_FILE))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.argv = ["<code>"]
    sock = socket.socket(fileno=CONTROL_FD)
    # Programs started by user code must not inherit the control channel.
    sock.set_inheritable(False)
    return sock


def main():
    oneshot = "--oneshot" in sys.argv[1:]
    sock = _setup()
    _take_reserve()
    rfile = sock.makefile("rb")
    v = sys.version_info
    _send(sock, {"op": "ready", "python": sys.version.split()[0],
                 "version": [v[0], v[1]], "pid": _PID})
    while True:
        try:
            line = rfile.readline()
        except OSError as e:
            _write_stderr("pysandbox worker: control channel: %s\n" % (e,))
            return 1
        if not line:
            return 0  # the Go side hung up
        try:
            req = _loads(line)
        except ValueError:
            req = None
        if not isinstance(req, dict):
            _send_error(sock, "", "request is not a JSON object")
            continue
        rid = req.get("id")
        if not isinstance(rid, str):
            rid = ""
        op = req.get("op")
        if op == "run":
            code = _run(sock, req, rid)
            if oneshot:
                _flush_output()
                sock.close()
                return code
            # Each run gets a fresh namespace; let the last one be freed now
            # rather than at the next run, in case it is what filled memory.
            sys.modules["__main__"] = types.ModuleType("__main__")
            _take_reserve()
        elif op == "validate":
            valid, err = _validate(req)
            msg = {"op": "validated", "id": rid, "valid": valid}
            if err is not None:
                msg["syntax_error"] = err
            _send(sock, msg)
        elif op == "probe":
            msg = _probe()
            msg["op"], msg["id"] = "probed", rid
            _send(sock, msg)
        else:
            _send_error(sock, rid, "unknown op %r" % (op,))


if __name__ == "__main__":
    sys.exit(main())
