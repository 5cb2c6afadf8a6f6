"""SQL text to one sqlglot statement (DuckDB's dialect), and what the server routes on.

Every SQL text Ticktable takes goes through :func:`parse_one`: a text that does not parse
is a :class:`~engine.errors.SqlError` naming the parser's line and column, and a text of
several statements is refused (one statement per query, so a query is one thing to run,
time and cancel). :func:`statement_kind` says what the statement is, and
:func:`tables_of` which tables it reads (not the names of its own CTEs).
:func:`parse_condition` parses what may follow ``WHERE`` alone (a mirror's filter).

**Shapes.** Clients send the same text with other literals again and again (a point lookup
with a new id each time), and sqlglot's parse costs 0.1-0.5 ms of Python per text. A text's
*shape* is the text with its plain literals (``'...'`` strings and decimal numbers, as
DuckDB's tokenizer finds them: a C++ call of about a microsecond) cut out. The first text of
a shape is parsed in full, and kept as the shape's template when each of its literals is
one ``Literal`` node of the tree, at the literal's place in the text, with the literal's
value, where the parser takes a literal as it is (an operand of a comparison, ``IN``, ...:
``_OPAQUE``), and no other ``Literal`` node exists (a literal the parser reads, as in
``INTERVAL '1 day'``, a function's unit or ``'a' 'b'``, leaves its shape uncached). A later text of that shape is
the template's copy with its literals' values set: the tree a full parse would give, since
the parser saw the same tokens but for those literals' values, which it copies into their
nodes without looking at them. DuckDB still runs the text itself, never the tree.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from engine.errors import SqlError

__all__ = ["DIALECT", "parse_condition", "parse_one", "shape_key", "statement_kind", "tables_of"]

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
    shape = _shape(text)
    if shape is not None:
        tree = _SHAPES.tree(shape)
        if tree is not None:
            return tree
    statement = _parse_one(text)
    if shape is not None:
        _SHAPES.keep(shape, statement)
    return statement


def _parse_one(text: str) -> exp.Expression:
    """:func:`parse_one` without the shapes: sqlglot's whole parse."""
    try:
        if "?::" in text:
            text = _placeholder_casts(text)
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


def _placeholder_casts(text: str) -> str:
    """``?::INTEGER`` (a parameter cast, in DuckDB) as ``? ::INTEGER``: sqlglot's tokenizer
    reads ``?::`` as one operator (another dialect's try-cast) and the parse fails."""
    tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    cuts = [t.start + 1 for t in tokens if t.token_type == sqlglot.TokenType.QDCOLON]
    for at in reversed(cuts):
        text = f"{text[:at]} {text[at:]}"
    return text


#: A decimal number that sqlglot keeps as written (it writes ``.5`` as ``0.5`` and ``1_000``
#: as ``1000``: such a text has no shape)
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?")


#: Longer texts have no shape (a long ``INSERT ... VALUES`` text is written once, and kept
#: shapes hold their texts)
_SHAPED_CHARS = 4096


class _Shape:
    """A text with its plain literals cut out (``key``) and those literals: each one's
    offset in the text, value (a string's quotes and doubled quotes removed) and kind."""

    __slots__ = ("key", "literals")

    def __init__(self, key: tuple[str, ...], literals: list[tuple[int, str, bool]]) -> None:
        self.key = key
        self.literals = literals


def _shape(text: str) -> _Shape | None:
    """``text``'s shape (see the module docstring); None when it is longer than
    :data:`_SHAPED_CHARS`, has no literal, or one that is not a plain ``'...'`` string or
    decimal number as sqlglot keeps it (an ``E'...'`` string, ``$$...$$``, ``.5``,
    ``1_000``, ``1e3``, ...), or DuckDB cannot tokenize it."""
    if len(text) > _SHAPED_CHARS:
        return None
    try:
        tokens = duckdb.tokenize(text)
    except (duckdb.Error, RuntimeError, ValueError):
        return None
    parts: list[str] = []
    literals: list[tuple[int, str, bool]] = []
    at = 0
    for i, (start, kind) in enumerate(tokens):
        name = kind.name
        if name not in ("string_const", "numeric_const"):
            continue
        end = tokens[i + 1][0] if i + 1 < len(tokens) else len(text)
        raw = text[start:end].rstrip()
        if name == "string_const":
            if len(raw) < 2 or raw[0] != "'" or raw[-1] != "'":
                return None
            value = raw[1:-1]
            if "'" in value.replace("''", ""):
                return None
            literals.append((start, value.replace("''", "'"), True))
        else:
            if not _NUMBER.fullmatch(raw):
                return None
            literals.append((start, raw, False))
        parts.append(text[at:start])
        parts.append("'" if name == "string_const" else "0")  # a cut: only its kind is kept
        at = start + len(raw)
    if not literals:
        return None  # a text of its own: nothing to gain over the parse
    parts.append(text[at:])
    return _Shape(tuple(parts), literals)


def shape_key(text: str) -> tuple[str, ...] | None:
    """``text`` with its plain literals cut out (each cut keeps only whether it was a
    string or a number): equal for two texts that differ only in those literals' values;
    None for a text without a shape (see :func:`_shape`)."""
    shape = _shape(text)
    return None if shape is None else shape.key


