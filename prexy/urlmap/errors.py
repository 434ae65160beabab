"""The one exception a map file can raise while it is read: :class:`MapError`.

It carries where the problem is (file and line), the offending text and why,
so an operator can fix the file; ``str()`` reads like
``old.map:12: invalid regex "~^/(a": missing )``.
"""

from __future__ import annotations


class MapError(Exception):
    """A map file (or one it includes) cannot be loaded.

    ``filename`` and ``line`` locate the problem, ``text`` is the offending
    token or statement, ``reason`` says what is wrong with it and ``detail``
    (possibly empty) adds what the regex engine or the file system said.
    ``line`` is 0 for a problem with the file as a whole (it cannot be read).
    """

    def __init__(self, filename: str, line: int, text: str, reason: str, detail: str = "") -> None:
        self.filename = filename
        self.line = line
        self.text = text
        self.reason = reason
        self.detail = detail
        super().__init__(self.__str__())

    def __str__(self) -> str:
        place = f"{self.filename}:{self.line}" if self.line else self.filename
        where = f"{place}: {self.reason}"
        if self.text:
            where += f' "{self.text}"'
        if self.detail:
            where += f": {self.detail}"
        return where

    def __reduce__(self) -> tuple[type[MapError], tuple[str, int, str, str, str]]:
        return (MapError, (self.filename, self.line, self.text, self.reason, self.detail))
