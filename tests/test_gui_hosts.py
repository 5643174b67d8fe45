"""Issue 21, item 2: the Live tab's Hosts view — one row per host of a rig with its role,
its part's state, its cards, its clock offset ± bound and round trip, and after a loss
the reason in red — fed by :meth:`RunController.rig_status`.

The controller's snapshot comes from a real rig of two local agents (``localhost`` and
``127.0.0.1``: both run here without SSH, under two labels): the head's agent launches
the simulated rig's server for real, the other agent is SIGKILLed (a lost host). The
window shows that snapshot through the adapter and its redraw timer, and the selected
profile's hosts before any launch."""
from __future__ import annotations

import os
import time

from PySide6.QtGui import QColor

from app.config import ServerConfig
from app.hosts.plan import HostCommand
from app.hosts.rig import Rig
from app.hosts.spec import Host, hosts_from
from app.run.controller import RunController
from widgets.hosts_view import REASON_COLOR, HostsView, cards_text
from widgets.testing import gui_guard, main_window, pump  # noqa: F401  (fixtures)


def _wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out: {what}"
        time.sleep(0.05)


def test_rig_status_of_two_local_agents_and_the_view_of_it(qtbot):
    ctl = RunController()
    head, other = Host(ssh="localhost"), Host(ssh="127.0.0.1")
    rig = Rig([head, other], clock=ctl.clock)
    ctl.rig = rig
    assert [r["state"] for r in ctl.rig_status()] == ["connecting", "connecting"]  # no hello yet
    try:
        rig.open(timeout=60)
        cfg = ServerConfig(model="Llama-3-8B")
        ctl.rig_plan = [HostCommand(head, "head", 0, cfg), HostCommand(other, "headless", 1, cfg)]
        rows = ctl.rig_status()
        assert [(r["host"], r["role"], r["rank"], r["state"]) for r in rows] == \
            [("localhost", "head", 0, "starting"), ("127.0.0.1", "headless", 1, "starting")]
        for r, link in zip(rows, rig.links):
            assert r["hostname"] == link.hello["hostname"] and r["cards"] == [c["name"] for c in link.hello["cards"]]
            assert r["offset_s"] == link.offset.offset_s and r["rtt_s"] == link.offset.rtt_s
            assert 0 < r["bound_s"] == r["rtt_s"] / 2 < 1.0  # one machine: well under a second
        rig.call(rig.links[0].launch(cfg, engine="sim", sim_args=["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1"]),
                 60)
        _wait(lambda: ctl.rig_status()[0]["state"] in ("ready", "failed"), 90, "the head's part is ready")
        assert ctl.rig_status()[0]["state"] == "ready", rig.links[0].log_lines
        os.kill(rig.links[1].agent_pid, 9)  # the other host goes away
        _wait(lambda: ctl.rig_status()[1]["state"] == "lost", 30, "the killed agent is seen lost")
        rows = ctl.rig_status()
        assert rows[1]["reason"] == rig.links[1].lost and "closed" in rows[1]["reason"]
        assert rows[0]["state"] == "ready" and rows[0]["reason"] == ""
    finally:
        ctl.stop()
    assert ctl.rig is None
    after = ctl.rig_status()  # the closed rig's rows stay for the view
    assert [r["host"] for r in after] == ["localhost", "127.0.0.1"] and after[1]["state"] == "lost"

    view = HostsView({"ready": "#1e7b34", "lost": "#a61b1b"})
    qtbot.addWidget(view)
    view.set_rows(rows)
    assert view.table.rowCount() == 2
    assert view.cell(0, "Host") == "localhost" and view.cell(0, "Role") == "head, rank 0"
    assert view.cell(1, "Role") == "headless, rank 1" and view.cell(1, "State") == "lost"
    assert view.cell(0, "Cards") == cards_text(rows[0]) == ("CPU" if not rows[0]["cards"] else view.cell(0, "Cards"))
    assert cards_text({"hostname": "h", "cards": ["H100", "H100", "L4"]}) == "2 × H100, 1 × L4"
    assert cards_text({"hostname": "", "cards": []}) == ""  # before its hello
    off = rows[0]
    assert view.cell(0, "Clock offset") == f"{off['offset_s'] * 1e3:+.3f} ± {off['bound_s'] * 1e3:.3f} ms"
    assert view.cell(0, "Round trip") == f"{off['rtt_s'] * 1e3:.3f} ms"
    reason = view.table.item(1, 6)
    assert reason.text() == rows[1]["reason"] and reason.foreground().color() == QColor(REASON_COLOR)
    assert view.cell(0, "Reason") == ""


