"""Lazy re-exports for a package's ``__init__`` (PEP 562): a name is
imported from its submodule on first use, so importing the package, or a
pure submodule of it, does not import its heavy ones."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exporter(package: str, sources: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], object]:
    """The package's ``__getattr__``: ``sources`` maps each re-exported
    name to the submodule that defines it; a name once imported is kept in
    ``namespace`` (the package's globals), so it is looked up only once."""

    def __getattr__(name: str) -> object:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value
        return value

    return __getattr__
