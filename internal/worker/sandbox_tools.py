"""Call the tools of other MCP servers from Python code.

    import tools
    tools.list()                              # ['github.search_issues', ...]
    help(tools.github.search_issues)          # its arguments and result
    found = tools.github.search_issues(query="bug", limit=5)
    tools.call("github.search_issues", {"query": "bug"})   # by full name

Servers and tools are attributes; a character Python does not allow in a
name becomes "_" (get-sum: get_sum). Arguments are keywords, checked against
the tool's schema before anything is sent; None leaves an optional one out.
A tool returns its structured result (dicts, lists) when it has one, else
its text; non-text content (images...) comes as a list of content dicts.
A refused or failed call raises ToolError, or a subclass that says why
(ToolDenied, ToolCallError, ToolTimeout, ToolArgumentError...).
tools.describe(pattern) and tools.servers() tell what is there.

Calls run in parallel from threads, or with asyncio:

    a, b = await asyncio.gather(tools.x.one.acall(q=1), tools.y.two.acall(q=2))

Tools can be called only while a run is in progress. The server's policy
checks and records each call, and may cap how many a run makes.
"""

import _thread
import json
import sys
import time
import types

__all__ = [
    "call", "acall", "list", "describe", "servers",
    "ToolError", "ToolCallError", "ToolDenied", "ToolApprovalDeclined", "ToolRateLimited",
    "ToolLimitExceeded", "ToolTimeout", "ToolCancelled", "ToolUnavailable", "ToolArgumentError",
    "ToolNotFound",
]

# The worker sets _channel before running this file: call(msg, arguments)
# sends a tool message and returns its answer; epoch changes with each run.
_channel = globals().get("_channel")

MAX_ARGUMENT_BYTES = 1 << 20  # protocol.go's MaxToolArgsBytes
MAX_IN_FLIGHT = 16  # MaxToolCallsInFlight: calls beyond it wait for a turn
# One lock per call the server serves at once (no threading module: the
# worker keeps it out of runs that do not import it).
_slots = [_thread.allocate_lock() for _ in range(MAX_IN_FLIGHT)]


def _take_slot():
    """Waits for one of the MAX_IN_FLIGHT slots; sleeps between tries, so
    that a KeyboardInterrupt (a session's timeout) reaches a main thread
    waiting here."""
    delay = 0.0005
    while True:
        for lock in _slots:
            if lock.acquire(False):
                return lock
        time.sleep(delay)
        delay = min(delay * 2, 0.02)

# As the server's list_tools_in_sandbox spells names (pyIdent).
_KEYWORDS = frozenset((
    "False None True and as assert async await break class continue def del elif else except "
    "finally for from global if import in is lambda nonlocal not or pass raise return try while "
    "with yield").split())
