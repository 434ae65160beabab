"""Pure work on files spread over forked processes while this one goes on.

A master's start with thousands of sites checks hundreds of rules files
(every pattern compiled on its engine: most of the start's CPU) while it
reads the site files that name them.  :class:`Pool` takes the files as
they are named (:meth:`Pool.submit`, which never blocks), has forked
children work on them (a pure function of the file's path: it reads the
file itself), and gives back what was found once the caller needs it
(:meth:`Pool.results`).  The caller's own serial path stays the
reference: a result is a hint it checks (a rules file's digest, compared
with the bytes it read), and an item whose work raised or whose child
died is simply missing from the results, so the serial path does that
item itself and reports its error exactly as without a pool.

A child works on its items in the order it was handed them and appends
each answer to a file of its own (a ``memfd``: it never waits for this
process to read).  When the caller asks for the results, this process
reads the answers so far and works on the items no child has answered
yet itself, each child's last one first, until it meets the child
working forwards: the items left then are shared, not waited for.

No child is forked for a few items (:data:`MIN_ITEMS`: the first ones
wait in this process until there are that many), on a single CPU, or in a
process running other threads (a fork copies only the calling thread,
and locks the others held).  The children start as copies of this
process (the work's modules imported, nothing to read again but the
files) and end with ``os._exit``: nothing of this process runs in them
but the work.  Linux only (``memfd``); elsewhere nothing is forked.
No Twisted here.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import signal
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["MIN_ITEMS", "Pool", "available_cpus"]

R = TypeVar("R")

#: Items a pool holds before it forks: below that, forking (a few
#: milliseconds per child) would cost about what the children save.
MIN_ITEMS = 32

#: Bytes a child's pipe of items holds (Linux's most for a process
#: without privileges, by default): items that do not fit wait in this
#: process until it writes more, or works on them itself.
PIPE_SIZE = 1 << 20

_LENGTH = struct.Struct("!I")


def available_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Child:
    """One forked child, from the parent's side: the pipe it takes items
    from (written without blocking: what does not fit waits in
    ``unsent``) and the file it appends its answers to."""

    def __init__(self, pid: int, tasks: int, answers: int) -> None:
        self.pid = pid
        self.tasks = tasks
        self.answers = answers
        #: The items it was handed, in order (all of their bytes written).
        self.sent: list[str] = []
        #: Items handed but not all written yet: (item, its line's bytes not written).
        self.unsent: deque[tuple[str, bytes]] = deque()
        #: Answers read (the first ``frames`` of ``sent``: it answers in order).
        self.frames = 0
        self.read = 0
        self.dead = False

    def hand(self, item: str) -> None:
        self.unsent.append((item, json.dumps(item).encode("utf-8") + b"\n"))
        self.flush()

    def flush(self) -> None:
        while self.unsent and not self.dead:
            item, data = self.unsent[0]
            try:
                written = os.write(self.tasks, data)
            except BlockingIOError:
                return
            except OSError:  # (it died: what it holds is this process's)
                self.dead = True
                return
            if written < len(data):
                self.unsent[0] = (item, data[written:])
                return
            self.unsent.popleft()
            self.sent.append(item)

    def answers_now(self) -> Iterator[tuple[str, bool, Any]]:
        """The answers it appended since the last look."""
        while True:
            head = os.pread(self.answers, _LENGTH.size, self.read)
            if len(head) < _LENGTH.size:
                return
            (size,) = _LENGTH.unpack(head)
            frame = os.pread(self.answers, size, self.read + _LENGTH.size)
            if len(frame) < size:  # (being written)
                return
            self.read += _LENGTH.size + size
            try:
                answer = pickle.loads(frame)
            except Exception:
                self.dead = True
                return
            self.frames += 1
            yield answer


class Pool(Generic[R]):
    """``work(item)`` for the items submitted, in ``children`` forked
    processes and then this one (see the module's docstring)."""

    def __init__(
        self, work: Callable[[str], R], children: int, min_items: int = MIN_ITEMS,
        alone: Callable[[], bool] = lambda: threading.active_count() == 1,
    ) -> None:
        self.work = work
        self.wanted = children
        self.min_items = min_items
        #: Whether this process runs no other thread (a fork is safe).
        self.alone = alone
        #: Items submitted before the pool forked (all of them, when it does not).
        self.waiting: list[str] = []
        self.children: list[_Child] = []
        self._seen: set[str] = set()
        self._next = 0
        self._done = False
        #: Items this process worked on itself (``results``).
        self.own = 0

    @classmethod
    def for_this_machine(cls, work: Callable[[str], R], min_items: int = MIN_ITEMS) -> Pool[R]:
        """A pool of one child per CPU but one (this process goes on with
        its own work meanwhile); none on a single CPU."""
        return cls(work, available_cpus() - 1, min_items)

    @property
    def forked(self) -> bool:
        return bool(self.children)

    def submit(self, item: str) -> None:
        """Have ``item`` worked on (once, however many times it is submitted)."""
        if self._done or item in self._seen:
            return
        self._seen.add(item)
        if self.children:
            self._hand(item)
            return
        self.waiting.append(item)
        if len(self.waiting) >= self.min_items and self.wanted > 0 and hasattr(os, "memfd_create") \
                and self.alone():
            self._fork()
            if self.children:
                waiting, self.waiting = self.waiting, []
                for waited in waiting:
                    self._hand(waited)

    def results(self) -> dict[str, R]:
        """What was found, by item (nothing when the pool never forked: the
        caller does every item).  The items no child answered yet are
        worked on here, each child's last first, until every item is
        answered; then the children end.  The pool takes no more items."""
        if self._done or not self.children:
            self._done = True
            return {}
        self._done = True
        found: dict[str, R] = {}
        try:
            left: list[str] = []  # (no child has them: this process's)
            for child in self.children:
                left += [item for item, _ in child.unsent]
                child.unsent.clear()
            for item in left:
                self._own(item, found)
            while True:
                busy = None
                for child in self.children:
                    for item, ok, result in child.answers_now():
                        if ok:
                            found.setdefault(item, result)
                    behind = child.sent[child.frames:]  # (it answers them in order)
                    if behind and (busy is None or len(behind) > len(busy[1])):
                        busy = (child, behind)
                if busy is None:
                    break
                child, behind = busy
                item = behind[-1]
                child.sent.remove(item)  # (its answer, if it comes, is the same)
                self._own(item, found)
        finally:
            self.close()
        return found

    def close(self) -> None:
        """End the children (if they still run) and reap them."""
        self._done = True
        children, self.children = self.children, []
        for child in children:
            for fd in (child.tasks, child.answers):
                os.close(fd)
            try:
                os.kill(child.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(child.pid, 0)
            except ChildProcessError:  # (reaped already)
                pass

    def __enter__(self) -> Pool[R]:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _own(self, item: str, found: dict[str, R]) -> None:
        self.own += 1
        try:
            found[item] = self.work(item)
        except Exception:  # (left to the caller, who reports it)
            pass

    def _hand(self, item: str) -> None:
        child = self.children[self._next % len(self.children)]
        self._next += 1
        child.hand(item)

    def _fork(self) -> None:
        for n in range(self.wanted):
            tasks_r, tasks_w = os.pipe()
            answers = os.memfd_create(f"prexy-forked-{n}", os.MFD_CLOEXEC)
            try:
                pid = os.fork()
            except OSError:
                for fd in (tasks_r, tasks_w, answers):
                    os.close(fd)
                break
            if pid == 0:  # the child: never returns
                code = 1
                try:
                    os.close(tasks_w)
                    for earlier in self.children:  # (else their pipes never end)
                        os.close(earlier.tasks)
                        os.close(earlier.answers)
                    code = _serve(self.work, tasks_r, answers)
                finally:
                    os._exit(code)
            os.close(tasks_r)
            os.set_blocking(tasks_w, False)
            try:  # (room for thousands of names: what does not fit waits here)
                fcntl.fcntl(tasks_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            except (AttributeError, OSError):
                pass
            self.children.append(_Child(pid, tasks_w, answers))


def _serve(work: Callable[[str], Any], tasks: int, answers: int) -> int:
    """A child's life: each item read from ``tasks`` worked on, in order,
    and its answer (its result, or that its work raised) appended to
    ``answers``, until ``tasks`` ends."""
    buffered = b""
    while True:
        chunk = os.read(tasks, 1 << 16)
        if not chunk:
            return 0
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            item = json.loads(line)
            try:
                data = pickle.dumps((item, True, work(item)), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:
                data = pickle.dumps((item, False, None), protocol=pickle.HIGHEST_PROTOCOL)
            os.write(answers, _LENGTH.pack(len(data)) + data)
