"""Compile ``proto/ticktable_proto/v1/*.proto`` and ``proto/arrow/flight/protocol/{,sql/}*.proto`` into
``flight/pb/`` (``make proto``).

protoc names generated imports after the proto path (``from ticktable_proto.v1 import ...``);
the modules live in ``flight.pb``, so those imports are rewritten to it. (The protobuf package
is ``ticktable_proto.v1``, not ``ticktable.v1``: it no longer shares its name with the
``ticktable`` facade package, whose import protoc's output would have shadowed.) ``tests/flight/test_proto.py`` regenerates into a temporary directory and fails
when the committed files differ.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent
_DIRS = (("ticktable_proto", "v1"), ("arrow", "flight", "protocol"),
         ("arrow", "flight", "protocol", "sql"))
PROTOS = sorted(p for d in _DIRS for p in ROOT.joinpath(*d).glob("*.proto"))
_IMPORT = re.compile(r"^from (ticktable_proto\.v1|arrow\.flight\.protocol(\.sql)?) import ",
                     re.MULTILINE)


def generate(out: Path) -> list[Path]:
    """Write the generated modules into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "_protoc"
    tmp.mkdir(exist_ok=True)
    include = Path(protoc.__file__).resolve().parent / "_proto"
    bindir = Path(sys.executable).parent  # the venv's protoc-gen-mypy plugins
    plugins = [f"--plugin=protoc-gen-{n}={bindir / ('protoc-gen-' + n)}" for n in ("mypy", "mypy_grpc")]
    args = ["protoc", *plugins, f"-I{ROOT}", f"-I{include}", f"--python_out={tmp}", f"--mypy_out={tmp}",
            f"--grpc_python_out={tmp}", f"--mypy_grpc_out={tmp}"]
    if protoc.main(args + [str(p.relative_to(ROOT)) for p in PROTOS]) != 0:
        raise SystemExit("protoc failed")
    written = []
    for parts in sorted(_DIRS, key=len, reverse=True):  # sql/ before its parent folder
        for f in sorted(p for p in tmp.joinpath(*parts).iterdir() if p.is_file()):
            text = _IMPORT.sub("from flight.pb import ", f.read_text())
            target = out / f.name
            target.write_text(text)
            written.append(target)
            f.unlink()
        for depth in range(len(parts), 0, -1):
            folder = tmp.joinpath(*parts[:depth])
            if not any(folder.iterdir()):  # a parent may still hold another folder's files
                folder.rmdir()
    tmp.rmdir()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT.parent / "flight" / "pb")
    args = parser.parse_args(argv)
    for f in generate(args.out):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
