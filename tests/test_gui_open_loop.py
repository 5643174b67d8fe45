"""Open-loop traffic in the window (issue 20, item 5): the Ramp tab's Traffic set to
request rate, a short rate ramp against the simulated rig through the window, and the
Results table showing each level's offered vs achieved rate. pytest-qt, offscreen.

The sim runs 10× faster than the wall clock; the form and the results are in rig
seconds (a rate of 2 req/s is 20 requests per wall second).
"""
from __future__ import annotations

import os

from app.loadgen.spec import RampSpec
from widgets.testing import gui_guard, main_window, pump  # noqa: F401  (fixtures)
from tests.test_gui_session import _launch_ready, _stop, sim_window  # noqa: F401  (fixture)


def _shot(widget, name: str, tmp_path) -> None:
    """Save ``widget`` as a PNG under ``DYNO_SHOT_DIR`` (or the test's tmp_path), to look at."""
    out = os.environ.get("DYNO_SHOT_DIR") or str(tmp_path)
    os.makedirs(out, exist_ok=True)
    assert widget.grab().save(os.path.join(out, name))


def test_ramp_tab_rate_mode_builds_and_round_trips(main_window, qtbot):
    """Open loop on the form: req/s levels, burstiness, the cap; the search's words; and
    the profile round trip (to_profile → set_from_profile) keeps every rate field."""
    rp = main_window.ramp
    assert rp.mode == "concurrency" and not rp.burstiness.isVisibleTo(rp)
    rp.set_mode("rate")
    assert rp.levels_label.text() == "Levels (req/s)" and rp.burstiness.isVisibleTo(rp)
    assert "max rate" in rp.find.text()
    rp.levels.setText("0.5,1,2")
    rp.burstiness.setValue(0.5)
    rp.max_conc.setValue(16)
    spec = rp.build_spec("http://127.0.0.1:1", None)
    assert (spec.mode, spec.levels, spec.burstiness, spec.max_concurrency) == ("rate", [0.5, 1, 2], 0.5, 16)
    rp.levels.setText("2.5")  # one rate that is not a whole number: one level, not 1, 2 … 2.5
    assert rp.build_spec("http://127.0.0.1:1", None).levels == [2.5]
    rp.levels.setText("8")
    assert rp.build_spec("http://127.0.0.1:1", None).levels == [1, 2, 4, 8]
    d = rp.to_profile()
    assert RampSpec(**d).burstiness == 0.5
    rp.set_mode("concurrency")
    rp.burstiness.setValue(1)
    rp.max_conc.setValue(0)
    rp.set_from_profile(d)
    assert (rp.mode, rp.burstiness.value(), rp.max_conc.value(), rp.levels.text()) == ("rate", 0.5, 16, "8")
    # the capacity search in rate mode: a fractional maximum rate stands
    rp.levels.setText("6.5,")
    rp.slo_ttft.setValue(2000)
    rp.find.setChecked(True)
    s = rp.build_spec("http://127.0.0.1:1", None)
    assert s.mode == "rate" and s.search is not None and s.search.max_level == 6.5


def test_rate_ramp_through_the_window_shows_offered_vs_achieved(sim_window, qtbot, tmp_path):
    w = sim_window
    w.left_tabs.setCurrentWidget(w.ramp)
    _launch_ready(w, qtbot)
    rp = w.ramp
    rp.set_mode("rate")
    rp.levels.setText("1,2")
    rp.step.setValue(30)
    rp.warmup.setValue(2)
    rp.output.setText("64")
    rp.slo_ttft.setValue(0)
    rp.slo_tpot.setValue(0)
    rp.burstiness.setValue(1.0)
    w.left_tabs.setCurrentWidget(rp)
    _shot(w, "ramp-tab-rate.png", tmp_path)
    w.act_ramp.trigger()
    pump(qtbot, lambda: w.controller.ramp_running, 10, "the ramp starts")
    pump(qtbot, lambda: len(w.results.steps) >= 1 or not w.controller.ramp_running, 60, "the first level ends")
    assert "req/s" in w.run_label.text() or not w.controller.ramp_running, w.run_label.text()
    pump(qtbot, lambda: not w.controller.ramp_running, 90, "the ramp ends")
    assert "ramp: done" in w.run_label.text(), w.run_label.text()
    steps = w.results.steps
    assert [s.level for s in steps] == [1, 2] and all(s.mode == "rate" for s in steps)
    for s in steps:  # rig req/s: the offered rate is the level, the achieved one near it (Poisson, ~30–60 arrivals)
        assert s.offered_rps == s.level and abs(s.achieved_rps - s.offered_rps) <= 0.35 * s.offered_rps, s
        assert s.n_delayed == 0 and s.n_held == 0
    tsv = w.results.to_tsv().splitlines()
    head = tsv[0].split("\t")
    assert head[:3] == ["Level (offered)", "Sent req/s", "Cap delayed / held"], head
    rows = [r.split("\t") for r in tsv[1:]]
    assert [r[0] for r in rows] == ["1 req/s", "2 req/s"]
    assert [float(r[1].split()[0]) for r in rows] == [round(s.achieved_rps, 2) for s in steps]
    # the Curves tab plots against the offered rate, without the plan's closed-loop curve
    assert w.curves.tput_plot.getAxis("bottom").labelText == "offered request rate (req/s)"
    assert not w.curves.pred_tput.isVisible()
    assert w.dashboard.plots["throughput"].getAxis("right").labelText == "offered req/s"
    w.tabs.setCurrentWidget(w.results)
    _shot(w, "results-rate.png", tmp_path)
    w.tabs.setCurrentWidget(w.curves)
    _shot(w, "curves-rate.png", tmp_path)
    _stop(w, qtbot)
