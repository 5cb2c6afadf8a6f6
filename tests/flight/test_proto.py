"""The committed generated code is what ``make proto`` produces from proto/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_the_protos(tmp_path):
    spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    written = gen.generate(tmp_path)
    assert {p.name for p in written} >= {"flight_pb2.py", "flight_pb2.pyi",
                                         "table_service_pb2.py", "table_service_pb2_grpc.py"}
    committed = ROOT / "flight" / "pb"
    for p in written:
        assert (committed / p.name).read_text() == p.read_text(), (
            f"flight/pb/{p.name} is stale: run `make proto` and commit the result")
    extra = {p.name for p in committed.glob("*_pb2*")} - {p.name for p in written}
    assert not extra, f"flight/pb has files no proto produces: {extra}"
