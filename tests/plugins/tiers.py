"""The test tiers: a test's tier is the folder it lives in, and the unit tier guards itself.

======================  ==================================================================
``tests/unit``          no process, no Qt, no socket: models, parsers, planner and engine
                        arithmetic, statistics, settings, security rules
``tests/integration``   the sim and other local processes, Qt widgets offscreen, the load
                        generator against local servers, the kill matrix against the sim,
                        the GUI on Xvfb, the HTML report in Chromium
``tests/e2e``           the real CPU build of vLLM (the tiny local model)
``tests/multinode``     a rig of hosts as network namespaces (root)
======================  ==================================================================

Each collected test gets its folder's marker (``-m unit`` … selects a tier); a test file
outside the four folders, or one that marks itself with another tier's marker, is a
collection error. While a ``tests/unit`` module is imported and while its tests run
(setup, call, teardown), starting a process (``subprocess``, ``os.fork``, ``os.exec*``,
``os.posix_spawn``, ``os.system``, asyncio's subprocesses, which go through
``subprocess.Popen``), opening a socket to or on an address (``bind``/``connect``) or
importing PySide6, pyqtgraph, pytest-qt or ``widgets`` fails the test with a message
naming the tier to move it to. The operation is refused where it happens (an audit hook
for processes and sockets, a wrapper of ``builtins.__import__`` for imports, so a module
another tier imported first is caught too) and recorded, so code that swallows the
error still fails its test.
"""
from __future__ import annotations

import builtins
import os
import sys
import threading
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
#: tier → what belongs there (the folder name is the tier's name and its marker)
TIERS = {
    "unit": "no process, no Qt, no socket",
    "integration": "the sim and other local processes, Qt widgets, local servers",
    "e2e": "drives a real vLLM (CPU build) launched by the tests",
    "multinode": "a rig of several hosts as network namespaces with an SSH server each (needs root)",
}
#: tier → the per-test timeout (s, pytest-timeout) where a test sets none: a stuck test
#: fails in its tier's time instead of the suite's 600 s
TIMEOUTS = {"unit": 60, "integration": 240, "e2e": 600, "multinode": 600}
#: under coverage (`make coverage` sets COVERAGE_FILE; its subprocesses COVERAGE_PROCESS_START)
#: Python runs 2–4× slower: the timeouts grow by this factor there (the unit tier's whole tunes
#: took 60 s under coverage beside a benchmark)
COVERAGE_TIMEOUT_SCALE = 4
#: audit events of starting a process (CPython's audit events table)
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn",
                            "os.spawn", "os.system", "pty.spawn"})
#: audit events of a socket reaching an address
SOCKET_EVENTS = frozenset({"socket.bind", "socket.connect"})
#: top-level modules the unit tier may not import: Qt and the GUI package
QT_MODULES = frozenset({"PySide6", "shiboken6", "pyqtgraph", "pytestqt", "widgets"})


class TierViolation(RuntimeError):
    """Raised where a unit-tier test starts a process, opens a socket or imports Qt."""


def tier_of(path: Path) -> str | None:
    """The tier of a test file: the first folder under ``tests/`` when it is a tier's."""
    try:
        rel = Path(path).resolve().relative_to(TESTS)
    except ValueError:
        return None
    return rel.parts[0] if len(rel.parts) > 1 and rel.parts[0] in TIERS else None


def library_probe() -> bool:
    """Whether the process being started is ``ctypes.util.find_library``'s look-up
    (``ldconfig -p``, ``gcc``): libraries such as asyncssh run it at import to find a
    shared library; it is the import's, not the test's."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.endswith(("ctypes/util.py", "ctypes\\util.py")):
            return True
        f = f.f_back
    return False


class UnitGuard:
    """Refuses and records processes, sockets and Qt imports while :attr:`active`."""

    def __init__(self) -> None:
        self.active = False
        self.violations: list[str] = []
        self._thread = None  # only the thread that turned the guard on is watched
        self._import = builtins.__import__

    def on(self) -> None:
        self.violations = []
        self._thread = threading.get_ident()
        self.active = True

    def off(self) -> list[str]:
        self.active = False
        seen, self.violations = self.violations, []
        return seen

    def _watching(self) -> bool:
        return self.active

    def _refuse(self, what: str, move_to: str) -> None:
        msg = (f"{what}: a test in tests/unit may not start a process, open a socket or import Qt; "
               f"move it to {move_to}")
        self.violations.append(msg)
        raise TierViolation(msg)

    def audit(self, event: str, args: tuple) -> None:
        if not self._watching():
            return
        if event in PROCESS_EVENTS and not library_probe():
            what = args[1] if event == "subprocess.Popen" and len(args) > 1 else args[:2]
            self._refuse(f"started a process ({event} {what!r})",
                         "tests/integration (tests/e2e if it launches a real vLLM)")
        elif event in SOCKET_EVENTS:
            self._refuse(f"opened a socket ({event} {args[1:2]!r})", "tests/integration")

    def import_(self, name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and self._watching() and name.partition(".")[0] in QT_MODULES:
            self._refuse(f"imported {name}", "tests/integration (Qt widgets run offscreen there)")
        return self._import(name, globals, locals, fromlist, level)


GUARD = UnitGuard()


def pytest_configure(config):
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (tests/{tier}): {what}")
    sys.addaudithook(GUARD.audit)
    builtins.__import__ = GUARD.import_


def pytest_unconfigure(config):
    if builtins.__import__ is GUARD.import_:
        builtins.__import__ = GUARD._import
    GUARD.active = False


def _is_unit(node) -> bool:
    path = getattr(node, "path", None)
    return path is not None and tier_of(path) == "unit"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Watch the import of a unit-tier module; a file outside the tiers is an error."""
    guarded = isinstance(collector, pytest.Module) and _is_unit(collector)
    if guarded:
        GUARD.on()
    outcome = yield
    if guarded:
        seen = GUARD.off()
        rep = outcome.get_result()
        if seen and rep.outcome != "failed":
            rep.outcome, rep.longrepr = "failed", "\n".join(seen)
    if isinstance(collector, pytest.Module) and tier_of(collector.path) is None:
        rep = outcome.get_result()
        rep.outcome = "failed"
        rep.longrepr = (f"{collector.path}: a test file belongs in one tier folder — "
                        + ", ".join(f"tests/{t}" for t in TIERS) + " (tests/plugins/tiers.py says which)")


def pytest_collection_modifyitems(config, items):
    """Give each test its folder's tier marker; a hand-set marker of another tier is an error."""
    wrong = []
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            continue
        others = [m.name for m in item.iter_markers() if m.name in TIERS and m.name != tier]
        if others:
            wrong.append(f"{item.nodeid}: marked {others[0]} but lives in tests/{tier}; move the file instead")
        item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("timeout") is None:
            covered = os.environ.get("COVERAGE_FILE") or os.environ.get("COVERAGE_PROCESS_START")
            item.add_marker(pytest.mark.timeout(TIMEOUTS[tier] * (COVERAGE_TIMEOUT_SCALE if covered else 1)))
    if wrong:
        raise pytest.UsageError("tests marked for another tier than their folder:\n  " + "\n  ".join(wrong))


def _guarded_phase(item):
    if not _is_unit(item):
        outcome = yield
        return
    GUARD.on()
    outcome = yield
    seen = GUARD.off()
    if seen:
        outcome.force_exception(pytest.fail.Exception("\n".join(seen), pytrace=False))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _guarded_phase(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _guarded_phase(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _guarded_phase(item)
