"""The process-starting half of tests/integration/test_gui_tune.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import time
import pytest
from tests.plugins.qt import pump
from tests.integration.test_gui_tune import K, TUNE_SLO_MS, narrow_space


def test_a_tune_over_the_profiles_hosts_shows_them_in_the_hosts_view(main_window, qtbot, monkeypatch):
    """The Tune tab over a profile whose ``hosts:`` are the bed's two network namespaces
    (tests/netns.py, reached over SSH with the bed's key): before the tune the window asks
    to let the head listen beyond this machine (the exposure dialog, naming the hosts);
    during the launch the Live tab's Hosts view shows both hosts with their roles (fed by
    RunController.rig_status()); the launch's run is recorded over both; nothing is left
    on either host. (Issue 21 meets issue 18.)"""
    from PySide6.QtWidgets import QMessageBox

    from tests import netns
    from tests.integration.test_gui_hosts import load_rig_profile
    from tests.multinode.test_multinode import DYNO, ssh_options

    why = netns.unavailable()
    if why:
        pytest.skip(why)
    bed = netns.Bed.make(2)
    try:
        w = main_window
        w.sim_time_scale = K
        load_rig_profile(w, qtbot, [{"ssh": h.destination, "dyno": DYNO} for h in bed.hosts], tensor_parallel_size=4,
                     pipeline_parallel_size=2)
        w.ssh_options = ssh_options(bed)  # the bed's key and known hosts instead of the user's
        asked = []
        monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: asked.append(a[2]) or QMessageBox.Yes)
        w.tabs.setCurrentWidget(w.tune)
        t = w.tune
        pump(qtbot, lambda: bool(t.boxes) and t.res is not None and any(
            (c["pruned_because"] or "").startswith("launch_plan: ") for c in t.res["candidates"]), 120,
            "the space over the rig is predicted (the layouts its launch plan refuses pruned)")
        span = next(c for c in t.res["candidates"] if c["key"].startswith("TP8 PP1 DP1"))
        assert "would span hosts" in span["pruned_because"], span
        t.slo_ttft.setValue(TUNE_SLO_MS["ttft"])
        t.slo_tpot.setValue(TUNE_SLO_MS["tpot"])
        narrow_space(t, tensor_parallel_size=[4], pipeline_parallel_size=[2], data_parallel_size=[1],
                kv_cache_dtype=["auto"], enforce_eager=[False], max_num_batched_tokens=[2048])
        t.max_launches.setValue(1)
        t.start_btn.click()
        h0, h1 = bed.hosts
        assert len(asked) == 1 and "The tune launches over 2 hosts" in asked[0] and h0.address in asked[0], asked
        assert t.running
        w.tabs.setCurrentWidget(w.dashboard)  # the Live tab
        v = w.hosts_view
        pump(qtbot, lambda: [r.get("role") for r in v.rows] == ["head", "headless"], 180,
             "the tune's launch over both hosts in the Hosts view")
        assert v.isVisible()
        assert [v.cell(i, "Host") for i in range(2)] == [h0.destination, h1.destination]
        assert [v.cell(i, "Role") for i in range(2)] == ["head, rank 0", "headless, rank 1"]
        pump(qtbot, lambda: not t.running, 300, "the tune ends")
        res = t.res
        assert res is not None and res["launches"] == 1, t.progress.text()
        run = w.run_store().get_run(res["launch_log"][0]["run_id"])
        assert [x["host"] for x in run["config"]["hosts"]] == [h0.destination, h1.destination]
        deadline = time.monotonic() + 30
        while any(h.app_pids() for h in bed.hosts) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(h.app_pids() for h in bed.hosts), {h.ns: h.app_pids() for h in bed.hosts}
    finally:
        bed.close()
