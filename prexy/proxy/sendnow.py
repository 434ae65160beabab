"""Send bytes at once, not on the reactor's next turn.

One speed trick, behind this one seam, used for the upstream requests
(``UpstreamProtocol``) and the answers to clients (``ProxyChannel``).  Twisted's
``transport.write`` queues: the bytes leave in the next reactor iteration,
which costs an ``epoll_ctl`` to watch the socket for writability, the
iteration itself, and another ``epoll_ctl`` when the buffer has drained.
A request head is what the origin waits for, an answer what the client
waits for: they are sent in the same turn when the socket takes them.

Per proxied request (``strace -c`` on a worker), a worker makes 4
``epoll_wait`` and 4 ``epoll_ctl`` calls with every write queued, 2 and 0
when both the upstream request and the response are sent at once.  The
writer must be the transport's only one, or be told when another wrote
(``queued``), so it knows whether anything is queued; bench/README.md has
the figures with and without it.

Only plain TCP (``ITCPTransport`` without ``ISSLTransport``), through the
public ``ISystemHandle.getHandle()``; once anything had to be queued (a partial send, a
streamed request body) the connection writes through the transport for
good, so bytes never overtake queued ones.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import ISSLTransport, ISystemHandle, ITCPTransport


class SendNow:
    """Writes for one transport that this object alone writes to."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self._socket: Any = None
        plain_tcp = ITCPTransport.providedBy(transport) and not ISSLTransport.providedBy(transport)
        if plain_tcp and ISystemHandle.providedBy(transport):
            self._socket = transport.getHandle()
        #: True once bytes may wait in the transport's buffer: from then on
        #: everything goes through ``transport.write``, in order.
        self.queued = self._socket is None

    def write(self, data: bytes) -> None:
        transport = self.transport
        if self.queued or transport.disconnecting or not transport.connected:
            transport.write(data)
            return
        try:
            sent = self._socket.send(data)
        except OSError:
            sent = 0  # transport.write meets the error again and reports it
        if sent < len(data):
            self.queued = True
            transport.write(data[sent:])

    def write_parts(self, parts: list[bytes]) -> None:
        """Write ``parts`` in order as one send (``sendmsg``), so a head and
        a large body need not be joined into a copy first."""
        transport = self.transport
        if self.queued or transport.disconnecting or not transport.connected:
            transport.writeSequence(parts)
            return
        try:
            sent = self._socket.sendmsg(parts)
        except OSError:
            sent = 0  # transport.write meets the error again and reports it
        for i, part in enumerate(parts):
            if sent < len(part):
                self.queued = True
                transport.writeSequence([part[sent:], *parts[i + 1 :]])
                return
            sent -= len(part)

    def hand_over(self) -> Any:
        """The transport, for a writer of its own (a streamed body): later
        writes here queue behind whatever it writes."""
        self.queued = True
        return self.transport
