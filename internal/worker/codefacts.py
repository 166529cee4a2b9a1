# pysandbox code facts: what Python's parser says about a program, without
# running it (internal/codefacts). This file is either the code of a
# sandboxed run, where the program to look at is the string global
# codefacts_source (a run input, never part of this code), or a module the
# worker loads to take the facts of a run's own code before running it
# (codefacts_line; see worker.py's _gate). It parses it with ast.parse, never compile() or
# exec(), walks the tree in loops (never recursing with its depth), and
# prints one JSON line.
#
# It runs on Python 3.6 through 3.13: no syntax or ast API newer than 3.6.
# The parse happens in a forked child, since before 3.11 ast.parse crashes
# the interpreter on some deep trees ("1" + "+1" * 200000): a child that dies
# is reported as unanalysable, not as a run that failed.


def _codefacts_main(source):
    import ast
    import json
    import os
    import re
    import sys
    import warnings

    MAX_ENTRIES = 200  # per list
    MAX_NAME = 200  # characters per name
    MAX_URLS = 100
    MAX_URL = 2000
    NAME_BUDGET = 24 << 10  # JSON bytes per list of names
    URL_BUDGET = 96 << 10  # JSON bytes of the URLs
    MAX_OUTPUT = 250 << 10  # the whole line (the server reads 256 KiB)
    MAX_BINDINGS = 16  # meanings one name may have
    MAX_CALL_DEPTH = 8  # calls looked through in one dotted name
    MAX_URL_SCAN = 10000  # distinct URLs gathered before the cut

    LISTS = ("imports", "process_calls", "file_calls", "network_calls", "dynamic_code")

    try:
        import builtins as _b
    except ImportError:  # pragma: no cover
        _b = None
    BUILTIN_NAMES = set(dir(_b)) if _b is not None else set()
    BUILTIN_NAMES.update(("exec", "__builtins__", "__import__"))

    # Module prefixes: a dotted name rooted in an import matches a prefix p
    # when it is p or starts with p + ".". "os.exec" and "os.spawn" also
    # match os.execv, os.spawnlp, ...
    PROCESS = (
        "subprocess", "_subprocess", "multiprocessing", "pty", "os.system", "os.popen*",
        "os.fork*", "os.posix_spawn*", "os.startfile", "os.exec*", "os.spawn*",
        "posix.system", "posix.fork*", "posix.exec*", "posix.spawn*", "posix.posix_spawn*",
        "nt.system", "nt.exec*", "nt.spawn*", "nt.startfile",
        "concurrent.futures.ProcessPoolExecutor", "concurrent.futures.process",
        "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell",
        "asyncio.subprocess", "commands", "popen2", "pexpect", "sh", "plumbum", "sarge",
        "platform.popen", "platform._syscmd_*", "webbrowser", "_posixsubprocess",
        "pydoc.pager", "pydoc.getpager", "pydoc.pipepager", "pydoc.tempfilepager",
        # Helpers of the standard library that start processes.
        "uuid._*", "distutils.spawn.spawn", "distutils.util.spawn", "distutils.util.execute",
        "ctypes.util.find_library", "ctypes.util._*",
    )
    FILE = (
        "io.open", "io.FileIO", "io.open_code", "_io.open", "_io.FileIO", "os.open", "os.fdopen",
        "os.remove", "os.unlink", "os.rename", "os.renames", "os.replace", "os.rmdir",
        "os.removedirs", "os.mkdir", "os.makedirs", "os.chmod", "os.lchmod", "os.fchmod",
        "os.chown", "os.lchown", "os.fchown", "os.link", "os.symlink", "os.truncate",
        "os.ftruncate", "os.mkfifo", "os.mknod", "os.utime", "os.listdir", "os.scandir",
        "os.walk", "os.fwalk", "os.chdir", "os.chroot", "os.readlink", "os.sendfile",
        "os.copy_file_range", "os.memfd_create", "os.write", "os.pwrite", "os.read",
        "posix.open", "posix.remove", "posix.unlink", "posix.rename",
        "shutil", "tempfile", "glob", "fileinput", "codecs.open", "gzip.open", "gzip.GzipFile",
        "bz2.open", "bz2.BZ2File", "lzma.open", "lzma.LZMAFile", "tarfile", "zipfile",
        "shelve.open", "dbm", "sqlite3.connect", "distutils.file_util", "distutils.dir_util",
        "mmap", "filecmp",
    )
    # pathlib: these methods of a Path (pathlib.X.<method>, or *.<method>
    # for a receiver the analysis cannot name, for the methods only paths
    # have).
    PATH_METHODS = set((
        "open", "write_text", "write_bytes", "read_text", "read_bytes", "unlink", "rmdir",
        "mkdir", "touch", "rename", "replace", "symlink_to", "hardlink_to", "link_to",
        "chmod", "lchmod", "iterdir", "glob", "rglob", "walk", "readlink", "exists",
    ))
    PATH_ONLY_METHODS = set((
        "write_text", "write_bytes", "read_text", "read_bytes", "touch", "symlink_to",
        "hardlink_to", "link_to", "iterdir", "rglob",
    ))
    # Methods that name what they do whatever their object: on an object
    # the analysis cannot name (a parameter, sys.modules["os"], ...) they
    # are listed as "*.<method>".
    UNKNOWN_RECEIVER = {}
    for m in PATH_ONLY_METHODS:
        UNKNOWN_RECEIVER[m] = "file_calls"
    for m in ("system", "popen", "Popen", "check_output", "check_call", "getoutput",
              "getstatusoutput", "execv", "execve", "execvp", "execvpe", "execl", "execle",
              "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnl", "spawnle",
              "spawnlp", "posix_spawn", "posix_spawnp", "fork", "forkpty",
              "create_subprocess_exec", "create_subprocess_shell"):
        UNKNOWN_RECEIVER[m] = "process_calls"
    for m in ("urlopen", "urlretrieve", "create_connection", "getaddrinfo"):
        UNKNOWN_RECEIVER[m] = "network_calls"
    UNKNOWN_RECEIVER["import_module"] = "dynamic_code"
    # Rooted names the fallback above leaves alone: they are well known
    # and harmless (platform.system() names the OS).
    KNOWN_HARMLESS = set(("platform.system", "doctest.OutputChecker.check_output"))
    # Modules other modules re-export (shutil.os, tempfile._os,
    # os.path.os, ctypes.util.subprocess): an attribute of an imported
    # name with one of these names is taken as that module, so
    # shutil.os.system is os.system. Never rewritten: the first part of a
    # name, "a.a" (socket.socket is a class), the last part (only
    # attributes of the module say what it does), and a module an import
    # statement names (pip._internal.utils.subprocess is pip's own).
    REEXPORT = {
        "os": "os", "_os": "os", "posix": "posix", "_posix": "posix", "nt": "nt",
        "subprocess": "subprocess", "_subprocess": "subprocess",
        "_posixsubprocess": "_posixsubprocess", "sys": "sys", "_sys": "sys",
        "builtins": "builtins", "_builtins": "builtins", "__builtin__": "builtins",
        "__builtins__": "builtins", "importlib": "importlib", "_importlib": "importlib",
        "_imp": "_imp", "imp": "imp", "socket": "socket", "_socket": "_socket",
        "pty": "pty", "multiprocessing": "multiprocessing", "pickle": "pickle",
        "_pickle": "_pickle", "marshal": "marshal", "runpy": "runpy", "shutil": "shutil",
        "_shutil": "shutil", "urllib": "urllib", "urllib2": "urllib2", "urllib3": "urllib3",
        "requests": "requests", "webbrowser": "webbrowser", "asyncio": "asyncio",
        "pexpect": "pexpect", "pkgutil": "pkgutil",
    }

    def reexport(n, imported):
        """n with a re-exported module in it taken as that module (the
        last one: os.path.os.sys.modules is sys.modules)."""
        parts = n.split(".")
        for i in range(len(parts) - 2, 0, -1):
            m = REEXPORT.get(parts[i])
            if m is not None and parts[i - 1].lstrip("_") != parts[i].lstrip("_") \
                    and ".".join(parts[:i + 1]) not in imported:
                return ".".join([m] + parts[i + 1:])
        return n
    NETWORK = (
        "socket", "_socket", "ssl", "urllib.request", "urllib.urlopen", "urllib.urlretrieve",
        "urllib.URLopener", "urllib.FancyURLopener", "urllib2", "urllib3", "http.client",
        "httplib", "http.server", "socketserver", "SocketServer", "requests", "httpx",
        "aiohttp", "ftplib", "smtplib", "poplib", "imaplib", "telnetlib", "nntplib",
        "xmlrpc.client", "xmlrpc.server", "xmlrpclib", "asyncio.open_connection",
        "asyncio.start_server", "asyncio.open_unix_connection", "asyncio.start_unix_server",
        "websocket", "websockets", "paramiko", "pycurl", "grpc", "boto3", "botocore",
        "smtpd", "asyncore", "asynchat", "tornado.httpclient", "twisted.internet",
        "dns.resolver", "ntplib", "pysftp", "fabric", "mechanize", "selenium", "scapy",
        "http.cookiejar", "wsgiref.simple_server", "multiprocessing.connection",
    )
    DYNAMIC = (
        "importlib", "imp", "_imp", "runpy", "code", "codeop", "marshal.loads", "marshal.load",
        "pickle.loads", "pickle.load", "pickle.Unpickler", "pickle._loads", "pickle._load",
        "pickle._Unpickler", "_pickle", "cPickle", "copyreg", "copy_reg", "dill",
        "cloudpickle", "joblib.load", "shelve", "jsonpickle", "yaml.load", "yaml.load_all",
        "yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load", "yaml.Loader",
        "yaml.UnsafeLoader", "types.FunctionType", "types.CodeType", "types.LambdaType",
        "types.ModuleType", "ctypes", "_ctypes", "cffi", "sys.modules", "sys._getframe",
        "sys.meta_path", "sys.path_hooks", "sys.settrace", "sys.setprofile",
        "sys.addaudithook", "inspect.currentframe", "inspect.stack", "inspect.getouterframes",
        "inspect.trace", "gc.get_objects", "gc.get_referents", "gc.get_referrers",
        "timeit.timeit", "timeit.repeat", "timeit.Timer", "cProfile.run", "cProfile.runctx",
        "cProfile.Profile.run", "cProfile.Profile.runctx", "profile.run", "profile.runctx",
        "profile.Profile.run", "profile.Profile.runctx", "pdb.run*", "pdb.Pdb.run*",
        "bdb.Bdb.run*", "trace.Trace.run", "trace.Trace.runctx", "zipimport",
        # doctest runs the examples in docstrings (or a file).
        "doctest.testmod", "doctest.testfile", "doctest.run_docstring_examples",
        "doctest.DocTestRunner", "doctest.DebugRunner", "doctest.DocTestSuite",
        "doctest.DocFileSuite", "doctest.debug*",
        "pkgutil.get_loader", "pkgutil.find_loader", "pkgutil.resolve_name",
        "pkgutil.get_importer", "pkgutil.ImpImporter", "pkgutil.ImpLoader",
        # dictConfig and fileConfig import and call what their configuration names.
        "logging.config", "operator.attrgetter",
        "operator.methodcaller", "builtins", "__builtin__", "__builtins__", "pydoc.locate",
        "threading.settrace", "atexit.register", "signal.signal",
    )
    # Builtins, by their bare names (or builtins.X).
    B_FILE = set(("open",))
    B_DYNAMIC = set(("eval", "exec", "compile", "__import__"))
    SENSITIVE_BUILTINS = set((
        "eval", "exec", "compile", "__import__", "open", "getattr", "setattr", "delattr",
        "globals", "locals", "vars", "type",
    ))
    IMPORT_HOOKS = ("sys.modules", "sys.meta_path", "sys.path_hooks", "sys.path_importer_cache",
                    "importlib")
    IMPORT_CALLS = set(("__import__", "importlib.import_module", "importlib.__import__"))
    ATTR_CALLS = set(("getattr", "setattr", "delattr", "hasattr"))
    NAMESPACE_CALLS = set(("globals", "locals", "vars"))
    DECODERS = (
        "base64", "binascii", "codecs.decode", "codecs.encode", "codecs.getdecoder",
        "zlib.decompress", "gzip.decompress", "bz2.decompress", "lzma.decompress",
        "marshal.loads", "pickle.loads", "bytes.fromhex", "bytearray.fromhex", "quopri",
        "uu", "str.translate",
    )
    DECODE_METHODS = set(("decode", "fromhex", "decompress", "b64decode", "translate"))
    # Dunders that ordinary code uses; any other dunder attribute is a fact.
    BENIGN_DUNDERS = set((
        "__name__", "__qualname__", "__doc__", "__module__", "__version__", "__file__",
        "__init__", "__new__", "__enter__", "__exit__", "__aenter__", "__aexit__", "__len__",
        "__str__", "__repr__", "__format__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
        "__ge__", "__hash__", "__bool__", "__annotations__", "__all__", "__slots__",
        "__iter__", "__next__", "__aiter__", "__anext__", "__await__", "__class__",
        "__contains__", "__getitem__", "__setitem__", "__delitem__", "__missing__",
        "__call__", "__add__", "__sub__", "__mul__", "__matmul__", "__truediv__",
        "__floordiv__", "__mod__", "__divmod__", "__pow__", "__neg__", "__pos__", "__abs__",
        "__invert__", "__and__", "__or__", "__xor__", "__lshift__", "__rshift__", "__radd__",
        "__rsub__", "__rmul__", "__rmatmul__", "__rtruediv__", "__rfloordiv__", "__rmod__",
        "__rpow__", "__rand__", "__ror__", "__rxor__", "__iadd__", "__isub__", "__imul__",
        "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
        "__ixor__", "__int__", "__float__", "__complex__", "__index__", "__round__",
        "__trunc__", "__floor__", "__ceil__", "__sizeof__", "__copy__", "__deepcopy__",
        "__fspath__", "__post_init__", "__dataclass_fields__", "__members__", "__wrapped__",
        "__signature__", "__init_subclass__", "__class_getitem__", "__set_name__", "__get__",
        "__set__", "__delete__", "__setattr__", "__delattr__", "__getstate__",
        "__setstate__", "__traceback__", "__cause__", "__context__", "__suppress_context__",
        "__notes__", "__path__", "__package__", "__reversed__", "__length_hint__",
        "__subclasshook__", "__instancecheck__", "__subclasscheck__", "__dir__",
        "__match_args__", "__orig_bases__", "__parameters__", "__args__", "__origin__",
        "__del__", "__bytes__", "__abstractmethods__", "__isabstractmethod__",
    ))
    # Attributes that reach frames, code and globals.
    FRAME_ATTRS = set((
        "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "gi_frame", "gi_code",
        "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "co_code", "co_consts",
        "func_globals", "func_code", "im_func", "im_self",
    ))
    DANGEROUS_STRINGS = set((
        "__globals__", "__builtins__", "__subclasses__", "__code__", "__import__", "__bases__",
        "__base__", "__mro__", "__getattribute__", "__closure__", "__loader__", "__self__",
        "__func__", "__reduce__", "__reduce_ex__", "f_globals", "f_builtins", "f_locals",
        "gi_frame", "tb_frame", "co_code",
    ))
    URL_RE = re.compile(r"(?:https?|ftps?|wss?)://[^\s\x00-\x20\x7f-\x9f'\"<>\\^`|]+", re.I)
    URL_TRAIL = ".,;:!?"

    def clip(s, n):
        return s if len(s) <= n else s[:n]

    def printable(s):
        return "".join(c if c.isprintable() else "?" for c in s)

    tables = {}

    def matches(name, prefixes):
        t = tables.get(id(prefixes))
        if t is None:
            t = tables[id(prefixes)] = (
                frozenset(p for p in prefixes if not p.endswith("*")),
                tuple(p[:-1] for p in prefixes if p.endswith("*")))
        exact, stars = t
        if stars and name.startswith(stars):
            return True
        i = name.find(".")
        while i >= 0:
            if name[:i] in exact:
                return True
            i = name.find(".", i + 1)
        return name in exact

    def tname(node):
        return type(node).__name__

    def str_const(node):
        t = tname(node)
        if t == "Constant":
            v = node.value
            return v if isinstance(v, str) else None
        if t == "Str":
            return node.s
        return None

    def const_text(node):
        """The text of a str or bytes constant (bytes as latin-1), else None."""
        t = tname(node)
        if t == "Constant":
            v = node.value
        elif t == "Str":
            v = node.s
        elif t == "Bytes":
            v = node.s
        else:
            return None
        if isinstance(v, bytes):
            return v.decode("latin-1")
        return v if isinstance(v, str) else None

    def is_constant(node):
        return tname(node) in ("Constant", "Str", "Bytes", "Num", "NameConstant")

    facts = dict((k, set()) for k in LISTS)
    urls = set()
    state = {"syntax_error": "", "urls_over": False, "decoded": False}

    def add(kind, name):
        facts[kind].add(clip(name, MAX_NAME))

    def add_import(mod):
        if not mod:
            return
        add("imports", mod)
        if not mod.startswith("."):
            parts = mod.split(".")
            for i in range(1, len(parts)):
                add("imports", ".".join(parts[:i]))

    def scan_urls(text):
        if "://" not in text:
            return
        for m in URL_RE.finditer(text):
            u = m.group(0)
            while u and u[-1] in URL_TRAIL:
                u = u[:-1]
            while u.endswith(")") and u.count(")") > u.count("("):
                u = u[:-1]
            if u.find("://") + 3 >= len(u):
                continue
            if len(urls) >= MAX_URL_SCAN:
                state["urls_over"] = True
                return
            urls.add(clip(u, MAX_URL))

    def analyse(tree):
        # Bindings: a name -> the dotted names it may stand for, each with
        # whether it is rooted in an import (or a builtin).
        bind = {}
        modnames = set()  # what import statements bind names to
        stars = []
        pending = []  # (name, value node) of plain assignments

        def bind_add(name, value):
            s = bind.setdefault(name, set())
            if len(s) < MAX_BINDINGS:
                s.add(clip(value, MAX_NAME))

        # Every node, breadth first (a parent before its children), as
        # ast.walk but without its generators.
        AST = ast.AST
        nodes = [tree]
        i = 0
        while i < len(nodes):
            n = nodes[i]
            i += 1
            for f in n._fields:
                v = getattr(n, f, None)
                if type(v) is list:
                    for x in v:
                        if isinstance(x, AST):
                            nodes.append(x)
                elif isinstance(v, AST):
                    nodes.append(v)

        def children(n):
            out = []
            for f in n._fields:
                v = getattr(n, f, None)
                if type(v) is list:
                    out.extend(x for x in v if isinstance(x, AST))
                elif isinstance(v, AST):
                    out.append(v)
            return out

        # Pass 1: imports and assignments of names.
        for node in nodes:
            t = tname(node)
            if t == "Import":
                for a in node.names:
                    add_import(a.name)
                    if a.asname:
                        bind_add(a.asname, a.name)
                        modnames.add(a.name)
                    else:
                        top = a.name.split(".")[0]
                        bind_add(top, top)
                        modnames.add(top)
            elif t == "ImportFrom":
                mod = "." * (node.level or 0) + (node.module or "")
                add_import(mod)
                for a in node.names:
                    if a.name == "*":
                        if mod not in stars and len(stars) < MAX_BINDINGS:
                            stars.append(mod)
                        continue
                    full = mod + a.name if mod.endswith(".") else mod + "." + a.name
                    bind_add(a.asname or a.name, full)
                    modnames.add(full)
            elif t in ("Assign", "AnnAssign", "NamedExpr"):
                targets = node.targets if t == "Assign" else [node.target]
                value = node.value
                if value is None:
                    continue
                for tg in targets:
                    if tname(tg) == "Name":
                        pending.append((tg.id, value))
                    elif tname(tg) in ("Tuple", "List") and tname(value) in ("Tuple", "List") \
                            and len(tg.elts) == len(value.elts):
                        for e, v in zip(tg.elts, value.elts):
                            if tname(e) == "Name":
                                pending.append((e.id, v))
        importnames = modnames | facts["imports"]
        STAR = 2  # rooted, but only a guess: a name a star import may have made
        memo = {}

        def resolve(node, depth=0):
            """The dotted names node may stand for: a set of (name, rooted).
            Memoised by node (the bindings are fixed while memo is kept), so
            every node is resolved once however names nest."""
            key = id(node)
            r = memo.get(key)
            if r is None:
                r = memo[key] = _resolve(node, depth)
            return r

        def _resolve(node, depth):
            parts = []
            cur = node
            for _ in range(256):
                t = tname(cur)
                if t == "Attribute":
                    parts.append(cur.attr)
                    cur = cur.value
                    continue
                if t == "Name":
                    name = cur.id
                    if name in bind:
                        bases = set((b, True) for b in bind[name])
                        if name in SENSITIVE_BUILTINS:
                            # Bound or not, the name may still be the
                            # builtin: a binding may never run, or be
                            # deleted (if 0: from re import compile).
                            bases.add((name, True))
                    elif name in BUILTIN_NAMES:
                        bases = set([(name, True)])
                    elif stars:
                        bases = set((s + "." + name if not s.endswith(".") else s + name, STAR)
                                    for s in stars)
                        bases.add((name, False))
                    else:
                        bases = set([(name, False)])
                    break
                if t == "Call" and depth < MAX_CALL_DEPTH:
                    fn = resolve(cur.func, depth + 1)
                    fnames = set(n for n, rooted in fn if rooted)
                    arg0 = str_const(cur.args[0]) if cur.args else None
                    arg1 = str_const(cur.args[1]) if len(cur.args) > 1 else None
                    bases = set()
                    for f in fnames:
                        if f in IMPORT_CALLS and arg0 is not None:
                            if f == "__import__" and "." in arg0 and not cur.args[1:] and not cur.keywords:
                                # __import__("a.b") returns a
                                bases.add((arg0.split(".")[0], True))
                            else:
                                bases.add((arg0, True))
                        elif f == "pkgutil.resolve_name" and arg0 is not None:
                            # resolve_name("os:popen") is os.popen
                            bases.add((arg0.replace(":", "."), True))
                        elif f == "getattr" and len(cur.args) >= 2 and arg1 is not None:
                            for n, rooted in resolve(cur.args[0], depth + 1):
                                bases.add((n + "." + arg1, rooted))
                        elif "." in f and (f.rsplit(".", 1)[1][:1].isupper() or f == "socket.socket"):
                            # an instance of a class: Path(...).write_text
                            bases.add((f, True))
                    if not bases:
                        return set()
                    break
                if t == "BinOp" and tname(cur.op) == "Div" and depth < MAX_CALL_DEPTH:
                    # pathlib: Path(...) / "name"
                    bases = set(x for x in resolve(cur.left, depth + 1) if x[0].startswith("pathlib."))
                    if not bases:
                        return set()
                    break
                return set()
            else:
                return set()
            tail = ".".join(reversed(parts))
            out = set()
            for b, rooted in bases:
                n = b + "." + tail if tail else b
                if rooted and "." in n:
                    n = reexport(n, importnames)
                for pre in ("builtins.", "__builtin__.", "__builtins__."):
                    if n.startswith(pre) and len(n) > len(pre):
                        n = n[len(pre):]
                        rooted = True
                out.add((clip(n, MAX_NAME), rooted))
            return out

        # Aliases made by assignment (x = os.system), to a fixed point.
        for _ in range(5):
            changed = False
            memo.clear()
            for name, value in pending:
                for n, rooted in resolve(value):
                    if not rooted or n == name:
                        continue
                    s = bind.setdefault(name, set())
                    if n not in s and len(s) < MAX_BINDINGS:
                        s.add(n)
                        changed = True
            if not changed:
                break
        memo.clear()

        classified = set()

        def classify(name, rooted):
            """Put a referenced dotted name in its lists."""
            if (name, rooted) in classified:
                return
            classified.add((name, rooted))
            if not rooted:
                last = name.rsplit(".", 1)
                if len(last) == 2 and last[1] in UNKNOWN_RECEIVER:
                    add(UNKNOWN_RECEIVER[last[1]], "*." + last[1])
                return
            if "." not in name:
                if name in B_FILE:
                    add("file_calls", name)
                elif name in B_DYNAMIC:
                    add("dynamic_code", name)
                elif name == "__builtins__":
                    add("dynamic_code", name)
                elif matches(name, DYNAMIC) and name not in ("builtins", "__builtin__"):
                    add("dynamic_code", name)
                return
            kinds = set()
            if matches(name, PROCESS):
                add("process_calls", name)
                kinds.add("process_calls")
            if matches(name, NETWORK):
                add("network_calls", name)
                kinds.add("network_calls")
            if matches(name, DYNAMIC):
                add("dynamic_code", name)
                kinds.add("dynamic_code")
            if name.startswith("pathlib."):
                if name.rsplit(".", 1)[1] in PATH_METHODS:
                    add("file_calls", name)
                    kinds.add("file_calls")
            elif matches(name, FILE):
                add("file_calls", name)
                kinds.add("file_calls")
            # A telling method the tables do not place (a module of
            # someone else's re-exporting os under another name, ...).
            if rooted is STAR:
                # Any unbound name could come from a star import: it is no
                # evidence that x.run or x.system is a module's.
                return
            recv, last = name.rsplit(".", 1)
            kind = UNKNOWN_RECEIVER.get(last)
            if kind is not None:
                if kind not in kinds and name not in KNOWN_HARMLESS:
                    add(kind, "*." + last)
            elif last == "run" and "process_calls" not in kinds and "." in recv \
                    and recv not in modnames and not recv.rsplit(".", 1)[1][:1].isupper():
                # X.y.run where X.y is not a module imported by name (as
                # asyncio.run, absl.app.run are) nor a class: a module
                # reached through another (subprocess under another name).
                add("process_calls", "*.run")

        decoded = set()  # ids of the nodes with a decoding call in them

        def contains_decoder(node):
            """Whether node has a call that decodes (base64, codecs,
            .decode(), ...) in it: from a table of the whole tree, built
            once, children first, so nested exec(exec(...)) stays linear."""
            if not state["decoded"]:
                state["decoded"] = True
                for n in reversed(nodes):  # a child comes after its parent
                    found = False
                    if tname(n) == "Call":
                        f = n.func
                        if tname(f) == "Attribute" and f.attr in DECODE_METHODS:
                            found = True
                        else:
                            for name, rooted in resolve(f):
                                if rooted and matches(name, DECODERS):
                                    found = True
                                    break
                    if not found:
                        for c in children(n):
                            if id(c) in decoded:
                                found = True
                                break
                    if found:
                        decoded.add(id(n))
            return id(node) in decoded

        inner = set()  # ids of nodes that are part of a larger name or f-string
        callee = set()  # ids of the nodes called
        for node in nodes:
            t = tname(node)
            if t == "Attribute":
                inner.add(id(node.value))
                attr = node.attr
                if attr.startswith("__") and attr.endswith("__") and len(attr) > 4:
                    if attr == "__dict__":
                        base = node.value
                        if not (tname(base) == "Name" and base.id in ("self", "cls")):
                            add("dynamic_code", ".__dict__")
                    elif attr not in BENIGN_DUNDERS:
                        add("dynamic_code", "." + attr)
                elif attr in FRAME_ATTRS:
                    add("dynamic_code", "." + attr)
                base = node.value
                if tname(base) == "Call":
                    for n, rooted in resolve(base.func):
                        if rooted and n in NAMESPACE_CALLS:
                            add("dynamic_code", n + "()." + attr)
                if tname(node.ctx) in ("Store", "Del"):
                    # Replacing a builtin, or hooking the import system.
                    for n, rooted in resolve(base):
                        full = n + "." + attr
                        if rooted and (n in ("builtins", "__builtin__", "__builtins__")
                                       or matches(full, IMPORT_HOOKS)):
                            add("dynamic_code", clip(full, MAX_NAME - 1) + "=")
                if id(node) not in inner:
                    for n, rooted in resolve(node):
                        classify(n, rooted)
            elif t == "Name":
                name = node.id
                if name in ("__builtins__", "__loader__", "__spec__"):
                    add("dynamic_code", name)
                if id(node) in inner:
                    continue
                if tname(node.ctx) == "Load":
                    for n, rooted in resolve(node):
                        classify(n, rooted)
                        if rooted and n in ATTR_CALLS and id(node) not in callee:
                            # getattr passed around: its names are unknown.
                            add("dynamic_code", n + "(non-literal)")
            elif t == "Call":
                callee.add(id(node.func))
                fn = resolve(node.func)
                args = node.args
                arg0 = args[0] if args else None
                for n, rooted in fn:
                    if not rooted:
                        continue
                    if n in IMPORT_CALLS:
                        lit = str_const(arg0) if arg0 is not None else None
                        if lit is not None:
                            add_import(lit)
                        else:
                            add("dynamic_code", n + "(non-literal)")
                    elif n == "pkgutil.resolve_name":
                        lit = str_const(arg0) if arg0 is not None else None
                        if lit is not None:
                            add_import(lit.split(":")[0] if ":" in lit else lit.split(".")[0])
                        else:
                            add("dynamic_code", n + "(non-literal)")
                    elif n in ATTR_CALLS:
                        lit = str_const(args[1]) if len(args) > 1 else None
                        if len(args) > 1 and lit is None:
                            add("dynamic_code", n + "(non-literal)")
                        elif lit is not None and lit.startswith("__") and lit.endswith("__") \
                                and lit not in BENIGN_DUNDERS:
                            add("dynamic_code", clip(n + "(" + lit + ")", MAX_NAME))
                        if n in ("setattr", "delattr") and arg0 is not None:
                            for m, r in resolve(arg0):
                                if r and (m in facts["imports"] or m in (
                                        "builtins", "__builtins__", "__builtin__")):
                                    add("dynamic_code", n + "(module)")
                    elif n in ("eval", "exec", "compile"):
                        if arg0 is None or str_const(arg0) is None:
                            add("dynamic_code", n + "(non-literal)")
                        # The code argument (a literal is not decoded).
                        src = [a for a in args[:1] if str_const(a) is None]
                        src += [k.value for k in node.keywords if k.arg in ("source", "object")]
                        if any(contains_decoder(a) for a in src):
                            add("dynamic_code", n + "(decoded)")
                    elif n == "type" and len(args) == 3:
                        add("dynamic_code", "type(name, bases, dict)")
                    elif n == "vars" and args:
                        for m, r in resolve(arg0):
                            if r:
                                add("dynamic_code", "vars(module)")
                                break
                    elif n in ("operator.attrgetter", "operator.methodcaller") and arg0 is not None \
                            and str_const(arg0) is None:
                        add("dynamic_code", n + "(non-literal)")
                if tname(node.func) == "Call":
                    # f(...)(...): what the inner call returns, when it is
                    # known (pkgutil.resolve_name("os:popen")("id")).
                    for n, rooted in fn:
                        classify(n, rooted)
                    for n, rooted in resolve(node.func.func):
                        if rooted and n == "type":
                            add("dynamic_code", "type(...)(...)")
                # Telling methods on a receiver the analysis cannot name.
                f = node.func
                if tname(f) == "Attribute" and f.attr in UNKNOWN_RECEIVER and not fn:
                    add(UNKNOWN_RECEIVER[f.attr], "*." + f.attr)
            elif t == "Subscript":
                base = node.value
                if tname(base) == "Call":
                    for n, rooted in resolve(base.func):
                        if rooted and n in NAMESPACE_CALLS:
                            add("dynamic_code", n + "()[...]")
            elif t == "JoinedStr":
                text = []
                for v in node.values:
                    inner.add(id(v))
                    s = str_const(v)
                    if s is not None:
                        text.append(s)
                    elif tname(v) == "FormattedValue" and tname(v.value) == "Name":
                        text.append("{" + v.value.id + "}")
                    else:
                        text.append("{...}")
                scan_urls("".join(text))
            elif t in ("Constant", "Str", "Bytes"):
                if id(node) in inner:
                    continue
                s = const_text(node)
                if s is not None:
                    scan_urls(s)
                    if s in DANGEROUS_STRINGS:
                        add("dynamic_code", repr(str(s)))
            elif t in ("Import", "ImportFrom"):
                for a in node.names:
                    full = a.name if t == "Import" else (node.module or "")
                    if full.split(".")[0] in ("ctypes", "_ctypes", "cffi"):
                        add("dynamic_code", "import " + full.split(".")[0])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tree = ast.parse(source, "<code>")
        except SyntaxError as e:
            line = getattr(e, "lineno", None)
            msg = printable(str(getattr(e, "msg", "") or "invalid syntax"))
            msg = clip(msg, 300) + (" (line %d)" % line if isinstance(line, int) else "")
            if "too many nested" in msg or "too many levels" in msg or "too complex" in msg:
                # The parser's own depth limits (3.9+): the same bomb that
                # is a MemoryError or RecursionError elsewhere.
                msg = "too deeply nested to parse (" + msg + ")"
                facts["dynamic_code"].add("unanalysable")
            state["syntax_error"] = msg
            tree = None
        except ValueError as e:  # null bytes, before 3.12
            state["syntax_error"] = clip(printable(str(e)), 300)
            tree = None
        except (RecursionError, MemoryError) as e:
            state["syntax_error"] = "too deeply nested to parse (%s)" % (
                clip(printable(type(e).__name__ + (": " + str(e) if str(e) else "")), 200),)
            facts["dynamic_code"].add("unanalysable")
            tree = None
        if tree is not None:
            try:
                analyse(tree)
            except (RecursionError, MemoryError) as e:
                state["syntax_error"] = "too deeply nested to analyse (%s)" % (type(e).__name__,)
                facts["dynamic_code"].add("unanalysable")
            tree = None

    # The lists: sorted and unique; when one is too long, the names the
    # tables above know and the shortest go first, and dynamic_code says so.
    known = set(PROCESS + FILE + NETWORK + DYNAMIC) | B_FILE | B_DYNAMIC
    out = {"v": 1}
    truncated = []

    def cap(items, limit, budget):
        items = sorted(items, key=lambda s: (not s.startswith("unanalysable"), s not in known, len(s), s))
        kept, size = [], 2
        for s in items:
            n = len(json.dumps(s)) + 1
            if len(kept) >= limit or size + n > budget:
                return sorted(kept), True
            kept.append(s)
            size += n
        return sorted(kept), False

    for k in LISTS:
        if k == "dynamic_code":
            continue
        out[k], over = cap(facts[k], MAX_ENTRIES, NAME_BUDGET)
        if over:
            truncated.append(k)
    out["urls"], over = cap(urls, MAX_URLS, URL_BUDGET)
    if over or state["urls_over"]:
        truncated.append("urls")
    dyn = facts["dynamic_code"]
    for k in truncated:
        dyn.add("unanalysable: too many " + k)
    out["dynamic_code"], over = cap(dyn, MAX_ENTRIES, NAME_BUDGET)
    if over:
        truncated.append("dynamic_code")
        dyn.add("unanalysable: too many dynamic_code")
        out["dynamic_code"], over = cap(dyn, MAX_ENTRIES, NAME_BUDGET)
    out["truncated"] = sorted(truncated)
    out["syntax_error"] = state["syntax_error"]
    line = json.dumps(out, ensure_ascii=True, separators=(",", ":"))
    if len(line) > MAX_OUTPUT:  # cannot happen with the budgets above
        raise MemoryError("codefacts output too large")
    return line


