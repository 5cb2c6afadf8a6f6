"""parse_one, statement_kind, tables_of."""

from __future__ import annotations

import pytest
from sqlglot import exp

from engine.errors import SqlError
from flight.sql.parse import parse_one, statement_kind, tables_of


@pytest.mark.parametrize(("text", "kind"), [
    ("SELECT 1", "select"),
    ("SELECT 1 UNION ALL SELECT 2", "select"),
    ("WITH w AS (SELECT 1) SELECT * FROM w", "select"),
    ("CREATE VIEW v AS SELECT * FROM t", "create_view"),
    ("INSERT INTO t VALUES (1)", "insert"),
    ("DELETE FROM t WHERE k = 1", "delete"),
    ("DROP VIEW v", "drop_view"),
    ("DROP TABLE t", "drop_table"),
    ("CREATE TABLE t (k INT)", "create_table"),
    ("CREATE TABLE t AS SELECT 1", "create_table"),
    ("UPDATE t SET a = 1 WHERE k = 2", "update"),
    ("CREATE SCHEMA s", "other"),
    ("DROP SCHEMA s", "other"),
])
def test_statement_kind(text, kind):
    assert statement_kind(parse_one(text)) == kind


@pytest.mark.parametrize(("text", "tables"), [
    ("SELECT * FROM c JOIN a ON c.k = a.k JOIN b USING (k)", ["c", "a", "b"]),
    ("WITH w AS (SELECT * FROM a) SELECT * FROM w JOIN b USING (k) JOIN a USING (k)", ["a", "b"]),
    ("SELECT * FROM a WHERE k IN (SELECT k FROM b)", ["a", "b"]),
    ("CREATE VIEW v AS SELECT * FROM a", ["a"]),
    ("INSERT INTO t (k) SELECT k FROM u", ["u"]),
    ("DELETE FROM t WHERE k IN (SELECT k FROM z)", ["t", "z"]),
    ("UPDATE t SET a = (SELECT max(a) FROM y) WHERE k IN (SELECT k FROM z)", ["t", "y", "z"]),
    ("CREATE TABLE t (k INT)", []),
    ("CREATE TABLE t AS SELECT * FROM u", ["u"]),
    ("DROP VIEW v", []),
    ("SELECT 1", []),
])
def test_tables_of_in_order_once_without_ctes_or_targets(text, tables):
    assert tables_of(parse_one(text)) == tables


def test_syntax_errors_name_line_and_column():
    with pytest.raises(SqlError, match=r"^SQL syntax error at line 1, column 13: .*end of the text"):
        parse_one("SELECT x FROM")
    with pytest.raises(SqlError, match=r"^SQL syntax error at line 2, column 8: Missing '"):
        parse_one("SELECT x\nFROM t 'abc")
    with pytest.raises(SqlError, match="one statement per query: the text holds 2 statements"):
        parse_one("SELECT 1; SELECT 2")
    with pytest.raises(SqlError, match="no statement"):
        parse_one("  ;")
    assert parse_one("SELECT 1;").sql() == "SELECT 1"


def test_a_syntax_error_names_sqlglot_nodes_by_their_name_only():
    with pytest.raises(SqlError) as raised:
        parse_one("SELEC * FROM orders")
    assert str(raised.value) == ("SQL syntax error at line 1, column 12: Required keyword: "
                                 "'expression' missing for Mul")


# ---------------------------------------------------------------------------- shapes
def _fresh(text: str):
    """What sqlglot's whole parse gives, without the shapes."""
    from flight.sql.parse import _parse_one

    return _parse_one(text)


_TEMPLATES = [
    "SELECT * FROM t WHERE id + 0 = {n}",
    "SELECT * FROM k WHERE s = {s} AND x IN ({n}, {f}, {n}) AND y BETWEEN {n} AND {f}",
    "SELECT g, count(*) FROM t WHERE x > {n} AND s <> {s} GROUP BY g HAVING count(*) > {n} LIMIT {n}",
    "SELECT CAST({n} AS DECIMAL(10, 2)), {s} || {s}, -{f} FROM t",
    "WITH w AS (SELECT * FROM a WHERE v = {s}) SELECT * FROM w JOIN b USING (k) WHERE k < {n}",
    "INSERT INTO t VALUES ({n}, {s}, {f})",
    "DELETE FROM k WHERE id = {n}",
    "SELECT * FROM t WHERE s = {s} /* a comment */ AND id = {n}",
    # literals the parser reads into something else: never kept, parsed each time
    "SELECT INTERVAL {sd} + x FROM t WHERE id = {n}",
    "SELECT a[{n}] FROM t",
    "SELECT {s} {s} FROM t",
    "SELECT E{s}, {n}e3, 0x{n} FROM t",
    "SELECT date_trunc({su}, ts), strftime(ts, {s}), round(x, {n}) FROM t WHERE ts > DATE {sdate}",
    "SELECT * FROM t WHERE ts > {sdate}::DATE AND x = -({n}) AND y LIKE {s} LIMIT {n} OFFSET {n}",
    "SELECT {n} AS a, {s} AS b, ({n}, {s}) FROM t WHERE NOT x = {n} OR x IS DISTINCT FROM {n}",
]


