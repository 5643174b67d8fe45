"""Compare and History views on a real SQLite run store holding two recorded runs
(4 and 8 cards; levels and power samples written as a session writes them) — the
figures the views show are app.comparison's. pytest-qt, offscreen."""
from __future__ import annotations

import csv
import io

import pytest

from app.store import RunStore
from tests.plugins.qt import pump


def _run(store: RunStore, name: str, gpus: int, tps: dict[int, float], watts: float) -> int:
    rid = store.create_run(name, "vllm", config={"profile": {"name": name}}, clock_wall0=0.0)
    for i, (lvl, t) in enumerate(sorted(tps.items())):
        w0, w1 = 10.0 * i, 10.0 * i + 8
        store.add_level(rid, {"idx": i, "level": lvl, "t_start": w0, "t_end": w1 + 1, "window_start": w0,
                              "window_end": w1, "window_s": 8.0, "n_measured": 20, "n_ok": 20, "output_tps": t,
                              "ttft_p99": 0.1 * lvl, "tpot_p99": 0.02, "failure_rate": 0.0})
        store.add_samples(rid, [(w0 + k, f"gpu{g}", "power_w", watts) for g in range(gpus) for k in range(8)])
    store.finish_run(rid, "done", summary={"gpu_count": gpus, "peak_output_tps": max(tps.values()),
                                           "peak_level": max(tps)})
    return rid


@pytest.fixture
def store(tmp_path):
    with RunStore(tmp_path / "runs.sqlite") as s:
        yield s


