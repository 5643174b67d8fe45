"""The Ramp form's Multi-turn and Shared prefix fields and the Results table's per-turn
TTFT column (issue 20, items 2 and 3; pytest-qt, offscreen, real widgets)."""
from __future__ import annotations

import os
import time

import pytest

from app.loadgen.stats import StepStats, TurnStats
from widgets.ramp_panel import RampPanel
from widgets.results import COLUMNS, TURNS_COLUMN, ResultsTable


def test_the_ramp_form_builds_both_workloads_and_keeps_them_in_the_profile(qtbot):
    p = RampPanel(time.monotonic)
    qtbot.addWidget(p)
    p.levels.setText("1,2,4")
    spec = p.build_spec("http://127.0.0.1:8000", None)
    assert spec.multi_turn is None and spec.shared_prefix is None  # empty fields: off
    p.multi_turn.setText("4:2")
    p.shared_prefix.setText("1024:0.5:4")
    spec = p.build_spec("http://127.0.0.1:8000", None)
    assert (spec.multi_turn.turns, spec.multi_turn.think_s) == (4, 2)
    assert (spec.shared_prefix.tokens, spec.shared_prefix.fraction, spec.shared_prefix.count) == (1024, 0.5, 4)
    d = p.to_profile()
    q = RampPanel(time.monotonic)
    qtbot.addWidget(q)
    q.set_from_profile(d)
    assert (q.multi_turn.text(), q.shared_prefix.text()) == ("4:2", "1024:0.5:4")
    p.multi_turn.setText("4:x")
    with pytest.raises(ValueError, match="TURNS\\[:THINK_S\\]"):
        p.build_spec("http://127.0.0.1:8000", None)
    assert p.plan_ramp() is None  # the plan waits for a valid form
    # … and the form says why under itself, naming the field and its form
    assert not p.form_error.isHidden() and "TURNS[:THINK_S]" in p.form_error.text()
    p.multi_turn.setText("4:2")
    assert p.form_error.isHidden()
    p.set_mode("rate")  # conversations need closed-loop users
    assert not p.form_error.isHidden() and "multi_turn" in p.form_error.text(), p.form_error.text()
    p.set_mode("concurrency")
    assert p.form_error.isHidden()
    if os.environ.get("DYNO_SHOTS"):
        p.multi_turn.setText("4:2")
        p.resize(460, 760)
        p.grab().save(os.path.join(os.environ["DYNO_SHOTS"], "ramp-form.png"))


def _step(idx: int, level: float, turns: list[TurnStats]) -> StepStats:
    return StepStats(idx=idx, level=level, t_start=0, t_end=10, window_start=0, window_end=10, window_s=10,
                     n_measured=30, n_ok=30, output_tps=100, ttft_p50=0.1, ttft_p99=0.2, turns=turns)


def test_results_show_ttft_p50_per_turn_with_the_figures_in_the_tooltip(qtbot):
    t = ResultsTable()
    qtbot.addWidget(t)
    t.add_step(_step(0, 2, [TurnStats(turn=1, n=11, ttft_p50=0.066, ttft_p99=0.08),
                            TurnStats(turn=2, n=10, ttft_p50=0.101, ttft_p99=0.15),
                            TurnStats(turn=3, n=10, ttft_p50=0.106, ttft_p99=0.2)]))
    t.add_step(_step(1, 4, []))
    assert COLUMNS[TURNS_COLUMN][0] == "TTFT p50 by turn ms"
    assert t.table.item(0, TURNS_COLUMN).text() == "66 · 101 · 106"
    assert "turn 2 101/150 ms (n 10)" in t.table.item(0, TURNS_COLUMN).toolTip()
    assert t.table.item(1, TURNS_COLUMN).text() == "–"  # a level without conversations
    assert "TTFT p50 by turn ms" in t.to_tsv().splitlines()[0]
    if os.environ.get("DYNO_SHOTS"):
        t.resize(1500, 200)
        t.table.horizontalScrollBar().setValue(t.table.horizontalScrollBar().maximum())
        t.grab().save(os.path.join(os.environ["DYNO_SHOTS"], "results-turns.png"))


def test_the_results_columns_are_the_declared_figures_and_a_new_one_shows(qtbot, monkeypatch):
    """The Results tab's columns are app.metrics' view RESULTS, nothing else; a figure declared
    there (a dummy) becomes a column with no other change (issue 33, item 3)."""
    from app import metrics
    from widgets.results import heading

    t = ResultsTable()
    qtbot.addWidget(t)
    assert t.headers == [heading(m) for m in metrics.in_view(metrics.RESULTS)], "view results"
    dummy = metrics.Metric("ttft_p75", "TTFT p75", "ms", 1000.0, "{:,.1f}", frozenset({metrics.RESULTS}),
                           field=False)
    monkeypatch.setattr(metrics, "LEVEL_METRICS", metrics.LEVEL_METRICS + (dummy,))
    t = ResultsTable()
    qtbot.addWidget(t)
    st = _step(0, 2, [])
    object.__setattr__(st, "ttft_p75", 0.0377)  # pydantic: extra attribute set for the dummy
    t.add_step(st)
    col = t.headers.index("TTFT p75 ms")
    assert t.table.item(0, col).text() == "37.7"


def test_the_ramp_forms_workload_rows_are_the_kinds_and_a_new_kind_shows(qtbot, monkeypatch):
    """Every kind's form rows (app.loadgen.workload.form_rows) are rows of the Ramp form,
    and a new kind's row appears with nothing but its declaration (the dummy kind of
    tests/unit/test_workload_kinds.py); the rows' values are the kind's fields."""
    from app.loadgen import workload as wl
    from tests.unit.test_workload_kinds import Dummy

    p = RampPanel(time.monotonic)
    qtbot.addWidget(p)
    shown = set(p.workload.widgets) | set(p.arrivals.widgets)
    assert {r.field for r in wl.form_rows()} == shown
    monkeypatch.setattr(wl, "KINDS", wl.KINDS + (Dummy,))
    q = RampPanel(time.monotonic)
    qtbot.addWidget(q)
    q.workload.widgets["think_tokens"].setText("300")
    assert q.workload.labels["think_tokens"].text() == "Think tokens"
    assert q.workload.values()["think_tokens"] == 300
