"""Lazy package attributes (PEP 562): a name is imported from its module on first use.

A package keeps ``import commrt`` cheap by naming where each public attribute
lives instead of importing it; ``attributes(package, table, namespace)``
returns the package's ``__getattr__`` and ``__dir__``.
"""
import importlib


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
