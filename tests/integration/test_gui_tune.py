"""The Tune tab (issue 18, item 5) against the simulated rig: the demo profile's space
(70B AWQ on 8× RTX 4090) with the planner's reason beside every pruned value; a real
two-launch tune through the window's run controller that fills the table, draws the
Pareto points and recommends flags that save as a profile and export as a command and
a --config file vLLM's option names accept; Stop mid-tune leaves no process.
pytest-qt, offscreen; the sim runs 20× faster than the wall clock."""
from __future__ import annotations

import shlex

import psutil
import pytest

from app.config import VLLM_OPTIONS, ServerConfig
from app.planner.versions import option_accepted
from app.sim.model_adapter import VLLM_RULES
from widgets import profiles
from tests.plugins.qt import pump

K = 20.0
#: the two-launch tune's SLO: looser than the demo profile's (TTFT p99 ≤ 2 s, TPOT p99 ≤ 100 ms), as
#: on 2 loaded cores a 100 ms hiccup of the wall clock is 2 s of the rig's at 20× — under the whole
#: suite no level met the profile's SLO. (The stop test's other failure there, the sim outliving the
#: 15 s wait, was the sim's: a request arriving while it stopped was queued on the stopped engine;
#: tests/integration/test_sim_server.py::test_sigint_under_closed_loop_load_stops_the_sim_at_once.)
TUNE_SLO_MS = {"ttft": 6000.0, "tpot": 150.0}


@pytest.fixture
def tune_window(main_window, qtbot):
    w = main_window
    w.sim_time_scale = K
    pump(qtbot, lambda: w.plan is not None and not w.planner.busy, 30, "the demo profile is planned")
    w.tabs.setCurrentWidget(w.tune)
    t = w.tune
    pump(qtbot, lambda: bool(t.boxes), 30, "the space is planned")
    pump(qtbot, lambda: t.res is not None and t.table.rowCount() == len(t.res["candidates"]), 180,
         "the space is predicted")
    return w


def narrow_space(t, **keep) -> None:
    """Tick only the given values of each dimension (field → values)."""
    for field, values in keep.items():
        for v, box in t.boxes[field].items():
            if box.isEnabled():
                box.setChecked(v in values)


