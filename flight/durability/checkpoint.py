"""Checkpoints: every source table's rows with their row keys, on disk, atomically.

A checkpoint is a directory ``ckpt-<seq>`` (``ckpt-<seq>-<n>`` when one of that position
already exists) under ``<data dir>/checkpoints`` holding one Parquet file per source table
or mirror (its rows in row-key order plus the ``__row_key`` column) and a ``manifest.json``
naming each file, its row count and CRC, the journal position the data reflects and
whatever else the server needs to resume (the catalog, allocator state, a mirror's position
in its origin's history).
The manifest is written last; a checkpoint exists only once ``CURRENT`` names it.

Every file is written to a temporary name, flushed with ``fsync``, renamed into place and
its directory fsynced, so a crash leaves either the old checkpoint or the new one, never
half of one. Older checkpoints are removed only after ``CURRENT`` names the new one.

Reading refuses, with a one-line :class:`CheckpointError` naming the file, anything that
is not exactly what the manifest promises: a missing file, a different size or CRC, a
manifest of another format version.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from engine.errors import CheckpointError

__all__ = ["FORMAT", "Checkpoint", "read_checkpoint", "write_checkpoint"]

log = logging.getLogger(__name__)

#: Bump when the layout changes (the row keys' column, :data:`flight.wire.ROW_KEY`, too): a
#: different version refuses to load.
FORMAT = 1
_CURRENT = "CURRENT"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint as read back: the tables' rows and the manifest's other contents.

    Attributes
    ----------
    seq
        The journal position the tables' rows reflect (records up to it are applied).
    tables
        Source table (or mirror) name -> its rows in row-key order, with ``__row_key``.
    state
        The JSON document the writer passed (catalog, allocators, ...).
    path
        The checkpoint's directory.
    """

    seq: int
    tables: dict[str, pa.Table]
    state: dict[str, Any]
    path: Path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _crc_file(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_checkpoint(root: Path, seq: int, tables: dict[str, pa.Table],
                     state: dict[str, Any]) -> Path:
    """Write a checkpoint atomically and make it the current one; returns its directory.

    Parameters
    ----------
    root
        ``<data dir>/checkpoints``.
    seq
        The journal position ``tables`` reflect.
    tables
        Source table (or mirror) name -> rows with their ``__row_key`` column, in row-key order.
    state
        JSON-serializable server state to keep beside the rows.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"ckpt-{seq:020d}"
    n = 0
    while final.exists():  # one of the same position (restarts with no write between):
        n += 1             # never delete what CURRENT may name before CURRENT moves
        final = root / f"ckpt-{seq:020d}-{n}"
    work = root / f"{final.name}.partial"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    files = {}
    for i, (name, rows) in enumerate(tables.items()):  # one file per table
        fname = f"t{i:05d}.parquet"
        path = work / fname
        with open(path, "wb") as f:
            pq.write_table(rows, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        files[name] = {"file": fname, "rows": rows.num_rows, "bytes": path.stat().st_size,
                       "crc32": _crc_file(path)}
    manifest = {"format": FORMAT, "seq": seq, "tables": files, "state": state}
    _write_atomic(work / "manifest.json", json.dumps(manifest).encode())
    _fsync_dir(work)
    os.replace(work, final)
    _fsync_dir(root)
    _write_atomic(root / _CURRENT, final.name.encode())
    for old in root.iterdir():  # only once CURRENT names the new one
        if old.name not in (final.name, _CURRENT) and old.name.startswith("ckpt-"):
            shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint %s: %d table(s), %d rows, journal position %d", final.name,
             len(tables), sum(t.num_rows for t in tables.values()), seq)
    return final


def read_checkpoint(root: Path) -> Checkpoint | None:
    """The current checkpoint, or ``None`` when there has never been one.

    Raises
    ------
    CheckpointError
        If ``CURRENT`` names a checkpoint that is missing or damaged, or of another format.
    """
    current = root / _CURRENT
    if not current.exists():
        return None
    path = root / current.read_text().strip()
    mpath = path / "manifest.json"
    try:
        manifest = json.loads(mpath.read_bytes())
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint manifest {mpath} is missing") from exc
    except ValueError as exc:
        raise CheckpointError(f"checkpoint manifest {mpath} is damaged ({exc})") from exc
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {manifest.get('format')!r}, this "
                              f"server reads format {FORMAT}; use a matching ticktable version")
    tables = {}
    for name, meta in manifest["tables"].items():  # one file per table
        fpath = path / meta["file"]
        if not fpath.exists():
            raise CheckpointError(f"checkpoint file {fpath} (table {name!r}) is missing")
        if fpath.stat().st_size != meta["bytes"] or _crc_file(fpath) != meta["crc32"]:
            raise CheckpointError(f"checkpoint file {fpath} (table {name!r}) is damaged: its "
                                  f"size or CRC differs from the manifest")
        rows = pq.read_table(fpath)
        if rows.num_rows != meta["rows"]:
            raise CheckpointError(f"checkpoint file {fpath} (table {name!r}) has {rows.num_rows} "
                                  f"rows, the manifest says {meta['rows']}")
        tables[name] = rows
    return Checkpoint(int(manifest["seq"]), tables, manifest["state"], path)
