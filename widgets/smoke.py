"""Smoke mode: ``VLLM_DYNO_SMOKE=/path/shot.png vllm-dyno`` (the frozen-app test, issue 9).

Opens the main window on the built-in simulated demo profile (8× RTX 4090,
Llama-3-70B AWQ), runs the sim :data:`TIME_SCALE` × faster than the wall clock,
launches it, waits for ready, runs a 3-level ramp (concurrency 1, 2, 4; 10 s rig
steps = 1 s of wall time each), saves ``window.grab()`` as a PNG to the given path,
stops the server and checks that no process of the server's group is left.

Exit status 0 on success; 1 with a message on stderr naming the failed step; the
whole run is bounded by :data:`DEADLINE_S` seconds (a watchdog thread ends the process
with status 3 if the event loop itself stops answering). Progress goes to stderr as
``smoke: …`` lines, including ``window shown <t> s after process start`` (the start
time figure of the packaging issue: from the process's creation time, so it covers
the frozen bootloader and imports too).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import psutil
from PySide6.QtWidgets import QApplication

from app.server.procs import group_members
from widgets import profiles
from widgets.main import create_app
from widgets.main_window import MainWindow

#: sim speed-up over the wall clock (``--sim-time-scale``)
TIME_SCALE = 10.0
#: the ramp: concurrency levels and rig seconds per level
LEVELS = "1,2,4"
STEP_S = 10.0
#: the whole smoke run's wall-clock limit, seconds
DEADLINE_S = 150.0


class SmokeFailed(RuntimeError):
    """A smoke step did not happen in time (the message names it)."""


def _say(msg: str) -> None:
    print(f"smoke: {msg}", file=sys.stderr, flush=True)


def process_age() -> float:
    """Seconds since this process was created, from the kernel's start time in
    ``/proc/self/stat`` (field 22, clock ticks since boot) against ``/proc/uptime``
    (10 ms resolution); falls back to ``psutil`` (whose boot time is whole seconds)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time() - psutil.Process().create_time()


def _watchdog(seconds: float) -> threading.Timer:
    def fire():
        _say(f"FAILED: no result after {seconds:.0f} s (event loop stuck); exiting with status 3")
        os._exit(3)  # the reaper ends the server's group when this process is gone

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.name = "dyno-smoke-watchdog"
    t.start()
    return t


def run_smoke(shot: str | os.PathLike[str], argv: list[str] | None = None) -> int:
    """Run the smoke sequence in a fresh QApplication; returns the exit status (0 ok)."""
    shot = Path(shot)
    if shot.suffix.lower() != ".png":
        _say(f"FAILED: VLLM_DYNO_SMOKE={shot}: give a path ending in .png")
        return 1
    if not shot.parent.is_dir():
        _say(f"FAILED: VLLM_DYNO_SMOKE={shot}: directory {shot.parent} does not exist")
        return 1
    dog = _watchdog(DEADLINE_S + 30.0)
    try:
        return _run(shot, argv)
    finally:
        dog.cancel()


