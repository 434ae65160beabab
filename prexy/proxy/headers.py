"""Header access on the Twisted side: twisted.web's ``Headers`` as the
mapping the pure modules take.  The header rules themselves (hop-by-hop
names, forwarding headers) are :mod:`prexy.forwarding`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prexy.forwarding import HOP_BY_HOP, VIA

__all__ = ["HOP_BY_HOP", "VIA", "raw_header_dict"]


def raw_header_dict(headers: Any) -> dict[bytes, Sequence[bytes]]:
    """Lower-case name -> values of a twisted.web Headers object."""
    return {name.lower(): values for name, values in headers.getAllRawHeaders()}