_IDENT_CHARS = frozenset("_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def _ident(name):
    """The attribute name of a server, tool or argument name."""
    out = []
    for i, ch in enumerate(name):
        if ch in _IDENT_CHARS:
            if i == 0 and ch.isdigit():
                out.append("_")
            out.append(ch)
        else:
            out.append("_")
    ident = "".join(out) or "_"
    return ident + "_" if ident in _KEYWORDS else ident


# ---------------------------------------------------------------- errors


class ToolError(Exception):
    """A tool call failed or was refused.

    kind is why (the protocol's ToolFailure kind), tool the tool's full name
    (SERVER.TOOL), message the reason; str() gives both.
    """

    kind = "error"

    def __init__(self, tool, message, kind=None):
        self.tool = tool
        self.message = message
        if kind is not None:
            self.kind = kind
        text = message if not tool or _names(message, tool) else "%s: %s" % (tool, message)
        Exception.__init__(self, text)

    def __reduce__(self):
        return (type(self), (self.tool, self.message, self.kind), self.__dict__)


def _names(text, name):
    """Whether text mentions name as a whole (not a.bc for a.b)."""
    start = text.find(name)
    while start >= 0:
        before = text[start - 1:start]
        after = text[start + len(name):start + len(name) + 1]
        if not (before and (before in _IDENT_CHARS or before in ".-")) and not (after and (after in _IDENT_CHARS or after == "-")):
            return True
        start = text.find(name, start + 1)
    return False


class ToolCallError(ToolError):
    """The tool ran and reported an error; content is what it said (a list
    of content dicts)."""

    kind = "tool_error"
    content = None


class ToolDenied(ToolError):
    """The server's policy does not allow this tool."""

    kind = "denied"


class ToolApprovalDeclined(ToolDenied):
    """The user did not approve the call."""

    kind = "declined"


class ToolRateLimited(ToolError):
    """A rate limit of the server's policy refused the call."""

    kind = "rate_limited"


class ToolLimitExceeded(ToolError):
    """A cap of this run (calls, bytes, calls in flight) refused the call."""

    kind = "limit"


class ToolTimeout(ToolError, TimeoutError):
    """The run's time ran out during the call."""

    kind = "timeout"


class ToolCancelled(ToolError):
    """The run was cancelled or ended, or no run is in progress."""

    kind = "cancelled"


class ToolUnavailable(ToolError):
    """The tool's server has failed, is still connecting after the wait
    for it, or failed during the call."""

    kind = "unavailable"


class ToolArgumentError(ToolError, TypeError):
    """The arguments do not match the tool's input schema."""

    kind = "invalid_arguments"


class ToolNotFound(ToolError, AttributeError):
    """No tool (or server) of that name."""

    kind = "unknown_tool"


_KINDS = dict((cls.kind, cls) for cls in (
    ToolCallError, ToolDenied, ToolApprovalDeclined, ToolRateLimited, ToolLimitExceeded, ToolTimeout,
    ToolCancelled, ToolUnavailable, ToolArgumentError, ToolNotFound))


def _failure(tool, error):
    if not isinstance(error, dict):
        error = {}
    kind = error.get("kind")
    kind = kind if isinstance(kind, str) else "error"
    message = error.get("message")
    if not isinstance(message, str) or not message:
        message = "the call failed (%s)" % kind
    exc = _KINDS.get(kind, ToolError)(tool, message, kind)
    if isinstance(exc, ToolCallError):
        exc.content = error.get("content")
    return exc


def _not_found(what, name, key, candidates):
    """ToolNotFound for name, with the candidates ({key: shown}) whose key
    is close to key as suggestions."""
    import difflib

    close = difflib.get_close_matches(key, sorted(candidates), n=3, cutoff=0.6)
    hint = "; did you mean %s?" % " or ".join(candidates[c] for c in close) if close else ""
    return ToolNotFound(name, "no %s of that name%s (tools.list() lists them)" % (what, hint))


# ---------------------------------------------------------------- catalog


class _Catalog(object):
    """The tools one run may call, as the server listed them."""

    def __init__(self, reply):
        self.specs = {}  # full name: spec
        self.by_server = {}  # server: {attribute: full name}
        self.server_attrs = {}  # attribute: server
        self.objects = {}  # built lazily: Tool and _Server objects
        tools = reply.get("tools")
        for spec in tools if isinstance(tools, type([])) else ():
            if isinstance(spec, dict) and isinstance(spec.get("name"), str):
                spec.setdefault("server", spec["name"].partition(".")[0])
                spec.setdefault("tool", spec["name"].partition(".")[2])
                self.specs[spec["name"]] = spec
        self.servers = []
        listed = reply.get("servers")
        for st in listed if isinstance(listed, type([])) else ():
            if isinstance(st, dict) and isinstance(st.get("name"), str):
                self.servers.append({"name": st["name"], "status": st.get("status", ""),
                                     "error": st.get("error", ""), "tools": st.get("tools", 0)})
        names = set(st["name"] for st in self.servers)
        names.update(spec["server"] for spec in self.specs.values())
        # A clash goes to the name spelled exactly like the attribute, else
        # to the first in order; the others stay reachable by tools.call.
        for server in sorted(names, key=lambda n: (_ident(n) != n, n)):
            self.server_attrs.setdefault(_ident(server), server)
            self.by_server.setdefault(server, {})
        for full in sorted(self.specs, key=lambda n: (_ident(self.specs[n]["tool"]) != self.specs[n]["tool"], n)):
            spec = self.specs[full]
            self.by_server.setdefault(spec["server"], {}).setdefault(_ident(spec["tool"]), full)

    def server(self, attr):
        name = self.server_attrs.get(attr)
        if name is None:
            raise _not_found("server", attr, attr, dict((a, a) for a in self.server_attrs))
        key = ("server", name)
        if key not in self.objects:
            self.objects[key] = _Server(name)
        return self.objects[key]

    def tool(self, full):
        spec = self.specs.get(full)
        if spec is None:
            raise self.missing(full)
        if full not in self.objects:
            self.objects[full] = Tool(spec)
        return self.objects[full]

    def resolve(self, name):
        """The full name that name (full, or as attributes) stands for. One
        not listed is taken as it is: the server says whether it exists,
        or whether the policy hides it."""
        if not isinstance(name, str) or "." not in name:
            raise ToolNotFound(str(name), "a tool's full name is SERVER.TOOL, as tools.list() gives them")
        if name in self.specs:
            return name
        server, _, tool = name.partition(".")
        return self.by_server.get(self.server_attrs.get(server, server), {}).get(tool, name)

    def missing(self, name):
        """ToolNotFound for a full name, suggesting tools of its server
        (or of any server)."""
        server, _, tool = name.partition(".")
        server = self.server_attrs.get(server, server)
        if server in self.by_server:
            candidates = dict((self.specs[f]["tool"], f) for f in self.by_server[server].values())
            return _not_found("tool", name, tool, candidates)
        return _not_found("tool", name, name, dict((f, f) for f in self.specs))


_catalog_lock = _thread.allocate_lock()
_state = None  # (the channel's epoch, its _Catalog)


def _catalog():
    """The catalog of the current run, fetched on first use in each run."""
    global _state
    ch = _channel
    if ch is None:
        raise ToolUnavailable("", "the tools module works only in a sandbox run given tools")
    state = _state
    if state is not None and state[0] == ch.epoch:
        return state[1]
    with _catalog_lock:
        epoch = ch.epoch
        state = _state
        if state is not None and state[0] == epoch:
            return state[1]
        reply = ch.call({"op": "tool_catalog"})
        if not isinstance(reply, dict) or reply.get("error"):
            raise _failure("", reply.get("error") if isinstance(reply, dict) else None)
        cat = _Catalog(reply)
        _state = (epoch, cat)
        return cat


# ---------------------------------------------------------------- calls


def _invoke(full, kwargs):
    cat = _catalog()
    spec = cat.specs.get(full)
    # A tool the catalog does not list is checked by the server alone.
    payload = _arguments(full, spec, kwargs) if spec is not None else dict(kwargs)
    try:
        text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise ToolArgumentError(full, "arguments cannot be sent as JSON: %s" % (e,)) from None
    if len(text) > MAX_ARGUMENT_BYTES:
        raise ToolLimitExceeded(full, "arguments of %d bytes as JSON; a call may send at most %d"
                                % (len(text), MAX_ARGUMENT_BYTES))
    # The server serves MAX_IN_FLIGHT calls of a run at once and refuses
    # more: threads beyond that wait here for their turn.
    slot = _take_slot()
    try:
        reply = _channel.call({"op": "tool_call", "name": full}, text)
    finally:
        slot.release()
    if spec is None and isinstance(reply, dict) and isinstance(reply.get("error"), dict) \
            and reply["error"].get("kind") == ToolNotFound.kind:
        raise cat.missing(full)  # with suggestions
    return _result(full, reply)


def _result(full, reply):
    if not isinstance(reply, dict):
        raise ToolError(full, "malformed answer")
    if reply.get("error"):
        raise _failure(full, reply["error"])
    if reply.get("structured") is not None:
        return reply["structured"]
    content = reply.get("content")
    if not content:
        return None
    if isinstance(content, type([])) and all(isinstance(c, dict) and c.get("type") == "text" for c in content):
        return "\n".join(c.get("text") or "" for c in content)
    return content


def _arguments(full, spec, kwargs):
    """kwargs as the tool's arguments object, checked against its schema."""
    schema = spec.get("input_schema")
    schema = schema if isinstance(schema, dict) else {}
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    required = set(required) if isinstance(required, type([])) else set()
    idents = _param_names(spec)
    extra = schema.get("additionalProperties")
    open_ = not props or extra is True or isinstance(extra, dict)
    payload = {}
    for key, value in kwargs.items():
        name = key if key in props else idents.get(key)
        if name is None:
            if not open_:
                import difflib

                close = difflib.get_close_matches(key, sorted(idents), n=1)
                raise ToolArgumentError(full, "unexpected argument %r%s; it takes %s" % (
                    key, " (did you mean %r?)" % close[0] if close else "",
                    ", ".join(sorted(idents)) or "no arguments"))
            name = key
        if value is None and name not in required and not _accepts_null(props.get(name)):
            continue  # None leaves an optional argument out
        if name in payload:
            raise ToolArgumentError(full, "argument %r given twice" % name)
        payload[name] = value
    error = _validate(payload, schema, [schema, 0], (), 0)
    if error is not None:
        raise ToolArgumentError(full, _describe_error(error))
    return payload


def _param_names(spec):
    """{Python name: property} for a tool's arguments."""
    names = spec.get("_params")
    if names is None:
        schema = spec.get("input_schema")
        props = schema.get("properties") if isinstance(schema, dict) else None
        names = {}
        for prop in sorted(props if isinstance(props, dict) else (), key=lambda p: (_ident(p) != p, p)):
            names.setdefault(_ident(prop), prop)
        spec["_params"] = names
    return names


def _accepts_null(schema):
    # Only a schema that says so: one that says nothing gets no null.
    return isinstance(schema, dict) and any(k in schema for k in ("type", "anyOf", "oneOf", "enum", "const")) \
        and _validate(None, schema, [schema, 0], (), 0) is None


# ---------------------------------------------------------------- schemas
#
# What tool schemas use of JSON Schema; other keywords are ignored. An error
# is (path, text): path the keys and indexes down to the value. ctx is
# [the root schema, steps taken].

_JSON_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, (type([]), tuple)),
    "null": lambda v: v is None,
}
_MAX_DEPTH = 64
_MAX_STEPS = 100000  # a schema that branches on itself is checked no further
_patterns = {}


