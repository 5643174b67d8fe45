"""Take the README screenshot: the main window mid-ramp against the simulated 8× RTX 4090.

Usage: ``python scripts/screenshot.py [OUT.png] [--curves CURVES.png] [--time-scale K]``
(default ``resources/screenshots/main-window.png``). Runs offscreen with a throw-away
data directory; launches the sim through the window, runs the demo profile's ramp and
grabs the Live tab while the ramp is in its later levels; stops everything after.
``--verdict``: run the demo profile's own ramp to its end instead and grab the Results
tab, whose first line is the verdict (``resources/screenshots/verdict.png``).
``--tune``: plan the Tune tab's space for the demo profile, narrow it (TP 2/4, kv auto,
CUDA graphs on, max_num_batched_tokens 2048), run a three-launch tune and grab the Tune
tab with its table, Pareto plot and result card (``resources/screenshots/tune.png``).
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
    ap.add_argument("out", nargs="?", default=str(ROOT / "resources" / "screenshots" / "main-window.png"))
    ap.add_argument("--curves", help="also save the Curves tab after the ramp here")
    ap.add_argument("--verdict", action="store_true",
                    help="instead: run the demo profile's own ramp (its SLO kept) to the end and grab the "
                         "Results tab with the verdict, as a new user sees it")
    ap.add_argument("--tune", action="store_true",
                    help="instead: run a short tune of the demo profile and grab the Tune tab")
    ap.add_argument("--time-scale", type=float, default=4.0, help="sim speed-up (rig time is what is shown)")
    ap.add_argument("--at-level", type=int, default=6, help="grab while this level (1-based) runs")
    a = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["VLLM_DYNO_HOME"] = tempfile.mkdtemp(prefix="dyno-shot-")
    from widgets.main import create_app

    app = create_app()
    from widgets.main_window import MainWindow

    w = MainWindow(restore=False)
    w.resize(1600, 1000)
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

    try:
        if a.tune:
            return _tune(w, a.out, pump)
        if not pump(30, lambda: w.plan is not None and w.act_launch.isEnabled()):
            print(f"screenshot: Launch is not enabled: {w.act_launch.toolTip()}", file=sys.stderr)
            return 1
        w.launch()
        if not pump(120, lambda: w.controller.state in ("ready", "failed")) or w.controller.state != "ready":
            print("screenshot: the sim did not become ready:\n" + w.log_pane.text()[-2000:], file=sys.stderr)
            return 1
        if a.verdict:  # the default ramp, as a new user runs it: the answer is the first thing shown
            w.run_ramp()
            pump(900, lambda: w.controller.ramp_spec is not None and not w.controller.ramp_running)
            pump(1.0)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            w.grab().save(a.out)
            print(f"saved {a.out}: {w.results.verdict.text()}")
            return 0
        # the demo profile's TTFT SLO (2 s for 512-token prompts) stops the ramp early on this
        # rig; without it the picture shows the later levels and the flattening
        w.ramp.slo_ttft.setValue(0)
        w.run_ramp()
        want = a.at_level - 1
        pump(600, lambda: w.controller.ramp_spec is not None and len(w.results.steps) >= want
             or not w.controller.ramp_running)
        pump(0.6 * (w.ramp.step.value() + w.ramp.warmup.value()) / a.time_scale)
        w.tabs.setCurrentWidget(w.dashboard)
        w.dashboard.refresh(force=True)
        pump(0.5)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        w.grab().save(a.out)
        print(f"saved {a.out}")
        if a.curves:
            pump(900, lambda: not w.controller.ramp_running)
            w.tabs.setCurrentWidget(w.curves)
            pump(0.5)
            w.grab().save(a.curves)
            print(f"saved {a.curves}")
        return 0
    finally:
        left = w.shutdown()
        w.close()
        if left:
            print(f"screenshot: processes left: {left}", file=sys.stderr)


def _tune(w, out: str, pump) -> int:
    """The Tune tab after a short tune of the demo profile (narrowed as a user would)."""
    pump(30, lambda: w.plan is not None)
    t = w.tune
    w.tabs.setCurrentWidget(t)
    t.plan_space()
    if not pump(120, lambda: bool(t.boxes)):
        print(f"screenshot: the space was not planned: {t.space_summary.text()}", file=sys.stderr)
        return 1
    keep = {"tensor_parallel_size": {2, 4}, "kv_cache_dtype": {"auto"}, "cuda_graphs": {True},
            "max_num_batched_tokens": {2048}}
    for dim, values in keep.items():
        for cb, v in t.boxes.get(dim, []):
            if cb.isEnabled():
                cb.setChecked(v.value in values)
    t.max_launches.setValue(3)
    if not t.start():
        print(f"screenshot: the tune did not start: {t.phase.text()}", file=sys.stderr)
        return 1
    pump(1200, lambda: not t.running)
    pump(1.0)
    if t.result is None:
        print(f"screenshot: the tune did not finish: {t.phase.text()}", file=sys.stderr)
        return 1
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    w.grab().save(out)
    print(f"saved {out}: {(t.result.get('recommendation') or {}).get('sentence')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
