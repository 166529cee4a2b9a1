"""pysandbox worker: runs user Python code on behalf of the Go server.

Started as `python3 -I -B worker.py [--oneshot]` with fd 3 a connected Unix
stream socket (the control channel), fd 1/2 the user's stdout/stderr and
stdin /dev/null. Messages are one JSON object per line; the protocol is
documented in protocol.go next to this file.

A serving worker (not --oneshot) is a session: globals and imports persist
from one run to the next, and SIGINT interrupts the current run (as a
KeyboardInterrupt in user code) without ending the worker.

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

import _signal
import _socket
import _thread
import ast
import binascii
import builtins
import io
import json
import keyword
import linecache
import marshal
import os
import signal
import socket
import time
import traceback
import types
import warnings

CONTROL_FD = 3
DEFAULT_MAX_RETURN_BYTES = 64 * 1024
# Figures (matplotlib): see _capture_figures.
DEFAULT_MAX_FIGURE_BYTES = 1 << 20
MAX_FIGURE_PNG_BYTES = 8 << 20  # never sent, whatever max_figure_bytes says
MAX_FIGURES_TOTAL_BYTES = 16 << 20  # all figures of one reply, before base64
MAX_FIGURES = 16
MIN_FIGURE_DPI = 20
FIGURE_RETRIES = 3
MAX_RETURN_TEXT_BYTES = 64 * 1024
_MARKER_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# Cap on the exception text echoed in a reply; the full traceback is on
# stderr anyway, and the Go side rejects oversized lines.
MAX_ERROR_CHARS = 32 * 1024
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
# the reply has room to allocate. There are two: in a session the user's
# globals may keep the memory full after a failed run, so the first may not
# be taken back; the second then gives room to read and compile the next
# run's code (which may free that memory).
_RESERVE_BYTES = 1 << 20
_RESERVES = 2
_reserves = []
# A pooled child's reserves are address space only (see _zygote_main): an
# anonymous mapping nothing touches costs no page, and frees room under
# RLIMIT_AS just as well. Real pages would be shared with the zygote and
# charged to it, so freeing them would give a child's cgroup nothing back.
_mmap = None


def _take_reserve():
    """Take back the reserves released, as far as memory allows."""
    while len(_reserves) < _RESERVES:
        try:
            if _mmap is not None:
                _reserves.append(_mmap.mmap(-1, _RESERVE_BYTES, flags=_mmap.MAP_PRIVATE))
            else:
                _reserves.append(bytearray(_RESERVE_BYTES))
        except (MemoryError, OSError):
            return


def _release_reserve():
    """Free one reserve; False if there was none left."""
    if not _reserves:
        return False
    _reserves.pop()
    return True


# Bound at import so user code that monkeypatches json cannot break replies
# by accident.
_dumps = json.dumps
_loads = json.loads
# The replies' encoder, made once: json.dumps with any argument builds a
# new JSONEncoder per call, and every function a pooled run calls for
# the first time costs it a page or two copied from the zygote.
_compact = json.JSONEncoder(separators=(",", ":")).encode
_JSONEncoder = json.JSONEncoder
_marshal_dumps = marshal.dumps  # for snapshot.py (marshal is loaded anyway)
_marshal_loads = marshal.loads


def _send(sock, msg):
    _send_bytes(sock, (_compact(msg) + "\n").encode("ascii"))


def _send_bytes(sock, data):
    """Write one message to sock. On the control channel, every message
    goes through the channel: its lines must never interleave with those
    of a tool call from another thread."""
    ch = _chan
    if ch is None or sock is not ch.sock:
        sock.sendall(data)
    else:
        ch.send(data)


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


# plt.show() has nothing to show on the headless backend (the Go side sets
# MPLBACKEND=Agg): figures are sent with the result instead, so its warning
# would only be noise. A filter costs nothing; importing matplotlib would.
warnings.filterwarnings(
    "ignore",
    message=r"(Matplotlib is currently using \S+, which is a non-GUI backend"
    r"|FigureCanvas\w* is non-interactive)",
    category=UserWarning,
)


# ---------------------------------------------------------------- interrupts
#
# The Go side sends SIGINT to stop a run that is taking too long without
# losing a session's state. It must raise KeyboardInterrupt in the code being
# run, and nowhere else: not while the worker is idle, nor while it builds or
# sends a reply (a SIGINT meant for a run may arrive just after the run
# ended). So the handler only raises while _guarded runs a function, and
# only in frames that are not the worker's own; one that lands in a worker
# frame during a run is kept pending and raised before the next piece of user
# code starts (_check_interrupt).
#
# An import cut short stays broken for the rest of the session (a package
# without some of its submodules fails every later import of it), so an
# interrupt that lands in one is delivered again a little later, once the
# import is done, unless the import takes longer than IMPORT_GRACE seconds:
# the Go side gives up and kills the worker a few seconds after its SIGINT.

IMPORT_GRACE = 1.0
_REDELIVER_DELAY = 0.02
_MAIN_THREAD = _thread.get_ident()
_interruptible = False
_interrupt_pending = False
_guard_seq = 0  # identifies the current _guarded call
_deferred_since = None


def _guarded(f, *args):
    """Call f(*args), which SIGINT may interrupt. Returns (True, result) or
    (False, exception); never raises. Not reentrant: f must not call it."""
    global _interruptible, _interrupt_pending, _guard_seq, _deferred_since
    try:
        _interrupt_pending = False
        _deferred_since = None
        _guard_seq += 1
        _interruptible = True
        result = f(*args)
        _interruptible = _interrupt_pending = False
        return True, result
    except BaseException as e:  # includes SystemExit and KeyboardInterrupt
        _interruptible = _interrupt_pending = False
        return False, e


def _check_interrupt():
    global _interrupt_pending
    if _interrupt_pending:
        _interrupt_pending = False
        raise KeyboardInterrupt


def _in_import(frame):
    depth = 0
    while frame is not None and depth < 1000:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
        depth += 1
    return False


def _redeliver(seq):
    # A thread of its own: sleeps, then signals the main thread again (a
    # real signal, which also ends a blocking call) if the same run is still
    # going.
    time.sleep(_REDELIVER_DELAY)
    if _interruptible and _guard_seq == seq:
        try:
            signal.pthread_kill(_MAIN_THREAD, signal.SIGINT)
        except Exception:
            pass


def _on_sigint(signum, frame):
    global _interrupt_pending, _deferred_since
    if not _interruptible:
        return
    if _in_import(frame):
        now = time.monotonic()
        if _deferred_since is None:
            _deferred_since = now
        if now - _deferred_since < IMPORT_GRACE:
            try:
                _thread.start_new_thread(_redeliver, (_guard_seq,))
                return
            except Exception:  # no threads: interrupt now
                pass
    if frame is not None and frame.f_code in _TOOL_WAITS:
        # The main thread waits for a tool's answer: nothing is lost if the
        # wait ends here (see _Channel).
        raise KeyboardInterrupt
    if _channel_busy or (frame is not None and frame.f_code.co_filename == _WORKER_FILE):
        # The worker's own code (the main thread's work on the channel
        # included): raised before the next piece of user code runs.
        _interrupt_pending = True
        return
    raise KeyboardInterrupt


def _raise_pending():
    """In the main thread during a run: raise the KeyboardInterrupt held
    back while the worker's own code ran."""
    global _interrupt_pending
    if _interruptible and _interrupt_pending and _thread.get_ident() == _MAIN_THREAD:
        _interrupt_pending = False
        raise KeyboardInterrupt


# A SIGINT handler of the user's own (or Python's default one, until the
# run ends) may raise anywhere, also in the middle of a line written to or
# read from the control channel. While the main thread works on the channel
# it is replaced by _defer_sigint, and a SIGINT that came meanwhile is sent
# again once it is back. Ours needs no such care: it raises only in the
# waits of _TOOL_WAITS, and holds the interrupt back elsewhere.
_sigint_deferred = False


def _defer_sigint(signum, frame):
    global _sigint_deferred
    _sigint_deferred = True


def _shield_sigint():
    """In the main thread: put _defer_sigint in place of a handler that is
    not ours. Returns what _unshield_sigint needs, or None."""
    if _thread.get_ident() != _MAIN_THREAD:
        return None
    try:
        # _signal's, without signal's conversion to enums: this is on the
        # path of every message.
        old = _signal.getsignal(signal.SIGINT)
        if old is _on_sigint or old is None:  # None: not set from Python
            return None
        _signal.signal(signal.SIGINT, _defer_sigint)
    except Exception:
        return None
    return (old,)


def _unshield_sigint(saved):
    global _sigint_deferred
    if saved is None:
        return
    _signal.signal(signal.SIGINT, saved[0])
    if _sigint_deferred:
        _sigint_deferred = False
        if _interruptible:  # else it was meant for a run that is over
            signal.pthread_kill(_MAIN_THREAD, signal.SIGINT)


# _signal's functions rather than signal's, here and below: signal's wrap
# every handler and number in enums, which is most of the Python a
# trivial run executes after its code (and pages a pooled run copies).
def _install_sigint_handler():
    try:
        _signal.signal(_signal.SIGINT, _on_sigint)
    except Exception:  # not the main thread
        pass


def _restore_sigint_handler():
    # User code that put Python's default handler back (it raises anywhere,
    # including while the reply is sent) gets ours again as soon as it is
    # done, which behaves the same in user code. Any other handler, or
    # SIG_IGN, is the user's choice and stays for the session.
    try:
        if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
            _signal.signal(_signal.SIGINT, _on_sigint)
    except BaseException:
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
        _check_interrupt()
        value = eval(code, g)
        if code.co_flags & CO_COROUTINE:
            value = await value
    return value


def _execute(source, filename, inputs, codes, main, args=()):
    """Run user code in main (a fresh module if None) and return the value
    of its last expression; user exceptions propagate. Appends to codes.
    Called through _guarded."""
    # The module is registered as __main__ so pickle, dataclasses and
    # `import __main__` see the user's namespace, not the worker's. A session
    # keeps one for all its runs: globals and imports persist, like in a REPL.
    in_session = main is not None
    if main is None:
        main = types.ModuleType("__main__")
    g = main.__dict__
    g["__builtins__"] = builtins
    if getattr(builtins, "display", None) is None:
        builtins.display = _display  # as in a notebook
    g.update(inputs)
    sys.modules["__main__"] = main
    sys.argv = [filename] + list(args)
    # A session may still hold the memory that made its last run fail: the
    # reserve gives room to compile code that frees it (`del big`), and is
    # taken back, if possible, before that code runs. A one-shot run starts
    # with its reserves whole, and skips this: a reserve taken back is a
    # fresh MiB, zero-filled page by page (measured: about a tenth of the
    # pool's CPU time at full throughput).
    if in_session:
        _release_reserve()
    _register_source(source, filename)
    codes.extend(_compile_user_code(source, filename))
    if in_session:
        _take_reserve()
    if any(c.co_flags & CO_COROUTINE for c in codes):
        import asyncio  # slow to import; only top-level await needs it

        return asyncio.run(_drive(codes, g))
    value = None
    for code in codes:
        _check_interrupt()
        value = eval(code, g)
    return value