def _validate(value, schema, ctx, path, depth):
    if schema is False:
        return path, "is not allowed"
    ctx[1] += 1
    if not isinstance(schema, dict) or depth > _MAX_DEPTH or ctx[1] > _MAX_STEPS:
        return None  # the server checks what is left
    ref = schema.get("$ref")
    if isinstance(ref, str):
        error = _validate(value, _resolve_ref(ctx[0], ref), ctx, path, depth + 1)
        if error is not None:
            return error
    types_ = schema.get("type")
    if types_ is not None:
        types_ = [types_] if isinstance(types_, str) else [t for t in types_ if isinstance(t, str)] \
            if isinstance(types_, type([])) else []
        if schema.get("nullable") is True:
            types_.append("null")
        if types_ and not any(_JSON_TYPES.get(t, lambda v: True)(value) for t in types_):
            return path, "expected %s, got %s" % (" or ".join(types_), type(value).__name__)
    if "enum" in schema and isinstance(schema["enum"], type([])) \
            and not any(_json_equal(value, e) for e in schema["enum"]):
        return path, "must be one of %s, got %s" % (", ".join(_short(e) for e in schema["enum"]), _short(value))
    if "const" in schema and not _json_equal(value, schema["const"]):
        return path, "must be %s, got %s" % (_short(schema["const"]), _short(value))
    if isinstance(value, str):
        error = _check_string(value, schema, path)
    elif _JSON_TYPES["number"](value):
        error = _check_number(value, schema, path)
    elif isinstance(value, (type([]), tuple)):
        error = _check_array(value, schema, ctx, path, depth)
    elif isinstance(value, dict):
        error = _check_object(value, schema, ctx, path, depth)
    else:
        error = None
    if error is not None:
        return error
    return _check_combinators(value, schema, ctx, path, depth)


