"""The pipes between the master and its workers carry one JSON object per
line, both ways (``ready``, ``metrics``, ``reloaded``, a ``cluster``
invalidation up; ``reload`` commands down).  Pure: bytes in, objects out."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["JsonLines", "encode"]


def encode(message: dict[str, Any]) -> bytes:
    """One message as its line."""
    return (json.dumps(message) + "\n").encode()


class JsonLines:
    """Reads messages from a pipe's bytes as they come: a line that is not
    a JSON object is skipped (nothing that arrives can stop the reader)."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """The messages ``data`` completes, in order."""
        self._buffer += data
        if b"\n" not in self._buffer:
            return []
        *lines, self._buffer = self._buffer.split(b"\n")
        out = []
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                out.append(message)
        return out
