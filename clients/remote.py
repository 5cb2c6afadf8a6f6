"""Remote composition: live tables derived on the server, built from the client.

``client.table("trades").where(pc.field("Price") > 50).agg_by([tt.agg.sum("Qty")], "Sym")``
describes a chain of operations; the server builds it (one ``CreateDerivedTable`` call on
the TableService) as live tables that update every cycle like any other table, and the
result is a named table to snapshot or subscribe to. With several servers it is created on
the one the client's calls go to, and a subscription to it stays on that server.

The chain is sent lazily, when its name is first needed (:meth:`RemoteTable.create`,
:meth:`snapshot`, :meth:`subscribe`, or using it as the other side of a join). Expressions
travel as Substrait, which binds column names against the schema of the table the
operation runs on; when an expression follows an operation that changed the schema, the
chain so far is created first (an intermediate table named by the server) to learn it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from clients.frames import FrameKind
from flight.pb import table_service_pb2 as tpb

if TYPE_CHECKING:
    import polars as pl

    from clients.live import LiveTable
    from clients.wire import Endpoint

__all__ = ["RemoteTable"]


class _Client(Protocol):
    """What a :class:`RemoteTable` asks of its :class:`~clients.client.Client`."""

    @property
    def endpoint(self) -> Endpoint: ...

    def schema(self, name: str) -> pa.Schema: ...

    def drop_table(self, name: str) -> None: ...

    def _table_service(self) -> tuple[Any, list[tuple[str, str]], str]: ...

    def snapshot(self, name: str, columns: Sequence[str] | None = None,
                 filter: pc.Expression | None = None,
                 as_: FrameKind = "pandas") -> pd.DataFrame | pa.Table | pl.DataFrame: ...

    def subscribe(self, name: str, columns: Sequence[str] | None = None,
                  viewport: Sequence[tuple[int, int]] | None = None,
                  on_update: Callable[[Any], None] | None = None, **options: Any) -> LiveTable: ...

_SCHEMA_KEEPING = ("where", "sort", "slice", "merge_with")


class RemoteTable:
    """A server-side table, or a chain of operations on one, not yet sent.

    Each method returns a new :class:`RemoteTable`; nothing runs on the server until the
    chain's :attr:`name` is needed. Method names and arguments follow
    :class:`ticktable.Table`.
    """

    def __init__(self, client: _Client, parent: str, ops: list[tpb.Operation],
                 schema: pa.Schema | None, name: str | None, uri: str | None = None) -> None:
        self._client = client
        self._parent = parent
        self._ops = ops
        self._schema = schema
        self._name = name
        self._uri = uri  # the server that created it (None: not created from here)

    @classmethod
    def _root(cls, client: _Client, name: str) -> RemoteTable:
        return cls(client, name, [], client.schema(name), name)

    def __repr__(self) -> str:
        if self._name is not None:
            return f"<RemoteTable {self._name!r}>"
        kinds = ", ".join(op.WhichOneof("op") or "?" for op in self._ops)
        return f"<RemoteTable {self._parent!r} -> [{kinds}] (not created yet)>"

    # ------------------------------------------------------------------ creation
    @property
    def name(self) -> str:
        """The table's name on the server (creating the chain if it was not yet)."""
        if self._name is None:
            self._send(None, replace=False)
        assert self._name is not None
        return self._name

    @property
    def schema(self) -> pa.Schema:
        """The table's schema (creating the chain if that is the only way to know it)."""
        if self._schema is None:
            self._send(None, replace=False)
        assert self._schema is not None
        return self._schema

    def create(self, name: str | None = None, *, replace: bool = False) -> RemoteTable:
        """Create the chain on the server, as ``name`` (default: a name the server picks).

        Parameters
        ----------
        replace
            Replace an existing table of that name (its subscribers see it dropped).

        Raises
        ------
        pyarrow.ArrowInvalid
            If an operation does not fit its input; the message names the operation.
        pyarrow.ArrowException
            If ``name`` is taken and ``replace`` is false (ALREADY_EXISTS).
        """
        if self._name is not None and name is None:
            return self
        out = RemoteTable(self._client, self._parent, list(self._ops), self._schema, None)
        out._send(name, replace=replace)
        return RemoteTable(self._client, out.name, [], out._schema, out._name, out._uri)

    def _send(self, name: str | None, *, replace: bool) -> None:
        import grpc

        stub, meta, uri = self._client._table_service()
        req = tpb.CreateDerivedTableRequest(name=name or "", parent=self._parent, ops=self._ops,
                                            replace=replace)
        try:
            resp = stub.CreateDerivedTable(req, metadata=meta,
                                           timeout=self._client.endpoint.timeout)
        except grpc.RpcError as exc:
            raise _from_grpc(exc) from None
        self._name = resp.name
        self._schema = pa.ipc.read_schema(pa.py_buffer(resp.schema))
        self._uri = uri

    def _then(self, op: tpb.Operation) -> RemoteTable:
        kind = op.WhichOneof("op")
        keeps = kind in _SCHEMA_KEEPING
        if self._name is not None:  # created: build on the table, not on its chain
            return RemoteTable(self._client, self._name, [op],
                               self._schema if keeps else None, None)
        return RemoteTable(self._client, self._parent, [*self._ops, op],
                           self._schema if keeps else None, None)

    def _bound(self) -> pa.Schema:
        """The schema expressions bind to: known, or learnt by creating the chain so far."""
        return self.schema

    def _materialized(self) -> RemoteTable:
        """This chain as a created table (expressions after it bind to its schema)."""
        if self._schema is not None:
            return self
        name = self.name  # (creates it, which sets where)
        return RemoteTable(self._client, name, [], self._schema, self._name, self._uri)

    # ------------------------------------------------------------------ operations
    def where(self, predicate: pc.Expression) -> RemoteTable:
        """Rows for which ``predicate`` (a ``pyarrow.compute`` expression) is true."""
        base = self._materialized()
        from flight import substrait

        return base._then(tpb.Operation(where=tpb.Where(
            predicate=substrait.encode({"predicate": predicate}, base._bound()))))

    def update(self, **exprs: pc.Expression) -> RemoteTable:
        """All columns plus ``name=expression`` columns (added or replaced)."""
        return self._named("update", (), exprs)

    def select(self, *columns: str, **exprs: pc.Expression) -> RemoteTable:
        """Only ``columns`` and the ``name=expression`` columns (computed once per change)."""
        return self._named("select", columns, exprs)

    def view(self, *columns: str, **exprs: pc.Expression) -> RemoteTable:
        """Like :meth:`select`; the server computes formula columns when read."""
        return self._named("view", columns, exprs)

    def _named(self, kind: str, columns: Sequence[str],
               exprs: Mapping[str, pc.Expression]) -> RemoteTable:
        base = self._materialized() if exprs else self
        enc = b""
        if exprs:
            from flight import substrait

            enc = substrait.encode(dict(exprs), base._bound())
        spec = tpb.NamedExpressions(columns=list(columns), expressions=enc)
        op = tpb.Operation()
        getattr(op, kind).CopyFrom(spec)
        return base._then(op)

    def drop_columns(self, *columns: str) -> RemoteTable:
        """All columns but ``columns``."""
        return self._then(tpb.Operation(drop_columns=tpb.NamedExpressions(columns=columns)))

    def rename_columns(self, mapping: Mapping[str, str]) -> RemoteTable:
        """Columns renamed ``old -> new``."""
        return self._then(tpb.Operation(rename=tpb.Rename(mapping=dict(mapping))))

    def sort(self, by: str | Sequence[str],
             descending: bool | Sequence[bool] = False) -> RemoteTable:
        """Rows ordered by ``by`` (stable; nulls last)."""
        cols = [by] if isinstance(by, str) else list(by)
        desc = [descending] * len(cols) if isinstance(descending, bool) else list(descending)
        return self._then(tpb.Operation(sort=tpb.Sort(by=cols, descending=desc)))

    def head(self, n: int) -> RemoteTable:
        """The first ``n`` rows."""
        return self._then(tpb.Operation(slice=tpb.Slice(kind="head", start=n)))

    def tail(self, n: int) -> RemoteTable:
        """The last ``n`` rows."""
        return self._then(tpb.Operation(slice=tpb.Slice(kind="tail", start=n)))

    def slice(self, start: int, stop: int | None = None) -> RemoteTable:
        """Rows at positions ``[start, stop)`` (negative: from the end)."""
        return self._then(tpb.Operation(slice=tpb.Slice(
            kind="slice", start=start, stop=stop or 0, has_stop=stop is not None)))

    def _join(self, kind: str, right: RemoteTable | str, on: str | Sequence[str],
              joins: Sequence[str] | None) -> RemoteTable:
        other = right if isinstance(right, str) else right.name
        cols = [on] if isinstance(on, str) else list(on)
        return self._then(tpb.Operation(join=tpb.Join(kind=kind, right=other, on=cols,
                                                      joins=list(joins or ()))))

    def natural_join(self, right: RemoteTable | str, on: str | Sequence[str],
                     joins: Sequence[str] | None = None) -> RemoteTable:
        """Every row, with ``joins`` from the one matching right row (nulls if none)."""
        return self._join("natural", right, on, joins)

    def exact_join(self, right: RemoteTable | str, on: str | Sequence[str],
                   joins: Sequence[str] | None = None) -> RemoteTable:
        """Every row with ``joins`` from exactly one matching right row (else an error)."""
        return self._join("exact", right, on, joins)

    def join(self, right: RemoteTable | str, on: str | Sequence[str],
             joins: Sequence[str] | None = None) -> RemoteTable:
        """Inner join: one row per matching (left, right) pair."""
        return self._join("inner", right, on, joins)

    def left_outer_join(self, right: RemoteTable | str, on: str | Sequence[str],
                        joins: Sequence[str] | None = None) -> RemoteTable:
        """Like :meth:`join`, keeping left rows without a match (nulls on the right)."""
        return self._join("left_outer", right, on, joins)

    def agg_by(self, aggs: Any, by: str | Sequence[str] = ()) -> RemoteTable:
        """One row per group of ``by`` with the aggregations ``aggs``, built on the server.

        Any aggregation of ``tt.agg`` travels: its kind, column, name and, where the kind
        takes them, the weight column, ``p`` and the order column (semantics:
        :mod:`engine.ops.aggregate`).

        Parameters
        ----------
        aggs
            One aggregation or a list of them (``tt.agg.sum("Qty")``,
            ``tt.agg.percentile("Price", 0.9, "P90")``,
            ``tt.agg.sorted_last("Qty", order="Price")``, ...).
        by
            Group-by column name(s); ``()`` aggregates the whole table.

        Examples
        --------
        >>> vwap = client.table("trades").agg_by(
        ...     [tt.agg.weighted_avg("Price", "Qty", "VWAP"), tt.agg.median("Price", "Mid")], "Sym")
        >>> vwap.snapshot()
        """
        specs = aggs if isinstance(aggs, (list, tuple)) else [aggs]
        out = []
        for a in specs:
            kind = getattr(a, "kind", None)
            if kind is None:
                raise TypeError(f"agg_by takes aggregations such as tt.agg.sum('Qty'), "
                                f"not {a!r}")
            msg = tpb.Aggregation(op=kind, column=a.column or "", name=a.name,
                                  weight=getattr(a, "weight", None) or "",
                                  order=getattr(a, "order", None) or "")
            p = getattr(a, "p", None)
            if p is not None:
                msg.p = p
            out.append(msg)
        cols = [by] if isinstance(by, str) else list(by)
        return self._then(tpb.Operation(agg_by=tpb.AggBy(aggs=out, by=cols)))

    def _by(self, kind: str, by: str | Sequence[str], name: str = "") -> RemoteTable:
        cols = [by] if isinstance(by, str) else list(by)
        return self._then(tpb.Operation(by_keys=tpb.ByKeys(kind=kind, by=cols, name=name)))

    def first_by(self, by: str | Sequence[str]) -> RemoteTable:
        """The first row of each group."""
        return self._by("first_by", by)

    def last_by(self, by: str | Sequence[str]) -> RemoteTable:
        """The last row of each group."""
        return self._by("last_by", by)

    def count_by(self, name: str, by: str | Sequence[str] = ()) -> RemoteTable:
        """Row count per group, in column ``name``."""
        return self._by("count_by", by, name)

    def merge(self, other: RemoteTable | str) -> RemoteTable:
        """This table's rows followed by ``other``'s (same schema)."""
        name = other if isinstance(other, str) else other.name
        return self._then(tpb.Operation(merge_with=name))

    # ------------------------------------------------------------------ reading
    @overload
    def snapshot(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None,
                 as_: Literal["pandas"] = "pandas") -> pd.DataFrame: ...

    @overload
    def snapshot(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None,
                 as_: Literal["arrow"] = ...) -> pa.Table: ...

    @overload
    def snapshot(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None,
                 as_: Literal["polars"] = ...) -> pl.DataFrame: ...

    @overload
    def snapshot(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None,
                 as_: FrameKind = ...) -> pd.DataFrame | pa.Table | pl.DataFrame: ...

    def snapshot(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None,
                 as_: FrameKind = "pandas") -> pd.DataFrame | pa.Table | pl.DataFrame:
        """A consistent snapshot (see :meth:`Client.snapshot`)."""
        return self._client.snapshot(self.name, columns, filter, as_)

    def subscribe(self, columns: Sequence[str] | None = None,
                  viewport: Sequence[tuple[int, int]] | None = None,
                  **options: Any) -> LiveTable:
        """A live subscription (see :meth:`Client.subscribe`), on the server that created
        the table when it was created from here."""
        name = self.name  # (creates it, which sets where)
        if self._uri is not None:
            options.setdefault("uri", self._uri)
        return self._client.subscribe(name, columns, viewport, **options)

    def drop(self) -> None:
        """Drop this table on the server (intermediate tables of the chain stay)."""
        if self._name is not None:
            self._client.drop_table(self._name)


def _from_grpc(exc: Any) -> Exception:
    """The exception a Flight call raises for the same error (the server's one table)."""
    from flight.errors import flight_error_for

    return flight_error_for(exc.code(), exc.details() or str(exc))
