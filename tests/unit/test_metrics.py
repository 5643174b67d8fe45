"""The per-level metric vocabulary (app/metrics.py, issue 33 item 3): every StepStats
field is declared once, and every view — the CLI table, both level CSVs, the HTML
report's table, the store's columns (and, in tests/integration/test_gui_workloads.py,
the Results tab) — is generated from the declarations: a forgotten figure or a view's
own column fails here, naming the view."""
from __future__ import annotations

import csv
import dataclasses
import io
import re
import sqlite3

import pytest

from app import metrics
from app.cli.common import level_table
from app.loadgen.stats import StepStats
from app.metrics import BY_NAME, CLI, CSV, LEVEL_METRICS, REPORT, STORE, VIEWS, Metric


def _level(**kw) -> StepStats:
    base = dict(idx=0, level=4, t_start=0.0, t_end=10.0, window_start=1.0, window_end=10.0, window_s=9.0,
                n_measured=120, n_ok=120, output_tps=1234.5, total_tps=2345.6, rps=3.2, goodput_rps=3.0,
                ttft_p50=0.0123, ttft_p90=0.03, ttft_p99=0.0456, tpot_p50=0.01, tpot_p99=0.02, itl_p50=0.011,
                itl_p99=0.025, e2e_p50=1.2, e2e_p99=1.5)
    return StepStats(**{**base, **kw})


def _report_headings(levels: list[dict], tmp_path) -> list[str]:
    from app.report import run_report
    from app.store import RunStore

    store = RunStore(tmp_path / "runs.db")
    rid = store.create_run("r", "sim", spec={"slo": {"ttft_p99": 1.0}})
    for d in levels:
        store.add_level(rid, d)
    store.finish_run(rid, "done")
    page = run_report(store, rid)
    store.close()
    table = page[page.index('<table id="levels">'):]
    return re.findall(r"<th>([^<]*)</th>", table[:table.index("</tr>")])


def _cli_leftover(head: str, levels: list[dict]) -> str:
    """The CLI table's header less the headings of the declared CLI figures (each must be there)."""
    for m in metrics.table_columns(CLI, levels):
        assert m.cli_heading in head, f"view cli lacks {m.name}"
        head = head.replace(m.cli_heading, "", 1)
    return head.strip()


def test_every_step_stats_field_is_declared_once():
    names = [m.name for m in LEVEL_METRICS]
    assert len(names) == len(set(names)), "a figure declared twice in app/metrics.py"
    fields = set(StepStats.model_fields)
    missing = sorted(fields - set(names))
    assert not missing, f"StepStats fields not declared in app.metrics.LEVEL_METRICS: {missing}"
    stale = sorted(m.name for m in LEVEL_METRICS if m.field and m.name not in fields)
    assert not stale, f"declared as StepStats fields but StepStats has none such: {stale}"
    for m in LEVEL_METRICS:
        assert set(m.views) <= set(VIEWS), (m.name, m.views)


def test_each_view_shows_exactly_its_declared_figures(tmp_path):
    lv = _level(slo_broken=["ttft_p99 0.0456 > 0.01"])
    d = lv.model_dump(mode="json")
    # CSV: ramp --csv and runs export --csv, one shape
    from app.history import LEVEL_COLUMNS, levels_csv
    from app.loadgen.export import STEP_COLUMNS, steps_csv
    want = [m.name for m in metrics.in_view(CSV)]
    assert STEP_COLUMNS == LEVEL_COLUMNS == want
    assert next(csv.reader(io.StringIO(steps_csv([lv])))) == want, "view csv (ramp --csv)"
    # the CLI table: every heading is a declared CLI figure's, nothing else
    leftover = _cli_leftover(level_table([d]).splitlines()[0], [d])
    assert not leftover, f"view cli has a column not in app.metrics: {leftover!r}"
    # the HTML report's per-level table
    assert _report_headings([d], tmp_path) == [m.heading for m in metrics.table_columns(REPORT, [d])], "view report"
    # the store's columns
    from app.store import RunStore
    RunStore(tmp_path / "s.db").close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        cols = [r[1] for r in db.execute("PRAGMA table_info(levels)")]
    assert set(cols) - {"run_id", "stats"} == {m.name for m in metrics.in_view(STORE)}, "view store"
    # levels_csv of a stored run is ramp --csv's, value for value
    store = RunStore(tmp_path / "s.db")
    rid = store.create_run("r", "sim")
    store.add_level(rid, lv)
    assert levels_csv(store, rid) == steps_csv([lv])
    store.close()


