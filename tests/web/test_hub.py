"""PerspectiveHub (feed ``perspective``): a table is held once for all its viewers and freed
with the last; a new viewer right after finds it again (no server: a scripted feed)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flight.web.feed import Change, conform, perspective_schema
from flight.web.hub import PerspectiveHub

SCHEMA = pa.schema([("k", pa.int64())])


def _snapshot(keys: list[int]) -> Change:
    rows = conform(pa.table({"k": keys}, schema=SCHEMA), np.arange(len(keys)),
                   perspective_schema(SCHEMA))
    return Change(True, rows, np.empty(0, np.int64), 1, 1, 0, len(keys))


class _Feed:
    """A followed table: its snapshot delivered on a thread; ``close`` sets ``closing`` and
    returns once ``closable`` is set (as RemoteFeed.close waits for a deliver in progress)."""

    def __init__(self, deliver: Callable[[Change], None],
                 on_failure: Callable[[BaseException], None] | None, keys: list[int]) -> None:
        self.closing = threading.Event()
        self.closable = threading.Event()
        self.closed = False

        def run() -> None:
            try:
                deliver(_snapshot(keys))
            except Exception as exc:  # what RemoteFeed does with a failed deliver
                if on_failure is not None:
                    on_failure(exc)

        threading.Thread(target=run, daemon=True).start()

    def close(self) -> None:
        self.closing.set()
        self.closable.wait(10)
        self.closed = True


class _Tables:
    """The server's tables as RemoteTables offers them: each follow a new feed."""

    def __init__(self) -> None:
        self.feeds: list[_Feed] = []

    def follow(self, name: str, deliver: Callable[[Change], None], *,
               on_failure: Callable[[BaseException], None] | None = None) -> _Feed:
        feed = _Feed(deliver, on_failure, keys=[len(self.feeds)])  # its own rows
        self.feeds.append(feed)
        return feed


def _settled(hub: PerspectiveHub) -> None:
    """Wait for the changes queued on Perspective's thread so far (deletes included)."""
    hub.executor.submit_change(lambda: None).result(10)


def _keys(table: Any) -> list[int]:
    view = table.view()
    try:
        return list(view.to_columns()["k"])
    finally:
        view.delete()


@pytest.fixture
def hub() -> Iterator[PerspectiveHub]:
    h = PerspectiveHub(_Tables())  # type: ignore[arg-type]
    yield h
    h.close()


def test_viewers_share_a_table_and_the_last_one_frees_it(hub):
    tables = hub.tables
    first = hub.acquire("t")
    assert hub.acquire("t") is first and first.viewers == 2 and len(tables.feeds) == 1
    hub.release(first)
    assert hub.hosted() == {"t": first} and not tables.feeds[0].closing.is_set()
    tables.feeds[0].closable.set()
    hub.release(first)
    assert hub.hosted() == {} and tables.feeds[0].closed
    _settled(hub)
    assert hub.client.get_hosted_table_names() == []


def test_a_table_opened_while_its_last_viewer_is_leaving_is_made_anew(hub):
    # the reloaded page's viewer comes while the old page's release still closes the feed:
    # the new copy was queued before the old one's delete and Perspective refused it
    tables = hub.tables
    old = hub.acquire("t")
    leaving = threading.Thread(target=hub.release, args=(old,))
    leaving.start()
    try:
        assert tables.feeds[0].closing.wait(10)  # released, its feed closing
        new = hub.acquire("t", timeout=10)
        assert new is not old and new.error is None and len(tables.feeds) == 2
        assert hub.executor.submit(_keys, new.table).result(10) == [1]  # the new feed's
    finally:
        tables.feeds[0].closable.set()
        leaving.join(10)
    _settled(hub)
    assert hub.client.get_hosted_table_names() == ["t"]  # the new one: the old one went
    tables.feeds[1].closable.set()
    hub.release(new)
