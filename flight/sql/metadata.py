"""Flight SQL's metadata commands, answered from the server's tables (DESIGN.md §10).

Each function returns the Arrow table of one command, with the schema the Flight SQL
specification gives it (ADBC and JDBC drivers read them by position and type):

=======================  ==============================================================
command                  answer
=======================  ==============================================================
CommandGetSqlInfo        :func:`sql_info`: server name and version, Arrow version, read-only
                         (for the read token), SQL and Substrait support, cancel, bulk
                         ingestion, the statement timeout, identifier rules, grammar
CommandGetCatalogs       :func:`catalogs`: none (Ticktable has no catalogs)
CommandGetDbSchemas      :func:`db_schemas`: one schema, ``main``
CommandGetTables         :func:`tables`: every table, its type (:data:`TABLE_TYPES`) and,
                         with ``include_schema``, its Arrow schema
CommandGetTableTypes     :func:`table_types`
CommandGetPrimaryKeys    :func:`primary_keys`: a keyed table's key columns, in order
CommandGetXdbcTypeInfo   :func:`xdbc_type_info`: the Arrow types Ticktable's tables hold
CommandGet*Keys          :func:`foreign_keys`: none (Ticktable has no foreign keys)
=======================  ==============================================================
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pyarrow as pa

from flight.pb import flight_sql_pb2 as sql
from flight.streams.registry import TableEntry
from flight.wire import TableKind

__all__ = [
    "SCHEMA_NAME",
    "TABLE_TYPES",
    "catalogs",
    "db_schemas",
    "foreign_keys",
    "primary_keys",
    "sql_info",
    "table_types",
    "tables",
    "xdbc_type_info",
]

#: The one schema every table is in.
SCHEMA_NAME = "main"

#: GetTables' table_type of each kind.
TABLE_TYPES: dict[str, str] = {
    TableKind.APPEND: "APPEND TABLE",
    TableKind.KEYED: "KEYED TABLE",
    TableKind.RING: "RING TABLE",
    TableKind.DERIVED: "DERIVED TABLE",
    TableKind.VIEW: "VIEW",
    TableKind.MIRROR: "MIRROR TABLE",
}

# ---------------------------------------------------------------------------- schemas
_UTF8, _NN = pa.utf8(), False
CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", _UTF8, _NN)])
DB_SCHEMAS_SCHEMA = pa.schema([pa.field("catalog_name", _UTF8),
                               pa.field("db_schema_name", _UTF8, _NN)])
TABLES_SCHEMA = pa.schema([pa.field("catalog_name", _UTF8), pa.field("db_schema_name", _UTF8),
                           pa.field("table_name", _UTF8, _NN),
                           pa.field("table_type", _UTF8, _NN)])
TABLES_WITH_SCHEMA = TABLES_SCHEMA.append(pa.field("table_schema", pa.binary(), _NN))
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", _UTF8, _NN)])
PRIMARY_KEYS_SCHEMA = pa.schema([
    pa.field("catalog_name", _UTF8), pa.field("db_schema_name", _UTF8),
    pa.field("table_name", _UTF8, _NN), pa.field("column_name", _UTF8, _NN),
    pa.field("key_name", _UTF8), pa.field("key_sequence", pa.int32(), _NN)])
FOREIGN_KEYS_SCHEMA = pa.schema([
    pa.field("pk_catalog_name", _UTF8), pa.field("pk_db_schema_name", _UTF8),
    pa.field("pk_table_name", _UTF8, _NN), pa.field("pk_column_name", _UTF8, _NN),
    pa.field("fk_catalog_name", _UTF8), pa.field("fk_db_schema_name", _UTF8),
    pa.field("fk_table_name", _UTF8, _NN), pa.field("fk_column_name", _UTF8, _NN),
    pa.field("key_sequence", pa.int32(), _NN), pa.field("fk_key_name", _UTF8),
    pa.field("pk_key_name", _UTF8), pa.field("update_rule", pa.uint8(), _NN),
    pa.field("delete_rule", pa.uint8(), _NN)])
_INT32_LIST_MAP = pa.map_(pa.int32(), pa.list_(pa.int32()))
SQL_INFO_VALUE = pa.dense_union([
    pa.field("string_value", _UTF8), pa.field("bool_value", pa.bool_()),
    pa.field("bigint_value", pa.int64()), pa.field("int32_bitmask", pa.int32()),
    pa.field("string_list", pa.list_(_UTF8)), pa.field("int32_to_int32_list_map", _INT32_LIST_MAP)])
SQL_INFO_SCHEMA = pa.schema([pa.field("info_name", pa.uint32(), _NN),
                             pa.field("value", SQL_INFO_VALUE, _NN)])
XDBC_SCHEMA = pa.schema([
    pa.field("type_name", _UTF8, _NN), pa.field("data_type", pa.int32(), _NN),
    pa.field("column_size", pa.int32()), pa.field("literal_prefix", _UTF8),
    pa.field("literal_suffix", _UTF8), pa.field("create_params", pa.list_(
        pa.field("item", _UTF8, _NN))),
    pa.field("nullable", pa.int32(), _NN), pa.field("case_sensitive", pa.bool_(), _NN),
    pa.field("searchable", pa.int32(), _NN), pa.field("unsigned_attribute", pa.bool_()),
    pa.field("fixed_prec_scale", pa.bool_(), _NN), pa.field("auto_increment", pa.bool_()),
    pa.field("local_type_name", _UTF8), pa.field("minimum_scale", pa.int32()),
    pa.field("maximum_scale", pa.int32()), pa.field("sql_data_type", pa.int32(), _NN),
    pa.field("datetime_subcode", pa.int32()), pa.field("num_prec_radix", pa.int32()),
    pa.field("interval_precision", pa.int32())])

def _sql_info_values(version: str, read_only: bool, timeout_ms: int) -> dict[int, object]:
    info = sql.SqlInfo
    return {
        info.FLIGHT_SQL_SERVER_NAME: "Ticktable",
        info.FLIGHT_SQL_SERVER_VERSION: version,
        info.FLIGHT_SQL_SERVER_ARROW_VERSION: pa.__version__,
        info.FLIGHT_SQL_SERVER_READ_ONLY: read_only,
        info.FLIGHT_SQL_SERVER_SQL: True,
        info.FLIGHT_SQL_SERVER_SUBSTRAIT: False,
        info.FLIGHT_SQL_SERVER_TRANSACTION: int(sql.SQL_SUPPORTED_TRANSACTION_NONE),
        info.FLIGHT_SQL_SERVER_CANCEL: True,
        info.FLIGHT_SQL_SERVER_BULK_INGESTION: not read_only,
        info.FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED: False,
        info.FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT: timeout_ms,
        info.FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT: 0,
        info.SQL_DDL_CATALOG: False,
        info.SQL_DDL_SCHEMA: False,
        info.SQL_DDL_TABLE: not read_only,  # CREATE / DROP TABLE and VIEW
        info.SQL_IDENTIFIER_CASE: int(sql.SQL_CASE_SENSITIVITY_CASE_INSENSITIVE),
        info.SQL_IDENTIFIER_QUOTE_CHAR: '"',
        info.SQL_QUOTED_IDENTIFIER_CASE: int(sql.SQL_CASE_SENSITIVITY_CASE_INSENSITIVE),
        info.SQL_ALL_TABLES_ARE_SELECTABLE: True,
        info.SQL_NULL_ORDERING: int(sql.SQL_NULLS_SORTED_AT_END),
        info.SQL_KEYWORDS: ["VIEW", "UNION", "DISTINCT", "LIMIT"],
        info.SQL_NUMERIC_FUNCTIONS: ["abs", "ceil", "floor", "round", "sqrt", "ln", "exp", "power"],
        info.SQL_STRING_FUNCTIONS: ["lower", "upper", "length", "substring", "concat", "trim"],
        info.SQL_SYSTEM_FUNCTIONS: [],
        info.SQL_DATETIME_FUNCTIONS: ["now", "date_trunc", "extract", "epoch_ms"],
        info.SQL_SUPPORTS_COLUMN_ALIASING: True,
        info.SQL_NULL_PLUS_NULL_IS_NULL: True,
        info.SQL_SUPPORTS_TABLE_CORRELATION_NAMES: True,
        info.SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY: True,
        info.SQL_SUPPORTED_GROUP_BY: 1 << sql.SQL_GROUP_BY_BEYOND_SELECT,
        info.SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE: True,
        info.SQL_SUPPORTED_GRAMMAR: 1 << sql.SQL_CORE_GRAMMAR,
        info.SQL_ANSI92_SUPPORTED_LEVEL: 1 << sql.ANSI92_ENTRY_SQL,
        info.SQL_OUTER_JOINS_SUPPORT_LEVEL: int(sql.SQL_FULL_OUTER_JOINS),
        info.SQL_SCHEMA_TERM: "schema",
        info.SQL_CATALOG_TERM: "catalog",
        info.SQL_SELECT_FOR_UPDATE_SUPPORTED: False,
        info.SQL_STORED_PROCEDURES_SUPPORTED: False,
        info.SQL_SUPPORTED_UNIONS: (1 << sql.SQL_UNION) | (1 << sql.SQL_UNION_ALL),
        info.SQL_TRANSACTIONS_SUPPORTED: False,
        info.SQL_BATCH_UPDATES_SUPPORTED: True,
        info.SQL_SAVEPOINTS_SUPPORTED: False,
        info.SQL_NAMED_PARAMETERS_SUPPORTED: False,
    }


def sql_info(codes: Iterable[int], *, version: str, read_only: bool,
             timeout_ms: int) -> pa.Table:
    """CommandGetSqlInfo: the values of ``codes`` (all the server knows when empty); a code
    it does not know is left out, as the specification asks."""
    values = _sql_info_values(version, read_only, timeout_ms)
    wanted = list(codes) or list(values)
    names, types, offsets = [], [], []
    children: dict[int, list[object]] = {k: [] for k in range(6)}
    for code in wanted:
        if code not in values:
            continue
        value = values[code]
        if isinstance(value, bool):
            kind = 1
        elif isinstance(value, str):
            kind = 0
        elif isinstance(value, list):
            kind = 4
        else:  # every integer the server answers is an int32 (enums, bitmasks, timeouts)
            kind = 3
        names.append(code)
        types.append(kind)
        offsets.append(len(children[kind]))
        children[kind].append(value)
    child_types = [f.type for f in SQL_INFO_VALUE]
    arrays = [pa.array(children[k], type=child_types[k]) for k in range(6)]
    union = pa.UnionArray.from_dense(pa.array(types, pa.int8()), pa.array(offsets, pa.int32()),
                                     arrays, [f.name for f in SQL_INFO_VALUE], list(range(6)))
    return pa.Table.from_arrays([pa.array(names, pa.uint32()), union], schema=SQL_INFO_SCHEMA)


def catalogs() -> pa.Table:
    """CommandGetCatalogs: Ticktable has no catalogs."""
    return CATALOGS_SCHEMA.empty_table()


def _like(pattern: str | None) -> re.Pattern[str] | None:
    """A Flight SQL filter pattern (``%`` any, ``_`` one character) as a regex."""
    if pattern is None:
        return None
    out = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.compile(out + r"\Z", re.DOTALL)


def db_schemas(catalog: str | None, pattern: str | None) -> pa.Table:
    """CommandGetDbSchemas: ``main``, unless the catalog or pattern excludes it."""
    like = _like(pattern)
    if (catalog not in (None, "")) or (like is not None and not like.match(SCHEMA_NAME)):
        return DB_SCHEMAS_SCHEMA.empty_table()
    return pa.Table.from_pylist([{"catalog_name": None, "db_schema_name": SCHEMA_NAME}],
                                schema=DB_SCHEMAS_SCHEMA)


def tables(entries: Iterable[TableEntry], cmd: sql.CommandGetTables) -> pa.Table:
    """CommandGetTables: the tables the filters keep, by name."""
    schema_like = _like(cmd.db_schema_filter_pattern
                        if cmd.HasField("db_schema_filter_pattern") else None)
    name_like = _like(cmd.table_name_filter_pattern
                      if cmd.HasField("table_name_filter_pattern") else None)
    types = set(cmd.table_types)
    rows = []
    if not (cmd.HasField("catalog") and cmd.catalog) and (
            schema_like is None or schema_like.match(SCHEMA_NAME)):
        for e in sorted(entries, key=lambda e: e.name):
            kind = TABLE_TYPES.get(e.kind, e.kind.upper())
            if (name_like is not None and not name_like.match(e.name)) or (
                    types and kind not in types):
                continue
            row: dict[str, object] = {"catalog_name": None, "db_schema_name": SCHEMA_NAME,
                                      "table_name": e.name, "table_type": kind}
            if cmd.include_schema:
                row["table_schema"] = e.table.schema.serialize().to_pybytes()
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=TABLES_WITH_SCHEMA if cmd.include_schema
                                else TABLES_SCHEMA)


def table_types() -> pa.Table:
    """CommandGetTableTypes: one per kind."""
    return pa.Table.from_pylist([{"table_type": t} for t in sorted(TABLE_TYPES.values())],
                                schema=TABLE_TYPES_SCHEMA)


def primary_keys(entry: TableEntry | None) -> pa.Table:
    """CommandGetPrimaryKeys: the key columns of a keyed table (none for other kinds)."""
    if entry is None or not entry.keys:
        return PRIMARY_KEYS_SCHEMA.empty_table()
    return pa.Table.from_pylist([
        {"catalog_name": None, "db_schema_name": SCHEMA_NAME, "table_name": entry.name,
         "column_name": k, "key_name": None, "key_sequence": i + 1}
        for i, k in enumerate(entry.keys)], schema=PRIMARY_KEYS_SCHEMA)


def foreign_keys() -> pa.Table:
    """CommandGetExportedKeys, ImportedKeys, CrossReference: Ticktable has no foreign keys."""
    return FOREIGN_KEYS_SCHEMA.empty_table()


#: (type name, XDBC data type, column size, literal prefix/suffix, case sensitive,
#: searchable, unsigned, fixed precision, radix)
_XDBC: tuple[tuple[str, int, int | None, str | None, bool, int, bool | None, int | None], ...] = (
    ("BOOLEAN", sql.XDBC_BIT, 1, None, False, sql.SEARCHABLE_BASIC, None, None),
    ("TINYINT", sql.XDBC_TINYINT, 3, None, False, sql.SEARCHABLE_BASIC, False, 10),
    ("SMALLINT", sql.XDBC_SMALLINT, 5, None, False, sql.SEARCHABLE_BASIC, False, 10),
    ("INTEGER", sql.XDBC_INTEGER, 10, None, False, sql.SEARCHABLE_BASIC, False, 10),
    ("BIGINT", sql.XDBC_BIGINT, 19, None, False, sql.SEARCHABLE_BASIC, False, 10),
    ("REAL", sql.XDBC_REAL, 7, None, False, sql.SEARCHABLE_BASIC, False, 2),
    ("DOUBLE", sql.XDBC_DOUBLE, 15, None, False, sql.SEARCHABLE_BASIC, False, 2),
    ("DECIMAL", sql.XDBC_DECIMAL, 38, None, False, sql.SEARCHABLE_BASIC, False, 10),
    ("VARCHAR", sql.XDBC_VARCHAR, None, "'", True, sql.SEARCHABLE_FULL, None, None),
    ("BLOB", sql.XDBC_VARBINARY, None, "'", False, sql.SEARCHABLE_NONE, None, None),
    ("DATE", sql.XDBC_DATE, 10, "DATE '", False, sql.SEARCHABLE_BASIC, None, None),
    ("TIME", sql.XDBC_TIME, 15, "TIME '", False, sql.SEARCHABLE_BASIC, None, None),
    ("TIMESTAMP", sql.XDBC_TIMESTAMP, 26, "TIMESTAMP '", False, sql.SEARCHABLE_BASIC, None, None),
)


def xdbc_type_info(data_type: int | None) -> pa.Table:
    """CommandGetXdbcTypeInfo: the SQL types of the server's columns (one ``data_type``'s when
    given), ordered by data type as JDBC's getTypeInfo is."""
    rows = []
    for name, code, size, prefix, case, search, unsigned, radix in sorted(_XDBC, key=lambda r: r[1]):
        if data_type is not None and code != data_type:
            continue
        rows.append({
            "type_name": name, "data_type": code, "column_size": size, "literal_prefix": prefix,
            "literal_suffix": "'" if prefix else None,
            "create_params": ["precision", "scale"] if name == "DECIMAL" else None,
            "nullable": sql.NULLABILITY_NULLABLE, "case_sensitive": case, "searchable": search,
            "unsigned_attribute": unsigned, "fixed_prec_scale": name == "DECIMAL",
            "auto_increment": False if radix else None, "local_type_name": name,
            "minimum_scale": 0 if name == "DECIMAL" else None,
            "maximum_scale": 38 if name == "DECIMAL" else None, "sql_data_type": code,
            "datetime_subcode": None, "num_prec_radix": radix, "interval_precision": None})
    return pa.Table.from_pylist(rows, schema=XDBC_SCHEMA)

