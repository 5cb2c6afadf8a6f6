"""engine._kernels imports only numpy, pyarrow, pyroaring, the standard library and
engine.errors (dependency-free), so every layer, clients included, may use it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import engine._kernels

ALLOWED_PACKAGES = {"numpy", "pyarrow", "pyroaring"}
ALLOWED_MODULES = {"engine.errors"}  # plus engine._kernels itself


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            if node.module == "__future__":
                continue
            out.append(node.module or "")
    return out


def test_kernels_import_only_the_allowed_packages():
    root = Path(engine._kernels.__file__).parent
    files = sorted(root.glob("*.py"))
    assert len(files) >= 4
    bad = []
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            if top in ALLOWED_PACKAGES or top in sys.stdlib_module_names:
                continue
            if name in ALLOWED_MODULES or name == "engine._kernels" or name.startswith("engine._kernels."):
                continue
            bad.append(f"{path.name}: {name}")
    assert not bad, bad
