"""pysandbox session snapshots: the worker's side of the "snapshot" and
"restore" requests (protocol.go documents them, snapshot.go drives them).

worker.py loads this file from next to itself on first use, as the module
_pysandbox_snapshot, and keeps it in sys.modules under that name: a
snapshot names its reconstructors (_make_function, _make_class, ...) by
it, and unpickling finds them there. worker.py sets _worker (its own
module) before running it.

What a snapshot holds: the globals of the session's __main__, saved one by
one, in a stream only this file reads (it goes to the Go side in
snapshot_data frames and comes back verbatim in a restore):

    stream  = MAGIC frame*
    frame   = kind (1 byte) + length (4 bytes, big-endian) + payload
    H       header, JSON: {"v": 1, "python": "3.11.2", "code": CODE_TAG}
    R       a record begins, JSON: {"name": N} (a pickle follows in D
            frames), or {"name": N, "module": M} (re-imported), with
            "fresh": true when the pickle memo starts afresh
    D       pickle data of the current record
    E       the record ends
    A       the record is abandoned: it could not be saved after part of
            it was sent (restore skips it; snapshot listed it unsaveable)
    Z       the end of the stream

The records of one memo epoch are successive dump()s of one Pickler and
load()s of one Unpickler, so objects shared between globals (a = b = [])
stay shared. A record that fails, or one larger than RESET_AFTER, ends the
epoch (the memo would name objects the stream lacks, or hold large
temporaries alive): sharing across that boundary becomes copies.

Modules are records of their name. Functions and classes defined in the
session (and functions that cannot be found by name, such as a
namedtuple's __new__) are saved by value: code objects by marshal, with
the source of the cell they come from, so that tracebacks show it after a
restore and another Python version can compile it again. Everything else
is pickled. Definitions come first, then the other globals in their
order: an instance of a class saved in an earlier epoch refers to the
class by its name in the session.

User code runs here (__reduce__, __setstate__, imports): pickling and
unpickling are interruptible like a run (SIGINT raises KeyboardInterrupt),
except while a frame is read or sent, which keeps the stream in step.

Must run on CPython 3.8 and later, with the stdlib only.
"""

import _pickle
import _thread
import builtins
import linecache
import sys
import time
import types

_w = _worker  # noqa: F821 (set by the loader): worker.py's module

# Bound now: user code that patches json, pickle or marshal must not break
# snapshots by accident (worker.py binds json and marshal at its start).
_dumps = _w._dumps
_loads = _w._loads
_marshal_dumps = _w._marshal_dumps
_marshal_loads = _w._marshal_loads
_Pickler = _pickle.Pickler
_Unpickler = _pickle.Unpickler
_PickleBuffer = _pickle.PickleBuffer
_PicklingError = _pickle.PicklingError
_PROTOCOL = 5  # pickle.HIGHEST_PROTOCOL from 3.8 on (PickleBuffer: arrays without copies)
_FunctionType = types.FunctionType
_ModuleType = types.ModuleType
_CodeType = types.CodeType
_CellType = types.CellType
_MappingProxyType = types.MappingProxyType
_new_class = types.new_class
_import_module = __import__("importlib").import_module

MAGIC = b"PYSBSNP1"
WIRE_MAX = 1 << 20  # the payload of one snapshot_data frame (worker.MaxSnapshotFrameBytes)
BIG = 1 << 16  # pickle writes this large are sent straight, not copied
RESET_AFTER = 16 << 20
MAX_NAMES = 100000  # saved + unsaveable (worker.MaxSnapshotNames)
MAX_NAME_JSON = 1024  # worker.MaxSnapshotNameBytes
MAX_REASON_JSON = 512  # the Go side allows 2048 (worker.MaxSnapshotReasonBytes)
REPLY_BUDGET = 16 << 20  # the lists of one reply, as JSON
MAX_META_FRAME = 1 << 16  # an H or R frame
# Globals every session has, that the worker or Python put there.
_SKIP = frozenset(("__name__", "__builtins__", "__loader__", "__spec__", "__package__",
                   "__warningregistry__"))


def _code_tag():
    # Code objects are marshalled in the interpreter's own format: another
    # version recompiles from the cell's source instead.
    ext = sys.modules.get("_frozen_importlib_external") or sys.modules.get("importlib._bootstrap_external")
    magic = getattr(ext, "MAGIC_NUMBER", b"")
    return "%s:%s" % (sys.implementation.cache_tag, magic.hex() if isinstance(magic, bytes) else "")


CODE_TAG = _code_tag()


class _TooBig(BaseException):
    """The stream would exceed max_bytes (a BaseException, so that user
    code does not catch it by accident)."""


class _Damaged(Exception):
    """The restore stream is not what a snapshot wrote."""


class _Abandoned(Exception):
    """The record being restored was abandoned by the snapshot."""


class _EmptyCell(object):
    """Stands for a closure cell without a value (pickled by reference)."""


class _Critical(object):
    """While held, SIGINT is kept pending instead of raised (the worker's
    _on_sigint honours _channel_busy): reads and writes of the stream must
    never stop half-way. _raise_pending raises it afterwards."""

    __slots__ = ()

    def __enter__(self):
        _w._channel_busy += 1

    def __exit__(self, *exc):
        _w._channel_busy -= 1
        return False


