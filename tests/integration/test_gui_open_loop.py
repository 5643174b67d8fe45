"""Open-loop traffic on the Ramp tab (issue 20, item 5): the Traffic choice, req/s
levels, burstiness, the cap, the rate search and the profile round trip. The rate ramp
run through the window against the sim is in tests/integration/test_gui_session.py. pytest-qt,
offscreen."""
from __future__ import annotations

from app.loadgen.spec import RampSpec
from tests.plugins.qt import pump


def test_ramp_tab_rate_mode_builds_and_round_trips(main_window, qtbot):
    """Open loop on the form: req/s levels, burstiness, the cap; the search's words; and
    the profile round trip (to_profile → set_from_profile) keeps every rate field."""
    rp = main_window.ramp
    assert rp.mode == "concurrency" and not rp.burstiness.isVisibleTo(rp)
    rp.find.setChecked(False)  # fixed rates (the demo's SLO makes Run ramp a capacity search)
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
    w = main_window  # the form's edits re-plan: let the last plan finish before the window closes
    pump(qtbot, lambda: not w.planner.busy and not w.planner._timer.isActive(), 30, "the plan settles")
