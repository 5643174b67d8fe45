"""The Results tab's client-vs-server table (issue 20, item 6): a real ResultsTable, its
rows from levels with server figures (written by prometheus_client with vLLM's names,
see tests/unit/test_server_stats.py), the gap in words under it, and the one-off notes (no
/metrics; a prefix cache that was not reset)."""
from __future__ import annotations

import html

from app.loadgen.server_stats import SERVER_COLUMNS, server_window
from app.loadgen.stats import StepStats
from tests.unit.test_server_stats import VllmExposition
from widgets.results import ResultsTable


def _level(idx: int, level: float, server: bool = True, **kw) -> StepStats:
    sv = None
    if server:
        x = VllmExposition()
        before = x.snap()
        x.prefix(1000, 900)
        for _ in range(20):
            x.ttft.observe(0.15)
            x.queue.observe(0.12)
            x.itl.observe(0.03)
        x.gen.inc(640)
        sv = server_window(before, x.snap(), scrape_start=1, scrape_end=11)
        sv.client_output_tokens, sv.client_prompt_tokens = 640, 0
    return StepStats(idx=idx, level=level, t_start=0, t_end=12, window_start=1, window_end=11, window_s=10,
                     n_measured=20, n_ok=20, ttft_p50=0.162, ttft_p99=0.2, ttft_mean=0.165, itl_p50=0.03,
                     itl_mean=0.03, server=sv, **kw)


def test_results_show_client_vs_server_per_level(qtbot):
    w = ResultsTable()
    qtbot.addWidget(w)
    w.resize(1400, 700)
    w.show()
    assert w.server_table.isHidden()
    w.add_step(_level(0, 2))
    w.add_step(_level(1, 4))
    t = w.server_table
    assert not t.isHidden() and t.rowCount() == 2 and t.columnCount() == len(SERVER_COLUMNS)
    headers = [t.horizontalHeaderItem(c).text() for c in range(t.columnCount())]
    cell = {h: t.item(1, c).text() for c, h in enumerate(headers)}
    assert cell["Level"] == "4" and cell["Prefix hit"] == "90%" and cell["Cache reset"] == "no"
    assert cell["TTFT p50 ms c/s"].startswith("162 / ") and cell["TTFT p50 ms c/s"].endswith("‡")
    assert cell["Out tok c/s"] == "640 / 640"
    notes = html.unescape(w.server_notes.text())
    assert "Level 4" in notes and "TTFT: the client's mean exceeds the server's by 15 ms" in notes
    assert "not reset" in notes  # prefix caching counted, and the server offered no reset
    assert "TTFT:" in t.item(0, 0).toolTip()
    t.selectRow(0)
    assert "Level 2" in w.server_notes.text()
    w.clear()
    assert w.server_table.isHidden() and w.server_notes.isHidden() and w.server_label.isHidden()


def test_results_say_once_that_the_server_has_no_metrics(qtbot):
    """Said once, with the reason; a stored run from before server figures says nothing."""
    w = ResultsTable()
    qtbot.addWidget(w)
    w.show()
    w.add_step(_level(0, 1, server=False, server_problem="GET /metrics: HTTP 404"))
    assert w.server_table.isHidden()
    assert "/metrics did not answer (GET /metrics: HTTP 404" in w.server_notes.text()
    w.clear()
    w.add_step(_level(0, 1, server=False))  # a run recorded before levels had server figures: nothing to say
    assert w.server_table.isHidden() and w.server_notes.isHidden() and w.server_label.isHidden()