_critical = _Critical()


def _raise_pending():
    _w._raise_pending()


def _safe_str(obj):
    return _w._safe_str(obj)


def _type_name(obj):
    try:
        name = type(obj).__name__
        return name if isinstance(name, str) else "object"
    except BaseException:
        return "object"


def _clip_json(text, limit):
    """text, shortened so that its JSON is at most limit bytes."""
    if len(text) > limit:
        text = text[:limit] + "\u2026"
    while len(_dumps(text)) > limit:
        text = text[:max(len(text) * 2 // 3 - 1, 0)] + "\u2026"
    return text


class _Report(object):
    """The names of a reply, within the bounds the Go side checks (count,
    size of each) and within REPLY_BUDGET as a whole."""

    def __init__(self):
        self.ok = []
        self.bad = []
        self.cost = 512  # the rest of the reply, and the note on names cut
        self.cut = 0

    def room(self, name):
        if len(self.ok) + len(self.bad) >= MAX_NAMES - 1 or \
                self.cost + len(_dumps(name)) + MAX_REASON_JSON + 32 > REPLY_BUDGET:
            self.cut += 1
            return False
        return True

    def add_ok(self, name):
        self.ok.append(name)
        self.cost += len(_dumps(name)) + 1

    def add_bad(self, name, reason):
        reason = _clip_json(reason, MAX_REASON_JSON - 2)
        self.bad.append({"name": name, "reason": reason})
        self.cost += len(_dumps(name)) + len(_dumps(reason)) + 22

    def finish(self, what):
        if self.cut:
            self.bad.append({"name": "\u2026", "reason": "%d more names were not %s: a snapshot lists at most "
                                                         "%d names" % (self.cut, what, MAX_NAMES)})


def _display_name(key):
    """A global's name as a reply may show it."""
    if isinstance(key, str):
        return key if len(_dumps(key)) <= MAX_NAME_JSON else _clip_json(key, 256)
    try:
        text = repr(key)
    except BaseException:
        text = "<%s>" % _type_name(key)
    return _clip_json(text, 256)


# ---------------------------------------------------------------- snapshot


class _Writer(object):
    """The stream of one snapshot, sent in snapshot_data frames of at most
    WIRE_MAX bytes, never more than limit in all."""

    def __init__(self, rid, limit):
        self.head = ('{"op":"snapshot_data","id":%s,"bytes":' % _dumps(rid)).encode("ascii")
        self.limit = limit
        self.sent = 0
        self.out = bytearray()  # not sent yet; shorter than WIRE_MAX between calls
        self.mark = -1  # where the current record starts in out; -1: part of it is sent

    def size(self):
        return self.sent + len(self.out)

    def _room(self, n):
        if self.sent + len(self.out) + n > self.limit:
            raise _TooBig()

    def _send(self, view):
        # Inside _critical (and with a handler of the user's shielded): a
        # frame goes whole, with its count. Its line and its bytes go in
        # one hold of the channel, the bytes from where they are.
        n = len(view)
        ch = _w._chan
        with ch.send_lock:
            ch.sock.sendall(self.head + b"%d}\n" % n)
            ch.sock.sendall(view)
        self.sent += n

    def _flush(self, force=False):
        out = self.out
        k = len(out) if force else len(out) - len(out) % WIRE_MAX
        if not k:
            return
        with memoryview(out) as view:
            for i in range(0, k, WIRE_MAX):
                self._send(view[i:min(i + WIRE_MAX, k)])
        del out[:k]
        if self.mark >= 0:
            self.mark = self.mark - k if self.mark >= k else -1

    def raw(self, data):
        with _critical:
            self._room(len(data))
            self.out += data
            self._flush()
        _raise_pending()

    def frame(self, kind, payload=b""):
        with _critical:
            self._frame(kind, payload)
        _raise_pending()

    def _frame(self, kind, payload):
        n = len(payload)
        self._room(5 + n)
        self.out += kind
        self.out += n.to_bytes(4, "big")
        if n:
            self.out += payload
        self._flush()

    def write(self, data):
        """The Pickler's file.write: large payloads (a PickleBuffer of an
        array's memory) are sent from where they are, never copied whole."""
        if type(data) is _PickleBuffer:
            view = data.raw()
        else:
            view = memoryview(data)
            if view.ndim != 1 or view.format != "B":
                view = view.cast("B")
        with view:
            with _critical:
                if len(view) < BIG:
                    self._frame(b"D", view)
                else:
                    self._big(view)
        _raise_pending()

    def _big(self, view):
        pos, n = 0, len(view)
        while pos < n:
            k = min(n - pos, 1 << 30)
            self._room(5 + k)
            self.out += b"D"
            self.out += k.to_bytes(4, "big")
            self._flush()  # out is shorter than WIRE_MAX again
            piece = view[pos:pos + k]
            room = WIRE_MAX - len(self.out)
            self.out += piece[:room]
            self._flush()
            rest = piece[room:]
            while len(rest) >= WIRE_MAX:
                self._send(rest[:WIRE_MAX])
                self.mark = -1
                rest = rest[WIRE_MAX:]
            self.out += rest
            pos += k

    def begin(self, head):
        with _critical:
            self.mark = len(self.out)
            self._frame(b"R", _dumps(head, separators=(",", ":")).encode("ascii"))
        _raise_pending()

    def abandon(self):
        """Drop the current record: from the buffer if none of it was
        sent, else by an A frame."""
        with _critical:
            if self.mark >= 0:
                del self.out[self.mark:]
            else:
                self._frame(b"A", b"")
            self.mark = -1
        _raise_pending()

    def finish(self):
        with _critical:
            self._frame(b"Z", b"")
            self._flush(True)
        _raise_pending()


class _SessionPickler(_Pickler):
    def __init__(self, file, snap):
        _Pickler.__init__(self, file, _PROTOCOL)
        self._snap = snap

    def reducer_override(self, obj):
        return self._snap.reduce(obj)


_CONTAINERS = frozenset((list, tuple, set, frozenset, bytearray, complex))


def _by_reference(obj, main):
    """Whether pickle finds obj again by its module and qualified name (in
    a module other than the session's, which is being restored)."""
    try:
        if obj.__module__ == main:
            return False
        mod = sys.modules.get(obj.__module__)
        if mod is None:
            return False
        found = mod
        for part in obj.__qualname__.split("."):
            found = getattr(found, part)
        return found is obj
    except Exception:
        return False


def _worker_owns(obj):
    try:
        return _w.__dict__.get(obj.__name__) is obj
    except Exception:
        return False


def _code_names(code, out):
    out.update(code.co_names)
    for c in code.co_consts:
        if isinstance(c, _CodeType):
            _code_names(c, out)


class _Snap(object):
    """One snapshot: the session's namespace, the pickler of the current
    memo epoch, and what reducer_override needs."""

    def __init__(self, ns, writer):
        self.ns = ns
        main = ns.get("__name__")
        self.main = main if isinstance(main, str) else "__main__"
        self.writer = writer
        self.epoch = 0
        self.fresh = False
        self.def_epoch = {}  # a definition's name: the epoch its record was written in
        self.sources = {}  # a code object's filename: (filename, the cell's source or None)
        self.special = _specials()
        self.singletons = _singletons()
        self.pickler = _SessionPickler(writer, self)

    def reset(self):
        self.pickler.clear_memo()
        self.epoch += 1
        self.fresh = True

    def is_definition(self, value):
        if type(value) is _FunctionType:
            return value.__globals__ is self.ns
        if isinstance(value, type):
            try:
                return value.__module__ == self.main and not _worker_owns(value)
            except Exception:
                return False
        return False

    def reduce(self, obj):
        t = type(obj)
        if t is dict:
            if obj is self.ns:
                return _session_dict, ()
            return NotImplemented
        if t in _CONTAINERS:
            return NotImplemented
        if t is _FunctionType:
            return self.function(obj)
        if isinstance(obj, type):
            return self.cls(obj)
        if isinstance(obj, _ModuleType):
            return self.module(obj)
        special = self.special.get(t)
        if special is not None:
            return special(self, obj)
        s = self.singletons.get(id(obj))
        if s is not None and s[0] is obj:
            return getattr, (s[1], s[2])
        return NotImplemented

    def lookup(self, obj):
        """A definition bound under its name whose record an earlier epoch
        wrote: found there by name at restore."""
        try:
            name = obj.__name__
        except Exception:
            return None
        e = self.def_epoch.get(name)
        if e is not None and e != self.epoch and self.ns.get(name) is obj:
            return _lookup, (name,)
        return None

    def module(self, mod):
        name = getattr(mod, "__name__", None)
        if not isinstance(name, str) or sys.modules.get(name) is not mod:
            raise _PicklingError("module %r was not imported (it is not in sys.modules)" % (name,))
        if mod is _w._ToolsFinder.module:
            raise _PicklingError("the tools module: import it again in a run that uses tools")
        return _import, (name,)

    def source(self, filename):
        src = self.sources.get(filename)
        if src is None:
            text = None
            entry = linecache.cache.get(filename)
            # A cell the worker registered (no mtime): files are read again.
            if isinstance(entry, tuple) and len(entry) == 4 and entry[1] is None and isinstance(entry[2], list):
                try:
                    text = "".join(entry[2])
                except Exception:
                    text = None
            src = self.sources[filename] = (filename, text)
        return src

    def code_args(self, code):
        return (_marshal_dumps(code), CODE_TAG, self.source(code.co_filename),
                (code.co_name, code.co_firstlineno))

    def function(self, fn):
        g = fn.__globals__
        if g is self.ns:
            found = self.lookup(fn)
            if found is not None:
                return found
            mode = None
        elif "registry" in fn.__dict__ and "dispatch" in fn.__dict__ and g is getattr(
                sys.modules.get("functools"), "__dict__", None):
            # functools.singledispatch: made again from its registry (its
            # cache holds weak references).
            return _make_singledispatch, (list(fn.registry.items()),)
        elif g is _w.__dict__:
            if _worker_owns(fn):
                return _worker_attr, (fn.__name__,)
            raise _PicklingError("%s is part of the pysandbox worker" % (fn.__qualname__,))
        elif _by_reference(fn, self.main):
            return NotImplemented
        else:
            # A lambda or a nested function of a module: its globals are
            # the module's (found by the name in them: functools.wraps
            # copies another function's __module__).
            modname = g.get("__name__")
            mod = sys.modules.get(modname) if isinstance(modname, str) else None
            if mod is not None and modname != self.main and getattr(mod, "__dict__", None) is g:
                mode = ("module", modname)
            else:
                # Globals of no module (namedtuple's __new__, exec'd code):
                # a copy of those the code names.
                names = set()
                _code_names(fn.__code__, names)
                mode = ("globals", dict((k, g[k]) for k in names if k in g and k != "__builtins__"))
        code = fn.__code__
        state = {
            "qualname": fn.__qualname__,
            "module": fn.__module__,
            "defaults": fn.__defaults__,
            "kwdefaults": fn.__kwdefaults__,
            "doc": fn.__doc__,
            "dict": fn.__dict__ or None,
        }
        annotate = getattr(fn, "__annotate__", None)  # 3.14: lazy annotations
        if annotate is not None:
            state["annotate"] = annotate
        else:
            try:
                state["annotations"] = fn.__annotations__ or None
            except Exception:
                pass
        params = getattr(fn, "__type_params__", None)
        if params:
            state["type_params"] = params
        if fn.__closure__:
            cells = []
            for cell in fn.__closure__:
                try:
                    cells.append(cell.cell_contents)
                except ValueError:
                    cells.append(_EmptyCell)
            state["cells"] = cells
        return (_make_function, self.code_args(code) + (fn.__name__, mode), state, None, None, _set_function_state)

    def cls(self, cls):
        try:
            module = cls.__module__
        except Exception:
            return NotImplemented
        if module != self.main:
            return NotImplemented
        if _worker_owns(cls):
            return _worker_attr, (cls.__name__,)
        found = self.lookup(cls)
        if found is not None:
            return found
        return _class_reduce(cls, self.main)


def _class_reduce(cls, main):
    d = dict(cls.__dict__)
    kw = {"__module__": d.pop("__module__", main), "__qualname__": cls.__qualname__}
    if "__doc__" in d:
        kw["__doc__"] = d.pop("__doc__")
    if "__orig_bases__" in d:
        kw["__orig_bases__"] = d.pop("__orig_bases__")
    slots = d.pop("__slots__", None)
    if slots is not None:
        kw["__slots__"] = slots
        for name in ([slots] if isinstance(slots, str) else list(slots)):
            if not isinstance(name, str):
                continue
            d.pop(name, None)
            if name.startswith("__") and not name.endswith("__"):
                d.pop("_%s%s" % (cls.__name__.lstrip("_"), name), None)  # the mangled slot
    for name in ("__dict__", "__weakref__", "_abc_impl"):
        d.pop(name, None)
    meta = type(cls)
    enum = sys.modules.get("enum")
    if enum is not None and isinstance(cls, enum.EnumMeta) and cls.__members__:
        # Made again from its members' values, by its metaclass; then the
        # rest of its dict, but what the metaclass made (see _set_class_state).
        members = []
        for name, member in cls.__members__.items():
            members.append((name, member.value))
            d.pop(name, None)
        for name in _ENUM_INTERNALS:
            d.pop(name, None)
        return (_make_enum, (meta, cls.__name__, cls.__bases__, kw, members), (d, True), None, None,
                _set_class_state)
    return (_make_class, (meta, cls.__name__, cls.__bases__, kw), (d, False), None, None, _set_class_state)


_ENUM_INTERNALS = ("_member_names_", "_member_map_", "_value2member_map_", "_member_type_",
                   "_unhashable_values_", "_new_member_", "_use_args_", "_value_repr_", "_singles_mask_",
                   "_flag_mask_", "_all_bits_", "_boundary_", "_inverted_", "_numeric_repr_")


def _reduce_staticmethod(snap, obj):
    return type(obj), (obj.__func__,)


def _reduce_property(snap, obj):
    return type(obj), (obj.fget, obj.fset, obj.fdel, obj.__doc__)


def _reduce_mappingproxy(snap, obj):
    return _make_mappingproxy, (dict(obj),)


def _reduce_code(snap, obj):
    return _make_code, snap.code_args(obj)


def _reduce_lru(snap, obj):
    if _by_reference(obj, snap.main):  # a library's: itself, cache and all
        return NotImplemented
    wrapped = obj.__wrapped__
    params = getattr(obj, "cache_parameters", None)
    if params is not None:
        p = params()
        return _make_lru, (wrapped, p.get("maxsize"), p.get("typed", False))
    return _make_lru, (wrapped, obj.cache_info().maxsize, False)


def _reduce_cached_property(snap, obj):
    return _make_cached_property, (type(obj), obj.func, obj.attrname, obj.__doc__)


def _reduce_typevar(snap, obj):
    if getattr(obj, "__module__", None) != snap.main:
        return NotImplemented
    kw = {"bound": obj.__bound__, "covariant": obj.__covariant__, "contravariant": obj.__contravariant__}
    return _make_typevar, (type(obj), obj.__name__, tuple(obj.__constraints__), kw)


def _specials():
    table = {
        staticmethod: _reduce_staticmethod,
        classmethod: _reduce_staticmethod,
        property: _reduce_property,
        _MappingProxyType: _reduce_mappingproxy,
        _CodeType: _reduce_code,
    }
    functools = sys.modules.get("functools")
    if functools is not None:
        lru = getattr(functools, "_lru_cache_wrapper", None)
        if isinstance(lru, type):
            table[lru] = _reduce_lru
        cp = getattr(functools, "cached_property", None)
        if isinstance(cp, type):
            table[cp] = _reduce_cached_property
    typing = sys.modules.get("typing")
    if typing is not None and isinstance(getattr(typing, "TypeVar", None), type):
        table[typing.TypeVar] = _reduce_typevar
    return table


def _singletons():
    """Objects that must stay themselves (their identity is tested), by
    id: (object, module, name)."""
    table = {}
    dc = sys.modules.get("dataclasses")
    if dc is not None:
        for name in ("MISSING", "_FIELD", "_FIELD_CLASSVAR", "_FIELD_INITVAR", "_HAS_DEFAULT_FACTORY",
                     "KW_ONLY", "_EMPTY_METADATA"):
            obj = getattr(dc, name, None)
            if obj is not None and not isinstance(obj, type):
                table[id(obj)] = (obj, dc, name)
    return table


def _exc_text(exc):
    if isinstance(exc, RecursionError):
        return "too deeply nested to save (RecursionError)"
    if isinstance(exc, MemoryError):
        return "out of memory while saving it"
    text = _safe_str(exc)
    if isinstance(exc, (TypeError, _PicklingError)) and text:
        return text  # "cannot pickle '_thread.lock' object" says it all
    return "%s: %s" % (_type_name(exc), text) if text else _type_name(exc)


def _reason(value, exc):
    """Why value could not be saved, e.g. "TextIOWrapper: cannot pickle
    '_io.TextIOWrapper' object"."""
    return "%s: %s" % (_type_name(value), _exc_text(exc))


def _save_all(snap, writer, report):
    writer.raw(MAGIC)
    v = sys.version_info
    writer.frame(b"H", _dumps({"v": 1, "python": "%d.%d.%d" % (v[0], v[1], v[2]), "code": CODE_TAG},
                              separators=(",", ":")).encode("ascii"))
    ns = snap.ns
    modules, definitions, others = [], [], []
    for key in list(ns):
        if isinstance(key, str) and (key in _SKIP or (key == "__doc__" and ns.get(key) is None)):
            continue
        if key not in ns:  # gone meanwhile
            continue
        name = _display_name(key)
        if not report.room(name):
            continue
        if not isinstance(key, str):
            report.add_bad(name, "the name is not a string")
            continue
        if name is not key:
            report.add_bad(name, "the name is longer than %d bytes" % MAX_NAME_JSON)
            continue
        value = ns[key]
        if value is ns:  # g = globals(): pickle never asks how to reduce a dict
            modules.append((key, value))
        elif isinstance(value, _ModuleType):
            modules.append((key, value))
        elif snap.is_definition(value):
            definitions.append((key, value))
        else:
            others.append((key, value))
    for key, value in modules:
        if value is ns:
            mod = ""  # the session's namespace itself
        else:
            try:
                mod = snap.module(value)[1][0]
            except Exception as e:
                report.add_bad(key, _reason(value, e))
                continue
        writer.begin({"name": key, "module": mod})
        writer.frame(b"E")
        report.add_ok(key)
    del modules
    for group, is_def in ((definitions, True), (others, False)):
        for i in range(len(group)):
            key, value = group[i]
            group[i] = None  # saved: hold nothing of it longer than the namespace does
            _save_one(snap, writer, report, key, value, is_def)
            del value
    report.finish("saved")
    writer.finish()


def _save_one(snap, writer, report, key, value, is_def):
    head = {"name": key}
    if snap.fresh:
        head["fresh"] = True
    writer.begin(head)
    start = writer.size()
    try:
        snap.pickler.dump(value)
    except (KeyboardInterrupt, _TooBig):
        raise
    except BaseException as e:  # whatever user code raised, SystemExit too
        if isinstance(e, MemoryError):
            _w._release_reserve()
        writer.abandon()
        snap.reset()
        report.add_bad(key, _reason(value, e))
        return
    writer.frame(b"E")
    snap.fresh = False
    if is_def:
        snap.def_epoch[key] = snap.epoch
    report.add_ok(key)
    if writer.size() - start > RESET_AFTER:
        snap.reset()


def _snapshot(sock, rid, req, session):
    limit = req.get("max_bytes")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        _w._send_error(sock, rid, "max_bytes must be a positive integer")
        return
    ns = session.__dict__
    sys.modules["__main__"] = session
    writer = _Writer(rid, limit)
    report = _Report()
    shielded = _w._shield_sigint()  # a handler of the user's must not cut a frame
    try:
        snap = _Snap(ns, writer)
        ok, exc = _w._guarded(_save_all, snap, writer, report)
        snap = None
    finally:
        _w._unshield_sigint(shielded)
    _w._restore_sigint_handler()
    _w._take_reserve()
    _w._flush_output()
    if ok or isinstance(exc, _TooBig):
        exc = None
        _w._send(sock, {"op": "snapshotted", "id": rid, "saved": report.ok, "unsaveable": report.bad,
                        "too_big": not ok})
    elif isinstance(exc, KeyboardInterrupt):
        _w._send_error(sock, rid, "the snapshot was interrupted")
    else:
        _w._send_error(sock, rid, "the snapshot failed: " + _exc_text(exc))


# ---------------------------------------------------------------- restore


class _Source(object):
    """The raw bytes that follow a restore request, N of them."""

    def __init__(self, reader, n):
        self.reader = reader
        self.left = n
        self.eof = False
        # For what is skipped: allocated now, not when memory may be short.
        self.scratch = memoryview(bytearray(1 << 16))

    def readinto(self, view):
        """Fill view as far as the bytes left allow; the count."""
        want = min(len(view), self.left)
        got = 0
        while got < want:
            k = self.reader.read_into(view[got:want])
            if not k:
                self.eof = True  # the Go side hung up
                break
            got += k
            self.left -= k
        return got

    def skip(self):
        """Consume the rest (not interruptible: called outside _guarded)."""
        while self.left > 0 and not self.eof:
            self.readinto(self.scratch)


class _Stream(object):
    """The frames of a restore stream. Its state changes only in critical
    sections, so that after an interruption the rest can be read."""

    def __init__(self, src):
        self.src = src
        self.kind = None
        self.left = 0  # payload bytes of the current frame not read
        self.name = None  # the record being restored, not yet reported
        self.done = True  # the current record's E (or A) was read

    def exact(self, n):
        buf = bytearray(n)
        with memoryview(buf) as view:
            if self.src.readinto(view) != n:
                raise _Damaged("it ends early")
        return bytes(buf)

    def magic(self):
        with _critical:
            data = self.exact(len(MAGIC))
        if data != MAGIC:
            raise _Damaged("it is not a pysandbox snapshot")

    def next_frame(self):
        with _critical:
            if self.left:
                raise _Damaged("a frame was not read whole")
            head = self.exact(5)
            kind, n = head[:1], int.from_bytes(head[1:], "big")
            if n > self.src.left:
                raise _Damaged("a frame of %d bytes, %d left" % (n, self.src.left))
            self.kind, self.left = kind, n
        return kind

    def meta(self):
        """The JSON payload of an H or R frame; an R frame opens its record."""
        with _critical:
            if self.left > MAX_META_FRAME:
                raise _Damaged("a %s frame of %d bytes" % (self.kind.decode("latin-1"), self.left))
            data = self.exact(self.left)
            self.left = 0
            try:
                head = _loads(data)
            except Exception:
                head = None
            if not isinstance(head, dict):
                raise _Damaged("a %s frame that is not a JSON object" % self.kind.decode("latin-1"))
            if self.kind == b"R":
                name = head.get("name")
                if not isinstance(name, str) or len(_dumps(name)) > MAX_NAME_JSON:
                    raise _Damaged("a record without a valid name")
                self.name, self.done = name, False
        _raise_pending()
        return head

    def data_into(self, view):
        """Read the current record's data into view: the count (short at
        the record's end). Raises _Abandoned at its A frame."""
        with _critical:
            got = 0
            n = len(view)
            while got < n:
                if not self.left:
                    if self.done:
                        break
                    kind = self.next_frame()
                    if kind == b"D":
                        continue
                    if kind == b"E" or kind == b"A":
                        if self.left:
                            raise _Damaged("an %s frame with a payload" % kind.decode("latin-1"))
                        self.done = True
                        if kind == b"A":
                            raise _Abandoned()
                        break
                    raise _Damaged("a %r frame inside a record" % (kind,))
                k = self.src.readinto(view[got:got + min(self.left, n - got)])
                if not k:
                    raise _Damaged("it ends early")
                self.left -= k
                got += k
        _raise_pending()
        return got

    def end_module(self):
        """Read the E frame that ends a module's record."""
        with _critical:
            if self.next_frame() != b"E" or self.left:
                raise _Damaged("a module record with data")
            self.done = True
        _raise_pending()

    def end_record(self):
        """Skip what the unpickler left of the record, up to its end."""
        while not self.done:
            self.data_into(self.src.scratch)

    def skip_frame(self):
        with _critical:
            while self.left:
                k = self.src.readinto(self.src.scratch[:min(self.left, len(self.src.scratch))])
                if not k:
                    raise _Damaged("it ends early")
                self.left -= k


class _RecordFile(object):
    """The file an Unpickler reads: the data of the current record."""

    def __init__(self, stream):
        self.stream = stream

    def readinto(self, buf):
        with memoryview(buf) as view:
            if view.ndim != 1 or view.format != "B":
                view = view.cast("B")
            return self.stream.data_into(view)

    def read(self, n=-1):
        if n is None or n < 0:
            n = 1 << 16
        buf = bytearray(n)
        k = self.readinto(buf)
        del buf[k:]
        return bytes(buf)

    def readline(self):
        line = bytearray()
        while not line.endswith(b"\n"):
            c = self.read(1)
            if not c:
                break
            line += c
        return bytes(line)


_restore_ns = None  # the namespace being restored into
_restore_sources = {}  # a cell's filename: its code compiled again (another Python)


def _target():
    return _restore_ns if _restore_ns is not None else sys.modules["__main__"].__dict__


def _restore_all(stream, ns, report):
    stream.magic()
    if stream.next_frame() != b"H":
        raise _Damaged("no header")
    stream.meta()
    file = _RecordFile(stream)
    unpickler = None
    while True:
        kind = stream.next_frame()
        if kind == b"Z":
            if stream.left:
                raise _Damaged("a Z frame with a payload")
            return
        if kind != b"R":
            raise _Damaged("a %r frame between records" % (kind,))
        head = stream.meta()
        name = stream.name
        if not report.room(name):
            stream.name = None
            try:
                stream.end_record()
            except _Abandoned:
                pass
            continue
        module = head.get("module")
        if module is not None:
            stream.end_module()
            try:
                if module == "":
                    ns[name] = ns
                elif not isinstance(module, str) or module.startswith("."):
                    raise ImportError("bad module name %r" % (module,))
                else:
                    ns[name] = _import_module(module)
            except (KeyboardInterrupt, _Damaged):
                raise
            except BaseException as e:
                _failed(report, stream, name, e)
                continue
            stream.name = None
            report.add_ok(name)
            continue
        if unpickler is None or head.get("fresh") is True:
            unpickler = _Unpickler(file)
        try:
            value = unpickler.load()
        except (KeyboardInterrupt, _Damaged):
            raise
        except BaseException as e:
            if isinstance(e, _Abandoned):
                stream.name = None  # the snapshot listed it as unsaveable
            else:
                try:
                    stream.end_record()
                except _Abandoned:
                    pass
                _failed(report, stream, name, e)
            # The unpickler may hold unread bytes of the record: a new one,
            # with what it remembered, for the records that refer to it.
            memo = unpickler.memo.copy()
            unpickler = _Unpickler(file)
            unpickler.memo = memo
            del memo
            continue
        try:
            stream.end_record()
        except _Abandoned:
            stream.name = None
            continue
        ns[name] = value
        del value
        stream.name = None
        report.add_ok(name)


def _failed(report, stream, name, exc):
    if isinstance(exc, MemoryError):
        _w._release_reserve()
        text = "out of memory"
    else:
        text = "%s: %s" % (_type_name(exc), _safe_str(exc))
    stream.name = None
    report.add_bad(name, text)


def _drain(stream, report, why):
    """After an interruption or damage: list the records left as failed
    (why), and consume the rest of the stream."""
    try:
        if stream.name is not None:
            report.add_bad(stream.name, why)
            stream.name = None
        while True:
            stream.skip_frame()
            if not stream.done:
                try:
                    stream.end_record()
                except _Abandoned:
                    pass
            kind = stream.next_frame()
            if kind == b"Z":
                break
            if kind == b"R":
                stream.meta()
                if report.room(stream.name):
                    report.add_bad(stream.name, why)
                stream.name = None
    except (_Damaged, _Abandoned):
        pass
    stream.src.skip()


def _acquire_channel():
    """Read the raw bytes as the channel's only reader: since a tool call
    of the process, another thread may lead its reads (see _Channel)."""
    ch = _w._chan
    if ch is None or not ch.demux:
        return None
    me = _thread.get_ident()
    while True:
        with ch.mu:
            if ch.leader is None:
                ch.leader = me
                return ch
        time.sleep(0.001)


def _release_channel(ch):
    if ch is not None:
        with ch.mu:
            ch.leader = None
            ch._hand_over()


def _restore(sock, rid, req, session):
    global _restore_ns
    n = req.get("bytes", 0)  # omitted when 0
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        # Nothing can be read in step: the Go side never sends this.
        _w._send_error(sock, rid, "bytes must be a non-negative integer")
        return
    src = _Source(_w._chan.reader, n)
    stream = _Stream(src)
    report = _Report()
    ch = _acquire_channel()
    shielded = _w._shield_sigint()
    exc = None
    try:
        if session is None:
            src.skip()
            _w._send_error(sock, rid, "restore is for sessions only, not a one-shot worker")
            return
        ns = session.__dict__
        if "__builtins__" not in ns:
            ns["__builtins__"] = builtins  # as the first run would: functions need them
        sys.modules["__main__"] = session
        _w._refresh_cwd_imports()  # the workspace was restored just before
        _restore_ns = ns
        try:
            ok, exc = _w._guarded(_restore_all, stream, ns, report)
        finally:
            _restore_ns = None
            _restore_sources.clear()
        if isinstance(exc, KeyboardInterrupt):
            _drain(stream, report, "the restore was interrupted")
        elif isinstance(exc, _Damaged) and report.ok == [] and report.bad == [] and stream.kind in (None, b"H"):
            src.skip()
            _w._send_error(sock, rid, "the snapshot cannot be read: %s" % (_safe_str(exc),))
            return
        elif exc is not None:
            if isinstance(exc, MemoryError):
                _w._release_reserve()
            why = "the snapshot could not be read: %s" % (_safe_str(exc) if isinstance(exc, _Damaged) else
                                                          "%s: %s" % (_type_name(exc), _safe_str(exc)))
            name = stream.name if stream.name is not None else ""
            stream.name = None
            report.add_bad(name, why)
            _drain(stream, report, why)
        src.skip()
    finally:
        src.skip()
        _w._unshield_sigint(shielded)
        _release_channel(ch)
    exc = None
    report.finish("restored")
    _w._restore_sigint_handler()
    _w._take_reserve()
    _w._flush_output()
    _w._send(sock, {"op": "restored", "id": rid, "restored": report.ok, "failed": report.bad})


# ---------------------------------------------------------------- reconstructors
#
# Named in the streams as _pysandbox_snapshot.NAME: keep their names and
# arguments, or streams of earlier versions stop loading.


def _session_dict():
    return _target()


def _import(name):
    return _import_module(name)


def _worker_attr(name):
    return getattr(_w, name)


def _lookup(name):
    ns = _target()
    if name not in ns:
        raise LookupError("%s was not restored" % (name,))
    return ns[name]


def _load_code(data, tag, src, where):
    filename, text = src
    if text is not None and filename not in linecache.cache:
        # Tracebacks show the cell's lines again, as the worker had them.
        _w._register_source(text, filename)
    if tag == CODE_TAG:
        code = _marshal_loads(data)
        if isinstance(code, _CodeType):
            return code
    if text is None:
        raise ValueError("its code was compiled by another Python (%s) and its source is not known" % (tag,))
    top = _restore_sources.get(filename)
    if top is None:
        top = _restore_sources[filename] = compile(text, filename, "exec", flags=_w.COMPILE_FLAGS,
                                                   dont_inherit=True)
    stack = [top]
    while stack:
        code = stack.pop()
        if (code.co_name, code.co_firstlineno) == tuple(where) and code is not top:
            return code
        stack.extend(c for c in code.co_consts if isinstance(c, _CodeType))
    raise ValueError("its code was compiled by another Python (%s) and is not found in its source" % (tag,))


def _make_code(data, tag, src, where):
    return _load_code(data, tag, src, where)


def _make_function(data, tag, src, where, name, mode):
    code = _load_code(data, tag, src, where)
    if mode is None:
        g = _target()
    elif mode[0] == "module":
        g = _import_module(mode[1]).__dict__
    else:
        g = dict(mode[1])
        g["__builtins__"] = builtins
    closure = tuple(_CellType() for _ in code.co_freevars) or None
    return _FunctionType(code, g, name, None, closure)


def _set_function_state(fn, state):
    fn.__qualname__ = state["qualname"]
    fn.__module__ = state["module"]
    fn.__defaults__ = state["defaults"]
    fn.__kwdefaults__ = state["kwdefaults"]
    fn.__doc__ = state["doc"]
    if state.get("dict"):
        fn.__dict__.update(state["dict"])
    if "annotate" in state:
        fn.__annotate__ = state["annotate"]
    elif state.get("annotations"):
        fn.__annotations__ = state["annotations"]
    if state.get("type_params"):
        fn.__type_params__ = state["type_params"]
    for cell, value in zip(fn.__closure__ or (), state.get("cells") or ()):
        if value is not _EmptyCell:
            cell.cell_contents = value
    return fn


def _make_class(meta, name, bases, kw):
    kw = dict(kw)
    return _new_class(name, bases, {"metaclass": meta}, lambda d: d.update(kw))


def _make_enum(meta, name, bases, kw, members):
    classdict = meta.__prepare__(name, bases)
    for k, v in kw.items():
        classdict[k] = v
    for k, v in members:
        classdict[k] = v
    return meta.__new__(meta, name, bases, classdict)


def _set_class_state(cls, state):
    d, keep = state
    abstract = d.pop("__abstractmethods__", None)
    for k, v in d.items():
        if keep and k in cls.__dict__:
            continue  # an enum's machinery made it anew
        try:
            setattr(cls, k, v)
        except (AttributeError, TypeError):
            pass
    if abstract is not None:
        cls.__abstractmethods__ = abstract
    return cls


def _make_singledispatch(registry):
    import functools

    impls = dict(registry)
    fn = functools.singledispatch(impls.pop(object))
    for cls, impl in impls.items():
        fn.register(cls, impl)
    return fn


def _make_mappingproxy(d):
    return _MappingProxyType(d)


def _make_lru(wrapped, maxsize, typed):
    import functools

    return functools.lru_cache(maxsize=maxsize, typed=typed)(wrapped)


def _make_cached_property(cls, func, attrname, doc):
    p = cls(func)
    p.attrname = attrname
    p.__doc__ = doc
    return p


def _make_typevar(cls, name, constraints, kw):
    tv = cls(name, *constraints, **kw)
    tv.__module__ = _target().get("__name__", "__main__")
    return tv


# ---------------------------------------------------------------- entry


def handle(sock, op, req, rid, session):
    """Answer a "snapshot" or "restore" request (op). Never raises but
    MemoryError, which the worker's loop answers."""
    try:
        if op == "restore":
            _restore(sock, rid, req, session)
        elif session is None:
            _w._send_error(sock, rid, "snapshots are of sessions only, not of a one-shot worker")
        else:
            _snapshot(sock, rid, req, session)
    except MemoryError:
        raise
    except BaseException as e:  # a bug here must not end the session
        _w._send_error(sock, rid, "%s failed: %s: %s" % (op, _type_name(e), _safe_str(e)))