def test_the_store_adds_a_declared_column_an_older_file_lacks(tmp_path):
    """A store made before ttft_p90 was a column (layout v4 as it was) gains it on open, keeps its rows."""
    from app.store import RunStore, SCHEMA_VERSION
    path = tmp_path / "old.db"
    RunStore(path).close()
    with sqlite3.connect(path) as db:  # the v4 layout, less the column declared since
        db.execute("ALTER TABLE levels DROP COLUMN ttft_p90")
    store = RunStore(path)
    rid = store.create_run("r", "sim")
    store.add_level(rid, _level())
    assert store.levels(rid)[0]["ttft_p90"] == 0.03
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT ttft_p90 FROM levels").fetchone()[0] == 0.03
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # not a new layout


def test_a_new_metric_needs_only_its_declaration(tmp_path, monkeypatch):
    """A dummy figure declared once reaches every view it names: the CLI table, the CSVs, the
    HTML report and the store (the Results tab: tests/integration/test_gui_workloads.py)."""
    dummy = Metric("ttft_p75", "TTFT p75", "ms", 1000.0, "{:,.1f}", frozenset({CLI, CSV, REPORT, STORE}),
                   field=False)
    monkeypatch.setattr(metrics, "LEVEL_METRICS", LEVEL_METRICS + (dummy,))
    monkeypatch.setattr(metrics, "BY_NAME", {**BY_NAME, dummy.name: dummy})
    d = {**_level().model_dump(mode="json"), "ttft_p75": 0.0377}
    assert "TTFT p75" in level_table([d]).splitlines()[0] and "37.7" in level_table([d]).splitlines()[1]
    rows = list(csv.DictReader(io.StringIO(metrics.levels_csv([d]))))
    assert rows[0]["ttft_p75"] == "0.0377"
    assert "TTFT p75 ms" in _report_headings([d], tmp_path)
    with sqlite3.connect(tmp_path / "runs.db") as db:
        assert db.execute("SELECT ttft_p75 FROM levels").fetchone()[0] == 0.0377


def test_a_views_own_column_is_caught(monkeypatch):
    """A column the CLI table adds by hand, outside the vocabulary, is what the coverage check reports."""
    import app.cli.common as common
    real = common.level_table
    monkeypatch.setattr(common, "level_table", lambda levels, **kw: real(levels, **kw).replace("reqs", "reqs secret", 1))
    head = common.level_table([_level().model_dump(mode="json")]).splitlines()[0]
    assert _cli_leftover(head, [_level().model_dump(mode="json")]) == "secret"


def test_cells_format_scale_and_missing():
    m = BY_NAME["ttft_p99"]
    assert m.heading == "TTFT p99 ms" and m.cell({"ttft_p99": 0.0456}) == "45.6" and m.cell({}) == metrics.NONE_TEXT
    assert BY_NAME["failure_rate"].cell({"failure_rate": 0.125}) == "12.5 %"
    assert BY_NAME["output_tps"].heading == "out tok/s"
    assert BY_NAME["slo_broken"].cell({"slo_broken": ["a", "b"]}) == "broken: a; b"
    assert BY_NAME["failures"].csv_value({"failures": {"timeout": 2, "http_500": 1}}) == "http_500=1;timeout=2"
    assert dataclasses.replace(m, fmt="{:d}").format(3.0) == "3"


@pytest.mark.parametrize("mode", ["concurrency", "rate"])
def test_open_loop_figures_only_in_a_rate_tables(mode):
    cols = {m.name for m in metrics.table_columns(CLI, [{"mode": mode}])}
    assert ("achieved_rps" in cols) == (mode == "rate")


def test_ttfa_is_a_column_of_the_cli_and_the_report_only_for_a_reasoning_run(tmp_path):
    """Issue 38, item 2: a reasoning model's time to the first answer token reaches the CLI
    table (with its line in the legend) and the report; a run without one keeps them narrow."""
    plain = _level().model_dump(mode="json")
    thinking = _level(ttfa_p50=0.35, ttfa_p99=0.8123, reasoning_tokens_mean=120.0).model_dump(mode="json")
    table = level_table([plain, thinking])
    head, row = table.splitlines()[0], table.splitlines()[2]
    assert "TTFA p99" in head and "812.3" in row and "TTFA p99: time to the first answer token" in table
    assert "TTFA" not in level_table([plain])
    assert "TTFA p99 ms" in _report_headings([plain, thinking], tmp_path)
    assert "TTFA p99 ms" not in _report_headings([plain], tmp_path)
