"""Issue 19, item 3: while the server comes up the status bar says the launch's phase
(from the log) and its seconds; the second launch of the same configuration also says
about how long is left. The simulated rig at 2× (its launch takes a few seconds) through
the real supervisor and a real run store."""
from __future__ import annotations

from tests.plugins.qt import pump


def _launch(w, qtbot) -> list[str]:
    seen: list[str] = []
    w.launch_timer.timeout.connect(lambda: seen.append(w.launch_label.text()) if w.launch_label.isVisible() else None)
    w.act_launch.trigger()
    pump(qtbot, lambda: w.controller.state in ("ready", "failed"), 90, "the sim becomes ready")
    assert w.controller.state == "ready", w.log_pane.text()[-2000:]
    assert not w.launch_label.isVisible() and not w.launch_timer.isActive()  # gone once ready
    w.act_stop.trigger()
    pump(qtbot, lambda: w.controller.state == "stopped" and w.controller.supervisor is None, 60, "the sim stops")
    return seen


def test_the_status_bar_shows_the_launch_phase_and_then_the_time_left(main_window, qtbot):
    w = main_window
    w.sim_time_scale = 2.0  # a launch of several seconds: the 1 s timer sees its phases
    pump(qtbot, lambda: w.plan is not None and not w.planner.busy and not w.planner._timer.isActive(), 30,
         "the demo profile is planned")
    first = _launch(w, qtbot)
    assert any("loading weights" in t or "compiling" in t or "KV cache" in t for t in first), first
    assert not any("left" in t for t in first), first  # no earlier launch of it: no guess
    second = _launch(w, qtbot)
    assert any("left (last launches:" in t for t in second), second
    assert "Phases so far" in w.launch_label.toolTip()
