"""Packages that load their parts on first use (PEP 562), so that importing one starts no JAX.

``import snapaudit_jax`` or ``snapaudit_jax.dpicl`` (the command line's ``--help``, a bad flag, a script that uses
one part) then costs what the parts used cost; every name stays where it was (``sa.simulate``,
``from snapaudit_jax import audit``, ``sa.dpsgd``), loaded and kept in the package the first time it is read.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_package"]


def lazy_package(name: str, exports: Mapping[str, Iterable[str]],
                 submodules: Iterable[str] = ()) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of a package whose names load on first use.

    Args:
      name: the package's ``__name__``.
      exports: for each of its submodules, the names the package exports from it.
      submodules: its other submodules, each an attribute of the package once loaded (those of ``exports``
        are too).

    Returns:
      ``(__getattr__, __dir__)``, to assign at the package's top level: ``__getattr__(attr)`` imports the
      submodule ``attr`` or the one that exports ``attr``, keeps the value in the package and returns it (an
      ``AttributeError`` naming the package for any other name); ``__dir__()`` lists the package's names, the
      exported ones and the submodules, loaded or not.

    Example::

        __getattr__, __dir__ = lazy_package(__name__, {"run": ("run_audit",)}, ("config", "data"))
    """
    origin = {attr: module for module, attrs in exports.items() for attr in attrs}
    modules = set(exports) | set(submodules)

    def __getattr__(attr: str):
        if attr in origin:
            value = getattr(importlib.import_module(f"{name}.{origin[attr]}"), attr)
        elif attr in modules:
            value = importlib.import_module(f"{name}.{attr}")
        else:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        setattr(sys.modules[name], attr, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[name])) | set(origin) | modules)

    return __getattr__, __dir__
