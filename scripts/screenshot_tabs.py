"""Grab every tab of the window at laptop and desktop sizes (issue 37, item 7: fits a laptop).

Usage: ``python scripts/screenshot_tabs.py [OUT_DIR] [--sizes 1280x800,1600x1000] [--time-scale K]``
(default ``build/screenshots/tabs``). Runs offscreen with a throw-away data directory:
launches the demo profile's simulated rig through the window, runs two short fixed ramps
(levels 1,2,4,8 then 1,4,16; 10-second levels, no SLO, recorded as two runs), opens
the two runs in Compare and lets the Tune tab predict its space, so every tab has content.
Then, for each size, each tab of the right-hand side (Plan, Live, Curves, Results, Tune,
Log, Profiles, History, Compare) and each of the left (Server, Ramp) is shown and grabbed
to ``OUT_DIR/<W>x<H>-<tab>.png``. Prints one line per grab: the window's size as
shown, its minimum size hint and whether the window came out larger than asked (what
a screen of that size would clip). Exits 1 when any did.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(ROOT / "build" / "screenshots" / "tabs"))
    ap.add_argument("--sizes", default="1280x800,1600x1000", help="window sizes, WxH, comma-separated")
    ap.add_argument("--time-scale", type=float, default=20.0, help="sim speed-up (rig time is what is shown)")
    a = ap.parse_args(argv)
    sizes = [tuple(int(x) for x in s.lower().split("x")) for s in a.sizes.split(",") if s]
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["VLLM_DYNO_HOME"] = tempfile.mkdtemp(prefix="dyno-tabs-")
    from widgets.main import create_app

    app = create_app()
    from widgets.main_window import MainWindow

    w = MainWindow(restore=False)
    w.resize(*sizes[0])
    w.show()
    w.sim_time_scale = a.time_scale

    def pump(seconds: float, cond=None) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            if cond is not None and cond():
                return True
            time.sleep(0.01)
        return cond() if cond else True

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if not pump(60, lambda: w.plan is not None and w.act_launch.isEnabled()):
            print(f"screenshot_tabs: Launch is not enabled: {w.act_launch.toolTip()}", file=sys.stderr)
            return 1
        w.launch()
        if not pump(180, lambda: w.controller.state in ("ready", "failed")) or w.controller.state != "ready":
            print("screenshot_tabs: the sim did not become ready:\n" + w.log_pane.text()[-2000:], file=sys.stderr)
            return 1
        w.ramp.slo_ttft.setValue(0)
        w.ramp.slo_tpot.setValue(0)
        w.ramp.step.setValue(10)
        for levels in ("1,4,16", "1,2,4,8"):  # two recorded runs: History and Compare have two
            w.ramp.levels.setText(levels)
            w.run_ramp()
            if not pump(5, lambda: w.controller.ramp_running):
                print("screenshot_tabs: the ramp did not start: " + w.ramp.form_error.text(), file=sys.stderr)
                return 1
            pump(600, lambda: not w.controller.ramp_running)
            pump(1.0)
        ids = [int(r["id"]) for r in w.run_store().list_runs()][:2]
        w.history.refresh()
        if ids:
            w.compare_runs(ids)
        w.tabs.setCurrentWidget(w.tune)
        pump(600, lambda: w.tune.table.rowCount() > 0)  # the space predicted (minutes on a busy machine)
        for tabs in (w.left_tabs, w.tabs):  # what each tab needs: the widest sets the window's minimum
            print("minimum width by tab: " + ", ".join(
                f"{tabs.tabText(i).replace('&', '')} {tabs.widget(i).minimumSizeHint().width()}"
                for i in range(tabs.count())))
        bad = 0
        for width, height in sizes:
            w.resize(width, height)
            pump(0.5)
            for tabs in (w.left_tabs, w.tabs):
                w.left_tabs.setCurrentIndex(0)  # the right-hand tabs beside the Server form
                for i in range(tabs.count()):
                    tabs.setCurrentIndex(i)
                    w.dashboard.refresh(force=True)
                    pump(0.8)
                    name = tabs.tabText(i).replace("&", "").lower()
                    path = out / f"{width}x{height}-{name}.png"
                    w.grab().save(str(path))
                    hint = w.minimumSizeHint()
                    over = w.width() > width or w.height() > height
                    bad += over
                    print(f"{path}: window {w.width()}x{w.height()} (minimum {hint.width()}x{hint.height()})"
                          + (" — LARGER than asked: a screen this size clips it" if over else ""))
        return 1 if bad else 0
    finally:
        left = w.shutdown()
        w.close()
        if left:
            print(f"screenshot_tabs: processes left: {left}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
