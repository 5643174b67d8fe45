"""GUI runs are recorded like headless ones; the History and Compare views read them back
(pytest-qt, offscreen, against the real simulated rig via the Supervisor and a real
SQLite run store in the test's VLLM_DYNO_HOME).

The issue's "Done when", from the GUI: ramp → the run is in ``vllm-dyno runs list`` →
save it as a profile with its results → reload the profile → export it to ``vllm
serve`` → compare two runs side by side with scaling efficiency and cost per million
tokens → PNG and CSV.
"""
from __future__ import annotations

import csv
import io
import json
import os

import pytest

from app import history
from app.cli import main as cli_main
from app.profiles import ProfileLibrary
from app.server.procs import group_members
from tests.plugins.qt import pump

K = 10.0
SHOTS = os.environ.get("DYNO_SHOTS")  # a directory: save screenshots of the views there


def _shot(widget, name: str) -> None:
    if SHOTS:
        from PySide6.QtWidgets import QApplication

        QApplication.processEvents()  # pending layouts first
        widget.grab().save(os.path.join(SHOTS, name))


@pytest.fixture
def sim_window(main_window, qtbot):
    w = main_window
    w.sim_time_scale = K
    pump(qtbot, lambda: w.plan is not None and not w.planner.busy and not w.planner._timer.isActive(), 30,
         "the demo profile is planned")
    return w


def _launch(w, qtbot) -> None:
    assert w.act_launch.isEnabled(), w.act_launch.toolTip()
    w.act_launch.trigger()
    pump(qtbot, lambda: w.controller.state in ("ready", "failed"), 60, "the sim becomes ready")
    assert w.controller.state == "ready", w.log_pane.text()[-2000:]


def _ramp(w, qtbot, recorded: list[int], levels: str = "1,2,4") -> int:
    n = len(recorded)
    w.ramp.find.setChecked(False)  # the exploratory ramp of fixed levels
    w.ramp.levels.setText(levels)
    w.ramp.step.setValue(10)
    w.ramp.warmup.setValue(1)
    w.ramp.output.setText("64")
    w.ramp.slo_ttft.setValue(0)
    w.ramp.slo_tpot.setValue(0)
    w.act_ramp.trigger()
    pump(qtbot, lambda: len(recorded) > n, 90, "the ramp ends and its run is recorded")
    assert "ramp: done" in w.run_label.text(), w.run_label.text()
    return recorded[-1]


def _stop(w, qtbot) -> None:
    pgid = w.controller.supervisor.pgid
    w.act_stop.trigger()
    pump(qtbot, lambda: w.controller.state == "stopped" and w.controller.supervisor is None, 60, "the server stops")
    assert group_members(pgid) == []


def test_gui_ramp_is_recorded_like_a_headless_session(sim_window, qtbot, capsys):
    w = sim_window
    recorded: list[int] = []
    w.controller.run_recorded.connect(recorded.append)
    _launch(w, qtbot)
    rid = _ramp(w, qtbot, recorded)
    assert f"run #{rid}" in w.results.summary.text()
    store = w.run_store()
    run = history.get_run(store, rid)
    assert run["status"] == "done" and run["engine"] == "sim" and run["finished"]
    # the name says what differs from the loaded profile: the ramp's 64-token outputs (issue 19, item 6)
    assert run["name"] == f"{w.profile_name} · output_tokens 64", run["name"]
    assert run["config"]["profile"]["name"] == w.profile_name and run["config"]["argv"]
    assert run["config"]["profile"]["sim"] == {"gpu": "RTX 4090", "count": 8, "time_scale": 4.0}  # the demo's Sim speed
    assert run["spec"]["levels"] == [1, 2, 4] and run["spec"]["step_seconds"] == 10  # rig seconds, as typed
    assert run["plan"]["verdict"] in ("ok", "warn")
    assert run["capacity"]["kv_cache_tokens"] > 0
    s = run["summary"]
    assert s["time_scale"] == K and s["gpu_count"] == 8
    assert s["hardware"]["gpu"] == "RTX 4090" and s["hardware"]["count"] == 8
    assert s["results"]["levels"] and s["peak_output_tps"] > 0
    # levels in rig seconds: the same figures the window shows
    assert [d["level"] for d in run["levels"]] == [1, 2, 4]
    for d, st in zip(run["levels"], w.results.steps):
        assert d["output_tps"] == pytest.approx(st.output_tps) and d["ttft_p99"] == pytest.approx(st.ttft_p99)
        assert 8 < d["window_s"] < 12  # ≈ 10 rig seconds (1 s of wall time)
    reqs = store.requests(rid)
    assert len(reqs) >= sum(d["n_measured"] for d in run["levels"]) > 0
    assert {n for _, _, n, _ in store.samples(rid)} >= {"power_w", "temp_gpu_c"}
    log = store.log_lines(rid)
    assert len(log) > 5 and any("Uvicorn running" in line or "Starting vLLM" in line for _, _, line in log), log[:5]
    _stop(w, qtbot)
    # the headless CLI sees it
    assert cli_main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    assert str(rid) in out and w.profile_name[:20] in out


