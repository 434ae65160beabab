"""Where a configuration's files are read from: the disk, or a snapshot of
exactly what a master validated.

Loading a configuration (:mod:`prexy.config`, :mod:`prexy.runtime`,
:mod:`prexy.urlmap`) reads every file through one :class:`IFiles`: the
main file, the site files ``include`` finds, rules files, map files and
what they include, upstream CA files, the ``ssl:`` listeners' key and
certificate, and asks it whether the files a site names exist.

* :class:`DiskFiles` answers from the file system (``--check``,
  ``--workers 0``).
* :class:`Recorder` answers from the disk too and remembers every answer
  of one load, so that :meth:`Recorder.snapshot` gives exactly the bytes
  and answers that load saw: what the master validated.
* :class:`Snapshot` answers from those recorded answers only.  A worker
  loads from the snapshot its master hands it (at start and with every
  in-place reload), never from the disk, so a worker that replaces a
  dead one serves the configuration in force, whatever the files hold
  now (changed without a reload, or broken).

A snapshot travels as bytes (:meth:`Snapshot.encode`, once per validated
configuration): a JSON index line, then the files' contents one after the
other.  No Twisted here.
"""

from __future__ import annotations

import errno
import fnmatch
import glob as _glob
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from zope.interface import Interface, implementer