def _user_traceback(tb, codes):
    """Drop the worker's (and asyncio's) frames above the user's code, and
    the SIGINT handler's below it."""
    t = tb
    while t is not None:
        if any(t.tb_frame.f_code is c for c in codes):
            break
        t = t.tb_next
    else:
        # The error did not come from user code (e.g. a SyntaxError from
        # compiling it): like Python for a script, show no frames at all.
        return None
    start = t
    last_user = None
    while t.tb_next is not None:
        if t.tb_next.tb_frame.f_code is _on_sigint.__code__:
            # Python's own handler, written in C, leaves no frame either.
            t.tb_next = None
            break
        if t.tb_frame.f_code.co_filename not in (_TOOLS_PATH, _WORKER_FILE):
            last_user = t
        t = t.tb_next
    if last_user is not None and last_user.tb_next is not None \
            and last_user.tb_next.tb_frame.f_code.co_filename == _TOOLS_PATH:
        # An error from a tool call (or an interrupt during one) is shown
        # where the user's code called, as a builtin function's would be.
        last_user.tb_next = None
    return start


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
    enc = _JSONEncoder(allow_nan=False, separators=(",", ":"), default=_json_default)
    parts = []
    size = 0
    for chunk in enc.iterencode(value):
        size += len(chunk)  # ensure_ascii: characters are bytes
        if size > limit:
            return None
        parts.append(chunk)
    return "".join(parts)


def _json_default(obj):
    """numpy's scalars as the Python values they hold.

    They are what data code returns most (np.int64 from a sum, np.bool_
    from a comparison), and only np.float64 is a float already: the rest
    would come back as their repr's text. Anything else is not JSON-able.
    """
    np = sys.modules.get("numpy")
    # Numbers and booleans only: a datetime64's item() is an integer of
    # its unit (epoch nanoseconds for pandas' dates) or None for NaT,
    # which would read as a plain number or as no value; its repr says
    # what it is.
    if np is not None and isinstance(obj, (np.number, np.bool_)):
        value = obj.item()
        if not isinstance(value, np.generic):
            return value  # the encoder checks it in turn (complex: not JSON)
    raise TypeError("not JSON serializable")


def _repr_json(value, limit, truncate):
    """repr(value) as a JSON string of at most limit bytes."""
    # A __repr__ that hangs can be interrupted.
    ok, text = _guarded(repr, value)
    if not ok:
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
    """Return (json text, is_repr); None when an interrupt (the run's
    timeout, a cancel) stopped the value's own code as it was encoded."""
    if value is None:
        return "null", False
    # Guarded: dict and list subclasses and numpy scalars run the code's
    # own methods here, which the run's timeout must be able to interrupt
    # (a hang here ended a session).
    ok, s = _guarded(_bounded_json, value, limit)
    if ok and s is not None:
        return s, False
    if not ok and isinstance(s, KeyboardInterrupt):
        return None  # run none of the value's code again (its repr)
    return _repr_json(value, limit, ok), True


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


def _positive_int(value, default):
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return default


def _run(sock, req, rid, session=None):
    """Handle a "run" request; returns the exit code. session is the
    __main__ module kept across runs, or None for a fresh one."""
    fallback = _memory_fallback(rid)
    source = req.get("code", "")
    filename = req.get("filename") or "<code>"
    inputs = req.get("inputs") or {}
    limit = _positive_int(req.get("max_return_bytes"), DEFAULT_MAX_RETURN_BYTES)
    max_figure = min(_positive_int(req.get("max_figure_bytes"), DEFAULT_MAX_FIGURE_BYTES),
                     MAX_FIGURE_PNG_BYTES)
    args = req.get("args") or []
    if not isinstance(source, str) or not isinstance(filename, str) or \
            not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        _send_error(sock, rid, "code and filename must be strings, args a list of them")
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

    if req.get("gate") is True:
        why = _gate(sock, source)
        if why is not None:
            # Nothing of the code ran: the server said it may not.
            _flush_output()
            if session is None:
                _close_output()
            _send(sock, {"op": "result", "id": rid, "status": "error", "exit_code": 1,
                         "return_value": None,
                         "error": {"type": "PolicyRefusal", "message": why, "traceback": ""}})
            return 1

    _refresh_cwd_imports()
    codes = []
    _tools_begin(sock, req.get("tools") is True)
    ok, value = _guarded(_execute, source, filename, inputs, codes, session, args)
    _restore_sigint_handler()
    exc = None
    if not ok:
        exc, value = value, None

    try:
        out_of_memory = isinstance(exc, MemoryError)
        if out_of_memory:
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
            encoded = _encode_return(value, limit)
            if encoded is None:
                # The interrupt is the run's, as if its code had been
                # stopped: the server tells a timeout from a cancel.
                reply["status"], reply["exit_code"] = "error", 1
                reply["error"] = {"type": "KeyboardInterrupt", "traceback": "",
                                  "message": "interrupted while its return value was encoded (its own code ran then)"}
                encoded, value = ("null", False), None
            ret, is_repr = encoded
            ok, text = _guarded(_return_text, value)
            if ok and text is not None:
                reply["return_text"] = text
            del text
        if is_repr:
            reply["return_repr"] = True
        if not out_of_memory and os.getpid() == _PID:
            ok, taken = _guarded(_take_displays, value, reply["status"] != "success")
            if ok:
                displays, omitted = taken
                if displays:
                    reply["displays"] = displays
                if omitted:
                    reply["displays_omitted"] = omitted
                del displays, taken
        del value
        # Partial plots help debugging too, but after a MemoryError rendering
        # would only fail again.
        if not out_of_memory and os.getpid() == _PID:
            figures, omitted = _capture_figures(max_figure)
            if figures:
                reply["figures"] = figures
            if omitted:
                reply["figures_omitted"] = omitted
            del figures
        exit_code = reply["exit_code"]
        head = _compact(reply)
        del reply
        data = (head[:-1] + ',"return_value":' + ret + "}\n").encode("ascii")
    except MemoryError:
        data, exit_code = fallback, 1
    if session is None and os.getpid() == _PID:
        # A one-shot run's interpreter ends with it, as a script's would:
        # it waits for the run's non-daemon threads, then runs its atexit
        # handlers (after its figures are taken: pyplot closes them all at
        # exit), so that what they print is part of the run's output (see
        # below). The run's timeout bounds both.
        _guarded(_join_threads)
        _guarded(_run_atexit)
    _restore_sigint_handler()
    _flush_output()
    if os.getpid() != _PID:
        # User code forked and the child fell through to here: end it the way
        # a script would end, without a word on the control channel.
        os._exit(exit_code)
    # The run's code is done (a one-shot run's threads and atexit handlers
    # too, above): its tool calls end here, before its result goes.
    _tools_end(sock)
    if session is None:
        # One-shot: nothing more of the run can print, so let go of its
        # output before replying. Unless a process the run started still
        # holds them, the server sees the end of both streams with the
        # reply and can answer without waiting for this sandbox to be
        # torn down.
        _close_output()
    _send_bytes(sock, data)
    return exit_code


_FACTS_PATH = os.path.join(os.path.dirname(os.path.abspath(_WORKER_FILE)), "codefacts.py")
_facts = None  # codefacts.py, loaded once (in the zygote when it warms up)


def _facts_module():
    global _facts
    if _facts is None:
        import types

        with open(_FACTS_PATH, "rb") as f:
            source = f.read()
        module = types.ModuleType("_pysandbox_codefacts")
        module.__file__ = _FACTS_PATH
        exec(compile(source, _FACTS_PATH, "exec", dont_inherit=True), module.__dict__)
        _facts = module
    return _facts


def _gate(sock, source):
    """Before a gated run's code runs: send its facts (Python's parser on
    it, in a forked child) to the server and wait for its answer. Returns
    None when the code may run, else why not."""
    try:
        line = _facts_module().codefacts_line(source)
    except Exception as e:
        line = _dumps({"v": 1, "imports": [], "process_calls": [], "file_calls": [], "network_calls": [],
                       "dynamic_code": ["unanalysable"], "urls": [], "truncated": [],
                       "syntax_error": "the analysis failed: " + _clip(_safe_str(e))},
                      separators=(",", ":"))
    if _chan is None or sock is not _chan.sock:
        return "the sandbox cannot ask the server whether this code may run"
    _chan.begin_run(False)
    try:
        reply = _chan.call({"op": "code_facts"}, line, gate=True)
    finally:
        _chan.end_run()
    err = reply.get("error") if isinstance(reply, dict) else None
    if err is None and isinstance(reply, dict) and isinstance(reply.get("structured"), dict) \
            and reply["structured"].get("run") is True:
        return None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return "the server did not say that this code may run"


_SNAPSHOT_PATH = os.path.join(os.path.dirname(os.path.abspath(_WORKER_FILE)), "snapshot.py")
_snapshot = None  # snapshot.py, loaded on the first snapshot or restore


def _snapshot_module():
    """snapshot.py as the module _pysandbox_snapshot, in sys.modules: the
    streams it writes name their reconstructors by that name."""
    global _snapshot
    if _snapshot is None:
        with open(_SNAPSHOT_PATH, "rb") as f:
            source = f.read()
        module = types.ModuleType("_pysandbox_snapshot")
        module.__file__ = _SNAPSHOT_PATH
        module._worker = _THIS_MODULE
        exec(compile(source, _SNAPSHOT_PATH, "exec", dont_inherit=True), module.__dict__)
        _snapshot = module
    sys.modules["_pysandbox_snapshot"] = _snapshot  # again: user code may have taken it out
    return _snapshot


def _snapshot_request(sock, op, req, rid, session):
    """Answer "snapshot" or "restore" (snapshot.py). A restore's raw bytes
    are consumed whatever happens, to keep the stream in step."""
    try:
        module = _snapshot_module()
    except Exception as e:
        n = req.get("bytes") if op == "restore" else 0
        if isinstance(n, int) and n > 0:
            view = memoryview(bytearray(1 << 16))
            while n > 0:
                k = _chan.reader.read_into(view[:min(n, len(view))])
                if not k:
                    break
                n -= k
        _send_error(sock, rid, "snapshots are not available: " + _clip(_safe_str(e)))
        return
    module.handle(sock, op, req, rid, session)


def _join_threads():
    threading = sys.modules.get("threading")
    if threading is not None and hasattr(threading, "_shutdown"):
        threading._shutdown()


def _run_atexit():
    import atexit

    atexit._run_exitfuncs()


