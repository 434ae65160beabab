"""The parsed configuration a master hands its workers.

The master (:mod:`prexy.workers`) parses and validates every file of the
configuration once; its workers do not parse the main file or the site
files again.  What a worker gets, at start (``configuration``) and with
each in-place reload (``reload``), is a :class:`Handoff`: the validated
``Config`` itself, and the bytes of the files a worker builds its runtime
from (rules, maps, CA files, the ``ssl:`` listeners' key and certificate:
a :class:`~prexy.files.Snapshot` without the configuration's own files).
A worker that starts also gets the rules files' rule sets as the master
parsed them (their patterns parsed again only when a site's scanner is
built): it parses no file the master parsed.

A configuration of thousands of sites changes a few sites at a time, so a
handoff is encoded against the configuration the worker received last
(``base``): each site the base holds as the very same object (the master's
``ConfigMemo`` reuses the ``SiteConfig`` of an unchanged site file) travels
as its position in the base's sites, and the worker takes its own copy of
that site from its base.  The pipe is ordered and every handoff the master
sends a worker is decoded by it, in order, so both ends agree on the base.
A worker that reloads keeps the unchanged ``SiteConfig`` objects, which is
what lets ``build_runtime`` keep their runtimes (compiled rule sets
included) without comparing them field by field.

The encoding is ``pickle``: it comes only from the master, over the pipe it
opened to the worker it spawned.  No Twisted here.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from prexy.config import Config, SiteConfig
from prexy.files import Snapshot

if TYPE_CHECKING:
    from prexy.substitution.ruleset import RuleSet

__all__ = ["Handoff", "HandoffError", "decode", "encode"]

#: The format's version: a worker refuses a handoff of another.
VERSION = 2


class HandoffError(ValueError):
    """Bytes that are not a handoff, or one whose base the worker does not hold."""


@attrs.frozen
class Handoff:
    """What a worker serves with: the validated configuration, and the
    bytes of the files its runtime is built from; for a worker that has no
    configuration yet, the rules files' rule sets the master parsed too
    (``RuleSets.portable``: by path, with the digest of their bytes), so
    that it parses none of them again."""

    config: Config
    files: Snapshot = attrs.field(eq=False)
    rulesets: Mapping[str, tuple[bytes, RuleSet]] = attrs.field(factory=dict, eq=False)


def _sites_of(base: Config | None) -> dict[int, int]:
    return {id(site): i for i, site in enumerate(base.sites)} if base is not None else {}


class _Pickler(pickle.Pickler):
    def __init__(self, out: io.BytesIO, known: dict[int, int]) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self._known = known

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is SiteConfig:
            return self._known.get(id(obj))
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: io.BytesIO, base: Config | None) -> None:
        super().__init__(data)
        self._base = base.sites if base is not None else ()

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, int) or not 0 <= pid < len(self._base):
            raise HandoffError(f"configuration handoff: site {pid!r} of a base this worker does not hold")
        return self._base[pid]


def encode(handoff: Handoff, base: Config | None = None) -> bytes:
    """``handoff`` as bytes for a worker whose last configuration was
    ``base`` (None: a worker that has none yet): the sites ``base`` holds
    as the same objects travel as references to them."""
    out = io.BytesIO()
    known = _sites_of(base)
    # (``persistent_id`` is asked about every object pickled: without a
    # base, nothing to refer to, and a third of the encoding's time saved.)
    pickler = _Pickler(out, known) if known else pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    rulesets = dict(handoff.rulesets) if base is None else {}  # (a worker that reloads has its own)
    pickler.dump((VERSION, handoff.config, handoff.files.encode(), rulesets))
    return out.getvalue()


def decode(data: bytes, base: Config | None = None) -> Handoff:
    """The handoff :func:`encode` gave for ``base``; ``HandoffError`` when
    ``data`` is not one (or refers to sites ``base`` does not have)."""
    try:
        version, config, files, rulesets = _Unpickler(io.BytesIO(data), base).load()
    except HandoffError:
        raise
    except Exception as exc:  # (whatever a cut or foreign pickle raises)
        raise HandoffError(f"configuration handoff: {exc!r}") from None
    if version != VERSION or not isinstance(config, Config) or not isinstance(files, bytes) \
            or not isinstance(rulesets, dict):
        raise HandoffError(f"configuration handoff: not version {VERSION} of a configuration")
    return Handoff(config, Snapshot.decode(files), rulesets)