@attrs.frozen
class FileStatus:
    """What tells a file changed without reading it (git's index compares
    the same fields)."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @property
    def mtime(self) -> float:
        """Modification time in seconds."""
        return self.mtime_ns / 1e9

    @classmethod
    def of(cls, st: os.stat_result) -> FileStatus:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class IFiles(Interface):
    """The files a configuration is loaded from."""

    def read(path: str) -> bytes:
        """The whole content of the file at ``path``; ``OSError`` when it
        cannot be read."""

    def status(path: str) -> FileStatus | None:
        """The file's (or directory's) status; None when it does not exist."""

    def is_file(path: str) -> bool:
        """Whether ``path`` is a regular file."""

    def glob(pattern: str) -> list[str]:
        """The paths a shell pattern matches, sorted."""

    def listdir(path: str) -> list[str]:
        """The names in a directory, sorted; ``NotADirectoryError`` for a
        file, another ``OSError`` when it cannot be read."""


@implementer(IFiles)
class DiskFiles:
    """The file system."""

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def status(self, path: str) -> FileStatus | None:
        try:
            return FileStatus.of(os.stat(path))
        except OSError:
            return None

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def glob(self, pattern: str) -> list[str]:
        return sorted(_glob.glob(pattern))

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))


DISK = DiskFiles()


@implementer(IFiles)
class Recorder:
    """The disk (or ``base``), with every answer of the current load kept.

    :meth:`begin` starts a load; :meth:`snapshot` gives what it saw.  The
    contents last read of every file are kept across loads with the status
    they were read at, because a load may skip reading a file whose status
    did not change (``ConfigMemo``, maps reused by modification time): the
    snapshot still holds its bytes, the ones that load relied on.
    """

    def __init__(self, base: Any = DISK) -> None:
        self.base = base
        #: path -> (status when read, bytes), kept across loads.
        self._kept: dict[str, tuple[FileStatus | None, bytes]] = {}
        self.begin()

    def begin(self) -> None:
        """Start recording a new load."""
        self._read: dict[str, bytes] = {}
        self._status: dict[str, FileStatus | None] = {}
        self._is_file: dict[str, bool] = {}
        self._globs: dict[str, list[str]] = {}
        self._dirs: dict[str, list[str] | None] = {}

    def read(self, path: str) -> bytes:
        status = self.status(path)
        data = self.base.read(path)
        self._read[path] = data
        self._kept[path] = (status, data)
        return data

    def status(self, path: str) -> FileStatus | None:
        if path not in self._status:
            self._status[path] = self.base.status(path)
        return self._status[path]

    def is_file(self, path: str) -> bool:
        if path not in self._is_file:
            self._is_file[path] = self.base.is_file(path)
        return self._is_file[path]

    def glob(self, pattern: str) -> list[str]:
        if pattern not in self._globs:
            self._globs[pattern] = list(self.base.glob(pattern))
        return list(self._globs[pattern])

    def listdir(self, path: str) -> list[str]:
        if path not in self._dirs:
            try:
                self._dirs[path] = list(self.base.listdir(path))
            except NotADirectoryError:
                self._dirs[path] = None  # (a file: read it)
        names = self._dirs[path]
        if names is None:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        return list(names)

    def snapshot(self) -> Snapshot:
        """What the current load saw: the bytes of every file it read, and
        of every file it found unchanged since it last read it; the status,
        existence and pattern answers it got.  Files no longer seen are
        forgotten."""
        contents = dict(self._read)
        for path, status in self._status.items():
            if path in contents or status is None:
                continue
            kept = self._kept.get(path)
            # Unchanged (its modification time, what a reuse relies on)
            # since it was last read: those bytes are the ones in force.
            if kept is not None and kept[0] is not None and kept[0].mtime_ns == status.mtime_ns:
                contents[path] = kept[1]
        self._kept = {path: entry for path, entry in self._kept.items() if path in self._status}
        return Snapshot(contents, self._status, self._is_file, self._globs, self._dirs)


class NotInSnapshot(FileNotFoundError):
    """A file the loaded configuration needs but its snapshot does not hold."""


@implementer(IFiles)
class Snapshot:
    """Answers recorded from one load (:meth:`Recorder.snapshot`), and
    nothing else: the disk is never consulted."""

    def __init__(
        self,
        contents: Mapping[str, bytes],
        status: Mapping[str, FileStatus | None] | None = None,
        is_file: Mapping[str, bool] | None = None,
        globs: Mapping[str, Iterable[str]] | None = None,
        dirs: Mapping[str, Iterable[str] | None] | None = None,
    ) -> None:
        self.contents = dict(contents)
        self._status = dict(status or {})
        self._is_file = dict(is_file or {})
        self._globs = {pattern: list(found) for pattern, found in (globs or {}).items()}
        #: Directory listings by path (None: the path is a file).
        self._dirs = {path: None if names is None else list(names) for path, names in (dirs or {}).items()}
        self._encoded: bytes | None = None

    def __len__(self) -> int:
        return len(self.contents)

    @property
    def size(self) -> int:
        """Bytes of file contents held."""
        return sum(len(data) for data in self.contents.values())

    def read(self, path: str) -> bytes:
        try:
            return self.contents[path]
        except KeyError:
            raise NotInSnapshot(errno.ENOENT, "not in the configuration the master validated", path) from None

    def status(self, path: str) -> FileStatus | None:
        if path in self._status:
            return self._status[path]
        return FileStatus(0, 0, len(self.contents[path]), 0, 0) if path in self.contents else None

    def is_file(self, path: str) -> bool:
        if path in self._is_file:
            return self._is_file[path]
        return path in self.contents

    def glob(self, pattern: str) -> list[str]:
        if pattern in self._globs:
            return list(self._globs[pattern])
        return sorted(p for p in self.contents if fnmatch.fnmatchcase(p, pattern))

    def listdir(self, path: str) -> list[str]:
        if path in self._dirs:
            names = self._dirs[path]
            if names is None:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
            return list(names)
        if path in self.contents:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        raise NotInSnapshot(errno.ENOENT, "not in the configuration the master validated", path)

    def without(self, paths: Iterable[str]) -> Snapshot:
        """This snapshot less the files ``paths`` (their contents and status):
        what a worker needs once it is handed the configuration parsed
        from them (:mod:`prexy.handoff`)."""
        drop = set(paths)
        return Snapshot(
            {p: data for p, data in self.contents.items() if p not in drop},
            {p: st for p, st in self._status.items() if p not in drop},
            {p: answer for p, answer in self._is_file.items() if p not in drop},
            # (a pattern that found only those files: ``include``'s)
            {pattern: found for pattern, found in self._globs.items() if not found or not drop.issuperset(found)},
            self._dirs,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshot):
            return NotImplemented
        return (self.contents, self._status, self._is_file, self._globs, self._dirs) == (
            other.contents, other._status, other._is_file, other._globs, other._dirs
        )

    __hash__ = None  # type: ignore[assignment]

    # -- as bytes -------------------------------------------------------------

    def encode(self) -> bytes:
        """One line of JSON (the index: paths, sizes, statuses, answers),
        then every file's contents in index order.  Computed once."""
        if self._encoded is None:
            paths = list(self.contents)
            index = {
                "files": [[path, len(self.contents[path])] for path in paths],
                "status": [[path, None if st is None else attrs.astuple(st)] for path, st in self._status.items()],
                "is_file": list(self._is_file.items()),
                "globs": list(self._globs.items()),
                "dirs": list(self._dirs.items()),
            }
            self._encoded = b"".join(
                [json.dumps(index, separators=(",", ":")).encode("ascii"), b"\n",
                 *(self.contents[path] for path in paths)]
            )
        return self._encoded

    @classmethod
    def decode(cls, data: bytes) -> Snapshot:
        """The snapshot :meth:`encode` gave; ``ValueError`` when ``data`` is
        not one (cut short, or not an index)."""
        line_end = data.find(b"\n")
        if line_end < 0:
            raise ValueError("configuration snapshot: no index line")
        try:
            index = json.loads(data[:line_end])
            files = [(str(path), int(size)) for path, size in index["files"]]
            status = {str(path): None if st is None else FileStatus(*st) for path, st in index["status"]}
            is_file = {str(path): bool(answer) for path, answer in index["is_file"]}
            globs = {str(pattern): [str(p) for p in found] for pattern, found in index["globs"]}
            dirs = {str(path): None if names is None else [str(n) for n in names] for path, names in index["dirs"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"configuration snapshot: bad index: {exc}") from None
        view = memoryview(data)
        offset = line_end + 1
        contents = {}
        for path, size in files:
            if offset + size > len(data):
                raise ValueError(f"configuration snapshot: cut short in {path}")
            contents[path] = bytes(view[offset : offset + size])
            offset += size
        if offset != len(data):
            raise ValueError("configuration snapshot: bytes after the last file")
        return cls(contents, status, is_file, globs, dirs)
