"""SQL text to one sqlglot statement (DuckDB's dialect), and what the server routes on.

Every SQL text Ticktable takes goes through :func:`parse_one`: a text that does not parse
is a :class:`~engine.errors.SqlError` naming the parser's line and column, and a text of
several statements is refused (one statement per query, so a query is one thing to run,
time and cancel). :func:`statement_kind` says what the statement is, and
:func:`tables_of` which tables it reads (not the names of its own CTEs).
:func:`parse_condition` parses what may follow ``WHERE`` alone (a mirror's filter).
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from engine.errors import SqlError

__all__ = ["DIALECT", "parse_condition", "parse_one", "statement_kind", "tables_of"]

#: The dialect every text is parsed in: the one the queries run in.
DIALECT = "duckdb"

# the tokenizer's inner error says where it stopped: "Missing ' from 1:7" (line:offset in text)
_TOKEN_AT = re.compile(r"from (\d+):(\d+)")
# the parser quotes tokens as their repr: "<Token token_type: TokenType.SENTINEL, text: ...>"
_TOKEN_REPR = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: .*?>")


#: sqlglot names a node by its class (``<class 'sqlglot.expressions.core.Mul'>``): its name
#: (``Mul``) is what a user can read
_CLASS_REPR = re.compile(r"<class 'sqlglot\.[\w.]*?(\w+)'>")


def _class_text(m: re.Match[str]) -> str:
    return m.group(1)


def _token_text(m: re.Match[str]) -> str:
    return "the end of the text" if m.group(1) == "SENTINEL" else repr(m.group(2))


def parse_one(text: str) -> exp.Expression:
    """Parse ``text``, which must hold exactly one SQL statement (DuckDB's dialect).

    Parameters
    ----------
    text
        The SQL text; a trailing ``;`` is fine.

    Returns
    -------
    sqlglot.exp.Expression
        The statement's syntax tree.

    Raises
    ------
    SqlError
        If the text does not parse (the message names the line and column, counted from
        1), holds no statement, or holds more than one.

    Examples
    --------
    >>> parse_one("SELECT x FROM t").sql()
    'SELECT x FROM t'
    >>> parse_one("SELECT x FROM")
    Traceback (most recent call last):
    engine.errors.SqlError: SQL syntax error at line 1, column 9: ...
    """
    try:
        statements = sqlglot.parse(text, dialect=DIALECT)
    except ParseError as exc:
        raise SqlError(_parse_message(exc)) from exc
    except TokenError as exc:
        raise SqlError(_token_message(text, exc)) from exc
    found = [s for s in statements if s is not None]
    if not found:
        raise SqlError("SQL text holds no statement")
    if len(found) > 1:
        raise SqlError(f"one statement per query: the text holds {len(found)} statements")
    statement = found[0]
    if not isinstance(statement, exp.Expression):  # every node the parser builds is one
        raise SqlError(f"SQL text parsed to an unexpected {type(statement).__name__}")
    return statement


def parse_condition(text: str) -> exp.Expression:
    """Parse ``text``, which must be one SQL condition: what may follow ``WHERE``.

    Parameters
    ----------
    text
        The condition (DuckDB's dialect), e.g. ``px > 100 AND sym IN ('A', 'B')``.

    Returns
    -------
    sqlglot.exp.Expression
        The condition's syntax tree (its type is checked where it is compiled, against
        a table's columns: :func:`flight.sql.views.compile_condition`).

    Raises
    ------
    SqlError
        If the text is empty or does not parse as one condition (the message names the
        line and column, counted from 1, as :func:`parse_one`'s).

    Examples
    --------
    >>> parse_condition("px > 100 AND sym = 'A'").sql()
    "px > 100 AND sym = 'A'"
    >>> parse_condition("px > 100 ORDER BY px")
    Traceback (most recent call last):
    engine.errors.SqlError: SQL syntax error at line 1, column 17: ...
    """
    if not text.strip():
        raise SqlError("empty condition: expected what may follow WHERE, e.g. px > 100")
    try:
        node = sqlglot.parse_one(text, read=DIALECT, into=exp.Condition)
    except ParseError as exc:
        raise SqlError(_parse_message(exc)) from exc
    except TokenError as exc:
        raise SqlError(_token_message(text, exc)) from exc
    if isinstance(node, exp.Block):  # "a; b": several statements
        raise SqlError(f"one condition expected: the text holds {len(node.expressions)} "
                       f"statements")
    if not isinstance(node, exp.Expression):  # every node the parser builds is one
        raise SqlError(f"condition parsed to an unexpected {type(node).__name__}")
    return node


def _parse_message(exc: ParseError) -> str:
    """The parser's first error as one line with a line and a column (counted from 1)."""
    first = exc.errors[0] if exc.errors else {}
    what = _TOKEN_REPR.sub(_token_text, str(first.get("description") or exc).splitlines()[0])
    what = _CLASS_REPR.sub(_class_text, what)
    return (f"SQL syntax error at line {first.get('line', '?')}, column {first.get('col', '?')}: "
            f"{what}")


def _token_message(text: str, exc: TokenError) -> str:
    """The tokenizer's failure as one line with a line and a column (counted from 1)."""
    inner = exc.__cause__
    what = str(inner) if inner is not None else str(exc)
    m = _TOKEN_AT.search(what)
    if m:  # "line:offset", the offset counted from the start of the text
        at = min(len(text), int(m.group(2)))
        what = what[: m.start()].strip()
    else:  # the snippet is text[start:end], centred (50 characters each side) on the failure
        at = min(len(text), (exc.start or 0) + (50 if exc.start else 0))
        what = "cannot tokenize"
    line = text.count("\n", 0, at) + 1
    col = at - (text.rfind("\n", 0, at) + 1) + 1
    return f"SQL syntax error at line {line}, column {col}: {what.splitlines()[0]}"


def statement_kind(statement: exp.Expression) -> str:
    """What ``statement`` is, for routing.

    Returns
    -------
    str
        ``"select"`` (also a set operation: ``UNION``, ...), ``"create_view"``,
        ``"insert"``, ``"delete"``, ``"drop_view"``, or ``"other"``.

    Examples
    --------
    >>> statement_kind(parse_one("CREATE VIEW v AS SELECT 1"))
    'create_view'
    """
    if isinstance(statement, exp.Query):
        return "select"
    if isinstance(statement, exp.Create) and str(statement.args.get("kind", "")).upper() == "VIEW":
        return "create_view"
    if isinstance(statement, exp.Insert):
        return "insert"
    if isinstance(statement, exp.Delete):
        return "delete"
    if isinstance(statement, exp.Drop) and str(statement.args.get("kind", "")).upper() == "VIEW":
        return "drop_view"
    return "other"


def _position(table: exp.Table) -> int:
    """Where ``table``'s name starts in the text (a tree built without a text: 0)."""
    start = table.this.meta.get("start", 0) if isinstance(table.this, exp.Expression) else 0
    return int(start)


def tables_of(statement: exp.Expression) -> list[str]:
    """The names of the tables ``statement`` reads, in order of appearance, once each.

    Names defined by the statement's own ``WITH`` (CTEs) are not tables and are left out;
    the target of ``CREATE VIEW``, ``INSERT`` and ``DROP`` is written, not read, and left
    out too (a ``DELETE`` reads its table: its ``WHERE`` runs over it). A qualified name
    (``db.t``) is given as written.

    Examples
    --------
    >>> tables_of(parse_one("WITH w AS (SELECT * FROM a) SELECT * FROM w JOIN b USING (k)"))
    ['a', 'b']
    """
    ctes = {c.alias_or_name for c in statement.find_all(exp.CTE)}
    target = statement.this if isinstance(statement, (exp.Create, exp.Insert)) else None
    if isinstance(statement, exp.Insert) and isinstance(target, exp.Schema):
        target = target.this  # INSERT INTO t (a, b) ...
    if isinstance(statement, exp.Drop):
        return []
    names: list[str] = []
    tables = sorted(statement.find_all(exp.Table), key=_position)  # order of appearance
    for t in tables:
        if t is target or not t.name:  # the written table; a table function
            continue
        qualified = ".".join(p.name for p in t.parts)
        if qualified in ctes or qualified in names:
            continue
        names.append(qualified)
    return names