def test_the_window_shows_hosts_only_for_a_rig(main_window, qtbot):
    w = main_window
    w.tabs.setCurrentWidget(w.dashboard)
    pump(qtbot, lambda: w.dashboard.isVisible(), 10, "the Live tab is shown")
    qtbot.wait(300)  # a few redraw ticks
    assert not w.hosts_view.isVisible()  # the demo profile: this machine only
    w.current_profile = w.current_profile.updated(hosts=hosts_from([{"ssh": "dyno@10.0.0.11"},
                                                                    {"ssh": "dyno@10.0.0.12"}]))
    pump(qtbot, lambda: w.hosts_view.isVisible(), 10, "the selected profile's two hosts are shown")
    assert [w.hosts_view.cell(i, "Host") for i in range(2)] == ["dyno@10.0.0.11", "dyno@10.0.0.12"]
    assert w.hosts_view.cell(0, "State") == "not launched"
    assert w.build_request().multi_host  # Launch starts the rig of the selected profile
    saved = w.form_profile(w.current_profile.name)  # what Save writes keeps the rig (no form field holds it)
    assert [h.label() for h in saved.hosts] == ["dyno@10.0.0.11", "dyno@10.0.0.12"]


def test_the_window_launches_a_rig_and_shows_its_hosts_ready_then_lost(main_window, qtbot):
    """Launch through the window with a profile of two local hosts (TP 4 × PP 2 over the
    sim's 8 cards: one stage per host, app.hosts.plan.mp_plan): the Hosts view fills
    from the controller's snapshot; the headless host's agent killed, its row says lost
    with the reason in red and the run fails naming it."""
    from widgets import profiles

    w = main_window
    w.sim_time_scale = 4.0
    pump(qtbot, lambda: w.plan is not None and w.act_launch.isEnabled(), 30, "the demo profile is planned")
    p = w.current_profile
    p = p.updated(hosts=hosts_from([{"ssh": "localhost"}, {"ssh": "127.0.0.1"}]),
                  server={**p.server, "tensor_parallel_size": 4, "pipeline_parallel_size": 2})
    profiles.apply_to_form(p, w.config, w.ramp)
    w.current_profile = p
    w.launch()
    pump(qtbot, lambda: w.controller.state in ("ready", "failed"), 180, "the rig becomes ready")
    assert w.controller.state == "ready", w.controller.core.failure_text + w.log_pane.text()[-3000:]
    assert w.tabs.currentWidget() is w.dashboard
    v = w.hosts_view
    # the headless part's agent says loading to its end (no API server of its own): with the head ready, ready
    assert w.controller.core.rig.links[1].states[-1]["state"] == "loading"
    pump(qtbot, lambda: [r["state"] for r in v.rows] == ["ready", "ready"], 30, "both parts ready in the view")
    assert v.isVisible()
    assert [(v.cell(i, "Host"), v.cell(i, "Role")) for i in range(2)] == \
        [("localhost", "head, rank 0"), ("127.0.0.1", "headless, rank 1")]
    assert all(v.cell(i, "Clock offset").endswith(" ms") and " ± " in v.cell(i, "Clock offset") for i in range(2))
    os.kill(w.controller.core.rig.links[1].agent_pid, 9)
    pump(qtbot, lambda: len(v.rows) == 2 and v.rows[1]["state"] == "lost", 60, "the lost host in the view")
    pump(qtbot, lambda: w.controller.state == "failed", 60, "the run fails")
    assert "host 127.0.0.1 was lost" in w.controller.core.failure_text
    item = v.table.item(1, 6)
    assert item.text() == "the agent's channel closed" and item.foreground().color() == QColor(REASON_COLOR)
    w.act_stop.trigger() if w.act_stop.isEnabled() else None
    pump(qtbot, lambda: w.controller.core.rig is None or not w.controller.server_running, 60, "the rig is closed")
