"""The process-starting half of tests/integration/test_gui_hosts.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import time
import pytest
from tests.plugins.qt import pump
from tests.integration.test_gui_hosts import click_button, load_rig_profile


def test_the_window_launches_a_sim_rig_over_ssh_hosts_through_the_plan(main_window, qtbot):
    """Two hosts as network namespaces reached over SSH (tests/netns.py): the head's API
    server listens on its private address, so the plan dialog asks to launch it
    reachable from other machines; its Launch is that confirmation (the head's agent
    refuses a bind beyond loopback without it). The sim rig (TP 4 × PP 2, one stage per
    host) becomes ready at the head's address, both hosts ready in the Hosts view; Stop
    leaves no process on either host."""
    import dataclasses

    from tests import netns
    from tests.multinode.test_multinode import DYNO, ssh_options

    why = netns.unavailable()
    if why:
        pytest.skip(why)
    bed = netns.Bed.make(2)
    try:
        w = main_window
        w.sim_time_scale = 4.0
        load_rig_profile(w, qtbot, [{"ssh": h.destination, "dyno": DYNO} for h in bed.hosts], tensor_parallel_size=4,
                     pipeline_parallel_size=2)
        build = w.build_request
        w.build_request = lambda config=None: dataclasses.replace(build(config), ssh=ssh_options(bed))  # the bed's key and known hosts
        said = []

        def answer(dlg):
            said.append((dlg.launch_button.text(), list(dlg.preview.exposure)))
            return click_button(dlg, dlg.launch_button)

        w._run_dialog = answer
        w.launch()
        head = bed.hosts[0]
        assert said[0][0] == "Launch, reachable from other machines"
        assert said[0][1][0].startswith(f"head {head.destination}: listening on {head.address}")
        pump(qtbot, lambda: w.controller.state in ("ready", "failed"), 180, "the rig becomes ready")
        assert w.controller.state == "ready", w.controller.core.failure_text + w.log_pane.text()[-3000:]
        assert w.controller.url.startswith(f"http://{head.address}:")
        pump(qtbot, lambda: [r["state"] for r in w.hosts_view.rows] == ["ready", "ready"], 30, "both hosts ready")
        w.stop()
        pump(qtbot, lambda: w.controller.core.rig is None, 60, "the rig is closed")
        deadline = time.monotonic() + 30
        while any(h.app_pids() for h in bed.hosts) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(h.app_pids() for h in bed.hosts), {h.ns: h.app_pids() for h in bed.hosts}
    finally:
        bed.close()
