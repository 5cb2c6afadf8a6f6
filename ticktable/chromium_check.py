"""Check that Chromium is available for the web UI's browser tests, and say what to install
when it is not.

Run as ``python -m ticktable.chromium_check`` (``make test`` does). The tests drive
Debian's Chromium through Playwright (which never downloads a browser of its own):
``$TICKTABLE_CHROMIUM``, else ``/usr/bin/chromium``. Exit status 0 when it runs, 1
otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys

DEFAULT = "/usr/bin/chromium"


def chromium_path() -> str:
    """The Chromium the browser tests drive: ``$TICKTABLE_CHROMIUM``, else ``/usr/bin/chromium``."""
    return os.environ.get("TICKTABLE_CHROMIUM") or DEFAULT


def find_chromium() -> tuple[str, str | None]:
    """``(path, version)`` of that Chromium; the version is ``None`` when it does not run."""
    path = chromium_path()
    try:
        out = subprocess.run([path, "--headless", "--version"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return path, None
    text = (out.stdout or out.stderr).strip()
    return path, (text.splitlines()[-1] if out.returncode == 0 and text else None)


def main() -> int:
    path, version = find_chromium()
    if version is not None:
        print(f"chromium check: {path} is {version}: ok")
        return 0
    print(
        f"chromium check FAILED: no working Chromium at {path}.\n"
        f"The web UI's tests (tests/web) drive Chromium headless through Playwright. "
        f"Install it, e.g.\n"
        f"  Debian/Ubuntu: sudo apt-get install -y chromium\n"
        f"or point TICKTABLE_CHROMIUM at a Chromium or Chrome binary, and rerun.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