def _check_string(value, schema, path):
    n = schema.get("minLength")
    if isinstance(n, int) and len(value) < n:
        return path, "must be at least %d characters long, got %d" % (n, len(value))
    n = schema.get("maxLength")
    if isinstance(n, int) and len(value) > n:
        return path, "must be at most %d characters long, got %d" % (n, len(value))
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        if pattern not in _patterns:
            import re

            try:
                _patterns[pattern] = re.compile(pattern)
            except (re.error, RecursionError, ValueError):
                _patterns[pattern] = None  # not a Python regex: not checked
        regex = _patterns[pattern]
        if regex is not None and not regex.search(value):
            return path, "must match the pattern %r" % pattern
    return None


def _check_number(value, schema, path):
    def num(key):
        v = schema.get(key)
        return v if _JSON_TYPES["number"](v) else None

    lo, hi = num("minimum"), num("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if xlo is True:  # draft 4: a flag on minimum
        lo, xlo = None, lo
    if xhi is True:
        hi, xhi = None, hi
    xlo = xlo if _JSON_TYPES["number"](xlo) else None
    xhi = xhi if _JSON_TYPES["number"](xhi) else None
    if lo is not None and value < lo:
        return path, "must be at least %s, got %s" % (lo, value)
    if hi is not None and value > hi:
        return path, "must be at most %s, got %s" % (hi, value)
    if xlo is not None and value <= xlo:
        return path, "must be greater than %s, got %s" % (xlo, value)
    if xhi is not None and value >= xhi:
        return path, "must be less than %s, got %s" % (xhi, value)
    m = num("multipleOf")
    if m and m > 0:
        q = value / m
        if abs(q - round(q)) > 1e-9 * max(1.0, abs(q)):
            return path, "must be a multiple of %s, got %s" % (m, value)
    return None


def _check_array(value, schema, ctx, path, depth):
    n = schema.get("minItems")
    if isinstance(n, int) and len(value) < n:
        return path, "must have at least %d items, got %d" % (n, len(value))
    n = schema.get("maxItems")
    if isinstance(n, int) and len(value) > n:
        return path, "must have at most %d items, got %d" % (n, len(value))
    items = schema.get("items")
    prefix = schema.get("prefixItems")
    if isinstance(items, type([])):  # draft 4: one schema per position
        prefix, items = items, schema.get("additionalItems")
    prefix = prefix if isinstance(prefix, type([])) else []
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        if sub is None:
            continue
        error = _validate(item, sub, ctx, path + (i,), depth + 1)
        if error is not None:
            return error
    if schema.get("uniqueItems") is True and len(value) <= 1000:
        for i in range(len(value)):
            for j in range(i):
                if _json_equal(value[i], value[j]):
                    return path, "must not repeat items (%d repeats %d)" % (i, j)
    return None


def _check_object(value, schema, ctx, path, depth):
    required = schema.get("required")
    for name in required if isinstance(required, type([])) else ():
        if name not in value:
            if not path:
                return path, "missing required argument %r" % name
            return path, "missing required property %r" % name
    n = schema.get("minProperties")
    if isinstance(n, int) and len(value) < n:
        return path, "must have at least %d properties" % n
    n = schema.get("maxProperties")
    if isinstance(n, int) and len(value) > n:
        return path, "must have at most %d properties" % n
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    patterns = schema.get("patternProperties")
    patterns = patterns if isinstance(patterns, dict) else {}
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        matched = False
        if key in props:
            matched = True
            error = _validate(item, props[key], ctx, path + (key,), depth + 1)
            if error is not None:
                return error
        for pattern, sub in patterns.items():
            if _check_string(key, {"pattern": pattern}, ()) is None:
                matched = True
                error = _validate(item, sub, ctx, path + (key,), depth + 1)
                if error is not None:
                    return error
        if matched or extra is None or extra is True:
            continue
        if extra is False:
            if not path:
                return path, "unexpected argument %r" % key
            return path, "unexpected property %r" % key
        error = _validate(item, extra, ctx, path + (key,), depth + 1)
        if error is not None:
            return error
    return None


def _check_combinators(value, schema, ctx, path, depth):
    for sub in schema.get("allOf") or ():
        error = _validate(value, sub, ctx, path, depth + 1)
        if error is not None:
            return error
    for key in ("anyOf", "oneOf"):
        subs = schema.get(key)
        if not isinstance(subs, type([])) or not subs:
            continue
        errors = [_validate(value, sub, ctx, path, depth + 1) for sub in subs]
        passed = sum(1 for e in errors if e is None)
        if passed == 0:
            expected = [e[1][len("expected "):].partition(", got ")[0] for e in errors
                        if e[0] == path and e[1].startswith("expected ")]
            if len(expected) == len(errors):
                return path, "expected %s, got %s" % (" or ".join(expected), type(value).__name__)
            deepest = max(errors, key=lambda e: len(e[0]))
            if deepest[0] != path:
                return deepest
            return path, "matches none of the allowed forms (%s)" % errors[0][1]
        if key == "oneOf" and passed > 1:
            return path, "matches more than one of the allowed forms"
    sub = schema.get("not")
    if isinstance(sub, dict) and _validate(value, sub, ctx, path, depth + 1) is None:
        return path, "matches a form that is not allowed"
    return None


def _resolve_ref(root, ref):
    """The schema a local $ref points to ("#/$defs/x"), or {} (ignored)."""
    if not ref.startswith("#"):
        return {}
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, type([])) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return {}
    return node


