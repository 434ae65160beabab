"""URL maps: nginx ``map`` files read and looked up in near-constant time.

Pure Python, no Twisted.  ``load_map(path)`` / ``parse_map(text, ...)`` give
an immutable :class:`UrlMap`; ``UrlMap.lookup(key)`` returns exactly what
nginx's ``map`` would (``""`` for no value); ``UrlMap.match(key)`` also says
which entry answered.  Load errors are :class:`MapError` with file and line.
"""

from prexy.urlmap.errors import MapError
from prexy.urlmap.index import MapLookup, SourceFile, UrlMap
from prexy.urlmap.loader import load_map, parse_map

__all__ = ["MapError", "MapLookup", "SourceFile", "UrlMap", "load_map", "parse_map"]
