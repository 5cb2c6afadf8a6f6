"""parse_one, statement_kind, tables_of."""

from __future__ import annotations

import pytest

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
    ("DROP TABLE t", "other"),
    ("CREATE TABLE t (k INT)", "other"),
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
