"""The test tiers guard themselves (tests/plugins/tiers.py): a test file placed in
tests/unit that starts a process, opens a socket or imports Qt fails there with a message
naming the tier to move it to; a test file outside the tier folders is a collection error;
every collected test of the suite is in exactly one tier folder."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT



@pytest.fixture
def bed(tmp_path):
    """A copy of the suite's skeleton: tests/ with the tier plugin and the four folders."""
    t = tmp_path / "tests"
    (t / "plugins").mkdir(parents=True)
    for d in ("unit", "integration", "e2e", "multinode"):
        (t / d).mkdir()
        (t / d / "__init__.py").write_text("")
    (t / "__init__.py").write_text("")
    (t / "plugins" / "__init__.py").write_text("")
    (t / "plugins" / "tiers.py").write_text((ROOT / "tests" / "plugins" / "tiers.py").read_text())
    (t / "conftest.py").write_text('pytest_plugins = ["tests.plugins.tiers"]\n')
    return tmp_path


def run(bed, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:pytestqt",
                           "-p", "no:xdist", *args], cwd=bed, capture_output=True, text=True, timeout=120)


UNIT_CASES = {
    "process": "import subprocess\n\ndef test_true():\n    subprocess.run(['true'])\n",
    "process_swallowed": ("import subprocess\n\ndef test_true():\n    try:\n        subprocess.run(['true'])\n"
                          "    except Exception:\n        pass\n"),
    "fork": "import os\n\ndef test_fork():\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n",
    "thread_process": ("import subprocess, threading\n\ndef test_in_a_thread():\n"
                       "    t = threading.Thread(target=subprocess.run, args=(['true'],)); t.start(); t.join()\n"),
    "asyncio_process": ("import asyncio\n\ndef test_asyncio():\n    async def go():\n"
                        "        p = await asyncio.create_subprocess_exec('true'); await p.wait()\n"
                        "    asyncio.run(go())\n"),
    "socket": ("import socket\n\ndef test_bind():\n    s = socket.socket()\n    s.bind(('127.0.0.1', 0))\n"
               "    s.close()\n"),
    "qt_in_test": "def test_qt():\n    import PySide6.QtCore  # noqa\n",
    "qt_at_import": "import PySide6  # noqa\n\ndef test_nothing():\n    pass\n",
    "widgets": "def test_widgets():\n    import widgets  # noqa\n",
}


@pytest.mark.parametrize("case", sorted(UNIT_CASES))
def test_a_unit_test_that_leaves_its_tier_fails_naming_where_to_move_it(bed, case):
    (bed / "tests" / "unit" / f"test_{case}.py").write_text(UNIT_CASES[case])
    r = run(bed, "tests/unit", "--rootdir", str(bed))
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "a test in tests/unit may not start a process, open a socket or import Qt" in out, out
    assert re.search(r"move it to tests/integration", out), out
    # the same file in the integration tier passes (Qt aside: that needs the package)
    if not case.startswith(("qt", "widgets")):
        (bed / "tests" / "unit" / f"test_{case}.py").rename(bed / "tests" / "integration" / f"test_{case}.py")
        r = run(bed, "tests/integration", "--rootdir", str(bed))
        assert r.returncode == 0, r.stdout + r.stderr


def test_a_pure_unit_test_passes_and_gets_its_marker(bed):
    (bed / "tests" / "unit" / "test_pure.py").write_text(textwrap.dedent("""
        import json

        def test_pure():
            assert json.loads("[1]") == [1]
    """))
    assert run(bed, "tests", "-m", "unit").returncode == 0
    r = run(bed, "tests", "-m", "integration")
    assert r.returncode == 5, r.stdout  # deselected: no test of that tier


def test_a_file_outside_the_tiers_or_marked_for_another_is_refused(bed):
    (bed / "tests" / "test_loose.py").write_text("def test_x():\n    pass\n")
    r = run(bed, "tests")
    assert r.returncode != 0 and "a test file belongs in one tier folder" in r.stdout, r.stdout
    (bed / "tests" / "test_loose.py").unlink()
    (bed / "tests" / "unit" / "test_marked.py").write_text(
        "import pytest\n\n@pytest.mark.e2e\ndef test_x():\n    pass\n")
    r = run(bed, "tests")
    assert r.returncode != 0 and "marked e2e but lives in tests/unit" in r.stdout + r.stderr, r.stdout + r.stderr


def test_every_test_of_the_suite_is_in_exactly_one_tier_folder():
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = [l for l in r.stdout.splitlines() if "::" in l]
    assert len(ids) > 1000
    tiers = {i.split("/")[1] for i in ids}
    assert tiers == {"unit", "integration", "e2e", "multinode"}, tiers
    files = {i.split("::")[0] for i in ids}
    assert all(f.startswith("tests/") and f.count("/") == 2 for f in files), [f for f in files if f.count("/") != 2]