def test_compare_view_table_prices_and_exports(gui_guard, qtbot, store, tmp_path):
    from widgets.compare_view import CompareView

    r4 = _run(store, "4 cards", 4, {1: 100.0, 2: 190.0, 4: 300.0}, 300.0)
    r8 = _run(store, "8 cards", 8, {1: 120.0, 2: 230.0, 4: 480.0}, 250.0)
    v = CompareView(lambda: store)
    qtbot.addWidget(v)
    v.resize(1100, 800)
    v.show()
    pump(qtbot, lambda: v._loaded, 5, "runs listed when shown")
    assert v.runs.count() == 2 and v.comparison is None
    assert not v.png_btn.isEnabled() and "two or more" in v.message.text()
    v.set_runs([r4, r8])
    c = v.comparison
    assert c is not None and v.png_btn.isEnabled() and v.table.rowCount() == 6
    row = next(r for r in c.rows if r.run_id == r8 and r.level == 4)
    assert row.scaling_efficiency == pytest.approx((480 / 300) / 2)
    assert row.tps_per_gpu == pytest.approx(60.0)
    assert row.power_w == pytest.approx(8 * 250.0) and row.j_per_token == pytest.approx(2000 / 480)
    assert row.cost_per_mtok_rented is None
    v.gpu_hour.setValue(2.5)
    v.kwh.setValue(0.2)
    row = next(r for r in v.comparison.rows if r.run_id == r8 and r.level == 4)
    assert row.cost_per_mtok_rented == pytest.approx(2.5 * 8 / (480 * 3600) * 1e6)
    assert row.cost_per_mtok_energy == pytest.approx(0.2 * 2.0 / (480 * 3600) * 1e6)
    heads = [v.table.horizontalHeaderItem(i).text() for i in range(v.table.columnCount())]
    i = next(k for k in range(6) if v.table.item(k, 0).text().startswith(f"#{r8}") and v.table.item(k, 2).text() == "4")
    assert v.table.item(i, heads.index("Scaling eff.")).text() == "0.80"
    assert v.table.item(i, heads.index("J/token")).text() == f"{2000 / 480:.3f}"
    assert "$2.5/GPU-hour" in v.message.text() and "4 cards" in v.message.text()
    v.currency.setText("€")
    v.currency.editingFinished.emit()
    assert "€/M tok (rented)" in [v.table.horizontalHeaderItem(k).text() for k in range(v.table.columnCount())]
    v.export_csv(tmp_path / "c.csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "c.csv").read_text())))
    assert len(rows) == 6 and float(rows[0]["tps_per_gpu"]) > 0
    v.export_png(tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 5000
    with pytest.raises(OSError, match="cannot write the PNG"):
        v.export_png(tmp_path / "no-such-dir" / "c.png")
    v.rows_mode.setCurrentIndex(1)
    assert v.table.rowCount() == 2
    v.close()


def test_history_view_lists_opens_and_deletes(gui_guard, qtbot, store, tmp_path):
    from widgets.history_view import HistoryView

    r4 = _run(store, "4 cards", 4, {1: 100.0, 2: 190.0}, 300.0)
    r8 = _run(store, "8 cards", 8, {1: 120.0, 2: 230.0}, 250.0)
    v = HistoryView(lambda: store)
    qtbot.addWidget(v)
    v.show()
    pump(qtbot, lambda: v._loaded, 5, "runs listed when shown")
    assert v.run_ids() == [r8, r4]
    heads = [v.table.horizontalHeaderItem(i).text() for i in range(v.table.columnCount())]
    assert v.table.item(0, 2).text() == "8 cards" and v.table.item(0, heads.index("Out tok/s at SLO")).text() == "230"
    assert v.table.item(0, heads.index("Users at SLO")).text() == "–"  # recorded without a verdict
    v.select_ids([r4])
    assert v.buttons["open"].isEnabled() and not v.buttons["compare"].isEnabled()
    assert not v.buttons["save_profile"].isEnabled()  # no profile library given
    v.buttons["open"].click()
    assert v.open_run["id"] == r4 and v.results.table.rowCount() == 2
    jcol = v.results.headers.index("J/token")
    assert v.results.table.item(0, jcol).text() == f"{1200 / 100:.3f}"
    v.select_ids([r4, r8])
    assert v.buttons["compare"].isEnabled()
    asked: list = []
    v.compare_requested.connect(asked.append)
    v.buttons["compare"].click()
    assert asked == [[r4, r8]]
    v.delete([r4])
    assert v.run_ids() == [r8] and v.open_run is None and v.results.table.rowCount() == 0
    v.close()


def test_compare_view_shows_what_differs_and_warns_when_runs_are_not_comparable(gui_guard, qtbot, store, tmp_path):
    """Issue 19, item 6: the diff table (model, rig, flags, request shape) and, for a tiny
    model on the CPU build beside a 70B on GPUs, "not comparable" instead of an efficiency."""
    from widgets.compare_view import CompareView

    def run(name, model, hw, server, prompt):
        rid = store.create_run(name, "vllm", config={"server": {"model": model, **server}},
                               spec={"prompt_tokens": prompt, "output_tokens": 128}, clock_wall0=0.0)
        store.add_level(rid, {"idx": 0, "level": 8, "t_start": 0.0, "t_end": 9.0, "window_start": 0.0,
                              "window_end": 8.0, "window_s": 8.0, "n_measured": 20, "n_ok": 20, "output_tps": 300.0,
                              "ttft_p99": 0.2, "tpot_p99": 0.02, "failure_rate": 0.0})
        store.finish_run(rid, "done", summary={"gpu_count": hw["count"], "hardware": hw})
        return rid

    gpu = run("70B on 8 cards", "meta-llama/Llama-3.1-70B-Instruct", {"gpu": "RTX 4090", "count": 8},
              {"tensor_parallel_size": 8}, 512)
    cpu = run("tiny on the CPU", "./build/tiny-llama", {"gpu": "CPU", "count": 1}, {"max_num_seqs": 8}, 32)
    v = CompareView(lambda: store)
    qtbot.addWidget(v)
    v.resize(1200, 900)
    v.show()
    pump(qtbot, lambda: v._loaded, 5, "runs listed when shown")
    v.set_runs([gpu, cpu])
    c = v.comparison
    assert not c.comparable and len(c.warnings) == 3, c.warnings
    text = v.message.text()
    assert "not comparable" in text and "different models" in text and "no scaling efficiency" in text
    assert all(r.scaling_efficiency is None for r in c.rows)
    cells = {(v.diff_table.item(i, 0).text(), v.diff_table.item(i, 1).text()): [
        v.diff_table.item(i, j).text() for j in range(2, v.diff_table.columnCount())]
        for i in range(v.diff_table.rowCount())}
    assert cells[("model", "model")] == ["meta-llama/Llama-3.1-70B-Instruct", "./build/tiny-llama"]
    assert cells[("rig", "cards")] == ["8× RTX 4090", "1× CPU"]
    assert cells[("flags", "tensor_parallel_size")] == ["8", "—"] and cells[("request shape", "prompt_tokens")] == [
        "512", "32"]
    qtbot.wait(100)  # the layout settles (the message grew by a line per warning)
    assert v.message.height() > 3 * v.message.fontMetrics().height()
    v.grab().save(str(tmp_path / "compare-not-comparable.png"))
