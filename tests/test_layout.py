"""Private means this module's (STYLE.md, "Layout and names"): no module of the library
imports a ``_name`` from another module. A name two modules share is a seam: give it a
public name in the module that owns it, or merge the modules if they are one family.

Checked per top-level package with ``ast``: every ``from X import _name`` (a dunder such as
``__version__`` is fine), wherever it stands (``TYPE_CHECKING`` blocks included). ruff's
PLC2701 (pyproject.toml) says the same across packages; this also covers imports inside
one package, which ruff lets through.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "flight", "clients", "ticktable")
GENERATED = (ROOT / "flight" / "pb",)

PENDING: dict[str, set[str]] = {}


def private_imports(package: str) -> list[str]:
    """``"path: from module import _name"`` for each private name ``package``'s modules import."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if any(path.is_relative_to(g) for g in GENERATED):
            continue
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{rel}: from {module} import {alias.name}")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_another_modules_private_names(package):
    found = private_imports(package)
    pending = PENDING.get(package, set())
    new = [f for f in found if f not in pending]
    assert not new, (
        f"{len(new)} private name(s) imported from another module (give each a public name "
        f"in the module that owns it, or merge the two modules):\n  " + "\n  ".join(new))
    gone = sorted(pending - set(found))
    assert not gone, "no longer imported, remove from the pending set:\n  " + "\n  ".join(gone)


def test_the_check_sees_private_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "demo"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from demo.b import _hidden, shown, __version__\n"
        "from . import _sibling\n"
        "if TYPE_CHECKING:\n"
        "    from demo.b import _Typed\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert private_imports("demo") == [
        "demo/a.py: from demo.b import _hidden",
        "demo/a.py: from . import _sibling",
        "demo/a.py: from demo.b import _Typed",
    ]
