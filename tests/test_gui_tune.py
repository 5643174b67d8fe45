"""The Tune tab (issue 18 item 5) driving the real tuner against the simulated rig through
the window's run controller: the space planned with the planner's reason next to each
pruned value; a narrowed two-launch tune fills the candidate table, the Pareto plot and
the result card; the exports (vllm serve command, --config YAML, a saved profile) are
valid; Stop mid-launch leaves no process. pytest-qt, offscreen; the demo profile (8× RTX
4090, Llama-3.1-70B AWQ) on the sim at 10× the wall clock."""
from __future__ import annotations

import shlex

import psutil
import pytest
import yaml

from app.profiles import ProfileLibrary
from app.tuner.space import server_flags
from widgets.testing import gui_guard, main_window, pump  # noqa: F401  (fixtures)

K = 10.0


@pytest.fixture
def tune_window(main_window, qtbot):
    w = main_window
    w.sim_time_scale = K
    pump(qtbot, lambda: w.plan is not None and not w.planner.busy, 30, "the demo profile is planned")
    w.tabs.setCurrentWidget(w.tune)
    return w


def _plan_space(w, qtbot):
    t = w.tune.plan_space()
    assert t is not None, w.tune.space_summary.text()
    pump(qtbot, lambda: bool(w.tune.boxes), 60, "the space is planned")


def _keep(panel, dim: str, values: set) -> None:
    for cb, v in panel.boxes[dim]:
        if cb.isEnabled():
            cb.setChecked(v.value in values)


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


def test_the_space_shows_every_pruned_value_with_the_planners_reason(tune_window, qtbot):
    w = tune_window
    _plan_space(w, qtbot)
    panel = w.tune
    # 70B AWQ is 37 GiB: one RTX 4090 (24 GiB) per replica cannot hold it, so DP 8 (TP1 PP1) cannot start
    dp8 = next((cb, v) for cb, v in panel.boxes["data_parallel_size"] if v.value == 8)
    assert not dp8[0].isEnabled() and not dp8[0].isChecked()
    assert dp8[1].reason.startswith("weights_do_not_fit"), dp8[1].reason
    labels = [lab.text() for lab in panel.dims_w.findChildren(type(panel.phase))]
    assert any("pruned: weights_do_not_fit" in t for t in labels), labels
    assert all(cb.isEnabled() and cb.isChecked() for cb, v in panel.boxes["tensor_parallel_size"])
    assert "configurations can start" in panel.space_summary.text()
    # the dry run's predictions: the table has every candidate, the plot the predicted points
    n = len(panel.dry["candidates"])
    assert panel.table.rowCount() == n and n >= 24
    states = [panel.table.item(i, 4).text() for i in range(n)]
    assert sum(s.startswith("pruned:") for s in states) == 8 and "predicted" in states
    assert len(panel.pred_scatter.data) > 0 and len(panel.meas_scatter.data) == 0
    assert panel.slo_line.isVisible() and abs(panel.slo_line.value() - 10.0) < 1e-9  # TPOT 100 ms → 10 tok/s
    # unticking every value of a dimension is refused with its name
    _keep(panel, "tensor_parallel_size", set())
    assert not panel.start()
    assert "tensor_parallel_size: keep at least one value" in panel.phase.text()
    assert not panel.running


def test_a_two_launch_tune_fills_the_tab_and_exports_valid_flags(tune_window, qtbot, tmp_path):
    w = tune_window
    _plan_space(w, qtbot)
    panel = w.tune
    _keep(panel, "tensor_parallel_size", {2, 4})
    _keep(panel, "kv_cache_dtype", {"auto"})
    _keep(panel, "cuda_graphs", {True})
    _keep(panel, "max_num_batched_tokens", {2048})
    panel.max_launches.setValue(2)
    assert panel.start(), panel.phase.text()
    assert not w.act_launch.isEnabled() and "a tune is running" in w.act_launch.toolTip()
    pump(qtbot, lambda: w.controller.state in ("loading", "ready"), 60, "the tune's first server starts")
    assert panel.progress.value() == 1 and "launch 1" in panel.phase.text()
    pump(qtbot, lambda: not panel.running and panel.result is not None, 300, "the tune finishes")
    res = panel.result
    rec = res["recommendation"]
    assert rec is not None and rec["measured"] and rec["users"] >= 4, panel.phase.text()
    assert res["launches"] == 2 and panel.progress.value() == 2
    keys = {c["key"] for c in res["candidates"] if c["pruned_because"] is None}
    assert keys and all(k.startswith(("TP2", "TP4")) and "kv auto" in k and "mnbt 2048" in k for k in keys)
    # the table: the recommendation first, in bold, with its measured interval
    assert panel.table.item(0, 0).text() == rec["key"] and panel.table.item(0, 4).text() == "recommended"
    assert "(" in panel.table.item(0, 2).text() and panel.table.item(0, 0).font().bold()
    # the Pareto plot: the measured point and the star on it
    assert len(panel.meas_scatter.data) >= 1 and len(panel.rec_scatter.data) == 1
    x, y = panel.rec_scatter.data[0]["x"], panel.rec_scatter.data[0]["y"]
    assert x == pytest.approx(rec["output_tps"] / rec["users"], rel=0.35) and y > 0
    # the card: the verdict sentence and the three columns
    assert w.tabs.currentWidget() is w.tune  # the tune's launches and searches kept the user's tab
    assert panel.card.isVisible()
    text = panel.card.toPlainText()
    assert "8× RTX 4090 (sim) serves" in text and "recommended" in text and "starting flags" in text
    # exports
    cmd = panel.copy_command()
    argv = shlex.split(cmd)
    assert argv[:3] == ["vllm", "serve", rec["server"]["model"]]
    assert f"--tensor-parallel-size={rec['server']['tensor_parallel_size']}" in argv or \
        str(rec["server"]["tensor_parallel_size"]) == argv[argv.index("--tensor-parallel-size") + 1]
    path = panel.export_config(str(tmp_path / "cfg.yaml"))
    cfg = yaml.safe_load(open(path))
    assert cfg["tensor-parallel-size"] == rec["server"]["tensor_parallel_size"]
    assert cfg["max-num-seqs"] == rec["server"]["max_num_seqs"]
    panel.save_profile("tuned demo")
    prof = ProfileLibrary().get("tuned demo")
    assert prof.engine == "sim" and prof.sim is not None and prof.sim.count == 8
    saved = server_flags(prof.server_config())
    assert {k: saved.get(k) for k in rec["server"]} == rec["server"]
    # the runs of the tune are in History, the window is free again
    pump(qtbot, lambda: w.act_launch.isEnabled(), 30, "Launch is enabled again")
    assert w.controller.supervisor is None and not _children()


def test_stop_mid_launch_leaves_no_process_and_saves_the_tune(tune_window, qtbot):
    w = tune_window
    panel = w.tune
    panel.max_launches.setValue(2)
    assert panel.start(), panel.phase.text()  # the whole default space (no dry run first)
    pump(qtbot, lambda: w.controller.state in ("loading", "ready") and bool(_children()), 90,
         "the tune's first server starts")
    panel.stop()
    pump(qtbot, lambda: not panel.running, 60, "the tune stops")
    assert "vllm-dyno tune --resume" in panel.phase.text(), panel.phase.text()
    pump(qtbot, lambda: not _children(), 10, "no child process is left")
    assert panel.start_btn.isEnabled() and not panel.stop_btn.isEnabled()
    row = w.run_store().get_tune(panel.tuner.tune_id)
    assert row["status"] == "interrupted"
