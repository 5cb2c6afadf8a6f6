"""polars beside pandas: the client's conversions between Arrow and polars frames.

pandas is a dependency and the client's default frame; polars is an optional extra
(``pip install 'ticktable[polars]'``), imported only when a polars frame is asked for
(``as_="polars"``, :attr:`LiveTable.pl <clients.live.LiveTable.pl>`,
:attr:`Update.pl <clients.livestate.Update.pl>`). Importing ``ticktable`` never imports
it: :func:`is_polars` recognizes a polars frame by looking for the module among those
already imported (a frame cannot exist before its module did).

Arrow to polars is :func:`polars.from_arrow`: a numeric column held in one Arrow chunk is
shared, not copied; a column in several chunks is concatenated once (polars' default, and
what keeps a frame of a long-lived subscription fast to query). Polars to Arrow
(:func:`from_polars`) gives the types a pandas frame of the same data would have
(``string`` rather than polars' ``large_string``), so a table created from polars data
has the schema it would have had from pandas.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeGuard

import pyarrow as pa

if TYPE_CHECKING:
    import polars as pl

__all__ = ["MISSING", "FrameKind", "from_polars", "is_polars", "polars_schema",
           "require_polars", "to_polars"]

FrameKind: TypeAlias = Literal["pandas", "arrow", "polars"]
"""What a call returns rows as (its ``as_``): a pandas DataFrame, a pyarrow Table or a
polars DataFrame."""

MISSING = "polars is not installed: pip install 'ticktable[polars]' (or pip install polars)"
"""The message of the error raised when polars is asked for and cannot be imported."""


def require_polars() -> ModuleType:
    """The ``polars`` module, imported now if it was not yet.

    Raises
    ------
    ModuleNotFoundError
        If polars cannot be imported; the message names the extra that installs it.
    """
    try:
        return importlib.import_module("polars")
    except ImportError as exc:
        raise ModuleNotFoundError(MISSING, name="polars") from exc


def is_polars(obj: object) -> TypeGuard[pl.DataFrame | pl.LazyFrame]:
    """Whether ``obj`` is a polars ``DataFrame`` or ``LazyFrame`` (never imports polars)."""
    polars = sys.modules.get("polars")
    return polars is not None and isinstance(obj, (polars.DataFrame, polars.LazyFrame))


def to_polars(table: pa.Table) -> pl.DataFrame:
    """``table`` as a polars DataFrame (:func:`polars.from_arrow`).

    Raises
    ------
    ModuleNotFoundError
        If polars is not installed.
    """
    frame: pl.DataFrame = require_polars().from_arrow(table)
    return frame


def from_polars(frame: pl.DataFrame | pl.LazyFrame) -> pa.Table:
    """The rows of ``frame`` (a ``LazyFrame`` is collected) as an Arrow table in plain types.

    Polars' ``large_string``, ``large_binary`` and ``large_list`` become ``string``,
    ``binary`` and ``list`` (also inside lists, structs and dictionaries); every other
    type is kept.
    """
    import polars as pl  # imported already: ``frame`` is one of its objects

    if isinstance(frame, pl.LazyFrame):
        frame = frame.collect()
    table: pa.Table = frame.to_arrow()
    schema = pa.schema([pa.field(f.name, _plain(f.type), f.nullable) for f in table.schema])
    return table if table.schema.equals(schema) else table.cast(schema)


def polars_schema(frame: pl.DataFrame | pl.LazyFrame) -> pa.Schema:
    """The Arrow schema :func:`from_polars` gives ``frame`` (computing no row of it)."""
    schema: pa.Schema = from_polars(frame.head(0)).schema
    return schema


def _plain(t: Any) -> Any:
    """``t`` with 64-bit-offset string, binary and list types made the usual ones."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _plain(t.value_type),
                                 t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, _plain(t.value_type), t.ordered)
    return t
