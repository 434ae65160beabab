"""Fakes for the Twisted side of issuance: a thread pool whose jobs run
when the test says, a reactor whose calls from threads run at once, and a
blocking issuer that answers what the test scripted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prexy.acme.storage import StoredCertificate


class QueuedPool:
    """``callInThreadWithCallback`` queues; :meth:`run_one` runs the oldest job."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[bool, Any], None], Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []

    def callInThreadWithCallback(self, on_result: Callable[[bool, Any], None], f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.jobs.append((on_result, f, args, kwargs))

    def run_one(self) -> None:
        from twisted.python.failure import Failure

        on_result, f, args, kwargs = self.jobs.pop(0)
        try:
            result = f(*args, **kwargs)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)


class ImmediateReactor:
    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        f(*args, **kwargs)


class ScriptedIssuer:
    """A stand-in for :class:`prexy.acme.issuer.BlockingIssuer`: each name's
    outcomes in order (a certificate to return or an exception to raise)."""

    def __init__(self, outcomes: dict[str, list[StoredCertificate | BaseException]]) -> None:
        self.outcomes = outcomes
        self.calls: list[str] = []

    def issue(self, name: str) -> StoredCertificate:
        self.calls.append(name)
        outcome = self.outcomes[name].pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
