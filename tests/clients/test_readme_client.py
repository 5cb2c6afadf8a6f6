"""The README's client snippet runs as written against a real server (its URI swapped in)."""

from __future__ import annotations

import re
from pathlib import Path

from engine.graph import UpdateGraph
from flight.server import ServerConfig, TicktableServer

README = Path(__file__).resolve().parents[2] / "README.md"


def snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (code,) = [b for b in blocks if "tt.connect(" in b and "mirror" not in b and "9001" not in b]
    return code


def test_readme_client_snippet(capsys) -> None:
    graph = UpdateGraph(validate=True)
    graph.start(0.02)
    server = TicktableServer(graph, ServerConfig()).start()
    try:
        code = snippet().replace("grpc://127.0.0.1:8815", server.location)
        code += "\nresult = live.df\n"  # the last state it held, after close
        scope: dict[str, object] = {}
        exec(compile(code, str(README), "exec"), scope)
        result = scope["result"]
        assert result.to_dict("list") == {"sym": ["B"], "n": [1]}  # type: ignore[attr-defined]
        out = capsys.readouterr().out
        assert "60.0" in out  # the filtered snapshot printed
        assert "shape: (1, 2)" in out and "shape: (3, 3)" in out  # live.pl, polars snapshot
        assert scope["live"].closed  # type: ignore[attr-defined]
        frames = scope["frames"]  # subscribe_many: both tables at one step
        assert frames["trades"]["id"].tolist() == [1, 2]  # type: ignore[index]
        assert frames[scope["big"].name].to_dict("list") == {"sym": ["B"], "n": [1]}  # type: ignore[index,attr-defined]
        assert scope["group"].closed  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        graph.stop()


def test_readme_sql_snippet() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (code,) = [b for b in blocks if "client.sql(" in b]
    graph = UpdateGraph(validate=True)
    graph.start(0.02)
    server = TicktableServer(graph, ServerConfig()).start()
    try:
        scope: dict[str, object] = {}
        exec(compile(snippet().replace("grpc://127.0.0.1:8815", server.location) + code,
                     str(README), "exec"), scope)
        assert scope["df"].to_dict("list") == {"sym": ["B"], "n": [1]}  # type: ignore[attr-defined]
        assert isinstance(scope["df"].attrs["step"], int)  # type: ignore[attr-defined]
        assert scope["live"].closed  # type: ignore[attr-defined]
        tables = scope["client"].tables()  # type: ignore[attr-defined]
        assert "trades" in tables and not [t for t in tables if t.startswith("__sql_")]
        scope["client"].close()  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        graph.stop()