def _run(shot: Path, argv: list[str] | None) -> int:
    app = create_app(argv)

    deadline = time.monotonic() + DEADLINE_S
    win = MainWindow(restore=False)
    win.sim_time_scale = TIME_SCALE
    win.show()
    wait_until(win.isVisible, 10, "the window is shown", deadline)
    QApplication.processEvents()
    _say(f"window shown {process_age():.2f} s after process start")
    fg, avail = win.frameGeometry(), win.screen().availableGeometry()
    _say(f"window {fg.width()}x{fg.height()} at {fg.x()},{fg.y()} on a {avail.width()}x{avail.height()} screen "
         f"at {avail.x()},{avail.y()} ({QApplication.platformName()})")
    status, pgid = 1, None
    try:
        if not win.config.engine_key().simulated:
            win.load_profile(profiles.DEMO_NAME, quiet=True)
        if not win.config.engine_key().simulated:
            raise SmokeFailed(f"the demo profile {profiles.DEMO_NAME!r} does not select the simulated rig")
        wait_until(lambda: win.plan is not None or (win.plan_error is not None), 30, "the demo profile is planned",
                   deadline)
        reason = win.launch_block_reason()
        if reason:
            raise SmokeFailed(f"Launch is disabled: {reason}")
        win.act_launch.trigger()
        wait_until(lambda: win.controller.state in ("ready", "failed"), 60, "the sim becomes ready", deadline)
        if win.controller.state != "ready":
            raise SmokeFailed(f"the sim failed to start: {win.log_pane.text()[-1500:]}")
        pgid = win.controller.supervisor.pgid
        _say(f"sim ready at {win.controller.url} ({process_age():.1f} s)")
        r = win.ramp
        r.find.setChecked(False)  # a fixed ramp: the demo's SLO would make Run ramp a capacity search
        r.levels.setText(LEVELS)
        r.step.setValue(STEP_S)
        r.warmup.setValue(1)
        r.output.setText("64")
        r.slo_ttft.setValue(0)
        r.slo_tpot.setValue(0)
        win.act_ramp.trigger()
        wait_until(lambda: win.controller.ramp_running, 10, "the ramp starts", deadline)
        wait_until(lambda: len(helper_processes()) >= 3, 10, "the load generator's process", deadline)
        check_helpers(helper_processes())
        wait_until(lambda: not win.controller.ramp_running, 60, "the ramp ends", deadline)
        levels = [s.level for s in win.results.steps]
        if "ramp: done" not in win.run_label.text() or levels != [1, 2, 4]:
            raise SmokeFailed(f"the ramp did not complete: {win.run_label.text()!r}, levels {levels}")
        _say(f"ramp done: levels {levels} ({process_age():.1f} s)")
        win.tabs.setCurrentWidget(win.curves)
        QApplication.processEvents()
        if not win.grab().save(str(shot), "PNG"):
            raise SmokeFailed(f"cannot write the screenshot {shot}")
        _say(f"screenshot {shot}")
        win.act_stop.trigger()
        wait_until(lambda: win.controller.state == "stopped" and win.controller.supervisor is None, 30,
                   "the server stops", deadline)
        status = 0
    except SmokeFailed as e:
        _say(f"FAILED: {e}")
    finally:
        left = win.shutdown()
        win.hide()
        win.deleteLater()
        QApplication.processEvents()
        if pgid is not None:
            survivors = [p.pid for p in group_members(pgid)] + list(left)
            if survivors:
                _say(f"FAILED: processes of the server's group survived the stop: {sorted(set(survivors))}")
                status = 1
        app.quit()
    if status == 0:
        _say(f"ok ({process_age():.1f} s)")
    return status


def helper_processes() -> list[tuple[list[str], dict[str, str]]]:
    """``(command line, environment)`` of this process's descendants (reaper, sim server,
    load generator)."""

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            out.append((p.cmdline(), p.environ()))
        except psutil.Error:
            continue
    return out


def check_helpers(procs: list[tuple[list[str], dict[str, str]]]) -> None:
    """In a frozen build every helper must be this executable re-entered as ``_helper``
    (no separate Python exists), and none may inherit an ``LD_LIBRARY_PATH`` pointing into
    the bundle (the sim server is started exactly as vLLM would be; packaging/entry.py).
    Raise :class:`SmokeFailed` naming the offender."""
    cmds = [c for c, _ in procs]
    mods = sorted({c[2] for c in cmds if len(c) > 2 and c[1] in ("_helper", "-m")})
    _say(f"helper processes: {', '.join(mods)}")
    if not getattr(sys, "frozen", False):
        return
    exe = os.path.realpath(sys.executable)
    bad = [c for c in cmds if not c or os.path.realpath(c[0]) != exe or c[1:2] != ["_helper"]]
    if bad:
        raise SmokeFailed(f"helper processes not started from {exe} _helper: {bad}")
    bundle = os.path.realpath(getattr(sys, "_MEIPASS", os.path.dirname(exe)))
    for c, env in procs:
        paths = [os.path.realpath(p) for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        if bundle in paths:
            raise SmokeFailed(f"{' '.join(c[:3])} inherited LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']} "
                              "(the bundle's libraries would be forced on vLLM)")


def wait_until(cond, timeout: float, what: str, deadline: float) -> None:
    """Process Qt events until ``cond()`` is true; raise :class:`SmokeFailed` naming
    ``what`` after ``timeout`` seconds or at the run's ``deadline`` (monotonic seconds)."""

    end = min(time.monotonic() + timeout, deadline)
    while not cond():
        if time.monotonic() > end:
            raise SmokeFailed(f"timed out waiting for {what}")
        QApplication.processEvents()
        time.sleep(0.02)
