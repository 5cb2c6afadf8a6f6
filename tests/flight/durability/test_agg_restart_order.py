"""A derived ``agg_by`` keeps its rows *and their order* across a clean restart (#35 item 7).

A real ``ticktable serve --data-dir`` subprocess (``bench.crash.ServerProcess``) stopped
with SIGTERM (the shutdown checkpoint) and started again on the same data dir: the source
comes back with its row keys and the derived table is rebuilt from it, from scratch. The
writes in between delete groups' first rows, empty a group and bring it back, and add new
groups on reused row keys — the histories after which a result that kept each group where
it first appeared would disagree with the rebuilt one. The rule both must follow
(engine.ops.aggregate): groups in order of their first row in the parent's current rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

import ticktable as tt
from bench.crash import ServerProcess

KV = pa.schema([("k", pa.int64()), ("g", pa.int64()), ("v", pa.float64())])


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.kill()


def _serve(servers: list[ServerProcess], data: Path, log: Path) -> ServerProcess:
    server = ServerProcess(data, log, checkpoint_seconds=3600.0, checkpoint_bytes=1 << 30)
    servers.append(server)
    return server


def _rows(client: Any, name: str) -> list[dict[str, Any]]:
    t = client.snapshot(name, as_="arrow")
    assert isinstance(t, pa.Table)
    rows: list[dict[str, Any]] = t.to_pylist()
    return rows


def _recomputed(kv: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The aggregation from scratch: groups in order of their first row in ``kv`` (row order)."""
    out: dict[int, dict[str, Any]] = {}
    for r in kv:
        grp = out.setdefault(r["g"], {"g": r["g"], "v": 0.0, "count": 0})
        grp["v"] += r["v"]
        grp["count"] += 1
    return list(out.values())


def _push(client: Any, k: list[int], g: list[int], v: list[float]) -> None:
    client.push("kv", pd.DataFrame({"k": k, "g": g, "v": v}), mode="upsert")


def _delete(client: Any, k: list[int]) -> None:
    client.push("kv", pd.DataFrame({"k": k}), mode="delete")


def test_agg_by_rows_and_order_survive_a_clean_restart(servers, tmp_path):
    data = tmp_path / "data"
    a = _serve(servers, data, tmp_path / "a.log")
    with tt.connect(a.location, timeout=30) as c:
        c.create_table("kv", KV, "keyed", keys=["k"])
        # row keys 0..8 in this order; groups first appear as 1, 2, 3, 4
        _push(c, list(range(9)), [1, 2, 3, 1, 2, 3, 4, 4, 1], [0.5 * i for i in range(9)])
        c.table("kv").agg_by([tt.agg.sum("v"), tt.agg.count()], by="g").create("by_g")
        assert [r["g"] for r in _rows(c, "by_g")] == [1, 2, 3, 4]
        _delete(c, [0])  # group 1 loses its first row: its next one (row key 3) is after 2's and 3's
        _delete(c, [1, 4])  # group 2 is emptied ...
        _push(c, [20], [2], [1.5])  # ... and comes back in the next cycle, on a freed row key
        _push(c, [21, 22], [5, 3], [2.0, 2.5])  # a new group and a new row of 3, on freed row keys
        _delete(c, [2])  # group 3 loses its first row
        before_kv = _rows(c, "kv")
        before = _rows(c, "by_g")
    assert a.stop() == 0  # SIGTERM: a clean stop, with the shutdown checkpoint

    b = _serve(servers, data, tmp_path / "b.log")
    with tt.connect(b.location, timeout=30) as c:
        assert _rows(c, "kv") == before_kv  # the source: same rows in the same order
        after = _rows(c, "by_g")
    assert b.stop() == 0
    assert after == before  # same rows, same order
    assert after == _recomputed(before_kv)  # the order rule: each group's first row
