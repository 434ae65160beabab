"""Parametrized test methods for trial: one generated method per case.

``twisted.trial`` has no parametrization and (as of Twisted 26) runs
``subTest`` blocks without reporting them apart: the first failing case ends
the loop and the report does not say which case it was.  So each case gets a
method of its own, named after the case, which trial collects, counts and
reports on its own::

    @expand
    class RuleTests(SynchronousTestCase):
        @parametrize("pattern", {"dot": b"a.b", "class": b"[ab]"})
        @parametrize("flags", ["g", "gi"])
        def test_compiles(self, pattern: bytes, flags: str) -> None:
            ...

gives ``test_compiles_dot_g``, ``test_compiles_dot_gi``,
``test_compiles_class_g`` and ``test_compiles_class_gi``.  Stacked
``parametrize`` decorators multiply, the one nearest the function naming
the last part.  ``names`` is one argument name, or several (a tuple, or
separated by commas; each value is then a tuple); ``values`` is a mapping of case id to
value, or a sequence of values or of :func:`param` (a value with its id);
a bare value's id is its ``str`` made into a Python name.  A skip on the decorated function (``skip`` attribute,
or ``unittest.skipIf``) applies to every generated method.
"""

from __future__ import annotations

import functools
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_CASES = "_prexy_cases"


def case_id(value: object) -> str:
    """A Python-name-safe id for a case value."""
    if isinstance(value, bytes):
        text = value.decode("latin-1")
    else:
        text = str(value)
    name = re.sub(r"\W+", "_", text, flags=re.ASCII).strip("_")
    return name or "empty"


class _Param:
    __slots__ = ("ident", "values")

    def __init__(self, values: tuple[Any, ...], ident: str) -> None:
        self.values = values
        self.ident = ident


def param(*values: Any, id: str) -> Any:  # noqa: A002 - pytest.param's name
    """One case with an explicit id, like ``pytest.param``."""
    return _Param(values, id)


def parametrize(
    names: str | tuple[str, ...],
    values: Mapping[str, Any] | Iterable[Any],
    ids: Iterable[str] | None = None,
) -> Callable[[T], T]:
    """Mark a test method to be expanded, by :func:`expand`, once per value
    (``ids``, if given, name the values of a sequence in order)."""
    if isinstance(names, str):
        names = tuple(names.split(","))
    argnames = [n.strip() for n in names if n.strip()]
    if ids is not None:
        values = [param(*(v if len(argnames) > 1 else (v,)), id=i) for v, i in zip(values, ids, strict=True)]
    if isinstance(values, Mapping):
        items = [(case_id(k), v) for k, v in values.items()]
    else:
        items = []
        for v in values:
            if isinstance(v, _Param):
                items.append((case_id(v.ident), v.values if len(argnames) > 1 else v.values[0]))
                continue
            shown = "-".join(map(case_id, v)) if len(argnames) > 1 else case_id(v)
            items.append((case_id(shown), v))
    rows = []
    for ident, v in items:
        if len(argnames) == 1:
            rows.append((ident, {argnames[0]: v}))
        else:
            if len(v) != len(argnames):
                raise ValueError(f"case {ident}: {len(v)} values for {argnames}")
            rows.append((ident, dict(zip(argnames, v, strict=True))))

    def mark(fn: T) -> T:
        inner = getattr(fn, _CASES, [((), {})])
        combined = [
            ((ident, *ids), {**kwargs, **more}) for ident, kwargs in rows for ids, more in inner
        ]
        setattr(fn, _CASES, combined)
        return fn

    return mark


def expand(cls: type[T]) -> type[T]:
    """Replace each :func:`parametrize`-d method of ``cls`` by one per case.

    Method names are made unique (a counter is appended when two case ids
    reduce to the same name), so no case is lost to a collision.
    """
    for name, fn in list(vars(cls).items()):
        table = getattr(fn, _CASES, None)
        if table is None:
            continue
        delattr(cls, name)
        for ids, kwargs in table:
            method_name = "_".join((name, *ids))
            unique, n = method_name, 1
            while hasattr(cls, unique):
                n += 1
                unique = f"{method_name}_{n}"
            setattr(cls, unique, _bind(fn, kwargs, unique))
    return cls


def _bind(fn: Callable[..., Any], kwargs: dict[str, Any], name: str) -> Callable[..., Any]:
    @functools.wraps(fn, assigned=("__module__", "__doc__"), updated=())
    def method(self: Any) -> Any:
        return fn(self, **kwargs)

    method.__name__ = method.__qualname__ = name
    for attr in ("skip", "todo", "__unittest_skip__", "__unittest_skip_why__"):
        if hasattr(fn, attr):
            setattr(method, attr, getattr(fn, attr))
    return method


def tmp_dir(case: Any) -> Path:
    """A new empty directory for one test (under trial's ``_trial_temp``),
    removed when the test ends."""
    path = Path(case.mktemp()).absolute()
    path.mkdir(parents=True)
    case.addCleanup(shutil.rmtree, path, True)
    return path


def unlinked_store(prefix: str, max_bytes: int, clock: Callable[[], float]) -> Any:
    """A cache store (``prexy.cache.store.Store``) for one test that leaves
    nothing on disk: its directory is removed as soon as LMDB has opened its
    files, whose descriptors and mapping keep the data for as long as the
    store lives.  For helpers that build a store without a test case at
    hand to clean up after; such a store cannot be opened by another
    process."""
    from prexy.cache.store import Store

    path = tempfile.mkdtemp(prefix=prefix)
    try:
        return Store.open(path, max_bytes, clock=clock)
    finally:
        shutil.rmtree(path, ignore_errors=True)