def _json_equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (type([]), tuple)) and isinstance(b, (type([]), tuple)):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if type(a) in (type([]), tuple, dict) or type(b) in (type([]), tuple, dict):
        return False
    try:
        return bool(a == b)
    except Exception:
        return False


def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe_error(error):
    path, text = error
    if not path:
        return text
    where = "argument %r" % (path[0],) + "".join("[%r]" % (p,) for p in path[1:])
    return "%s: %s" % (where, text)


# ---------------------------------------------------------------- documentation


def _type_text(schema, depth=0):
    """A schema's type in words: "string", "array of integer"..."""
    if not isinstance(schema, dict) or depth > 4:
        return "any"
    if isinstance(schema.get("enum"), type([])) and schema["enum"]:
        return "one of " + ", ".join(_short(e) for e in schema["enum"][:10])
    if "const" in schema:
        return _short(schema["const"])
    t = schema.get("type")
    if isinstance(t, type([])):
        return " or ".join(_type_text(dict(schema, type=x), depth + 1) for x in t)
    if t == "array" and isinstance(schema.get("items"), dict):
        return "array of " + _type_text(schema["items"], depth + 1)
    if isinstance(t, str):
        return t
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), type([])):
            return " or ".join(_type_text(s, depth + 1) for s in schema[key])
    if isinstance(schema.get("$ref"), str):
        return schema["$ref"].rpartition("/")[2]
    return "object" if "properties" in schema else "any"


