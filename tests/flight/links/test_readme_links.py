"""The README's links topology runs as written: its four ``ticktable serve`` lines as real
processes (ports swapped for free ones, data in a temporary directory), then its Python
lines against them."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

from bench.crash import ServerProcess
from bench.ports import HeldPort

README = Path(__file__).resolve().parents[3] / "README.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), re.S)


def test_the_readme_topology_of_one_origin_and_two_mirrors(tmp_path, capsys):
    (shell,) = [b for b in _blocks("bash") if "--mirror-of" in b]
    (code,) = [b for b in _blocks("python") if "9001" in b]
    # held until the end: each server starts only after the ones before it are up
    held = {p: HeldPort() for p in ("8815", "9001", "9002", "9003")}
    ports = {p: str(h.port) for p, h in held.items()}

    def swapped(text: str) -> str:
        for old, new in ports.items():
            text = text.replace(f":{old}", f":{new}").replace(f"--port {old}", f"--port {new}")
        return text

    servers = []
    try:
        for i, line in enumerate(shell.strip().splitlines()):
            argv = shlex.split(swapped(line.split("#")[0]))
            assert argv[:2] == ["ticktable", "serve"], line
            servers.append(ServerProcess(tmp_path / f"data{i}", tmp_path / f"log{i}",
                                         args=argv[2:]))
        import ticktable as tt

        end = time.monotonic() + 30
        with tt.connect(f"grpc://127.0.0.1:{ports['9001']}") as mirror, \
                tt.connect(f"grpc://127.0.0.1:{ports['9002']}") as eu, \
                tt.connect(f"grpc://127.0.0.1:{ports['9003']}") as filtered:
            while not ({"quotes", "board", "stats"} <= set(mirror.tables())
                       and "board_eu" in eu.tables() and "big" in filtered.tables()):
                assert time.monotonic() < end, (mirror.tables(), eu.tables(),
                                                filtered.tables())
                time.sleep(0.1)
            kinds = dict(zip(*(mirror.stats()[c] for c in ("name", "kind")), strict=True))
            assert set(kinds.values()) == {"mirror"}
            big = filtered.snapshot("big")
            assert list(big.columns) == ["Sym", "Bid"] and (big["Bid"] > 100).all()
        scope: dict[str, object] = {}
        exec(compile(swapped(code), str(README), "exec"), scope)
        out = capsys.readouterr().out
        assert "Sym" in out and "mirror" in out
        live = scope["live"]
        assert live.closed and len(live.df) > 0  # type: ignore[attr-defined]
    finally:
        for s in servers:
            s.stop()
        for h in held.values():
            h.close()
