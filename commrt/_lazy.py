"""Lazy imports: package attributes (PEP 562) and modules, loaded on first use.

A package keeps ``import commrt`` cheap by naming where each public attribute
lives instead of importing it; ``attributes(package, table, namespace)``
returns the package's ``__getattr__`` and ``__dir__``.

A module keeps a heavy dependency (NumPy) out of paths that never touch it
(``commrt.init()`` and a barrier, docs/launcher.md "Start-up time") with
``np = module("numpy", globals(), "np")``: the module itself when it is
loaded already, else a stand-in whose first attribute access imports it and
puts the real module in place of the stand-in in every namespace that asked
for it, so later uses cost what a plain global costs.  ``when_loaded(name,
fn)`` runs ``fn(module)`` once it is loaded that way (or now, if it is loaded
already): module constants made from it (dtype tables) are filled there.
"""
import importlib
import sys
import threading


def attributes(package: str, table: dict, namespace: dict):
    """``__getattr__`` and ``__dir__`` for ``package``, whose globals are ``namespace``.

    ``table`` maps an attribute name to the module defining it; it may grow
    after this call. A resolved name is cached in ``namespace``.
    """
    def __getattr__(name):
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


_lock = threading.RLock()
_homes = {}         # module name -> [(namespace, alias)] holding its stand-in
_hooks = {}         # module name -> [fn] to run once it is loaded
_loaded = set()     # module names whose stand-ins and hooks are done


class _Stub:
    """Stands in for a module not imported yet; see module()."""
    __slots__ = ("_name",)

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr):
        return getattr(load(object.__getattribute__(self, "_name")), attr)

    def __repr__(self):
        return f"<module {object.__getattribute__(self, '_name')!r}, imported on first use>"


def module(name, namespace, alias):
    """The module `name` if it is loaded (and its hooks done), else a stand-in that
    loads it on first attribute access and rebinds ``namespace[alias]`` to it."""
    with _lock:
        if name in _loaded:
            return sys.modules[name]
        if name in sys.modules:             # imported by someone else: ours now
            return load(name)
        _homes.setdefault(name, []).append((namespace, alias))
        return _Stub(name)


def when_loaded(name, fn):
    """fn(module) once `name` is loaded through module()'s stand-ins (now if it
    already is, or if anyone imported it before this call)."""
    with _lock:
        if name in _loaded or name in sys.modules:
            fn(load(name))
        else:
            _hooks.setdefault(name, []).append(fn)


def load(name):
    """Import `name`, put it in place of its stand-ins, run its hooks; the module."""
    mod = importlib.import_module(name)
    with _lock:
        if name not in _loaded:
            _loaded.add(name)
            for namespace, alias in _homes.pop(name, ()):
                if isinstance(namespace.get(alias), _Stub):
                    namespace[alias] = mod
            for fn in _hooks.pop(name, ()):
                fn(mod)
    return mod
