"""Check that Java 17+ is available for PySpark, and say what to install when it is not.

Run as ``python -m ticktable.java_check`` (``make test`` does). Exit status 0 when a
suitable ``java`` is found (``JAVA_HOME`` first, then ``PATH``), 1 otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MIN_MAJOR = 17


def find_java() -> tuple[str | None, int | None]:
    """``(path, major version)`` of the java PySpark would use, or ``(None, None)``."""
    candidates = []
    home = os.environ.get("JAVA_HOME")
    if home:
        candidates.append(str(Path(home) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    for java in candidates:
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
        if m:
            major = int(m.group(1))
            if major == 1 and m.group(2):  # "1.8" style
                major = int(m.group(2))
            return java, major
    return None, None


def main() -> int:
    java, major = find_java()
    if java is not None and major is not None and major >= MIN_MAJOR:
        print(f"java check: {java} is Java {major} (PySpark needs {MIN_MAJOR}+): ok")
        return 0
    found = f"found Java {major} at {java}" if java else "no java found (JAVA_HOME unset or wrong, none on PATH)"
    print(
        f"java check FAILED: {found}.\n"
        f"PySpark needs Java {MIN_MAJOR} or newer. Install it, e.g.\n"
        f"  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless\n"
        f"  macOS:         brew install openjdk@17\n"
        f"then set JAVA_HOME to its folder (e.g. /usr/lib/jvm/java-17-openjdk-amd64) and rerun.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