#: Where the parser takes a literal as it is, whatever its value: an operand of a comparison,
#: of arithmetic or of ``IN``/``BETWEEN``/``LIKE``, a ``LIMIT``, a selected value. Elsewhere
#: it may read the value (``INTERVAL '1 day'`` is ``INTERVAL '1' DAY``, a function may take a
#: string as a unit), so a text with a literal there has no template.
_OPAQUE = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
           exp.In, exp.Between, exp.Like, exp.ILike, exp.Add, exp.Sub, exp.Mul, exp.Div,
           exp.Mod, exp.DPipe, exp.And, exp.Or, exp.Limit, exp.Offset, exp.Select, exp.Alias,
           exp.Tuple)


def _opaque(node: exp.Expression) -> bool:
    """Whether the parser took literal ``node`` as it is (see :data:`_OPAQUE`)."""
    parent = node.parent
    while isinstance(parent, (exp.Neg, exp.Paren)):  # -5, (5)
        parent = parent.parent
    return type(parent) in _OPAQUE


class _Shapes:
    """Parsed templates by shape (the last :attr:`KEPT` shapes; see the module docstring)."""

    KEPT = 256

    def __init__(self) -> None:
        # key -> (template, index in template.find_all(exp.Literal) of each literal)
        self._kept: OrderedDict[tuple[str, ...], tuple[exp.Expression, list[int]]] = OrderedDict()
        self._lock = threading.Lock()

    def tree(self, shape: _Shape) -> exp.Expression | None:
        """The tree of a text of ``shape``; None when the shape has no template."""
        with self._lock:
            kept = self._kept.get(shape.key)
            if kept is None:
                return None
            self._kept.move_to_end(shape.key)
        template, where = kept
        tree = template.copy()
        nodes = list(tree.find_all(exp.Literal))
        for (_start, value, _is_string), i in zip(shape.literals, where, strict=True):
            nodes[i].set("this", value)
        return tree

    def keep(self, shape: _Shape, tree: exp.Expression) -> None:
        """Keep ``tree`` (a text of ``shape``, parsed) as the shape's template, if each of
        the text's literals is one ``Literal`` node holding its value and no other is."""
        nodes = list(tree.find_all(exp.Literal))
        if len(nodes) != len(shape.literals):
            return
        at = {}
        for i, node in enumerate(nodes):
            start = node.meta.get("start")
            if not isinstance(start, int) or start in at:
                return
            at[start] = i
        where = []
        for start, value, is_string in shape.literals:
            i = at.get(start, -1)
            if (i < 0 or nodes[i].this != value or bool(nodes[i].is_string) != is_string
                    or not _opaque(nodes[i])):
                return
            where.append(i)
        template = tree.copy()  # the caller's tree is its own to change
        with self._lock:
            self._kept[shape.key] = (template, where)
            self._kept.move_to_end(shape.key)
            while len(self._kept) > self.KEPT:
                self._kept.popitem(last=False)


_SHAPES = _Shapes()


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
        ``"create_table"``, ``"insert"``, ``"update"``, ``"delete"``, ``"drop_view"``,
        ``"drop_table"``, or ``"other"``.

    Examples
    --------
    >>> statement_kind(parse_one("CREATE VIEW v AS SELECT 1"))
    'create_view'
    """
    if isinstance(statement, exp.Query):
        return "select"
    if isinstance(statement, (exp.Create, exp.Drop)):
        kind = str(statement.args.get("kind", "")).upper()
        if kind in ("VIEW", "TABLE"):
            return f"{'create' if isinstance(statement, exp.Create) else 'drop'}_{kind.lower()}"
    if isinstance(statement, exp.Insert):
        return "insert"
    if isinstance(statement, exp.Update):
        return "update"
    if isinstance(statement, exp.Delete):
        return "delete"
    return "other"


def _position(table: exp.Table) -> int:
    """Where ``table``'s name starts in the text (a tree built without a text: 0)."""
    start = table.this.meta.get("start", 0) if isinstance(table.this, exp.Expression) else 0
    return int(start)


def tables_of(statement: exp.Expression) -> list[str]:
    """The names of the tables ``statement`` reads, in order of appearance, once each.

    Names defined by the statement's own ``WITH`` (CTEs) are not tables and are left out;
    the target of ``CREATE VIEW``, ``CREATE TABLE``, ``INSERT`` and ``DROP`` is written, not
    read, and left out too (``DELETE`` and ``UPDATE`` read their table: their ``WHERE`` runs
    over it). A qualified name
    (``db.t``) is given as written.

    Examples
    --------
    >>> tables_of(parse_one("WITH w AS (SELECT * FROM a) SELECT * FROM w JOIN b USING (k)"))
    ['a', 'b']
    """
    ctes = {c.alias_or_name for c in statement.find_all(exp.CTE)}
    target = statement.this if isinstance(statement, (exp.Create, exp.Insert)) else None
    if isinstance(target, exp.Schema):
        target = target.this  # INSERT INTO t (a, b) ..., CREATE TABLE t (a INT, ...)
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