def _children(before: set[int] = frozenset()) -> list[psutil.Process]:
    """Live children of this process, less ``before`` (those of other tests: the shared
    CPU vLLM of the e2e tests lives for the whole session)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_the_space_shows_every_pruned_value_with_the_planners_reason(tune_window, qtbot):
    w = tune_window
    t = w.tune
    # 8 cards: TP, PP, DP each 1, 2, 4, 8; DP 8 leaves one card per replica: 70B AWQ does not fit on 24 GiB
    assert sorted(t.boxes["tensor_parallel_size"]) == [1, 2, 4, 8]
    dp8 = t.boxes["data_parallel_size"][8]
    assert not dp8.isEnabled() and not dp8.isChecked() and dp8.font().strikeOut()
    why = t.reasons["data_parallel_size"][8]
    assert "weights_do_not_fit" in why.text() and why.isVisible()
    assert "weights_do_not_fit: the weights do not fit" in dp8.toolTip()
    assert all(b.isEnabled() and b.isChecked() for v, b in t.boxes["data_parallel_size"].items() if v != 8)
    assert set(t.boxes["kv_cache_dtype"]) == {"auto", "fp8"} and set(t.boxes["enforce_eager"]) == {False, True}
    assert "80 configurations" in t.space_status.text() and "8 pruned" in t.space_status.text()
    # the table: the predicted first, the pruned last with the reason in its own column
    rows = [[t.table.item(r, c).text() for c in range(t.table.columnCount())] for r in range(t.table.rowCount())]
    assert len(rows) == 80
    pruned = [r for r in rows if r[4].startswith("pruned: weights_do_not_fit")]
    assert len(pruned) == 8 and all(r[0].startswith("TP1 PP1 DP8") for r in pruned) and rows[-1] in pruned
    assert rows[0][2] not in ("—", "") and rows[0][3] == "—"
    assert t.pred_pts.data.size > 0 and t.met_pts.data.size == 0  # predicted points only, before a launch
    assert t.slo_line.isVisible() and t.slo_line.value() == pytest.approx(10.0)  # TPOT p99 ≤ 100 ms
    assert not t.save_btn.isEnabled() and not t.copy_btn.isEnabled()  # nothing recommended yet
    assert t.start_btn.isEnabled()
    # the window's own server runs: the tune (which launches its own) waits for it
    w.act_launch.trigger()
    pump(qtbot, lambda: w.controller.state == "ready", 60, "the window's server is up")
    assert not t.start_btn.isEnabled() and "stop it first" in t.start_btn.toolTip()
    t.start_tune()
    assert not t.running and "Cannot start: a server of this session is ready" in t.progress.text()
    w.act_stop.trigger()
    pump(qtbot, lambda: w.controller.state == "stopped", 60, "the window's server stops")
    assert t.start_btn.isEnabled()
    # nothing ticked in a dimension: refused by name
    for b in t.boxes["kv_cache_dtype"].values():
        b.setChecked(False)
    with pytest.raises(ValueError, match="kv_cache_dtype: tick at least one value"):
        t.selection()


@pytest.mark.long(150)  # seconds on 2 cores: opens an xdist chunk (tests/plugins/order.py)
@pytest.mark.timeout(600)  # the two-launch tune, then the verifying launch and its search
def test_a_two_launch_tune_fills_the_tab_and_its_flags_export(tune_window, qtbot, tmp_path):
    w = tune_window
    t = w.tune
    t.slo_ttft.setValue(TUNE_SLO_MS["ttft"])
    t.slo_tpot.setValue(TUNE_SLO_MS["tpot"])
    narrow_space(t, tensor_parallel_size=[8, 4, 2], kv_cache_dtype=["auto"], enforce_eager=[False],
            max_num_batched_tokens=[2048])
    assert t.selection() == {"tp": [2, 4, 8], "kv_cache_dtype": ["auto"], "enforce_eager": [False],
                             "max_num_batched_tokens": [2048]}
    t.max_launches.setValue(2)
    t.start_btn.click()
    assert t.running and not t.start_btn.isEnabled() and t.stop_btn.isEnabled()
    assert not w.act_launch.isEnabled() and "a tune is running" in w.launch_block_reason()
    pump(qtbot, lambda: w.controller.state == "ready", 60, "the first candidate is up")
    assert w.tabs.currentWidget() is t  # the tune does not pull the window to the Live tab
    pump(qtbot, lambda: "launch 1 of ≤ 2" in t.progress.text(), 10, "the progress line")
    pump(qtbot, lambda: not t.running, 150, "the tune ends")
    res = t.res
    assert res["launches"] == 2 and res["recommendation"] is not None, t.progress.text()
    assert "done" in t.progress.text()
    rows = [[t.table.item(r, c).text() for c in range(t.table.columnCount())] for r in range(t.table.rowCount())]
    assert len(rows) == 6 and rows[0][4] == "recommended" and rows[0][3] != "—"
    assert sum(r[3] != "—" for r in rows) == 1  # one measured, one confirmed: the rest predicted
    assert t.met_pts.data.size >= 1 and t.rec_pt.data.size == 1 and t.pred_pts.data.size == 5
    assert len(t.front.xData) >= 1
    cards = [lab.text() for fr, lab in t.card_labels if fr.isVisible()]
    assert cards[0].startswith("<span") and "Recommended" in cards[0] and "Runner-up" in cards[1]
    assert "Starting flags" in cards[2] and "users at SLO" in cards[0]
    assert "serves" in t.sentence.text() and "users" in t.sentence.text()
    # the live plots followed the launches
    w.tabs.setCurrentWidget(w.dashboard)
    w.dashboard.refresh(force=True)
    assert any(w.dashboard.plots_with_data().values())
    assert w.run_store().get_tune(res["tune_id"])["status"] == "done"

    server = res["recommendation"]["server"]
    assert t.save_btn.isEnabled() and t.copy_btn.isEnabled() and t.export_btn.isEnabled()
    t.save_profile("tuned demo")
    prof = profiles.library().entry("tuned demo").profile
    assert prof.engine == "sim" and prof.sim.gpu == "RTX 4090" and prof.sim.count == 8
    saved, want = prof.server_config(resolve=False).model_dump(), ServerConfig(**server).model_dump()
    # the recommended flags, with the environment the tune launched with (issue 37: every option)
    assert {k: v for k, v in saved.items() if v != want[k]} == {"env": {"NCCL_P2P_DISABLE": "1"}}, want
    assert prof.server_config(resolve=False) == ServerConfig.model_validate(res["recommendation"]["config"])
    assert prof.ramp.slo.tpot_p99 == pytest.approx(TUNE_SLO_MS["tpot"] / 1000)
    assert "tuned demo" in profiles.list_profiles()

    cmd = t.serve_command()
    argv = shlex.split(cmd)
    assert argv[:3] == ["vllm", "serve", server["model"]]
    flags = {s.flag: s for s in VLLM_OPTIONS.values()} | {"--no-" + s.key: s for s in VLLM_OPTIONS.values()}
    used = [a for a in argv[3:] if a.startswith("--")]
    assert used and all(a in flags and option_accepted(flags[a], VLLM_RULES) for a in used), used
    assert ServerConfig.from_command_line(cmd) == ServerConfig(**server)
    t.copy_command()
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == cmd
    out = tmp_path / "tuned.yaml"
    t.export_config(str(out))
    assert ServerConfig.from_vllm_config_yaml(out.read_text()) == ServerConfig(**server)

    # Verify (find capacity) (issue 37 item 5): the window launches exactly the configuration
    # the tune measured and searches its capacity from the users the tune measured
    rec = res["recommendation"]
    done = []
    w.controller.ramp_finished.connect(done.append)
    assert t.launch_btn.isEnabled() and t.verify_btn.isEnabled()
    t.verify_btn.click()
    pump(qtbot, lambda: w.controller.state == "ready", 60, "the recommendation is up")
    launched, tuned = w.controller.core.target.config, ServerConfig.model_validate(rec["config"])
    for field in ServerConfig.model_fields:
        if field != "port":  # the launch's own
            assert getattr(launched, field) == getattr(tuned, field), field
    pump(qtbot, lambda: bool(done), 240, "the verifying search ends")
    cap = done[0].capacity
    assert cap is not None and cap.levels[0].users == int(rec["users"])  # it starts where the tune measured
    # whether it lands in the tune's interval is not judged here: at 20× on two loaded cores a
    # wall-clock hiccup is 20× the rig's (28 vs 42 users seen under the suite); the scripted
    # check is scripts/screenshot.py --tune --verify, alone (13 vs 13 users in one run)
    assert cap.users > 0 and cap.sentence, cap.sentence
    w.stop()
    pump(qtbot, lambda: not w.controller.server_running, 30, "the recommendation's server stops")


def test_stop_mid_tune_leaves_no_process(tune_window, qtbot):
    w = tune_window
    t = w.tune
    narrow_space(t, tensor_parallel_size=[8, 4], kv_cache_dtype=["auto"], enforce_eager=[False],
            max_num_batched_tokens=[2048])
    t.max_launches.setValue(3)
    before = {p.pid for p in _children()}
    t.start_btn.click()
    pump(qtbot, lambda: w.controller.state == "ready" and w.controller.core.ramp_running, 60,
         "the first search runs")
    assert _children(before), "the sim server is a child of this process"
    assert w.act_stop.isEnabled() and "tune" in w.act_stop.toolTip()  # the toolbar's Stop stops it too
    t.stop_btn.click()
    pump(qtbot, lambda: not t.running, 60, "the tune stops")
    assert "Stopped" in t.progress.text() and "vllm-dyno tune --resume" in t.progress.text()
    assert t.start_btn.isEnabled() and not t.stop_btn.isEnabled()
    pump(qtbot, lambda: not _children(before), 15, "no child process of the tune is left")
    tid = int(t.progress.text().rsplit(" ", 1)[1])
    assert w.run_store().get_tune(tid)["status"] == "interrupted"
    assert w.act_launch.isEnabled()


