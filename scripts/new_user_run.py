"""Issue 37's scripted new-user run (not in CI): the real window on a real X server.

A fresh data dir (``VLLM_DYNO_HOME``, the window's settings with it) and a fresh Xvfb
screen; the window opens on Qt's xcb platform and is driven with real X input events
(``xdotool``: the pointer moved onto a button and clicked, as a user does):

1. the first start shows the built-in demo (sim: 8× RTX 4090, Llama-3.1-70B AWQ) and its
   Plan; **Launch** (toolbar) → the rig is ready;
2. **Run ramp** (toolbar) with the form's defaults → the verdict;
3. the Plan banner, the verdict and History are read and compared; screenshots of the
   screen (the X root window) at each step, and of History;
4. the window is closed, and a **separate capacity search** of the same rig runs through
   the run controller (doubling from 1 user, each level ≥ 100 requests): the verdict's
   users must fall within that search's interval.

Printed: wall time Launch → verdict (≤ 5 min asked), the ramp's rig time (≤ 6 min asked),
the three numbers and the check, and where the screenshots are. Exit status 0 when every
check holds. Needs Xvfb and xdotool (``scripts/setup-system.sh --test``).

Usage: ``PYTHONPATH=$PWD .venv/bin/python scripts/new_user_run.py [--out DIR] [--size 1600x1000]``
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))


def start_xvfb(size: str) -> subprocess.Popen:
    exe = shutil.which("Xvfb")
    if exe is None or shutil.which("xdotool") is None:
        raise SystemExit("needs Xvfb and xdotool: scripts/setup-system.sh --test")
    r, w = os.pipe()
    proc = subprocess.Popen([exe, "-displayfd", str(w), "-screen", "0", f"{size}x24", "-nolisten", "tcp",
                             "-noreset"], pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r) as f:
        num = f.readline().strip()
    if not num:
        raise SystemExit("Xvfb did not start")
    os.environ["DISPLAY"] = f":{num}"
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "build" / "new-user-run"), help="folder for the screenshots")
    ap.add_argument("--size", default="1600x1000", help="the X screen, WxH")
    ap.add_argument("--no-separate", action="store_true", help="skip the separate capacity search")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="dyno-new-user-"))
    os.environ["VLLM_DYNO_HOME"] = str(home)  # a fresh data dir: runs, profiles, settings, onboarding
    os.environ["QT_QPA_PLATFORM"] = "xcb"
    xv = start_xvfb(a.size)
    checks: list[tuple[str, bool]] = []
    try:
        return drive(out, home, checks, a)
    finally:
        xv.terminate()
        xv.wait(5)
        for name, ok in checks:
            print(f"{'PASS' if ok else 'FAIL'}  {name}")


def drive(out: Path, home: Path, checks: list, a) -> int:
    # deferred: Qt must see DISPLAY and QT_QPA_PLATFORM set above before it loads
    from app import history
    from app.loadgen.spec import CapacitySearch, RampSpec
    from app.run.controller import RunController
    from app.run.target import launch_target
    from PySide6.QtWidgets import QToolBar

    from widgets.main import create_app
    from widgets.main_window import MainWindow

    app = create_app(["vllm-dyno"])
    win = MainWindow()
    win.show()
    t_start = time.monotonic()

    def pump(cond, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not cond():
            app.processEvents()
            if time.monotonic() > end:
                raise SystemExit(f"timed out ({timeout:g} s) waiting for: {what}")
            time.sleep(0.05)

    def shot(name: str) -> None:
        app.processEvents()
        app.primaryScreen().grabWindow(0).save(str(out / name))  # the X screen as a user sees it
        print(f"screenshot {out / name}", flush=True)

    def click(widget, what: str) -> None:
        pump(lambda: widget.isVisible() and widget.isEnabled(), 60, f"{what} enabled")
        p = widget.mapToGlobal(widget.rect().center())
        subprocess.run(["xdotool", "mousemove", "--sync", str(p.x()), str(p.y()), "click", "1"], check=True)
        print(f"{time.monotonic() - t_start:6.1f} s  click {what} at ({p.x()}, {p.y()})", flush=True)

    pump(lambda: win.windowHandle() is not None and win.windowHandle().isExposed(), 30, "the window on screen")
    pump(lambda: win.plan is not None and not win.planner.busy and not win.planner._timer.isActive(), 120,
         "the demo's plan")
    print(f"profile: {win.profile_name}; plan: {win.plan_panel.verdict.text()}", flush=True)
    shot("1-first-start.png")
    tb = win.findChild(QToolBar, "mainToolbar")
    click(tb.widgetForAction(win.act_launch), "Launch")
    t_launch = time.monotonic()
    pump(lambda: win.controller.state in ("ready", "failed"), 180, "the rig ready")
    if win.controller.state != "ready":
        raise SystemExit(f"launch failed: {win.log_pane.text()[-2000:]}")
    t_ready = time.monotonic()
    print(f"ready after {t_ready - t_launch:.1f} s (sim ×{win.controller.time_scale:g})", flush=True)
    click(tb.widgetForAction(win.act_ramp), "Run ramp")
    pump(lambda: win.controller.ramp_running, 30, "the ramp starts")
    progress: list[str] = []
    next_note = 0.0
    mid = False

    def watch() -> bool:
        nonlocal next_note, mid
        if time.monotonic() >= next_note:
            line = re.sub("<[^>]+>", " ", win.ramp.progress.text().split("<br>")[-1])
            progress.append(line)
            print(f"{time.monotonic() - t_start:6.1f} s  {line}", flush=True)
            next_note = time.monotonic() + 15
            if not mid and "requests" in line:
                win.left_tabs.setCurrentWidget(win.ramp)
                shot("2-search-in-progress.png")
                mid = True
        return not win.controller.ramp_running

    pump(watch, 900, "the ramp ends")
    pump(lambda: win.results.verdict.isVisible(), 30, "the verdict")
    t_verdict = time.monotonic()
    steps = list(win.results.steps)
    rig_s = sum(s.t_end - s.t_start for s in steps)
    shot("3-verdict.png")
    pump(lambda: history.list_runs(win.run_store()) and history.list_runs(win.run_store())[0].users_at_slo is not None,
         60, "the run in the store")
    tabs = win.tabs
    bar = tabs.tabBar()
    idx = tabs.indexOf(win.history)
    r = bar.tabRect(idx)
    p = bar.mapToGlobal(r.center())
    subprocess.run(["xdotool", "mousemove", "--sync", str(p.x()), str(p.y()), "click", "1"], check=True)
    pump(lambda: tabs.currentWidget() is win.history and win.history.table.rowCount() > 0, 30, "History")
    shot("4-history.png")
    row = win.history.rows[0]
    run = win.run_store().get_run(row.id)
    v = ((run or {}).get("summary") or {}).get("verdict") or {}
    plan_text = re.sub("<[^>]+>", "", win.plan_panel.verdict.text())
    m = re.search(r"predicted (\d+(?:\.\d+)?) users?", plan_text)
    predicted = float(m.group(1)) if m else None
    m = re.search(r"measured (\d+(?:\.\d+)?) users?", plan_text)
    plan_users = float(m.group(1)) if m else None
    verdict_text = re.sub("<[^>]+>", " ", win.results.verdict.text())
    hist_cell = win.history.table.item(0, 5).text()
    users = v.get("users")
    print(f"\nplan banner: {plan_text}")
    print(f"verdict:     {verdict_text.strip()}")
    print(f"History:     Users at SLO = {hist_cell}")
    print(f"levels:      {' '.join(f'{s.level:g}' + ('' if s.slo_met else '✗') + ('d' if s.stop_reason == 'decided' else '') + f'/{s.n_ok}' for s in steps)}")
    wall = t_verdict - t_launch
    print(f"Launch → verdict: {wall / 60:.2f} wall min (ready {t_ready - t_launch:.0f} s); ramp rig time "
          f"{rig_s / 60:.2f} min")
    checks.append((f"Launch → verdict ≤ 5 wall min ({wall / 60:.2f})", wall <= 300))
    checks.append((f"rig time ≤ 6 min ({rig_s / 60:.2f})", rig_s <= 360))
    checks.append(("the verdict is a capacity search's (not indicative)", bool(users) and not v.get("indicative")))
    checks.append((f"verdict and History say the same number ({users:g} / {hist_cell})",
                   users is not None and hist_cell == f"{users:g}"))
    checks.append((f"the Plan banner says the same number (banner: measured {plan_users}, predicted {predicted}; "
                   f"verdict {users})", plan_users is not None and users is not None and plan_users == users))
    cfg = win.config.build_config()
    rig = win.config.sim_rig(win.sim_time_scale)
    spec = win.controller.ramp_spec
    win.shutdown()
    win.close()
    app.processEvents()
    if a.no_separate:
        return 0 if all(ok for _, ok in checks) else 1
    print("\nseparate capacity search of the same rig (from 1 user, doubling) …", flush=True)
    ctl = RunController()
    try:
        errs = ctl.launch(launch_target("sim", cfg, sim_args=rig.argv(), telemetry=False))
        if errs:
            raise SystemExit(f"launch refused: {errs}")
        if not ctl.wait_ready(180):
            raise SystemExit(ctl.failure_text)
        t0 = time.monotonic()
        sep = RampSpec(**{**spec.model_dump(), "url": ctl.url,
                          "search": CapacitySearch(max_level=spec.search.max_level if spec.search else 128)})
        res = ctl.ramp(sep)
        t1 = time.monotonic()
    finally:
        ctl.stop()
        ctl.close()
    c = res.capacity
    if c is None:
        raise SystemExit(f"the separate search gave no capacity: {res.status} {res.stop_reason}")
    print(f"separate search: {c.sentence}  [{' '.join(f'{lv.users:g}' + ('' if lv.met else '✗') for lv in c.levels)}]"
          f" — {(t1 - t0) / 60:.2f} wall min, {sum(s.t_end - s.t_start for s in res.steps) / 60:.2f} rig min")
    checks.append((f"the verdict's {users:g} users within the separate search's {c.users_low:g}–{c.users_high:g}",
                   users is not None and c.users_low <= users <= c.users_high))
    print(f"data dir {home}; screenshots in {out}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
