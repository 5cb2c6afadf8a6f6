"""SQL text to a sqlglot tree, with the parser's line and column on a syntax error.

(Placeholder until the view compiler's branch lands: parse_one, tables_of, statement_kind.)
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from engine.errors import SqlError

__all__ = ["parse_one", "statement_kind", "tables_of"]


def parse_one(text: str) -> exp.Expression:
    """One statement of DuckDB's dialect. Raises SqlError naming line and column."""
    try:
        trees = [t for t in sqlglot.parse(text, dialect="duckdb") if t is not None]
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        raise SqlError(f"SQL syntax error at line {first.get('line')}, column "
                       f"{first.get('col')}: {first.get('description', e)}") from None
    except TokenError as e:
        raise SqlError(f"SQL syntax error: {e}") from None
    if not trees:
        raise SqlError("empty SQL text: send one statement")
    if len(trees) > 1:
        raise SqlError(f"{len(trees)} statements in one text: send one statement per query")
    return trees[0]


def tables_of(tree: exp.Expression) -> list[str]:
    """The table names a statement reads (not its CTEs), in order, once each."""
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    out: list[str] = []
    for t in tree.find_all(exp.Table):
        if t.name and t.name not in ctes and t.name not in out:
            out.append(t.name)
    return out


def statement_kind(tree: exp.Expression) -> str:
    """select, create_view, insert, delete, drop_view or other."""
    if isinstance(tree, exp.Query):
        return "select"
    if isinstance(tree, exp.Create) and str(tree.args.get("kind", "")).upper() == "VIEW":
        return "create_view"
    if isinstance(tree, exp.Insert):
        return "insert"
    if isinstance(tree, exp.Delete):
        return "delete"
    if isinstance(tree, exp.Drop) and str(tree.args.get("kind", "")).upper() == "VIEW":
        return "drop_view"
    return "other"
