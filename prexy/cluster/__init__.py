"""Nodes that act as one cache: invalidations and reloads shared through Redis.

Several Prexy nodes, each with its own store, share one log of
invalidations in Redis (``[cluster] redis = ...``).  A PURGE or a ban on
any node is applied there at once, then added to the log; every other node
applies it when the log's doorbell rings, and a node that was down or cut
off reads what it missed before it serves from its store again.

Which process talks to Redis.  The master, one per node, and no worker.
Every worker of a node reads the one LMDB store, so applying a purge or a
ban once per node reaches them all (the way PURGE and admin bans reach all
workers today); a Redis connection per worker would apply each message N
times and multiply connections by the core count, and an elected worker
would need an election and would lose it on every reload.  The master
already opens the store for admin bans, serves no request (so Redis I/O
is never on the request path: a cache hit runs no cluster code at all),
and outlives worker generations, so it is also the one that can hold the
workers back at start until the node caught up.  A worker that receives
a PURGE applies it to the store itself and hands it to the master over
the control pipe it already reports on; the master publishes it and sends
the verdict back as a datagram on the worker's cache-events socket.  With
``workers = 0`` the single process plays both parts.

Redis layout (``KEY`` = ``[cluster] key``, default ``prexy``):

- ``KEY:log``, a stream: one entry per purge, ban or reload (kind, node,
  time, site, URL or regex), trimmed by age (``keep``) and length
  (``max_entries``).  It is both the delivery and the memory: a node reads
  it after its position, whether it is live, just started or reconnecting,
  so there is one code path and no window between a replay and a
  subscription where a message could fall.
- ``KEY:events``, a pub/sub channel: ``entry ID`` rings the doorbell after
  an XADD (nodes then XREAD); ``ack NODE ID`` says a node applied the log
  up to ID.  The node that published waits (``confirm_timeout``) for the
  acks of the nodes seen alive, so when a PURGE's answer leaves, the other
  nodes have dropped the object.
- ``KEY:nodes``, a hash: each node's position and last heartbeat.

Each node saves its position in a file beside its store (they belong
together: a new store starts with no position).  If Redis trimmed entries
past a node's position (it was away longer than ``keep``) the node empties
its store, since it cannot know what they invalidated.

The modules: ``settings`` (the [cluster] table), ``messages`` (entries
and channel payloads as bytes), ``core`` (the node's state machine,
backoff and confirmations), all pure; ``redis`` (a pipelined RESP client:
``hiredis`` parses, Twisted carries) and ``node`` (the service).
"""
