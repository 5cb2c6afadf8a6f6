"""tests/conftest.py's hooks in a real pytest run: a test outside tests/web runs with no event
loop that a web test's session fixture left running in the main thread."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: what Playwright's sync API does: its loop becomes the main thread's running loop at the
#: session fixture's start and stays so until the session ends
WEB = '''
import asyncio

import pytest

@pytest.fixture(scope="session")
def browser():
    loop = asyncio.new_event_loop()
    asyncio._set_running_loop(loop)
    yield loop
    assert asyncio._get_running_loop() is loop, "the session's loop is back for its end"
    asyncio._set_running_loop(None)
    loop.close()

def test_page(browser):
    assert asyncio._get_running_loop() is browser
'''

OTHER = '''
import asyncio

async def twice(x):
    await asyncio.sleep(0)
    return 2 * x

def test_runs_its_own_loop():
    assert asyncio.run(twice(21)) == 42

def test_and_again():
    assert asyncio.run(twice(2)) == 4
'''


@pytest.mark.parametrize("hooks", [True, False], ids=["conftest", "without"])
def test_a_web_session_loop_stays_out_of_later_tests(pytester: pytest.Pytester,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      hooks: bool) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeini("[pytest]\n")  # node ids from here: tests/web/... as in the project
    (pytester.path / "tests" / "web").mkdir(parents=True)
    (pytester.path / "tests" / "web" / "test_page.py").write_text(WEB)
    (pytester.path / "tests" / "other").mkdir()
    (pytester.path / "tests" / "other" / "test_after.py").write_text(OTHER)
    plugins = ["-p", "tests.conftest"] if hooks else []
    # the web test first, so its session loop is running when the other two run
    result = pytester.runpytest_subprocess(*plugins, "-p", "no:cacheprovider",
                                           "tests/web", "tests/other")
    if hooks:
        result.assert_outcomes(passed=3)
    else:  # the failure the hooks are for: the check is not passing by luck
        result.assert_outcomes(passed=1, failed=2)
        result.stdout.fnmatch_lines(["*cannot be called from a running event loop*"])
