"""The pipes between the master and its workers carry one JSON object per
line, both ways (``loaded``, ``ready``, ``metrics``, ``reloaded``, a
``cluster`` invalidation up; ``configuration``, ``serve`` and ``reload``
commands down).  A command may carry a payload: ``"bytes": N`` in its
line, then N raw bytes (the configuration handed over, ``prexy.handoff``).
Pure: bytes in, objects out."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Commands", "JsonLines", "encode"]


def encode(message: dict[str, Any], payload: bytes | None = None) -> bytes:
    """One message as its line; with a ``payload``, the line says how many
    bytes follow it, and they do."""
    if payload is None:
        return (json.dumps(message) + "\n").encode()
    return (json.dumps({**message, "bytes": len(payload)}) + "\n").encode() + payload


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


class Commands:
    """Reads the master's commands from a worker's stdin as they come: a
    JSON object a line, each with the payload its ``"bytes": N`` announces
    (``b""`` when none).  A line that is not a JSON object is skipped.
    Payloads of tens of megabytes arrive in pieces: the buffer grows in
    place, so reading one is linear in its size."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._pending: dict[str, Any] | None = None
        self._needed = 0

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        """The commands ``data`` completes, in order, with their payloads."""
        self._buffer += data
        out: list[tuple[dict[str, Any], bytes]] = []
        while True:
            if self._pending is not None:
                if len(self._buffer) < self._needed:
                    return out
                payload = bytes(self._buffer[: self._needed])
                del self._buffer[: self._needed]
                out.append((self._pending, payload))
                self._pending = None
                continue
            end = self._buffer.find(b"\n")
            if end < 0:
                return out
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            size = message.get("bytes")
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                self._pending, self._needed = message, size
            else:
                out.append((message, b""))