_PY_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict,
             "array": type([]), "null": None}
_PY_NAMES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "object": "dict",
             "null": "None"}


def _py_hint(schema, depth=0):
    """A Python type hint for a schema, as list_tools_in_sandbox shows it."""
    if not isinstance(schema, dict) or depth > 4:
        return "Any"
    enum = schema.get("enum")
    if isinstance(enum, type([])) and 0 < len(enum) <= 8:
        return "Literal[%s]" % ", ".join(json.dumps(e) for e in enum)
    t = schema.get("type")
    if t == "array":
        items = schema.get("items")
        return "list[%s]" % _py_hint(items, depth + 1) if isinstance(items, dict) else "list"
    if isinstance(t, str):
        return _PY_NAMES.get(t, "Any")
    if isinstance(t, type([])):
        parts = [_py_hint(dict(schema, type=x), depth + 1) for x in t if isinstance(x, str)]
        return " | ".join(parts) if parts else "Any"
    return "Any"


def _annotation(schema):
    # A class where one says it all (shown bare), else the hint as text.
    t = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(t, str) and t in _PY_TYPES and t != "array" and not schema.get("enum"):
        return _PY_TYPES[t]
    return _py_hint(schema)


def _params(spec):
    """(Python name, property, schema, required), required ones first."""
    schema = spec.get("input_schema")
    schema = schema if isinstance(schema, dict) else {}
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    required = set(required) if isinstance(required, type([])) else set()
    out = []
    for ident, prop in _param_names(spec).items():
        out.append((ident, prop, props.get(prop), prop in required))
    out.sort(key=lambda p: (not p[3], p[0]))
    return out


def _open(spec):
    schema = spec.get("input_schema")
    if not isinstance(schema, dict):
        return True
    extra = schema.get("additionalProperties")
    return not schema.get("properties") or extra is True or isinstance(extra, dict)