def _codefacts_run(source):
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout.write(codefacts_line(source) + "\n")
    sys.stdout.flush()


# _SMALL is the largest program parsed without a fork on Python before
# 3.11: 4096 characters nest at most about 2000 levels, far from where
# those parsers crash (tens of thousands).
_SMALL = 4096


def codefacts_line(source):
    """The facts of source as one line of JSON, taken in a forked child
    where the parser could crash: a crash is a fact (unanalysable), not
    the caller's end."""
    import json
    import os
    import sys

    if not isinstance(source, str):
        raise TypeError("codefacts_source must be a string")
    if sys.version_info >= (3, 11) or len(source) <= _SMALL:
        # No crash to fear: since 3.11 the parser guards its own depth, and
        # a small program cannot nest deeply enough. A fork would cost more
        # than the analysis (about 8 ms against 0.2 for a short program).
        return _codefacts_main(source)
    limit = 256 << 10
    try:
        rfd, wfd = os.pipe()
        pid = os.fork()
    except (AttributeError, OSError):
        return _codefacts_main(source)
    if pid == 0:
        code = 1
        try:
            os.close(rfd)
            data = (_codefacts_main(source) + "\n").encode("ascii")
            while data:
                data = data[os.write(wfd, data):]
            code = 0
        except BaseException:
            pass
        finally:
            os._exit(code)
    os.close(wfd)
    chunks, size = [], 0
    while size <= limit:
        b = os.read(rfd, 65536)
        if not b:
            break
        chunks.append(b)
        size += len(b)
    os.close(rfd)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        status = -1
    data = b"".join(chunks)
    ok = status == 0 and size <= limit and data.endswith(b"\n")
    if ok:
        try:
            ok = isinstance(json.loads(data.decode("ascii")), dict)
        except ValueError:
            ok = False
    if ok:
        return data.decode("ascii").rstrip("\n")
    if status > 0 and os.WIFSIGNALED(status):
        why = "the parser crashed (signal %d)" % os.WTERMSIG(status)
    elif status > 0 and os.WIFEXITED(status):
        why = "the analysis failed (exit %d)" % os.WEXITSTATUS(status)
    else:
        why = "the analysis failed"
    out = {"v": 1, "imports": [], "process_calls": [], "file_calls": [], "network_calls": [],
           "dynamic_code": ["unanalysable"], "urls": [], "truncated": [],
           "syntax_error": "too deeply nested to parse: " + why}
    return json.dumps(out, separators=(",", ":"))


if "codefacts_source" in globals():
    _codefacts_run(codefacts_source)  # noqa: F821 (a run input)
