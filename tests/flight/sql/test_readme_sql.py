"""The README's Flight SQL snippet (ADBC, pandas, polars) runs as written against a real
server, its URI swapped in."""

from __future__ import annotations

import re
import time
from pathlib import Path

from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_flight_sql_snippet(capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (code,) = [b for b in blocks if "flightsql.connect(" in b]
    graph = UpdateGraph(validate=True)
    graph.start(0.02)
    server = TicktableServer(graph, ServerConfig()).start()
    try:
        exec(compile(code.replace("grpc://127.0.0.1:8815", server.location), str(README), "exec"),
             {})
        out = capsys.readouterr().out
        assert "qty:[[17,8]]" in out.replace(" ", "")  # the view, after the INSERT
        assert "0   A   17" in out and "1   B    8" in out  # pandas
        assert "│ 4   │" in out  # polars: count(*) of orders
        assert server.registry.get("per_sym").kind == "view"
        limits = server.registry.get("limits")
        assert (limits.kind, limits.keys) == ("keyed", ["sym"])
        want = [{"sym": "A", "max_qty": 20}, {"sym": "B", "max_qty": 10}, {"sym": "C", "max_qty": 8},
                {"sym": "D", "max_qty": 9}]
        deadline = time.monotonic() + 10  # the UPDATE was answered before its cycle
        while sorted(limits.table.to_arrow().to_pylist(), key=str) != want:
            assert time.monotonic() < deadline, limits.table.to_arrow().to_pylist()
            time.sleep(0.01)
    finally:
        server.shutdown()
        graph.stop()
