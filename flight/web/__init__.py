"""The web UI: a page listing the server's tables and showing any of them live in
Perspective's ``<perspective-viewer>`` (DESIGN.md §9, issue #17).

It runs in a process of its own, below the server's priority (:mod:`flight.web.link`);
the server keeps only the feeds. Reading order:

- :mod:`flight.web.feed`: (in the server) a table's updates as Perspective changes
  (upserts and removes keyed by row key), one thread per followed table, coalescing for
  slow consumers.
- :mod:`flight.web.link`: (in the server) starts the web process and sends it the changes
  of the tables its pages follow; :mod:`flight.web.child`: the web process's side.
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

from flight.web.feed import FEEDS as FEEDS
from flight.web.link import WebProcess as WebProcess

__all__ = ["FEEDS", "WebProcess"]
