"""The web UI: a page listing the server's tables and showing any of them live in
Perspective's ``<perspective-viewer>`` (DESIGN.md §9, issue #17).

Reading order:

- :mod:`flight.web.feed`: a table's updates as Perspective changes (upserts and removes
  keyed by row key), one thread per followed table, coalescing for slow consumers.
- :mod:`flight.web.hub`: feed ``perspective`` (the default): Perspective's Python server
  holds one table per opened live table, fed from its updates; the browser's viewer talks
  to it over Perspective's websocket protocol, so only the visible viewport crosses.
- :mod:`flight.web.gateway`: feed ``arrow``: our own WebSocket streaming the snapshot and
  each change as Arrow IPC into Perspective's WASM engine in the browser.
- :mod:`flight.web.app`: the HTTP server (tornado) in a thread of its own: the page, its
  assets (built from ``web/`` by ``make``; no CDN), the JSON table list, both websockets,
  the token gate and TLS.
"""

from __future__ import annotations

from flight.web.app import FEEDS as FEEDS
from flight.web.app import WebServer as WebServer

__all__ = ["FEEDS", "WebServer"]