def _close_output():
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    for fd in (1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


def _add_session_packages():
    # install_package copies packages into the workspace's .packages; put it
    # on sys.path (after the standard library, like every dependency
    # directory) once it exists.
    try:
        path = os.path.join(os.getcwd(), ".packages")
        if os.path.isdir(path) and path not in sys.path:
            _add_site_dir(path)
            importlib_invalidate = getattr(sys.modules.get("importlib"), "invalidate_caches", None)
            if importlib_invalidate is not None:
                importlib_invalidate()
    except Exception:
        pass


def _refresh_cwd_imports():
    # The directory listing the import system caches for the working
    # directory is only refreshed when the directory's mtime changes, which
    # has a granularity of a few milliseconds: make modules the user just
    # wrote there importable for sure.
    _add_session_packages()
    try:
        finder = sys.path_importer_cache.get(os.getcwd())
        if finder is not None:
            finder.invalidate_caches()
    except Exception:
        pass


def _return_text(value):
    """A plain-text table for pandas objects (DataFrame, Series), or None.

    Checked by module name so that pandas is never imported here.
    """
    if value is None:
        return None
    mod = getattr(type(value), "__module__", None)
    if not isinstance(mod, str) or not (mod == "pandas" or mod.startswith("pandas.")):
        return None
    to_string = getattr(value, "to_string", None)
    if not callable(to_string):
        return None
    try:
        text = to_string(max_rows=60, max_cols=20)
    except TypeError:  # Series.to_string has no max_cols
        text = to_string(max_rows=60)
    if not isinstance(text, str):
        return None
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_RETURN_TEXT_BYTES:
        return text
    tail = TRUNCATED.encode("utf-8")
    return data[: MAX_RETURN_TEXT_BYTES - len(tail)].decode("utf-8", "ignore") + TRUNCATED


# ---------------------------------------------------------------- display

# Rich outputs, as a notebook shows them: display(obj) during a run, and
# the last expression's value when it has a rich representation. Each is a
# bundle of MIME type -> data (binary types base64-encoded) with a
# text/plain fallback. Bounded here and again on the Go side.
MAX_DISPLAYS = 32  # worker.MaxDisplays
MAX_DISPLAY_ITEM_BYTES = 2 << 20
MAX_DISPLAYS_TOTAL_BYTES = 4 << 20  # worker.MaxDisplaysTotalBytes, as sent (JSON, base64)
MAX_DISPLAY_TEXT_BYTES = 64 << 10
_REPR_METHODS = (
    ("_repr_png_", "image/png", True),
    ("_repr_jpeg_", "image/jpeg", True),
    ("_repr_svg_", "image/svg+xml", False),
    ("_repr_html_", "text/html", False),
    ("_repr_markdown_", "text/markdown", False),
    ("_repr_json_", "application/json", False),
    ("_repr_latex_", "text/latex", False),
)
_displays = []
_display_state = {"bytes": 0, "omitted": 0}


def _clip_text(text, limit):
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[: limit - len(TRUNCATED)].decode("utf-8", "ignore") + TRUNCATED


def _rich_bundle(obj):
    """The MIME bundle of obj's rich representations (empty when it has
    none), without text/plain."""
    bundle = {}
    for name, mime, binary in _REPR_METHODS:
        method = getattr(type(obj), name, None)
        if method is None:
            continue
        try:
            data = getattr(obj, name)()
        except Exception as e:
            _figure_note("%s of a %s failed: %s: %s" % (name, _type_name(type(obj)), _type_name(type(e)), _safe_str(e)))
            continue
        if isinstance(data, tuple) and data:  # (data, metadata)
            data = data[0]
        if data is None:
            continue
        if binary:
            if isinstance(data, str):
                data = data.encode("latin-1", "replace")
            if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_DISPLAY_ITEM_BYTES:
                continue
            bundle[mime] = binascii.b2a_base64(bytes(data)).decode("ascii").strip()
        elif mime == "application/json":
            try:
                text = json.dumps(data, ensure_ascii=False, default=repr)
            except Exception:
                continue
            if len(text) <= MAX_DISPLAY_ITEM_BYTES:
                bundle[mime] = text
        elif isinstance(data, str) and len(data) <= MAX_DISPLAY_ITEM_BYTES:
            bundle[mime] = data
    return bundle


def _display(*objs, **_ignored):
    """display(obj, ...): show each object as a notebook would, with its
    richest representations (image, SVG, HTML, Markdown, JSON, LaTeX) and
    a text fallback."""
    for obj in objs:
        _add_display(obj, _rich_bundle(obj))


def _add_display(obj, bundle):
    if len(_displays) >= MAX_DISPLAYS:
        _display_state["omitted"] += 1
        return
    try:
        text = repr(obj)
    except Exception as e:
        text = "<%s: repr failed: %s>" % (_type_name(type(obj)), _type_name(type(e)))
    bundle["text/plain"] = _clip_text(text, MAX_DISPLAY_TEXT_BYTES)
    size = len(_dumps(bundle))  # as it goes on the wire (escapes included)
    if _display_state["bytes"] + size > MAX_DISPLAYS_TOTAL_BYTES:
        _display_state["omitted"] += 1
        return
    _display_state["bytes"] += size
    _displays.append({"data": bundle})


def _take_displays(value, failed):
    """The run's displays, with the last expression's value when it has a
    rich representation; resets them for the next run."""
    if not failed and value is not None:
        ok, bundle = _guarded(_rich_bundle, value)
        if ok and bundle:
            _add_display(value, bundle)
    out, omitted = list(_displays), _display_state["omitted"]
    del _displays[:]
    _display_state["bytes"], _display_state["omitted"] = 0, 0
    return out, omitted


# ---------------------------------------------------------------- IPython shim
#
# Code written for notebooks does `from IPython.display import display,
# HTML, Markdown, Image, SVG, JSON`. Without IPython installed, _IPythonFinder
# (last in sys.meta_path: an IPython a dependency installs wins) serves
# "IPython" and "IPython.display" (also as IPython.core.display): objects with
# the _repr_*_ methods display() shows, display() itself and a no-op
# clear_output(). IPython.get_ipython() returns None, as outside a shell.

_IPYTHON_NAMES = ("IPython", "IPython.core", "IPython.display", "IPython.core.display")


def _ipython_display_names():
    """The names of the IPython.display shim."""

    def _exists(path):
        try:
            return os.path.exists(path)
        except (ValueError, OSError):
            return False

    class DisplayObject(object):
        _read_flags = "r"

        def __init__(self, data=None, url=None, filename=None, metadata=None):
            if isinstance(data, os.PathLike):
                data = os.fspath(data)
            if isinstance(data, str):
                if data.startswith("http") and url is None:
                    url, data = data, None
                elif filename is None and "\n" not in data and len(data) < 4096 and _exists(data):
                    filename, data = data, None
            self.data, self.url, self.filename, self.metadata = data, url, filename, metadata
            if data is None and filename is not None:
                if self._read_flags == "rb":
                    with open(filename, "rb") as f:
                        self.data = f.read()
                else:
                    with open(filename, "r", encoding="utf-8") as f:
                        self.data = f.read()
            self._check_data()

        def _check_data(self):
            pass

        def __repr__(self):
            return "<IPython.core.display.%s object>" % type(self).__name__

    class TextDisplayObject(DisplayObject):
        def _check_data(self):
            if isinstance(self.data, bytes):
                self.data = self.data.decode("utf-8", "replace")
            if self.data is not None and not isinstance(self.data, str):
                raise TypeError("%s expects text, not %r" % (type(self).__name__, self.data))

    class HTML(TextDisplayObject):
        def _repr_html_(self):
            if self.data is None and self.url is not None:
                return '<iframe src="%s"></iframe>' % self.url.replace('"', "&quot;")
            return self.data

        def __html__(self):
            return self._repr_html_()

    class Markdown(TextDisplayObject):
        def _repr_markdown_(self):
            return self.data

    class Latex(TextDisplayObject):
        def _repr_latex_(self):
            return self.data

    class Math(TextDisplayObject):
        def _repr_latex_(self):
            s = (self.data or "").strip("$")
            return "$\\displaystyle %s$" % s

    class SVG(DisplayObject):
        _read_flags = "rb"

        def _check_data(self):
            if isinstance(self.data, (bytes, bytearray)):
                self.data = bytes(self.data).decode("utf-8", "replace")
            if self.data is not None and not isinstance(self.data, str):
                raise TypeError("SVG expects text or bytes, not %r" % (self.data,))
            if self.data is not None:
                # As IPython: the <svg> element, without an XML prologue.
                start = self.data.find("<svg")
                if start > 0:
                    self.data = self.data[start:]

        def _repr_svg_(self):
            return self.data

    class JSON(DisplayObject):
        def __init__(self, data=None, url=None, filename=None, expanded=False, metadata=None, root="root", **kwargs):
            self.expanded, self.root, self.kwargs = expanded, root, kwargs
            DisplayObject.__init__(self, data=data, url=url, filename=filename, metadata=metadata)

        def _check_data(self):
            if isinstance(self.data, (str, bytes)):
                self.data = json.loads(self.data)
            if self.data is not None and not isinstance(self.data, (dict, list)):
                raise TypeError("JSON expects a dict or a list, not %r" % (self.data,))

        def _repr_json_(self):
            return self.data

    _magic = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8", "jpeg"), (b"GIF87a", "gif"), (b"GIF89a", "gif"))
    _exts = {"png": "png", "jpg": "jpeg", "jpeg": "jpeg", "jpe": "jpeg", "gif": "gif", "webp": "webp", "bmp": "bmp"}

    class Image(DisplayObject):
        _read_flags = "rb"

        def __init__(self, data=None, url=None, filename=None, format=None, embed=None, width=None, height=None,
                     retina=False, unconfined=False, metadata=None, alt=None):
            if isinstance(data, os.PathLike):
                data = os.fspath(data)
            name = filename or (data if isinstance(data, str) else None) or url or ""
            if format is None and "." in name:
                format = _exts.get(name.rsplit(".", 1)[1].lower())
            self.width, self.height, self.alt = width, height, alt
            DisplayObject.__init__(self, data=data, url=url, filename=filename, metadata=metadata)
            if isinstance(self.data, str):
                raise ValueError("Image: %r is neither a file nor image data" % (self.data[:100],))
            if format is None and isinstance(self.data, (bytes, bytearray)):
                for magic, fmt in _magic:
                    if bytes(self.data[: len(magic)]) == magic:
                        format = fmt
                        break
            format = {"jpg": "jpeg"}.get(str(format).lower(), str(format).lower()) if format else "png"
            self.format = format
            self.embed = embed if embed is not None else self.data is not None

        def _repr_png_(self):
            if self.embed and self.format == "png":
                return self.data

        def _repr_jpeg_(self):
            if self.embed and self.format == "jpeg":
                return self.data

        def _repr_html_(self):
            if self.embed and self.format in ("png", "jpeg"):
                return None
            if self.embed and self.data is not None:
                src = "data:image/%s;base64,%s" % (self.format, binascii.b2a_base64(bytes(self.data)).decode("ascii").strip())
            elif self.url is not None:
                src = self.url.replace('"', "&quot;")
            else:
                return None
            return '<img src="%s"/>' % src

    class _RawBundle(object):
        """display(bundle, raw=True): a MIME bundle given as a dict."""

        def __init__(self, bundle):
            self.bundle = bundle

        def _get(self, mime):
            return self.bundle.get(mime)

        def _binary(self, mime):
            data = self.bundle.get(mime)
            if isinstance(data, str):
                return binascii.a2b_base64(data.encode("ascii"))
            return data

        def _repr_png_(self):
            return self._binary("image/png")

        def _repr_jpeg_(self):
            return self._binary("image/jpeg")

        def _repr_svg_(self):
            return self._get("image/svg+xml")

        def _repr_html_(self):
            return self._get("text/html")

        def _repr_markdown_(self):
            return self._get("text/markdown")

        def _repr_json_(self):
            return self._get("application/json")

        def _repr_latex_(self):
            return self._get("text/latex")

        def __repr__(self):
            text = self.bundle.get("text/plain")
            return text if isinstance(text, str) else repr(self.bundle)

    def display(*objs, **kwargs):
        """Show each object with its richest representations, as the
        worker's built-in display() does (raw=True: each is a MIME bundle)."""
        if kwargs.get("raw"):
            objs = [_RawBundle(o) if isinstance(o, dict) else o for o in objs]
        _display(*objs)

    def clear_output(wait=False):
        """A no-op: outputs are not shown until the run ends."""

    names = {}
    for obj in (DisplayObject, TextDisplayObject, HTML, Markdown, Latex, Math, SVG, JSON, Image, display, clear_output):
        obj.__module__ = "IPython.core.display"
        obj.__qualname__ = obj.__name__
        names[obj.__name__] = obj
    return names


class _IPythonFinder(object):
    """Serves the IPython shim when no real IPython is found first."""

    modules = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _IPYTHON_NAMES:
            return None
        from importlib.machinery import ModuleSpec

        spec = ModuleSpec(fullname, self, origin="pysandbox (IPython is not installed)")
        if fullname in ("IPython", "IPython.core"):
            spec.submodule_search_locations = []
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        if name in ("IPython.display", "IPython.core.display"):
            shared = _IPythonFinder.modules.get("display")
            if shared is None:
                shared = _IPythonFinder.modules["display"] = _ipython_display_names()
            module.__dict__.update(shared)
            module.__all__ = sorted(k for k in shared if k[0] != "_")
        elif name == "IPython":
            module.__doc__ = "A stand-in for IPython, which is not installed: IPython.display works; get_ipython() is None."
            module.get_ipython = _get_ipython


def _get_ipython():
    """There is no IPython shell (None, as IPython says outside one)."""
    return None


_IPYTHON_FINDER = _IPythonFinder()


# ---------------------------------------------------------------- figures


def _figure_note(text):
    _write_stderr("pysandbox: %s\n" % " ".join(text.split()))


def _png_size(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("savefig did not produce a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _render_png(fig, dpi):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _render_figure(plt, num, max_bytes, budget):
    """One figure as a reply entry; data beyond budget is left out."""
    fig = plt.figure(num)
    dpi = float(fig.dpi or 100)
    data = _render_png(fig, dpi)
    tries = 0
    while len(data) > max_bytes and tries < FIGURE_RETRIES and dpi > MIN_FIGURE_DPI:
        # The PNG size grows about with the pixel count, i.e. with dpi².
        dpi = max(MIN_FIGURE_DPI, int(dpi * (max_bytes / float(len(data))) ** 0.5 * 0.9))
        data = _render_png(fig, dpi)
        tries += 1
    width, height = _png_size(data)
    entry = {"width": width, "height": height, "dpi": dpi, "too_large": len(data) > max_bytes}
    if len(data) > MAX_FIGURE_PNG_BYTES or len(data) > budget:
        entry["too_large"] = True
        entry["omitted"] = True
        return entry, 0
    entry["png"] = binascii.b2a_base64(data, newline=False).decode("ascii")
    return entry, len(data)


def _capture_figures(max_bytes):
    """Render and close every open pyplot figure. Returns (entries, number
    left out beyond MAX_FIGURES). Never raises: a failure is a note on
    stderr, never a failed run."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return [], 0
    ok, nums = _guarded(lambda: sorted(plt.get_fignums()))
    if not ok:
        _figure_note("could not list figures: %s: %s" % (_type_name(type(nums)), _safe_str(nums)))
        nums = []
    figures, omitted, budget = [], 0, MAX_FIGURES_TOTAL_BYTES
    for num in nums:
        if len(figures) >= MAX_FIGURES:
            omitted += 1
            continue
        ok, r = _guarded(_render_figure, plt, num, max_bytes, budget)
        if ok:
            entry, size = r
            figures.append(entry)
            budget -= size
        elif isinstance(r, KeyboardInterrupt):
            _figure_note("figure capture interrupted")
            break
        else:
            _figure_note("could not render figure %s: %s: %s" % (num, _type_name(type(r)), _safe_str(r)))
        del r
    try:
        plt.close("all")  # not interruptible: a run must not leak figures into the next
    except BaseException as e:
        _figure_note("could not close figures: %s: %s" % (_type_name(type(e)), _safe_str(e)))
    return figures, omitted


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


def _exposed(hidden, readonly):
    """The hidden paths that show something, the read-only ones that are
    on writable mounts."""
    out = []
    for path in hidden if isinstance(hidden, list) else []:
        try:
            if not isinstance(path, str) or not os.path.lexists(path):
                continue
            if os.path.isdir(path):
                if os.listdir(path):
                    out.append(path)
            else:
                with open(path, "rb") as f:
                    if f.read(1):
                        out.append(path)
        except OSError:
            pass  # unreadable: hidden
    for path in readonly if isinstance(readonly, list) else []:
        try:
            if isinstance(path, str) and os.path.lexists(path) and not os.statvfs(path).f_flag & os.ST_RDONLY:
                out.append(path)
        except OSError:
            pass
    return out


def _inotify():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(0)
        if fd >= 0:
            os.close(fd)
            return "allowed"
        err = ctypes.get_errno()
        return "denied" if err == 1 else os.strerror(err)
    except Exception as e:
        return "%s: %s" % (type(e).__name__, e)


def _landlock_abi(libc, ctypes):
    """The kernel's Landlock ABI version, 0 without Landlock:
    landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)."""
    v = libc.syscall(ctypes.c_long(LL_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return v if v > 0 else 0


def _probe_landlock_abi():
    try:
        import ctypes

        return _landlock_abi(ctypes.CDLL(None, use_errno=True), ctypes)
    except Exception:
        return 0


def _probe(req=None):
    """Isolation facts as seen from inside; never raises."""
    req = req if isinstance(req, dict) else {}
    p = {
        "uid": -1, "gid": -1, "status": {}, "namespaces": {}, "interfaces": [],
        "rlimits": {}, "hostname": "", "cwd": "", "processes_seen": 0,
        "root_writable": False, "tmp_writable": False,
        "uid_map": _read_text("/proc/self/uid_map"),
        "exposed": _exposed(req.get("hidden"), req.get("readonly")),
        "inotify": _inotify(), "usr_local": [], "landlock_abi": _probe_landlock_abi(),
    }
    try:
        p["usr_local"] = sorted(os.listdir("/usr/local"))
    except OSError:
        pass
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


def _setup(zygote=False):
    # -I already leaves the script's directory off sys.path; make sure, so
    # user code cannot import this file's neighbours by accident.
    here = os.path.dirname(os.path.abspath(_WORKER_FILE))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    _tools_first()
    if _IPYTHON_FINDER not in sys.meta_path:
        sys.meta_path.append(_IPYTHON_FINDER)  # last: a real IPython wins
    args = sys.argv[1:]
    global _SITES
    _SITES = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--site" and os.path.isabs(args[i + 1])]
    sys.argv = ["<code>"]
    if not zygote:
        # A zygote never puts anything a caller controls on sys.path: the
        # working directory and the dependency environments are added by
        # each child once it is locked down (see _child).
        _user_paths()
    sock = socket.socket(fileno=CONTROL_FD)
    # Programs started by user code must not inherit the control channel.
    sock.set_inheritable(False)
    return sock


# Dependency environments (--site DIR, read-only --target installs).
_SITES = []


def _user_paths():
    """Put the paths a caller controls on sys.path.

    Like `python -c`, the working directory (/work) comes first, so user
    code can import the modules it or the user wrote there; "" follows
    later changes of directory, as it does in Python. The dependency
    environments go after the standard library and ahead of the
    interpreter's own site-packages, as a virtualenv's would: a requested
    version wins over a preinstalled one, but no wheel can shadow a stdlib
    module (which the worker itself imports). Their .pth files are
    processed here, with the privileges of user code and no more.
    """
    here = os.path.dirname(os.path.abspath(_WORKER_FILE))
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    if "" not in sys.path and (cwd is None or os.path.abspath(cwd) != here):
        sys.path.insert(0, "")
    for d in _SITES:
        _add_site_dir(d)


def _stdlib_end():
    """The index in sys.path just past the standard library."""
    for i, p in enumerate(sys.path):
        if p and os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages"):
            return i
    return len(sys.path)


def _add_site_dir(path):
    """Add path (and what its .pth files name) right after the stdlib."""
    if path in sys.path:
        return
    import site

    before = list(sys.path)
    try:
        site.addsitedir(path)
    except Exception:
        pass
    added = [p for p in sys.path if p not in before]
    if path not in added:
        added.insert(0, path)
    rest = [p for p in sys.path if p not in added]
    sys.path[:] = rest
    at = _stdlib_end()
    sys.path[at:at] = added
    _tools_first()


# ---------------------------------------------------------------- zygote
#
# The warm pool (internal/pool) starts one worker with --zygote inside a
# normal sandbox whose seccomp filter still allows unshare and mount. It
# imports the preloaded modules once and then only forks: it never runs user
# code. Each fork becomes one single-use sandbox of its own:
#
#   zygote ──fork──▶ A: new user namespace (uid 1000 → the zygote's uid),
#                       then new mount, net, ipc, uts and pid namespaces
#                    └──fork──▶ B: pid 1 of the new pid namespace. It tells
#                       the Go side its pid (SCM_CREDENTIALS, so the kernel
#                       translates it to a host pid), waits until Go has put it
#                       in its own cgroup, then mounts a fresh tmpfs on /tmp,
#                       /work and /dev/shm and a fresh /proc, brings lo up,
#                       sets rlimits, drops every capability, sets
#                       no_new_privs, installs the strict seccomp filter and
#                       serves requests as a one-shot worker.
#
# A only exists because a new pid namespace applies to children: it reports
# B's pid and exits, B is reparented to the zygote (pid 1 of its sandbox),
# and the zygote reports B's exit status. Killing B (pid 1 of the run) kills
# everything in the run's pid namespace.

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP = 24
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SANDBOX_ID = 1000
LANDLOCK_FIRST_FD = 10  # where a child opens the paths of its Landlock rules
SCRATCH = "/.pysandbox/scratch"


# Phase stamps of one child's setup, for `pysandbox bench` (see
# internal/pool/trace.go): None unless the spawn request asks for them.
# A child inherits the zygote's stamps and A's from the fork, so one list
# tells the whole story; CPU and minor faults are per process.
_TRACE = None
_RUSAGE = None  # resource.getrusage, bound in the zygote


def _stamp(name):
    if _TRACE is not None:
        _TRACE.append([name, time.monotonic_ns(), time.process_time_ns(), _RUSAGE(0).ru_minflt])


def _zygote_main():
    # Everything a child needs before it is locked down is imported here,
    # first, while sys.path holds only the interpreter's own directories:
    # between fork and its seccomp filter a child imports nothing, so no
    # module a caller controls can run with the privileges it has then.
    import base64
    import ctypes
    import fcntl
    import resource
    import select
    import signal
    import site  # noqa: F401 (the child's _user_paths needs it)
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    # Compiling this file (see worker.Command's bootstrap) freed some
    # 5 MiB of the parser's memory into the malloc heap, and whatever the
    # zygote allocates next lands among it, so the trim at the end finds
    # fewer whole pages free: give them back now too. Every page a zygote
    # keeps is a page table entry each fork copies and each child's exit
    # tears down.
    _malloc_trim(libc)
    global _TRACE, _RUSAGE
    _RUSAGE = resource.getrusage
    sock = _setup(zygote=True)
    rfile = sock.makefile("rb")
    init = _loads(rfile.readline() or b"null")
    if not isinstance(init, dict) or init.get("op") != "zygote":
        return 2
    loaded, failed = [], {}
    for name in init.get("preload") or []:
        try:
            __import__(name)
            loaded.append(name)
        except BaseException as e:  # a broken module must not kill the pool
            failed[name] = "%s: %s" % (type(e).__name__, _safe_str(e))
    ctx = {
        "libc": libc,
        "seccomp": base64.b64decode(init["seccomp"]),
        "ctypes": ctypes, "resource": resource, "struct": struct, "fcntl": fcntl,
        "proc_masks": _existing_masks(init.get("proc_masks")),
    }
    # Landlock rules hold inodes, and /tmp, /work and /dev/shm are each
    # child's own: the child builds its ruleset itself, from what is
    # prepared here (the system calls' arguments), in a few system calls.
    ctx["landlock"] = _landlock_prepare(ctx, init.get("landlock") or [])
    _prepare_child(ctx)
    _zygote_userns(ctx, init.get("id_block"))
    # Each child is forked straight into a pid namespace of its own (see
    # _spawn); this is the zygote's, to return to after each fork.
    ctx["pidns"] = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    _warm_up()
    # What a typical first use of a preloaded library sets up lazily is
    # done once here; each child then repeats it ahead of demand (see
    # _pretouch), so that a run's first DataFrame does not start with
    # copying hundreds of the zygote's pages.
    ctx["recipes"] = [_WARM_RECIPES[m] for m in loaded if m in _WARM_RECIPES]
    _exec_quietly(ctx["recipes"])
    v = sys.version_info
    rss = 0
    for line in _read_text("/proc/self/status").splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    # The top-level modules every child starts with, so the pool does not
    # try to preload what is already there.
    modules = sorted({m.partition(".")[0] for m in sys.modules if not m.startswith("_")})
    _send(sock, {"op": "zygote_ready", "pid": os.getpid(), "python": sys.version.split()[0],
                 "version": [v[0], v[1]], "preloaded": loaded, "failed": failed, "rss_bytes": rss,
                 "modules": modules})
    # Whatever importing allocated is shared copy-on-write with every child.
    # A fork copies the page table entry of every page the zygote has
    # touched, and each costs: give back what the collector and the
    # allocator no longer use, and keep the reserves out of it (a child's
    # are untouched mappings; see _take_reserve).
    global _mmap
    import gc
    import mmap

    _mmap = mmap
    gc.collect()
    if hasattr(gc, "freeze"):
        gc.freeze()  # keeps the collector from dirtying shared pages in children
    _malloc_trim(libc)
    # Children are reaped here and their ends reported: each has a pidfd
    # the loop polls, so the zygote needs no SIGCHLD handler (nor a wakeup
    # descriptor) that every child would have to undo.
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    ctx["poller"], ctx["kids"], ctx["traced"], ctx["pollin"] = poller, {}, set(), select.POLLIN
    buf, pending = b"", []
    # Every page the zygote writes between two forks is a page fault (each
    # fork write-protects them all) and, while a child lives, a copy: its
    # loop does as little as it can. The pool's spawn requests differ only
    # in their id, so one is parsed once and reused while the rest of the
    # line stays the same, and the replies are formatted by hand (the
    # JSON module touched some 80 pages a fork).
    last_key, last_req = None, None
    while True:
        sock_ready = False
        for fd, _ in poller.poll():
            if fd in ctx["kids"]:
                _reap(sock, ctx, fd)
            else:
                sock_ready = True
        if not sock_ready:
            continue
        data, fds = _recv_with_fds(sock, ctx)
        if not data:
            return 0  # the pool is gone; children die with our sandbox
        buf += data
        pending += fds
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            # The Go side sends one spawn at a time and waits for its reply,
            # so the descriptors received so far belong to this line.
            fds, pending = pending, []
            # rid: the request's id as a JSON string, for the reply.
            rid, uid, key = _spawn_id(line)
            if rid is None:
                req = None
            elif key == last_key:
                req = last_req
            else:
                try:
                    req = _loads(line)
                except ValueError:
                    req = None
                if (not isinstance(req, dict) or req.get("op") != "spawn" or req.get("id") != rid[1:-1].decode()
                        or (uid is not None and req.get("uid") != uid)):
                    req = None
                last_key, last_req = (key, req) if req is not None else (None, None)
            if req is not None and uid is not None:
                req["uid"] = uid  # this child's (a reused request holds the last one's)
            if req is None or len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                _send_error(sock, "", 'expected a spawn request ({"op":"spawn","id":"DIGITS",...}) with 3 descriptors')
                continue
            trace = req.get("trace") is True
            _TRACE = [] if trace else None
            _stamp("zygote.request")
            try:
                pid = _spawn(req, fds, ctx)
            except OSError as e:
                pid = 0
                _send_error(sock, str(req.get("id", "")), "could not fork the child: %s" % (e,))
            _TRACE = None
            for fd in fds:
                os.close(fd)
            if pid <= 0:
                continue
            if trace:
                _send_bytes(sock, b'{"op":"spawned","id":%s,"pid":%d,"zygote_cpu_us":%d}\n'
                            % (rid, pid, time.process_time_ns() // 1000))
            else:
                _send_bytes(sock, b'{"op":"spawned","id":%s,"pid":%d}\n' % (rid, pid))


# Representative first steps with a preloaded library, run in the zygote
# and again in each child before its run (see _zygote_main). Only the
# interpreter's own libraries run: these are the modules the zygote
# imported, never anything a caller controls.
_WARM_RECIPES = {
    "numpy": "import numpy as np\na = np.arange(64, dtype=float).reshape(8, 8)\n"
             "(a @ a.T).sum(); a.mean(axis=0); np.sort(a[:, 0]); repr(a[:2])",
    "pandas": "import pandas as pd\ndf = pd.DataFrame({'x': range(8), 'y': list('abcdabcd'), 'z': [0.5] * 8})\n"
              "int(df.x.sum()); df.groupby('y').z.mean(); df.describe(); df[df.x > 2].head(); "
              "df.to_dict(); repr(df); df.sort_values('z')",
}


def _malloc_trim(libc):
    """Give the malloc heap's free pages back to the kernel (glibc only)."""
    try:
        libc.malloc_trim(0)
    except AttributeError:
        pass  # not glibc


def _exec_quietly(sources):
    """Run trusted warm-up code in a throwaway namespace, output nowhere."""
    if not sources:
        return
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = io.StringIO()
    try:
        for source in sources:
            try:
                exec(compile(source, "<warm-up>", "exec"), {"__name__": "__warmup__"})
            except BaseException:
                pass  # a slower first run is all this can cost
    finally:
        sys.stdout, sys.stderr = saved


def _warm_up():
    """Send a few throwaway runs through the run path, in the zygote.

    What that path sets up lazily on first use (the compiler, the JSON
    encoder, traceback formatting, import caches) is then done once here and
    shared copy-on-write with every child, instead of costing each pooled
    run a millisecond or two. Nothing of it is visible to user code: the
    namespaces are thrown away and the output goes nowhere.
    """
    a, b = socket.socketpair()
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = io.StringIO()
    try:
        for i, code in enumerate((
            "x = [i * 2 for i in range(3)]\n{'x': x, 'text': str(x), 'f': 0.5}",
            "import json\ndef f():\n    return 1 / 0\nf()",
            "print('warm')\nobject()",
        )):
            _run(a, {"code": code, "filename": "<warm-up>"}, "warm-%d" % i)
            b.recv(1 << 16)
    except BaseException:
        pass  # a slower first run is all this can cost
    finally:
        sys.stdout, sys.stderr = saved
        linecache.cache.pop("<warm-up>", None)
        sys.modules["__main__"] = _THIS_MODULE
        a.close()
        b.close()
    try:
        # Gated runs parse their code with it: loaded once, here, and
        # used once, so that what its first use sets up (the ast and
        # warnings modules, its regular expressions) is shared with every
        # child instead of costing each gated run half a millisecond.
        _facts_module().codefacts_line("import os\nprint('warm', 'https://example.com')\n")
    except BaseException:
        pass


def _spawn_id(line):
    """Split a spawn request as the pool writes it: {"op":"spawn",
    "id":"DIGITS", then for a root server "uid":DIGITS, then the rest.
    Returns the id quoted as in JSON, the uid (None without one there), and
    the rest of the line; (None, None, None) for any other line (refused).
    The rest is the same from one spawn to the next: the uid is each
    child's own (see sandbox.ChildIDBase), so it is not part of it."""
    head = b'{"op":"spawn","id":"'
    if not line.startswith(head):
        return None, None, None
    end = line.find(b'"', len(head))
    if end < 0:
        return None, None, None
    rid = line[len(head):end]
    if not rid or not rid.isdigit() or len(rid) > 20:
        return None, None, None
    uid, rest = None, line[end:]
    if line.startswith(b',"uid":', end + 1):
        start = end + 8
        stop = line.find(b",", start)
        digits = line[start:stop]
        if stop > 0 and digits.isdigit() and len(digits) <= 10:
            uid, rest = int(digits), line[stop:]
    return line[len(head) - 1:end + 1], uid, rest


def _recv_with_fds(sock, ctx):
    struct = ctx["struct"]
    size = socket.CMSG_SPACE(3 * struct.calcsize("i"))
    data, anc, _, _ = sock.recvmsg(65536, size)
    fds = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            n = len(payload) // struct.calcsize("i")
            fds.extend(struct.unpack("%di" % n, payload[: n * struct.calcsize("i")]))
    return data, fds


def _reap(sock, ctx, pidfd):
    """Report the end of the child whose pidfd polled readable."""
    pid = ctx["kids"].pop(pidfd)
    ctx["poller"].unregister(pidfd)
    os.close(pidfd)
    traced = ctx["traced"]
    try:
        if pid in traced:
            # Only the bench shows a child's usage. os.wait4 imports the
            # resource module again on every call (for its result's type)
            # and so touches, in the zygote, pages that every fork
            # write-protects again: only a traced child pays for it.
            traced.discard(pid)
            pid, status, usage = os.wait4(pid, 0)
            used = b'"cpu_us":%d,"minflt":%d,' % (int((usage.ru_utime + usage.ru_stime) * 1e6), usage.ru_minflt)
        else:
            pid, status = os.waitpid(pid, 0)
            used = b""
    except ChildProcessError:
        return
    # By hand, as the spawn replies (see _zygote_main's loop).
    if os.WIFSIGNALED(status):
        end = b'"signal":%d}\n' % os.WTERMSIG(status)
    else:
        end = b'"code":%d}\n' % os.WEXITSTATUS(status)
    _send_bytes(sock, b'{"op":"exited","pid":%d,%s%s' % (pid, used, end))


def _libc_check(ctx, ret, what):
    if ret != 0:
        err = ctx["ctypes"].get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def _zygote_userns(ctx, id_block):
    """Move the zygote into a user namespace of its own, where it holds
    every capability, for its children to build their sandboxes in.

    A child then needs no process before it: forked by the zygote straight
    into a fresh pid namespace, it unshares its other namespaces, mounts
    its /tmp and /proc and brings up its loopback with those capabilities,
    then enters a user namespace of its own (where its uid is 1000 and it
    owns nothing else) and drops everything before any user code runs. So
    every namespace of a run is owned by this one, in which no run ever has
    a capability, and whatever mounts the zygote's sandbox made are locked
    in every child's mount namespace (copied into a less privileged user
    namespace). Only the zygote, which never runs user code, has power
    here, and it had as much before: it could always create a user
    namespace, as any fork of it could.

    The namespace maps the zygote's own id and, for a root server, the
    block of child ids; a helper left behind in the old namespace writes
    the maps, since only a process there may. Then the zygote forks itself
    into a pid namespace this user namespace owns, so that it may return
    to it (setns) after forking each child into a new one; the process it
    leaves behind only waits, and goes (and with it, as pid 1 of the
    sandbox, everything) when the zygote does.
    """
    libc = ctx["libc"]
    uid, gid = os.geteuid(), os.getegid()
    lines = ["%d %d 1" % (uid, uid)]
    if isinstance(id_block, list) and len(id_block) == 2 and all(isinstance(v, int) and v > 0 for v in id_block):
        lines.append("%d %d %d" % (id_block[0], id_block[0], id_block[1]))
    uid_map = "\n".join(lines) + "\n"
    gid_map = uid_map.replace("%d %d 1" % (uid, uid), "%d %d 1" % (gid, gid), 1)
    go_r, go_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        code = 1
        try:
            os.close(go_w)
            if os.read(go_r, 1) == b"u":
                target = os.getppid()
                if len(lines) == 1:
                    # Without CAP_SETGID here, gid_map may only be written
                    # once setgroups is denied.
                    _write_proc("/proc/%d/setgroups" % target, "deny")
                _write_proc("/proc/%d/uid_map" % target, uid_map)
                _write_proc("/proc/%d/gid_map" % target, gid_map)
                code = 0
        finally:
            os._exit(code)
    os.close(go_r)
    err = None
    if libc.unshare(CLONE_NEWUSER) != 0:
        err = OSError(ctx["ctypes"].get_errno(), "unshare(user)")
    os.write(go_w, b"x" if err else b"u")
    os.close(go_w)
    _, status = os.waitpid(helper, 0)
    if err is not None:
        raise err
    if status != 0:
        raise OSError("could not map the zygote's user namespace")
    _libc_check(ctx, libc.unshare(CLONE_NEWPID), "unshare(pid)")
    zygote = os.fork()
    if zygote != 0:
        os.closerange(0, 1 << 16)
        code = 1
        try:
            _, status = os.waitpid(zygote, 0)
            code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else 1
        finally:
            os._exit(code if 0 <= code < 256 else 1)


def _write_proc(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _spawn(req, fds, ctx):
    """Fork one child, as pid 1 of a fresh pid namespace; returns its pid."""
    libc = ctx["libc"]
    _libc_check(ctx, libc.unshare(CLONE_NEWPID), "unshare(pid)")
    _stamp("zygote.fork")
    try:
        pid = os.fork()
    except BaseException:
        _reset_pidns(ctx)
        raise
    if pid == 0:
        _child(req, fds, ctx)  # never returns
    _reset_pidns(ctx)
    try:
        pidfd = _pidfd_open(ctx, pid)
    except OSError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    ctx["kids"][pidfd] = pid
    if _TRACE is not None:  # the loop traces this spawn (see _reap)
        ctx["traced"].add(pid)
    ctx["poller"].register(pidfd, ctx["pollin"])
    return pid


def _pidfd_open(ctx, pid):
    if hasattr(os, "pidfd_open"):
        return os.pidfd_open(pid)
    fd = ctx["libc"].syscall(434, pid, 0)  # pidfd_open, the same number everywhere
    if fd < 0:
        raise OSError(ctx["ctypes"].get_errno(), "pidfd_open")
    return fd


def _reset_pidns(ctx):
    # Back to the zygote's own pid namespace for its next unshare. Should
    # that ever fail, every later child would share this one's pid
    # namespace: stop instead, and let the pool start a new zygote.
    if ctx["libc"].setns(ctx["pidns"], CLONE_NEWPID) != 0:
        os._exit(3)


def _child(req, fds, ctx):
    """The run's pid 1, forked by the zygote. Never returns."""
    global _PID

    try:
        _stamp("b.start")
        ctrl, out, err = fds
        # fd 3 is the zygote's own channel in the zygote; dup2 replaces it,
        # so the child never holds it, and everything else is closed below.
        # Programs started by user code must not inherit the channel.
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.dup2(ctrl, CONTROL_FD, inheritable=False)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.closerange(CONTROL_FD + 1, 1 << 16)
        _stamp("b.fds")
        libc = ctx["libc"]
        if _TRACE is None:
            _libc_check(ctx, libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
                        "unshare(namespaces)")
        else:
            # One at a time, to time each: the same namespaces in the end.
            for flag, name in ((CLONE_NEWNS, "mnt"), (CLONE_NEWNET, "net"), (CLONE_NEWIPC, "ipc"),
                               (CLONE_NEWUTS, "uts")):
                _libc_check(ctx, libc.unshare(flag), "unshare(%s)" % name)
                _stamp("b.unshare_" + name)
        _become_sandbox(req, ctx)
        # Locked down now: only from here may code a caller controls run
        # (the working directory and the dependency environments, with
        # their .pth files).
        _user_paths()
        _reseed()
        _stamp("b.user_paths")
        # Ahead of demand: touch (and so copy) now what a first use of the
        # preloaded libraries touches, rather than during the run.
        _exec_quietly(ctx.get("recipes"))
        _stamp("b.pretouch")
        if _TRACE is not None:
            os.write(CONTROL_FD, ('{"op":"trace","stamps":%s}\n' % _dumps(_TRACE)).encode())
    except BaseException as e:
        try:
            msg = ('{"op":"setup_error","message":%s}\n' % _dumps("%s: %s" % (type(e).__name__, e))).encode()
            os.write(CONTROL_FD, msg)
        except BaseException:
            pass
        os._exit(121)
    _PID = os.getpid()
    code = 1
    oneshot = req.get("oneshot", True) is not False
    try:
        # Family and type given, so that the socket need not ask the kernel.
        code = _serve(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, CONTROL_FD), oneshot)
        if not oneshot:
            # A session's end: its atexit handlers run now. A one-shot
            # run's ran before its reply, and nothing of the run may run
            # after the reply, when the server no longer counts it.
            import atexit

            atexit._run_exitfuncs()
            _flush_output()
    except BaseException:
        _flush_output()
    # No interpreter teardown: the sandbox is about to be destroyed.
    os._exit(code)


def _reseed():
    """Give this run random state of its own.

    Every pooled run is a fork of one zygote, so it starts with the
    zygote's random generators. CPython's random module reseeds itself at
    fork; a library with a global generator of its own does not, and then
    every run would draw the same numbers as every other (identical
    simulations, and one run could predict another's values).
    """
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            np_random.seed()  # no argument: fresh entropy from the OS
        except Exception:
            pass


def _prepare_child(ctx):
    """Build once, in the zygote, the arguments of the system calls every
    child makes: a child then only makes the calls. Every object a child
    builds or touches is a page it copies from the zygote, which costs far
    more than the call on a machine where page faults are slow."""
    ctypes = ctx["ctypes"]

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()
    prog = ctx["seccomp"]
    filt = ctypes.create_string_buffer(prog, len(prog))
    fprog = Fprog(len(prog) // 8, ctypes.cast(filt, ctypes.c_void_p))
    last = int(_read_text("/proc/sys/kernel/cap_last_cap").strip() or 63)
    ctx.update({
        "capset": (hdr, data, ctypes.byref(hdr), ctypes.byref(data)),
        "fprog": (filt, fprog, ctypes.byref(fprog)),
        "caps": list(range(last + 1)),
        "flags": ctypes.c_ulong,
        "joined": b'{"op":"joined"}\n',
        "environ": dict(os.environ),
    })


def _become_sandbox(req, ctx):
    """The run's pid 1, in fresh namespaces: finish the sandbox around
    ourselves, with the capabilities the zygote's user namespace gives us,
    then enter one of our own and drop every capability."""
    libc, ctypes, struct = ctx["libc"], ctx["ctypes"], ctx["struct"]
    # _socket's type, not socket's subclass: only its system calls are
    # needed here (the channel is not inheritable already: see _child).
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, CONTROL_FD)
    # The kernel rewrites pid, uid and gid for the receiver's namespaces: Go
    # learns our host pid without trusting anything we say.
    creds = struct.pack("3i", os.getpid(), os.getuid(), os.getgid())
    sock.sendmsg([b'{"op":"hello"}\n'], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
    joined = ctx["joined"]
    line = b""
    while len(line) < len(joined):
        chunk = sock.recv(len(joined) - len(line))  # nothing may follow it yet
        if not chunk:
            os._exit(0)  # the pool gave up on us
        line += chunk
    if line != joined:
        raise RuntimeError("unexpected message from the pool")
    sock.detach()
    _stamp("b.joined")
    # Now in our own cgroup: a cgroup namespace rooted there.
    _libc_check(ctx, libc.unshare(CLONE_NEWCGROUP), "unshare(cgroup)")
    _stamp("b.unshare_cgroup")
    flags = ctx["flags"]

    def mount(src, target, fstype, fl, data=None):
        _libc_check(ctx, libc.mount(src and src.encode(), target.encode(), fstype and fstype.encode(),
                                    flags(fl), data and data.encode()), "mount " + target)

    child_id = req.get("uid")
    if not (isinstance(child_id, int) and child_id > 0):
        child_id = None
    owner = os.geteuid() if child_id is None else child_id
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    size = int(req.get("tmp_bytes") or (256 << 20))
    mount("tmpfs", SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,nr_inodes=65536,mode=0755" % size)
    for name, target, mode in (("tmp", "/tmp", 0o1777), ("work", "/work", 0o755), ("shm", "/dev/shm", 0o1777)):
        path = SCRATCH + "/" + name
        os.mkdir(path)
        os.chmod(path, mode)
        if owner != os.geteuid():
            os.chown(path, owner, owner)  # the run's own user, which we become below
        mount(path, target, None, MS_BIND)
    _libc_check(ctx, libc.umount2(SCRATCH.encode(), MNT_DETACH), "umount " + SCRATCH)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _stamp("b.mounts")
    _mask_proc(ctx["proc_masks"], mount)
    _stamp("b.proc_masks")
    socket.sethostname("pysandbox")
    _loopback_up(struct, ctx["fcntl"])
    port = req.get("proxy_port")
    if isinstance(port, int) and 0 < port < 65536:
        _hand_over_listener(port, struct)
    _stamp("b.net")
    resource = ctx["resource"]
    for res, cur, mx in req.get("rlimits") or []:
        resource.setrlimit(res, (cur, mx))
    os.chdir("/work")
    env = req.get("env")
    # Against the zygote's environment as a dict: comparing with
    # os.environ itself decodes every variable in Python.
    if isinstance(env, dict) and env != ctx["environ"]:
        # (The zygote's own environment is the run's, as a rule.)
        os.environ.clear()
        os.environ.update(env)
    _stamp("b.limits")
    if child_id is not None:
        # A root server mapped a block of ids into the zygote's sandbox:
        # become this run's own host user before leaving for a user
        # namespace of our own.
        os.setgroups([])
        os.setresgid(child_id, child_id, child_id)
        os.setresuid(child_id, child_id, child_id)
        # The uid change made us non-dumpable, which hands our /proc
        # files to root; we need to write our own id maps below.
        _libc_check(ctx, libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "set dumpable")
    uid, gid = os.geteuid(), os.getegid()
    # From here we have no capability in the namespaces built above (the
    # zygote's user namespace owns them), only in this one, which owns
    # nothing; and those go below.
    _libc_check(ctx, libc.unshare(CLONE_NEWUSER), "unshare(user)")
    _write_proc("/proc/self/setgroups", "deny")
    _write_proc("/proc/self/uid_map", "%d %d 1" % (SANDBOX_ID, uid))
    _write_proc("/proc/self/gid_map", "%d %d 1" % (SANDBOX_ID, gid))
    _stamp("b.user")
    # Privileges last: nothing below may need them.
    _libc_check(ctx, libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient caps")
    for cap in ctx["caps"]:
        _libc_check(ctx, libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop bounding cap")
    _, _, hdr, data = ctx["capset"]
    _libc_check(ctx, libc.capset(hdr, data), "capset")
    _libc_check(ctx, libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _stamp("b.caps")
    _landlock_enter(ctx)
    _stamp("b.landlock")
    _libc_check(ctx, libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctx["fprog"][2], 0, 0), "seccomp")
    _stamp("b.seccomp")


# Landlock (see internal/sandbox/landlock.go): write access rights by ABI.
LL_CREATE_RULESET, LL_ADD_RULE, LL_RESTRICT_SELF = 444, 445, 446
LL_WRITE_V1 = 0x2 | 0x10 | 0x20 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x1000
LL_REFER, LL_TRUNCATE, LL_WRITE_FILE = 0x2000, 0x4000, 0x2
LL_SCOPE = 0x1 | 0x2  # abstract Unix sockets, signals


def _landlock_prepare(ctx, writable):
    """The arguments of the Landlock calls a child makes (see _landlock_enter),
    built once: None when the kernel has no Landlock."""
    libc, ctypes, struct = ctx["libc"], ctx["ctypes"], ctx["struct"]
    sc = libc.syscall
    sc.restype = ctypes.c_long
    abi = _landlock_abi(libc, ctypes)
    if abi <= 0 or not writable:
        return None
    handled, file_rights = LL_WRITE_V1, LL_WRITE_FILE
    if abi >= 2:
        handled |= LL_REFER
    if abi >= 3:
        handled |= LL_TRUNCATE
        file_rights |= LL_TRUNCATE
    size = 24 if abi >= 6 else 16
    attr = ctypes.create_string_buffer(struct.pack("=QQQ", handled, 0, LL_SCOPE if abi >= 6 else 0)[:size], size)
    rules = []
    for i, path in enumerate(writable[:32]):
        # Each rule names the descriptor the child will open path on.
        fd = LANDLOCK_FIRST_FD + i
        try:
            is_dir = os.stat(path).st_mode & 0o170000 == 0o040000
        except OSError:
            continue
        rights = handled if is_dir else file_rights
        rules.append((path, fd, ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)))
    return {"attr": attr, "size": ctypes.c_size_t(size), "rules": rules, "zero": ctypes.c_uint32(0),
            "one": ctypes.c_int(1), "nrs": [ctypes.c_long(n) for n in (LL_CREATE_RULESET, LL_ADD_RULE, LL_RESTRICT_SELF)]}


def _landlock_enter(ctx):
    """Writes only beneath the prepared paths; abstract Unix sockets and
    signals scoped to this sandbox. After no_new_privs."""
    ll = ctx["landlock"]
    if ll is None:
        return
    libc, ctypes = ctx["libc"], ctx["ctypes"]
    create, add, restrict = ll["nrs"]
    for path, fd, _ in ll["rules"]:
        tmp = os.open(path, os.O_PATH | os.O_CLOEXEC)
        os.dup2(tmp, fd, inheritable=False)
        os.close(tmp)
    rfd = libc.syscall(create, ll["attr"], ll["size"], ll["zero"])
    if rfd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path, _, rule in ll["rules"]:
            if libc.syscall(add, rfd, ll["one"], rule, ll["zero"]) != 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule " + path)
        if libc.syscall(restrict, rfd, ll["zero"]) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(rfd)
        for _, fd, _ in ll["rules"]:
            os.close(fd)


def _existing_masks(masks):
    """The masks whose paths this kernel's /proc has, looked up once, in
    the zygote: /proc's entries outside the pid directories are the same
    in every pid namespace, so each child need not look them up again."""
    if not isinstance(masks, dict):
        return {}
    return {kind: [p for p in paths if isinstance(p, str) and os.path.lexists(p)]
            for kind, paths in masks.items() if isinstance(paths, list)}


def _mask_proc(masks, mount):
    """Hide and freeze what /proc tells about the host (the Go side's
    DefaultProcMasks, as runc and Docker do)."""
    # Read-only copies first: a file masked below one of them (the boot
    # id, under /proc/sys) is then masked once, on the copy, rather than
    # below it and again in the copy. Each mount is copied at the fork and
    # torn down at the exit of every pooled run. Only paths this /proc has
    # are here (see _existing_masks).
    for path in masks.get("readonly") or []:
        mount(path, path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in masks.get("files") or []:
        mount("/dev/null", path, None, MS_BIND)
    # One empty read-only tmpfs for every masked directory: a bind mount
    # keeps its read-only flags, and costs no superblock of its own.
    empty = None
    for path in masks.get("dirs") or []:
        if empty is None:
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "size=4k,nr_inodes=1,mode=0555")
            empty = path
        else:
            mount(empty, path, None, MS_BIND)


def _loopback_up(struct, fcntl):
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0))
        flags = struct.unpack("16sH22x", ifr)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    finally:
        s.close()



def _hand_over_listener(port, struct):
    """Listen on 127.0.0.1:port in this network namespace and send the
    socket to the server, which serves the run's network on it (see
    internal/egress). No copy stays here: no code of the run can accept
    on it, or bind the port while the server holds it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        s.listen(128)
        ctrl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, CONTROL_FD)
        try:
            ctrl.sendmsg([b"L"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", s.fileno()))])
        finally:
            ctrl.detach()
    finally:
        s.close()


class _LineReader:
    """Reads the control channel line by line.

    Unlike a buffered file, it loses nothing when an exception (such as a
    KeyboardInterrupt from a handler user code installed) interrupts a read.
    """

    def __init__(self, sock):
        self._sock = sock
        self._buf = bytearray()
        self._scanned = 0  # no newline in _buf[:_scanned]
        # Reading must not need much memory: a session can have filled it.
        self._chunk = bytearray(1 << 16)

    def readline(self):
        """The next line with its newline; at EOF what is left, then b""."""
        while True:
            line = self.pop_line()
            if line is not None:
                return line
            if not self.fill():
                return self.rest()

    def pop_line(self):
        """The next complete line in the buffer, or None."""
        i = self._buf.find(b"\n", self._scanned)
        if i < 0:
            self._scanned = len(self._buf)
            return None
        line = bytes(self._buf[: i + 1])
        del self._buf[: i + 1]
        self._scanned = 0
        return line

    def fill(self, flags=0):
        """Receive once into the buffer; returns the byte count, 0 at EOF."""
        n = self._sock.recv_into(self._chunk, 0, flags)
        if n:
            with memoryview(self._chunk) as view:
                self._buf += view[:n]
        return n

    def read_into(self, view):
        """Raw bytes that follow a line (a restore's), into view: what the
        buffer holds first, else one receive; the count, 0 at EOF."""
        n = min(len(self._buf), len(view))
        if n:
            view[:n] = self._buf[:n]
            del self._buf[:n]
            self._scanned = 0
            return n
        return self._sock.recv_into(view)

    def rest(self):
        """What the buffer holds after the last complete line."""
        line = bytes(self._buf)
        del self._buf[:]
        self._scanned = 0
        return line


# ---------------------------------------------------------------- tool calls
#
# Code in a run given tools ("tools": true) calls them through
# sandbox_tools.py, which the worker makes importable as "pysandbox_tools"
# and "tools" (see _ToolsFinder). A call is a tool_call (or tool_catalog) message on the
# control channel and an answer with the same id, from any thread, while the
# main thread may be in user code; between runs the main loop reads
# requests. Until the first call of the process the main loop reads alone
# (_LineReader); from then on every read goes through _Channel, a
# leader/follower demultiplexer:
#
# - A thread that needs a line (an answer, or the main loop a request)
#   reads the socket itself if no other thread does: it becomes the leader,
#   hands each answer to the _Wait its id names and queues other lines for
#   the main loop, until its own is done; then it wakes a thread still
#   waiting to lead in its place. The others block on their _Wait's lock.
# - Calls are possible only while a run is (begin_run to end_run, which
#   comes just before the run's result is sent, after a one-shot run's
#   threads and atexit handlers). end_run fails the waits left and forgets
#   their ids, so their late answers are dropped, like any answer nobody
#   waits for: never an error reply, which would put the Go side out of
#   step. No tool message of a run is sent after end_run: the Go side
#   would take it for one of the next run's.
# - Lines are written whole, one at a time (send_lock); in the main thread
#   SIGINT cannot cut one short (see _on_sigint and _shield_sigint). The
#   main thread is interrupted only in _block and _poll, where it waits and
#   has taken nothing; a SIGINT that comes while it works on the channel is
#   raised when it next waits, or once its call is done. (Under a SIGINT
#   handler of the user's, a call of the main thread is not interrupted:
#   the handler runs once the call returns. At a session's timeout the Go
#   side ends the calls in flight, so that is soon.)

_chan = None  # the control socket's _Channel, from _serve on
_channel_busy = 0  # > 0 while the main thread works on the channel
_tools_enabled = False  # the current run may import the tools module
_TOOLS_PATH = os.path.join(os.path.dirname(os.path.abspath(_WORKER_FILE)), "sandbox_tools.py")


class _Wait(object):
    """A thread's wait for an answer (the main loop's: for a request)."""

    __slots__ = ("lock", "signaled", "done", "reply")

    def __init__(self):
        self.lock = _thread.allocate_lock()
        self.lock.acquire()  # released to wake the waiter
        self.signaled = False
        self.done = False
        self.reply = None


def _block(lock):
    # SIGINT may interrupt the main thread here (see _on_sigint): it only
    # waits to be woken, and its caller cleans up.
    lock.acquire()


def _poll(poller):
    # Likewise: nothing has been read when this is interrupted.
    return poller.poll()


_TOOL_WAITS = frozenset((_block.__code__, _poll.__code__))


def _tool_failure(kind, message):
    return {"op": "tool_result", "error": {"kind": kind, "message": message}}


class _Channel(object):
    """The control channel, shared by the main loop and tool calls."""

    def __init__(self, sock, reader):
        self.sock = sock
        self.reader = reader
        self.send_lock = _thread.allocate_lock()  # one line at a time
        self.mu = _thread.allocate_lock()  # guards everything below
        self.demux = False  # reads go through _await (since the first call)
        self.in_run = False
        self.tools_on = False
        self.epoch = 0  # changes when a run begins and when it ends
        self.seq = 0
        self.waiters = {}  # id of a message sent: its _Wait
        self.blocked = []  # _Waits blocked in _await
        self.requests = []  # lines for the main loop
        self.main_wait = None  # the main loop's _Wait for a request
        self.leader = None  # the thread reading the socket
        self.closed = None  # EOF (True) or the OSError that ended reading
        self.dropped = 0  # answers nobody waited for
        self.poller = None
        self.wake_r = self.wake_w = -1

    # -- runs

    def begin_run(self, tools):
        with self.mu:
            self._finish_waiters("cancelled", "a new run began before the tool answered")
            self.in_run, self.tools_on = True, tools
            self.epoch += 1

    def end_run(self):
        saved = _shield_sigint()
        try:
            with self.send_lock:  # a message under way is sent whole first
                with self.mu:
                    self.in_run = self.tools_on = False
                    self.epoch += 1
                    self._finish_waiters("cancelled", "the run ended before the tool answered")
                    if self.leader is not None and self.leader != _MAIN_THREAD:
                        # Blocked in _poll: make it see its wait is over,
                        # so that the main loop can read.
                        try:
                            os.write(self.wake_w, b"x")
                        except OSError:
                            pass  # full: a wake-up is pending anyway
        finally:
            _unshield_sigint(saved)

    def _finish_waiters(self, kind, message):
        for w in self.waiters.values():
            if not w.done:
                w.reply = _tool_failure(kind, message)
                w.done = True
                self._wake(w)
        self.waiters.clear()

    # -- sending

    def send(self, data):
        """Write one of the main loop's messages."""
        saved = _shield_sigint()
        try:
            with self.send_lock:
                self.sock.sendall(data)
        finally:
            _unshield_sigint(saved)

    def call(self, msg, arguments=None, gate=False):
        """Send msg, a tool message without its id (arguments: the JSON
        text of a call's arguments), and return its answer, a dict with an
        "error" when there is no result. Raises what encoding msg raises,
        and KeyboardInterrupt in the main thread. gate: the worker's own
        code_facts message, sent whether or not the run may call tools."""
        global _channel_busy
        if _thread.get_ident() != _MAIN_THREAD:
            return self._call(msg, arguments)
        saved = _shield_sigint()
        _channel_busy += 1
        try:
            reply = self._call(msg, arguments, gate)
        finally:
            _channel_busy -= 1
            _unshield_sigint(saved)
        _raise_pending()
        return reply

    def _call(self, msg, arguments, gate=False):
        if os.getpid() != _PID:
            return _tool_failure("unavailable", "tool calls cannot be made from a forked process")
        with self.mu:
            refusal = self._refusal(gate)
            if refusal is not None:
                return refusal
            self.seq += 1
            rid = "t%d" % self.seq
            epoch = self.epoch
        msg = dict(msg)
        msg["id"] = rid
        text = _dumps(msg, separators=(",", ":"), allow_nan=False)
        if arguments is not None:
            text = text[:-1] + ',"arguments":' + arguments + "}"
        data = (text + "\n").encode("ascii")
        w = _Wait()
        with self.mu:
            if self.epoch != epoch:
                return self._refusal() or _tool_failure("cancelled", "the run ended before the call was sent")
            if not self.demux:
                try:
                    self._start_demux()
                except OSError as e:
                    return _tool_failure("unavailable", "cannot wait for tool answers: %s" % (e,))
            self.waiters[rid] = w
        try:
            with self.send_lock:
                with self.mu:
                    # end_run holds send_lock while it fails the waits: a
                    # call is sent before the result, or not at all.
                    live = not w.done
                if live:
                    try:
                        self.sock.sendall(data)
                    except OSError as e:
                        return _tool_failure("unavailable", "the control channel failed: %s" % (e,))
            self._await(w)
        finally:
            with self.mu:
                self.waiters.pop(rid, None)
        return w.reply

    def _refusal(self, gate=False):
        if self.closed is not None:
            return _tool_failure("unavailable", "the control channel is closed")
        if not self.in_run:
            return _tool_failure(
                "cancelled", "no run is in progress: tools can be called only during a run, "
                "not by code that goes on after it (such as a background thread)")
        if not self.tools_on and not gate:
            return _tool_failure("unavailable", "this run cannot call tools")
        return None

    def _start_demux(self):
        import select

        r, w = os.pipe()  # wakes a leader blocked in _poll
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(r, select.POLLIN)
        self.wake_r, self.wake_w, self.poller = r, w, poller
        self.demux = True

    # -- reading

    def next_line(self):
        """The main loop's next request; at EOF what is left, then b""."""
        if not self.demux:
            return self.reader.readline()
        saved = _shield_sigint()
        try:
            while True:
                w = _Wait()
                with self.mu:
                    if self.requests:
                        return self.requests.pop(0)
                    if self.closed is True:
                        return b""
                    if self.closed is not None:
                        raise self.closed
                    self.main_wait = w
                try:
                    self._await(w)
                finally:
                    with self.mu:
                        self.main_wait = None
        finally:
            _unshield_sigint(saved)

    def _wake(self, w):
        if not w.signaled:
            w.signaled = True
            w.lock.release()

    def _hand_over(self):
        # The leader is gone: the first thread still waiting reads next.
        for w in self.blocked:
            if not w.done:
                self._wake(w)
                return

    def _await(self, w):
        """Return once w is done, meanwhile reading for every waiting
        thread if no other thread does."""
        me = _thread.get_ident()
        try:
            while True:
                with self.mu:
                    if w.done:
                        return
                    lead = self.leader is None
                    if lead:
                        self.leader = me
                    else:
                        self.blocked.append(w)
                if lead:
                    try:
                        self._lead(w)
                    finally:
                        with self.mu:
                            self.leader = None
                    continue
                try:
                    if me == _MAIN_THREAD:
                        _raise_pending()
                    _block(w.lock)
                finally:
                    with self.mu:
                        w.signaled = False
                        self.blocked.remove(w)
        finally:
            with self.mu:
                if self.leader is None:
                    self._hand_over()

    def _lead(self, w):
        main = _thread.get_ident() == _MAIN_THREAD
        reader = self.reader
        streaming = False
        while True:
            with self.mu:
                if w.done:
                    return
            line = reader.pop_line()
            if line is not None:
                self._dispatch(line)
                continue
            if not streaming:
                if main:
                    _raise_pending()
                for fd, _ in _poll(self.poller):
                    if fd == self.wake_r:
                        try:
                            while os.read(self.wake_r, 64):
                                pass
                        except OSError:  # drained
                            pass
            try:
                n = reader.fill(socket.MSG_DONTWAIT)
            except BlockingIOError:
                n = None
            except OSError as e:
                self._close(e)
                return
            if n == 0:
                self._close(True)
                return
            # A long line comes in many pieces: read on while they come.
            streaming = n is not None and n == len(reader._chunk)

    def _dispatch(self, line):
        if line.startswith(b'{"op":"tool_'):
            try:
                msg = _loads(line)
                rid = msg.get("id")
            except Exception:  # also MemoryError: the waiter fails at the run's end
                msg = rid = None
            with self.mu:
                w = self.waiters.get(rid) if isinstance(rid, str) else None
                if w is None or w.done:
                    self.dropped += 1  # late, or forged: never an error reply
                    return
                w.reply = msg
                w.done = True
                self._wake(w)
            return
        with self.mu:
            self.requests.append(line)
            if self.main_wait is not None:
                self.main_wait.done = True
                self._wake(self.main_wait)

    def _close(self, why):
        with self.mu:
            rest = self.reader.rest()
            if rest:
                self.requests.append(rest)
            self.closed = why
            self._finish_waiters("unavailable", "the control channel was closed")
            if self.main_wait is not None:
                self.main_wait.done = True
                self._wake(self.main_wait)


class _ToolsFinder(object):
    """Makes sandbox_tools.py, next to this file, importable during a run
    given tools, as "pysandbox_tools" and as "tools"; one module under both
    names, called "tools" either way.

    "pysandbox_tools" is reserved: _TOOLS_FIRST comes first in
    sys.meta_path, from before any path a caller controls is added, so no
    module of that name on sys.path (a dependency's, the workspace's) is
    ever found, nor imported by a .pth file; in a run without tools the
    name is simply not there. "tools" is served by _TOOLS_LAST, last in
    sys.meta_path: a tools module of the user's or of a dependency wins,
    since a dependency that ships a top-level "tools" package imports it
    by that name itself, and pysandbox_tools still reaches the built-in."""

    module = None  # shared by both finders

    def __init__(self, name, reserved):
        self.name = name
        self.reserved = reserved

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or fullname != self.name:
            return None
        if not _tools_enabled:
            if self.reserved:
                raise ModuleNotFoundError("No module named %r" % fullname, name=fullname)
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, self, origin=_TOOLS_PATH)

    def create_module(self, spec):
        if _ToolsFinder.module is None:
            return types.ModuleType("tools")
        return _ToolsFinder.module

    def exec_module(self, module):
        if module is _ToolsFinder.module:
            return
        with open(_TOOLS_PATH, "rb") as f:
            source = f.read()
        module.__file__ = _TOOLS_PATH
        module._channel = _chan
        exec(compile(source, _TOOLS_PATH, "exec", dont_inherit=True), module.__dict__)
        _ToolsFinder.module = module


_TOOLS_FIRST = _ToolsFinder("pysandbox_tools", True)
_TOOLS_LAST = _ToolsFinder("tools", False)


def _tools_first():
    """Put _TOOLS_FIRST back in front of sys.meta_path: a .pth file of a
    dependency may have put a finder of its own there."""
    if not sys.meta_path or sys.meta_path[0] is not _TOOLS_FIRST:
        sys.meta_path[:] = [_TOOLS_FIRST] + [f for f in sys.meta_path if f is not _TOOLS_FIRST]


def _tools_begin(sock, tools):
    """A run begins: tools says whether it may call tools."""
    global _tools_enabled
    _tools_enabled = tools
    _tools_first()
    if tools and _TOOLS_LAST not in sys.meta_path:
        sys.meta_path.append(_TOOLS_LAST)
    if _chan is not None and sock is _chan.sock:
        _chan.begin_run(tools)


def _tools_end(sock):
    global _tools_enabled
    _tools_enabled = False
    if _chan is not None and sock is _chan.sock:
        _chan.end_run()


def _valid_marker(marker):
    return (isinstance(marker, str) and 16 <= len(marker) <= 128
            and all(c in _MARKER_CHARS for c in marker))


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)  # retried by Python on EINTR (PEP 475)
        view = view[n:]


def _sync(sock, req, rid):
    """Handle a "sync" request: mark the end of everything written so far
    on fd 1 and fd 2, so the Go side can tell where a run's output ends."""
    marker = req.get("marker")
    if not _valid_marker(marker):
        _send_error(sock, rid, "marker must be 16 to 128 characters of [A-Za-z0-9_-]")
        return
    _flush_output()
    data = (marker + "\n").encode("ascii")
    try:
        for fd in (1, 2):
            _write_all(fd, data)
    except OSError as e:
        _send_error(sock, rid, "sync: cannot write to fd %d: %s" % (fd, e))
        return
    _send(sock, {"op": "synced", "id": rid})


# The ready message but for the pid, formatted once (by hand, as the
# zygote's replies are: see _zygote_main).
_READY = ('{"op":"ready","python":%s,"version":[%d,%d],"pid":%%d}\n' % (
    _dumps(sys.version.split()[0]), sys.version_info[0], sys.version_info[1])).encode("ascii")


def _serve(sock, oneshot):
    """Answer requests until the Go side hangs up (or, one-shot, until the
    first run is done). Returns the exit code."""
    global _chan
    _take_reserve()
    _install_sigint_handler()
    _chan = _Channel(sock, _LineReader(sock))
    # A serving worker is a session: one __main__ for all its runs.
    session = None if oneshot else types.ModuleType("__main__")
    _send_bytes(sock, _READY % _PID)
    while True:
        try:
            line = _chan.next_line()
        except KeyboardInterrupt:
            # Only if user code installed a handler that raises: a SIGINT
            # meant for a run that had just ended. Nothing was lost.
            continue
        except MemoryError:
            # User code's globals hold the memory. Nothing was lost either:
            # try again with the reserve freed.
            if not _release_reserve():
                _write_stderr("pysandbox worker: out of memory\n")
                return 1
            continue
        except OSError as e:
            _write_stderr("pysandbox worker: control channel: %s\n" % (e,))
            return 1
        if not line:
            return 0  # the Go side hung up
        try:
            code = _handle(sock, line, session)
        except MemoryError:
            # Not enough left even to set up the request or its reply.
            _release_reserve()
            code = None
            try:
                rid, op = _request_fields(line)
                if op == "run":
                    code = 1
                    _tools_end(sock)  # if the run got as far as beginning
                    _flush_output()
                    _send_bytes(sock, _memory_fallback(rid))
                else:
                    _send_error(sock, rid, "out of memory")
            except BaseException:
                return 1
        if oneshot and code is not None:
            # The output was flushed before the reply; flushing again
            # would run user code (a sys.stdout of its own) after it.
            sock.close()
            return code
        if code is not None:
            _take_reserve()


def _request_fields(line):
    try:
        req = _loads(line)
        rid, op = req.get("id"), req.get("op")
    except Exception:
        rid, op = None, None
    return (rid if isinstance(rid, str) else ""), op


def _handle(sock, line, session):
    """Answer one request. Returns the exit code of a run, else None."""
    try:
        req = _loads(line)
    except (ValueError, RecursionError):  # inputs nested too deeply, too
        req = None
    if not isinstance(req, dict):
        _send_error(sock, "", "request is not a JSON object (or nested too deeply)")
        return None
    rid = req.get("id")
    if not isinstance(rid, str):
        rid = ""
    op = req.get("op")
    if op in ("tool_result", "tool_catalog"):
        # An answer to a tool message nobody waits for (late, or forged by
        # user code): an error reply would put the Go side out of step.
        return None
    if op == "run":
        return _run(sock, req, rid, session)
    elif op == "sync":
        _sync(sock, req, rid)
    elif op == "validate":
        valid, err = _validate(req)
        msg = {"op": "validated", "id": rid, "valid": valid}
        if err is not None:
            msg["syntax_error"] = err
        _send(sock, msg)
    elif op == "probe":
        msg = _probe(req)
        msg["op"], msg["id"] = "probed", rid
        _send(sock, msg)
    elif op in ("snapshot", "restore"):
        _snapshot_request(sock, op, req, rid, session)
    else:
        _send_error(sock, rid, "unknown op %r" % (op,))


def main():
    if "--zygote" in sys.argv[1:]:
        return _zygote_main()
    oneshot = "--oneshot" in sys.argv[1:]
    code = _serve(_setup(), oneshot)
    if oneshot:
        # No interpreter teardown after a one-shot run's reply: it would
        # run the run's atexit handlers a second time and wait for its
        # threads, after the server stopped counting.
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
