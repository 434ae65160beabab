"""The limits of Prexy's HTTP/2 connections (the ``[http2]`` table), apart
from ``prexy.h2server`` so that loading a config does not import the h2
library (about 13 ms at every start, also with HTTP/2 off)."""

from __future__ import annotations

import attrs

__all__ = ["H2Settings"]


@attrs.frozen
class H2Settings:
    """The ``[http2]`` table: limits of every HTTP/2 connection (defaults
    like nginx's)."""

    #: SETTINGS_MAX_CONCURRENT_STREAMS (nginx ``http2_max_concurrent_streams``).
    max_concurrent_streams: int = 128
    #: SETTINGS_MAX_HEADER_LIST_SIZE, the decoded request head (nginx's
    #: ``large_client_header_buffers 4 8k`` allows 32 KiB).
    max_header_list_size: int = 32 * 1024
    #: A connection with nothing sent or received for this long is closed
    #: (GOAWAY first when no stream is open; nginx ``keepalive_timeout``).
    idle_timeout: float = 75.0
    #: RST_STREAM frames a client may send within ``flood_window`` seconds.
    max_resets: int = 200
    #: SETTINGS frames a client may send within ``flood_window`` seconds.
    max_settings: int = 100
    #: PING frames a client may send within ``flood_window`` seconds.
    max_pings: int = 100
    flood_window: float = 10.0
    #: DATA frames without data that do not end their stream a client may
    #: send within ``flood_window`` seconds (the "empty frames" flood,
    #: CVE-2019-9518: each costs the server work and carries nothing).
    max_empty_frames: int = 100