def _literals(rng):
    """Random literal texts: integers of every length, decimals, strings with quotes."""
    n = str(int(rng.integers(0, 10 ** int(rng.integers(1, 19)))))
    f = rng.choice([f"{rng.random() * 1000:.{int(rng.integers(0, 6))}f}", ".5", "7.", "1_000",
                    "007", "1e3"])
    chars = list("ab'c %_\\\"")
    s = "'" + "".join(rng.choice(chars, int(rng.integers(0, 8)))).replace("'", "''") + "'"
    sd = rng.choice(["'1 day'", "'2 hours'", "'3'"])
    su = rng.choice(["'day'", "'month'", "'x'", "'1'"])
    sdate = rng.choice(["'2020-01-01'", "'2024-02-29 10:00'", "'now'"])
    return {"n": n, "f": str(f), "s": s, "sd": str(sd), "su": str(su), "sdate": str(sdate)}


def test_a_text_of_a_known_shape_parses_to_the_whole_parse_s_tree():
    """Each text's tree, through the shapes or not, equals sqlglot's whole parse of it (or
    its error is the whole parse's), for many texts of each shape with random literals (the
    first of a shape is parsed and kept, the others are the template's copy with their
    literals)."""
    import numpy as np

    rng = np.random.default_rng(36)
    for template in _TEMPLATES:
        for _ in range(40):
            text = template.format(**_literals(rng))
            try:
                want = _fresh(text)
            except SqlError as exc:  # E'\' and the like: the same error either way
                with pytest.raises(SqlError) as raised:
                    parse_one(text)
                assert str(raised.value) == str(exc)
                continue
            got = parse_one(text)
            assert got == want, text
            assert got.sql(dialect="duckdb") == want.sql(dialect="duckdb"), text


def test_a_shape_is_kept_only_when_its_literals_are_the_tree_s():
    from flight.sql.parse import _SHAPES, _shape

    parse_one("SELECT * FROM t WHERE id + 0 = 41")
    tree = _SHAPES.tree(_shape("SELECT * FROM t WHERE id + 0 = 42"))
    assert tree is not None
    assert sorted(lit.this for lit in tree.find_all(exp.Literal)) == ["0", "42"]
    for text in ("SELECT INTERVAL '1 day' FROM t", "SELECT a[1] FROM t", "SELECT 'a' 'b'"):
        parse_one(text)
        assert _SHAPES.tree(_shape(text)) is None, text
    for text in ("SELECT E'a' FROM t", "SELECT $$a$$ FROM t", "SELECT 1e3 FROM t", "SELECT x FROM t",
                 "SELECT .5 FROM t", "SELECT 1_000 FROM t",
                 "INSERT INTO t VALUES " + ", ".join(f"({i}, 'x')" for i in range(500))):
        assert _shape(text) is None, text


def test_a_tree_from_a_shape_is_the_caller_s_own():
    """Changing a returned tree changes neither the template nor the next text's tree."""
    first = parse_one("SELECT * FROM t WHERE id = 1 AND s = 'x'")
    first.find(exp.Literal).set("this", "999")
    first.set("where", None)
    second = parse_one("SELECT * FROM t WHERE id = 2 AND s = 'y'")
    assert second == _fresh("SELECT * FROM t WHERE id = 2 AND s = 'y'")
    second.find(exp.Table).set("this", exp.to_identifier("other"))
    third = parse_one("SELECT * FROM t WHERE id = 3 AND s = 'z'")
    assert tables_of(third) == ["t"]
    assert [lit.this for lit in third.find_all(exp.Literal)] == _literal_values(
        "SELECT * FROM t WHERE id = 3 AND s = 'z'")


def _literal_values(text: str) -> list[str]:
    return [lit.this for lit in _fresh(text).find_all(exp.Literal)]


def test_errors_of_a_text_are_the_whole_parse_s_whatever_its_shape():
    parse_one("SELECT * FROM t WHERE id = 5")
    with pytest.raises(SqlError, match="one statement per query: the text holds 2"):
        parse_one("SELECT * FROM t WHERE id = 5; SELECT 6")
    with pytest.raises(SqlError, match="one statement per query: the text holds 2"):
        parse_one("SELECT * FROM t WHERE id = 5; SELECT 7")
    with pytest.raises(SqlError, match="SQL syntax error at line 1"):
        parse_one("SELECT * FROM t WHERE id = = 5")


def test_a_parameter_cast_parses_as_duckdb_reads_it():
    """sqlglot's tokenizer reads ``?::`` as one operator (another dialect's try-cast)."""
    assert parse_one("SELECT ?::INTEGER + 1").sql(dialect="duckdb") == "SELECT CAST(? AS INT) + 1"
    tree = parse_one("SELECT x FROM t WHERE ts > ?::TIMESTAMP AND s = '?::x'")
    assert tree.sql(dialect="duckdb") == (
        "SELECT x FROM t WHERE ts > CAST(? AS TIMESTAMP) AND s = '?::x'")
