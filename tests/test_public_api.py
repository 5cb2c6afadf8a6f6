"""The promised API is what ticktable re-exports (httpx-style guard), and the CLI runs."""

import subprocess
import sys

import pytest

import ticktable as tt


def test_all_is_sorted_and_complete():
    assert tt.__all__ == sorted(tt.__all__)
    # submodules imported by the CLI or the tests (the set-up checks), not API
    public = {n for n in dir(tt) if not n.startswith("_")} - {
        "annotations", "chromium_check", "cli", "java_check", "spark"}
    assert public == set(tt.__all__)


def test_spark_is_loaded_on_first_use():
    import pyspark.sql.datasource

    assert tt.spark.push is __import__("clients.spark").spark.push
    assert issubclass(tt.spark.TicktableDataSource, pyspark.sql.datasource.DataSource)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tt.nope  # noqa: B018


def test_readme_example_runs():
    import pyarrow as pa

    graph = tt.UpdateGraph(validate=True)
    quotes = graph.keyed_table(pa.schema([("Sym", pa.string()), ("Px", pa.float64())]), keys="Sym")
    seen = []
    quotes.listen(lambda update, table: seen.append(update))
    quotes.upsert({"Sym": ["AAPL", "MSFT"], "Px": [190.0, 410.0]})
    graph.run_cycle()
    quotes.upsert({"Sym": ["AAPL"], "Px": [191.5]})
    graph.run_cycle()
    assert seen[1].modified.keys().tolist() == [0] and seen[1].modified_columns == {"Px"}
    assert quotes.to_pandas()["Px"].tolist() == [191.5, 410.0]

    import pyarrow.compute as pc

    rich = quotes.where(pc.field("Px") > 200).update(Lot=pc.field("Px") * 100)
    by_sym = rich.sort("Px", descending=True)
    stats = quotes.agg_by([tt.agg.mean("Px"), tt.agg.max("Px", "Hi"), tt.agg.count("N")])
    quotes.upsert({"Sym": ["NVDA"], "Px": [950.0]})
    graph.run_cycle()
    assert by_sym.to_pandas()["Sym"].tolist() == ["NVDA", "MSFT"]
    assert by_sym.to_pandas()["Lot"].tolist() == [95000.0, 41000.0]
    assert stats.to_pandas().iloc[0].tolist() == [pytest.approx((191.5 + 410 + 950) / 3), 950.0, 3]


def test_cli_demo_prints_a_changing_table():
    out = subprocess.run([sys.executable, "-m", "ticktable.cli", "demo", "--cycles", "3", "--interval", "0",
                          "--seed", "2", "--validate"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("step ") == 3
    assert "Sym" in out.stdout and "added" in out.stdout


def test_cli_help():
    out = subprocess.run([sys.executable, "-m", "ticktable.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "demo" in out.stdout


def test_java_check_reports():
    out = subprocess.run([sys.executable, "-m", "ticktable.java_check"], capture_output=True, text=True)
    assert ("ok" in out.stdout) if out.returncode == 0 else ("needs Java 17" in out.stderr)