def test_history_compare_and_profile_from_run(sim_window, qtbot, tmp_path, dyno_home):
    """Two ramps (8 and 4 cards of the sim) → History → profile with results → Compare."""
    w = sim_window
    recorded: list[int] = []
    w.controller.run_recorded.connect(recorded.append)
    _launch(w, qtbot)
    r8 = _ramp(w, qtbot, recorded)
    _stop(w, qtbot)
    # the same model on 4 cards of the rig
    w.config.set_engine("sim", "RTX 4090", 4)
    w.config.set_config(w.config.build_config().model_copy(update={"tensor_parallel_size": 4}))
    pump(qtbot, lambda: w.plan is not None and not w.planner.busy and not w.planner._timer.isActive()
         and w.act_launch.isEnabled(), 30, "the 4-card plan")
    _launch(w, qtbot)
    r4 = _ramp(w, qtbot, recorded)
    _stop(w, qtbot)

    # ---- History: list, open, export, save as profile
    h = w.history
    w.tabs.setCurrentWidget(h)
    pump(qtbot, lambda: h._loaded, 5, "the history view reads the store when shown")
    assert h.run_ids()[:2] == [r4, r8]  # newest first
    from PySide6.QtCore import Qt
    hh = h.table.horizontalHeader()
    assert (hh.sortIndicatorSection(), hh.sortIndicatorOrder()) == (0, Qt.DescendingOrder)  # the arrow matches
    names = {rid: h.table.item(r, 2).text() for r, rid in enumerate(h.run_ids())}
    assert "tensor_parallel_size 4" in names[r4] and "rig 4× RTX 4090" in names[r4], names  # what differs
    run = h.open(r8)
    assert run["id"] == r8 and h.results.table.rowCount() == 3
    assert len(h.curves.meas_tput.xData) == 3 and len(h.curves.meas_lat.xData) == 3
    jcol = h.results.headers.index("J/token")
    assert all(h.results.table.item(r, jcol).text() != "–" for r in range(3))
    assert f"Run #{r8}" in h.run_label.text()
    _shot(w, "history.png")
    h.export_json(r8, tmp_path / "run.json")
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["id"] == r8 and len(data["levels"]) == 3 and data["requests"] and data["samples"]
    assert data["server_log"]
    h.export_html(r8, tmp_path / "run.html")  # the report (rendered in Chromium by tests/integration/test_report_html.py)
    page = (tmp_path / "run.html").read_text()
    assert f"Run #{r8}" in page and "<svg" in page and "vllm serve" in page
    h.export_csv(r8, tmp_path / "run.csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "run.csv").read_text())))
    assert [float(r["level"]) for r in rows] == [1, 2, 4]

    prof = h.save_as_profile(r8, "my 8-card rig")
    reloaded = ProfileLibrary().get("my 8-card rig")  # "next week": a fresh library reads the file
    assert reloaded.results is not None and reloaded.results.run_id == r8
    assert [lv.level for lv in reloaded.results.levels] == [1, 2, 4]
    assert reloaded.hardware.gpu == "RTX 4090" and reloaded.hardware.count == 8
    assert reloaded.server["tensor-parallel-size"] == 8 and reloaded.engine == "sim"
    assert prof.name == reloaded.name
    assert "my 8-card rig" in [w.config.profile.itemText(i) for i in range(w.config.profile.count())]
    cmd = w.profile_manager.export("my 8-card rig", "cmd", tmp_path / "serve.sh")
    assert cmd.startswith("NCCL_P2P_DISABLE=1") and "vllm serve" in cmd and "--tensor-parallel-size 8" in cmd
    assert (tmp_path / "serve.sh").read_text() == cmd
    assert w.load_profile("my 8-card rig")
    assert w.config.sim_count.value() == 8 and w.config.build_config().tensor_parallel_size == 8

    # ---- Compare: select both in History → Compare
    h.select_ids([r8, r4])
    assert h.buttons["compare"].isEnabled()
    h.buttons["compare"].click()
    c = w.compare
    assert w.tabs.currentWidget() is c
    assert sorted(c.checked_ids()) == sorted([r8, r4])
    c.gpu_hour.setValue(2.0)
    c.kwh.setValue(0.30)
    cmp = c.comparison
    assert cmp is not None and [s.gpus for s in cmp.series] == [8, 4]
    assert cmp.series[cmp.baseline].run_id == r4  # the fewest GPUs is the baseline
    assert c.table.rowCount() == 6
    heads = [c.table.horizontalHeaderItem(i).text() for i in range(c.table.columnCount())]
    row8 = next(r for r in cmp.rows if r.run_id == r8 and r.level == 4)
    row4 = next(r for r in cmp.rows if r.run_id == r4 and r.level == 4)
    assert row8.scaling_efficiency == pytest.approx(row8.output_tps / row4.output_tps / 2)
    assert row8.tps_per_gpu == pytest.approx(row8.output_tps / 8)
    assert row8.cost_per_mtok_rented == pytest.approx(2.0 * 8 / (row8.output_tps * 3600) * 1e6)
    assert row8.j_per_token is not None and row8.cost_per_mtok_energy is not None
    r = next(i for i in range(c.table.rowCount()) if c.table.item(i, 0).text().startswith(f"#{r8}")
             and c.table.item(i, 2).text() == "4")
    assert c.table.item(r, heads.index("Scaling eff.")).text() == f"{row8.scaling_efficiency:.2f}"
    assert c.table.item(r, heads.index("$/M tok (rented)")).text() == f"{row8.cost_per_mtok_rented:,.3f}"
    assert len(c.tput_plot.listDataItems()) == 2 and len(c.lat_plot.listDataItems()) == 2
    _shot(w, "compare.png")
    c.export_png(tmp_path / "cmp.png")
    from PySide6.QtGui import QImage

    img = QImage(str(tmp_path / "cmp.png"))
    assert not img.isNull() and img.width() > 300 and img.height() > 200
    c.export_csv(tmp_path / "cmp.csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "cmp.csv").read_text())))
    assert len(rows) == 6 and {"scaling_efficiency", "cost_per_mtok_rented", "j_per_token"} <= set(rows[0])
    c.rows_mode.setCurrentIndex(1)
    assert c.table.rowCount() == 2

    # ---- delete
    h.delete([r4])
    assert r4 not in h.run_ids() and history.list_runs(w.run_store())[0].id == r8
