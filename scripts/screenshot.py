"""Take the README screenshot: the main window mid-ramp against the simulated 8× RTX 4090.

Usage: ``python scripts/screenshot.py [OUT.png] [--curves CURVES.png] [--time-scale K]``
(default ``resources/screenshots/main-window.png``). Runs offscreen with a throw-away
data directory; launches the sim through the window, runs the demo profile's ramp and
grabs the Live tab while the ramp is in its later levels; stops everything after.
``--verdict``: run the demo profile's own ramp to its end instead and grab the Results
tab, whose first line is the verdict (``resources/screenshots/verdict.png``).
``--tune``: instead, a short tune of the demo profile on the Tune tab (TP 8/4/2, kv
auto, CUDA graphs, max_num_batched_tokens 2048, ``--launches`` launches) and grab the
tab when it is done (``resources/screenshots/tune.png``).
``--hosts``: instead, the demo profile launched as a rig of two local agents
(``localhost`` and ``127.0.0.1``), the second agent then killed, and the Live tab's Hosts
view grabbed (``resources/screenshots/hosts.png``).
``--rig-plan``: instead, Launch of the demo profile over two remote hosts (TP 4 × PP 2,
one stage per host) and the launch plan the window shows before anything starts
grabbed, then cancelled (``resources/screenshots/rig-plan.png``).
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
    ap.add_argument("--tune", action="store_true", help="instead: a short tune on the Tune tab, grabbed at its end")
    ap.add_argument("--launching", action="store_true",
                    help="instead: launch the sim, stop it, launch it again and grab the window while the second "
                         "launch loads (the status bar's phase and time left)")
    ap.add_argument("--hosts", action="store_true",
                    help="instead: the demo profile over two local agents, the second then killed; grab the Hosts view")
    ap.add_argument("--rig-plan", action="store_true",
                    help="instead: Launch over two remote hosts; grab the launch plan dialog, then cancel it")
    ap.add_argument("--launches", type=int, default=3, help="the tune's max launches (--tune)")
    ap.add_argument("--verify", metavar="PNG",
                    help="with --tune: then press Verify (find capacity) and grab the window here when its search "
                         "ends (the recommendation launched, its capacity searched from the tune's users)")
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
        if not pump(30, lambda: w.plan is not None and w.act_launch.isEnabled()):
            print(f"screenshot: Launch is not enabled: {w.act_launch.toolTip()}", file=sys.stderr)
            return 1
        if a.tune:
            return tune_shot(w, a, pump)
        if a.launching:
            return launching_shot(w, a, pump)
        if a.hosts:
            return hosts_shot(w, a, pump)
        if a.rig_plan:
            return rig_plan_shot(w, a, pump)
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


def hosts_shot(w, a, pump) -> int:
    """The demo profile as a rig of two local agents (two labels of this machine), the
    second agent SIGKILLed once the rig is ready: the Hosts view shows the loss."""
    import signal

    from app.hosts.spec import hosts_from

    from widgets import profiles

    p = w.current_profile
    # one pipeline stage per host: TP 4 × PP 2 over the sim's 8 cards (app.hosts.plan.mp_plan)
    p = p.updated(hosts=hosts_from([{"ssh": "localhost"}, {"ssh": "127.0.0.1"}]),
                  server={**p.server, "tensor_parallel_size": 4, "pipeline_parallel_size": 2})
    profiles.apply_to_form(p, w.config, w.ramp)
    w.current_profile = p
    pump(1.0)
    w._run_dialog = lambda dlg: (dlg.launch_button.click(), dlg.result())[1]  # the plan: launch it
    w.launch()
    if not pump(180, lambda: w.controller.state in ("ready", "failed")) or w.controller.state != "ready":
        print("screenshot: the rig did not become ready: " + w.controller.core.failure_text + "\n"
              + w.log_pane.text()[-3000:], file=sys.stderr)
        return 1
    w.tabs.setCurrentWidget(w.dashboard)
    pump(3.0)
    os.kill(w.controller.core.rig.links[1].agent_pid, signal.SIGKILL)
    pump(30, lambda: w.hosts_view.rows and w.hosts_view.rows[1]["state"] == "lost")
    pump(3.0)
    w.tabs.setCurrentWidget(w.dashboard)  # the failure showed the Log tab
    w.dashboard.refresh(force=True)
    pump(1.0)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    w.grab().save(a.out)
    print(f"saved {a.out}: " + "; ".join(f"{r['host']} {r['state']} {r['reason']}" for r in w.hosts_view.rows))
    return 0


def rig_plan_shot(w, a, pump) -> int:
    """The launch plan dialog of the demo profile over two remote hosts (one pipeline
    stage each), as Launch shows it before anything starts; cancelled after the grab."""
    from PySide6.QtWidgets import QDialogButtonBox

    from app.hosts.spec import hosts_from

    from widgets import profiles

    p = w.current_profile
    p = p.updated(hosts=hosts_from([{"ssh": "dyno@10.0.0.11", "gpus": 4, "link": "ib-hdr200"},
                                    {"ssh": "dyno@10.0.0.12", "gpus": 4, "link": "ib-hdr200"}]),
                  server={**p.server, "tensor_parallel_size": 4, "pipeline_parallel_size": 2})
    profiles.apply_to_form(p, w.config, w.ramp)
    w.current_profile = p
    pump(2.0)
    shot = []

    def grab(dlg) -> int:
        dlg.show()
        pump(1.0)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        dlg.grab().save(a.out)
        shot.append(dlg.commands.toPlainText())
        dlg.buttons.button(QDialogButtonBox.Cancel).click()
        return dlg.result()

    w._run_dialog = grab
    w.launch()
    if not shot:
        print(f"screenshot: no launch plan was shown: {w.statusBar().currentMessage()}", file=sys.stderr)
        return 1
    print(f"saved {a.out}:\n{shot[0]}")
    return 0


def launching_shot(w, a, pump) -> int:
    """The second launch of the demo profile, grabbed while it loads its weights."""
    w.launch()
    if not pump(120, lambda: w.controller.state == "ready"):
        print("screenshot: the sim did not become ready:\n" + w.log_pane.text()[-2000:], file=sys.stderr)
        return 1
    w.stop()
    pump(60, lambda: w.controller.state == "stopped" and w.controller.supervisor is None)
    w.launch()
    pump(60, lambda: "left" in w.launch_label.text() and w.launch_label.isVisible()
         and "loading weights" in w.launch_label.text())
    pump(1.2)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    w.grab().save(a.out)
    print(f"saved {a.out}: {w.launch_label.text()}")
    return 0


def tune_shot(w, a, pump) -> int:
    """The Tune tab after a short tune of the demo profile (the space narrowed as a user
    would, the pruned values still shown with the planner's reasons)."""
    t = w.tune
    w.tabs.setCurrentWidget(t)
    # predicting the whole space on the step-level engine takes a minute or more on a busy machine
    if not pump(600, lambda: t.res is not None and not t.res.get("recommendation") and t.table.rowCount() > 0):
        print("screenshot: the space was not predicted: " + t.space_status.text(), file=sys.stderr)
        return 1
    keep = {"tensor_parallel_size": [8, 4, 2], "kv_cache_dtype": ["auto"], "enforce_eager": [False],
            "max_num_batched_tokens": [2048]}
    for field, values in keep.items():
        for v, box in t.boxes[field].items():
            if box.isEnabled():
                box.setChecked(v in values)
    t.max_launches.setValue(a.launches)
    t.start_tune()
    pump(1.0)
    pump(1200, lambda: not t.running)
    pump(1.0)
    if not (t.res or {}).get("recommendation"):
        print("screenshot: the tune recommended nothing: " + t.progress.text(), file=sys.stderr)
        return 1
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    w.grab().save(a.out)
    print(f"saved {a.out}: {t.sentence.text()}")
    if a.verify:
        rec = t.res["recommendation"]
        t.verify_btn.click()
        if not pump(300, lambda: w.controller.state == "ready"):
            print(f"screenshot: the recommendation did not start: {w.controller.state}", file=sys.stderr)
            return 1
        pump(2.0)
        pump(1200, lambda: not w.controller.ramp_running)
        pump(2.0)
        w.grab().save(a.verify)
        print(f"saved {a.verify}: tune {rec['users']:g} users ({rec['users_low']:g}–{rec['users_high']:g}); "
              f"verify: {w.results.verdict.text() if hasattr(w.results, 'verdict') else ''}")
        w.stop()
        pump(30, lambda: not w.controller.server_running)
    return 0


if __name__ == "__main__":
    sys.exit(main())