def _signature_text(spec):
    parts = []
    for ident, _, schema, required in _params(spec):
        text = "%s: %s" % (ident, _py_hint(schema))
        if not required:
            default = schema.get("default") if isinstance(schema, dict) else None
            text += " = " + repr(default)
        parts.append(text)
    if _open(spec):
        parts.append("**arguments")
    ret = "dict" if spec.get("output_schema") else "str"
    head = "tools.%s.%s(" % (_ident(spec["server"]), _ident(spec["tool"]))
    return head + ("*, " if parts and not parts[0].startswith("**") else "") + ", ".join(parts) + ") -> " + ret


def _doc(spec):
    lines = []
    desc = spec.get("description")
    if isinstance(desc, str) and desc.strip():
        lines += [desc.strip(), ""]
    params = _params(spec)
    if params:
        lines.append("Arguments:")
        for ident, prop, schema, required in params:
            what = [_type_text(schema), "required" if required else "optional"]
            if not required and isinstance(schema, dict) and "default" in schema:
                what.append("default " + _short(schema["default"]))
            if ident != prop:
                what.append("sent as %r" % prop)
            text = "  %s (%s)" % (ident, ", ".join(what))
            pdesc = schema.get("description") if isinstance(schema, dict) else None
            if isinstance(pdesc, str) and pdesc.strip():
                text += ": " + " ".join(pdesc.split())
            lines.append(text)
        lines.append("")
    out = spec.get("output_schema")
    if isinstance(out, dict):
        lines.append("Returns: " + _summary(out))
    else:
        lines.append("Returns: its text (str); a list of content dicts if it returns images or other "
                     "non-text content.")
    lines.append("")
    lines.append('Full name: %s; tools.call("%s", {...}) calls it too.' % (spec["name"], spec["name"]))
    if spec.get("approval"):
        lines.append("The user is asked to approve the first call of each run.")
    return "\n".join(lines)


def _summary(schema):
    """An output schema in a line: dict {name: type, ...}."""
    props = schema.get("properties")
    if isinstance(props, dict) and props:
        fields = ["%s: %s" % (k, _type_text(v)) for k, v in props.items()]
        text = ", ".join(fields[:12]) + (", ..." if len(fields) > 12 else "")
        return "dict {%s}" % text
    return _type_text(schema)


# ---------------------------------------------------------------- objects


class Tool(object):
    """A tool: call it with keyword arguments, or await tool.acall(...)."""

    def __init__(self, spec):
        self.name = spec["name"]  # the full name, SERVER.TOOL
        self.server = spec["server"]
        self.description = spec.get("description") or ""
        self.input_schema = spec.get("input_schema")
        self.output_schema = spec.get("output_schema")
        self.__name__ = _ident(spec["tool"])
        self.__qualname__ = "%s.%s" % (_ident(spec["server"]), self.__name__)
        self.__module__ = __name__
        self.__doc__ = _doc(spec)
        self._spec = spec

    def __call__(self, *args, **kwargs):
        if args:
            raise ToolArgumentError(self.name, "takes keyword arguments only: %s" % _signature_text(self._spec))
        return _invoke(self.name, kwargs)

    def acall(self, **kwargs):
        """The call as an awaitable, to run calls in parallel."""
        return _acall(self.name, kwargs)

    def __get__(self, obj, cls=None):
        # Makes help() and inspect treat a tool as a function (a method
        # descriptor), also when kept as a class attribute.
        return self

    @property
    def __signature__(self):
        import inspect

        P = inspect.Parameter
        params = []
        for ident, _, schema, required in _params(self._spec):
            default = P.empty
            if not required:
                default = schema.get("default") if isinstance(schema, dict) else None
            params.append(P(ident, P.KEYWORD_ONLY, default=default, annotation=_annotation(schema)))
        if _open(self._spec):
            params.append(P("arguments", P.VAR_KEYWORD))
        ret = dict if self._spec.get("output_schema") else str
        return inspect.Signature(params, return_annotation=ret)

    def __repr__(self):
        return "<tool %s: %s>" % (self.name, _signature_text(self._spec))


class _Server(object):
    """The tools of one server, as attributes."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        cat = _catalog()
        tools = cat.by_server.get(self._name, {})
        if attr not in tools:
            for st in cat.servers if not tools else ():
                if st["name"] == self._name and st["status"] != "ready":
                    # The catalog waited for servers starting for the first
                    # time, and lists the tools of those restarting after
                    # they worked: a server here without tools has failed,
                    # or was still connecting after that wait.
                    why = " (%s)" % st["error"] if st["error"] else ""
                    if st["status"] == "connecting":
                        msg = ("the upstream server %r was still connecting when this run listed the tools%s, so this run "
                               "does not know its tools; a later run will, once it is ready" % (self._name, why))
                    else:
                        state = "has failed" if st["status"] == "failed" else "is " + st["status"]
                        msg = "the upstream server %r %s%s, so its tools cannot be called now" % (self._name, state, why)
                    raise ToolUnavailable("%s.%s" % (self._name, attr), msg)
            candidates = dict((a, "tools.%s.%s" % (_ident(self._name), a)) for a in tools)
            raise _not_found("tool", "%s.%s" % (self._name, attr), attr, candidates)
        return cat.tool(tools[attr])

    def __dir__(self):
        try:
            return sorted(_catalog().by_server.get(self._name, {}))
        except ToolError:
            return []

    def __repr__(self):
        return "<tools server %s>" % self._name


class _Module(types.ModuleType):
    """tools: servers as attributes (see the module's documentation)."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError("module %r has no attribute %r" % (self.__name__, attr))
        return _catalog().server(attr)

    def __dir__(self):
        names = set(__all__)
        try:
            names.update(_catalog().server_attrs)
        except ToolError:
            pass
        return sorted(names)


# ---------------------------------------------------------------- the API


def call(name, arguments=None, **kwargs):
    """Call a tool by its full name, SERVER.TOOL, with a dict of arguments
    and/or keyword arguments: call("github.search_issues", {"query": "x"}).
    (An argument called name or arguments goes in the dict.)"""
    args = {}
    if arguments is not None:
        if not isinstance(arguments, dict):
            raise ToolArgumentError(name, "arguments must be a dict, got %s" % type(arguments).__name__)
        args.update(arguments)
    args.update(kwargs)
    return _invoke(_catalog().resolve(name), args)


def acall(name, arguments=None, **kwargs):
    """call() as an awaitable: await tools.acall("github.search_issues", query="x")."""
    args = dict(arguments) if isinstance(arguments, dict) else {}
    if arguments is not None and not isinstance(arguments, dict):
        raise ToolArgumentError(name, "arguments must be a dict, got %s" % type(arguments).__name__)
    args.update(kwargs)
    return _acall(None, args, name)


_executor = None


async def _acall(full, kwargs, name=None):
    # Each call blocks a thread of our own pool until its answer comes, as
    # many at once as the server serves.
    global _executor
    import asyncio

    if _executor is None:
        with _catalog_lock:
            if _executor is None:
                from concurrent.futures import ThreadPoolExecutor

                _executor = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="tools")
    if full is None:
        full = _catalog().resolve(name)
    loop = asyncio.get_event_loop()
    return await loop.run_in_executor(_executor, _invoke, full, kwargs)


def list(pattern=None):
    """The full names (SERVER.TOOL) of the tools, sorted; pattern narrows
    them: a glob ("github.*", "*issue*") or a substring."""
    names = sorted(_catalog().specs)
    if not pattern:
        return names
    if any(c in pattern for c in "*?["):
        import fnmatch

        return [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    return [n for n in names if pattern.lower() in n.lower()]


def describe(name_or_pattern):
    """How to call the tools a name or pattern names: signature and
    documentation, as text."""
    cat = _catalog()
    try:
        names = [cat.resolve(name_or_pattern)]
    except ToolNotFound:
        names = []
    if not names or names[0] not in cat.specs:
        names = list(name_or_pattern)
    if not names:
        raise cat.missing(name_or_pattern)
    parts = []
    for full in names:
        spec = cat.specs[full]
        doc = "\n".join(("    " + line).rstrip() for line in _doc(spec).splitlines())
        parts.append(_signature_text(spec) + "\n" + doc)
    return "\n\n".join(parts)


def servers():
    """The servers: dicts of name, status (ready, connecting, failed),
    error and the number of their tools this run may call."""
    return [dict(s) for s in _catalog().servers]


# Attribute access on the module (tools.SERVER) goes through _Module.
_self = sys.modules.get(getattr(globals().get("__spec__"), "name", None) or __name__)
if _self is not None and _self.__dict__ is globals():
    _self.__class__ = _Module
del _self
