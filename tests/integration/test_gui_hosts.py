"""Issue 21, item 2: the Live tab's Hosts view — one row per host of a rig with its role,
its part's state, its cards, its clock offset ± bound and round trip, and after a loss
the reason in red — fed by :meth:`RunController.rig_status`.

The controller's snapshot comes from a real rig of two local agents (``localhost`` and
``127.0.0.1``: both run here without SSH, under two labels): the head's agent launches
the simulated rig's server for real, the other agent is SIGKILLed (a lost host). The
window shows that snapshot through the adapter and its redraw timer, and the selected
profile's hosts before any launch."""
from __future__ import annotations

import html
import os
import re
import time

import pytest
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QLabel

from app.config import ServerConfig
from app.hosts.plan import HostCommand
from app.run.handles import RigHandle
from app.hosts.spec import Host, hosts_from
from app.run.controller import RunController
from widgets.hosts_view import REASON_COLOR, HostsView, cards_text
from tests.plugins.qt import pump


def _wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out: {what}"
        time.sleep(0.05)


def test_rig_status_of_two_local_agents_and_the_view_of_it(qtbot):
    ctl = RunController()
    head, other = Host(ssh="localhost"), Host(ssh="127.0.0.1")
    ctl.rig_handle = RigHandle([head, other], clock=ctl.clock)
    rig = ctl.rig
    assert rig is not None
    assert [r["state"] for r in ctl.rig_status()] == ["connecting", "connecting"]  # no hello yet
    try:
        rig.open(timeout=60)
        cfg = ServerConfig(model="Llama-3-8B")
        ctl.rig_handle.plan = [HostCommand(head, "head", 0, cfg), HostCommand(other, "headless", 1, cfg)]
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


def load_rig_profile(w, qtbot, hosts: list, **server):
    """Load the demo profile with ``hosts`` and ``server`` options into the window's forms
    (as if loaded), once the demo profile is planned; returns the profile."""
    from widgets import profiles

    pump(qtbot, lambda: w.plan is not None and w.act_launch.isEnabled(), 30, "the demo profile is planned")
    p = w.current_profile
    p = p.updated(hosts=hosts_from(hosts), server={**p.server, **server})
    profiles.apply_to_form(p, w.config, w.ramp)
    w.current_profile = p
    pump(qtbot, lambda: w.state.config is not None and w.plan is not None, 30, "the rig's form is planned")
    return p


def click_button(dlg, button) -> int:
    """Show ``dlg`` as exec() would, click ``button``; what exec() would return."""
    dlg.show()
    button.click()
    return dlg.result()


def test_the_plan_dialog_before_a_rig_launch_and_its_export(main_window, qtbot, tmp_path_factory):
    """Launch with a profile of two remote hosts: before anything starts the window shows
    the plan — each host's role, rank and command exactly as `vllm-dyno hosts plan`
    renders them, the head's exposure (its API server on its address), Launch/Cancel —
    and Export… writes the ssh-line script atomically. Cancel starts nothing."""
    from PySide6.QtWidgets import QDialogButtonBox

    from app.hosts.plan import mp_plan, render, script

    w = main_window
    tmp_path = tmp_path_factory.mktemp("export")
    p = load_rig_profile(w, qtbot, ["dyno@10.0.0.11", "dyno@10.0.0.12:2222"], tensor_parallel_size=4,
                     pipeline_parallel_size=2)
    plan = mp_plan(p.hosts, w.build_request().config)
    seen = []

    def answer(dlg):
        seen.append(dlg)
        assert dlg.windowTitle() == "Launch on 2 hosts"
        assert dlg.commands.toPlainText() == render(plan)
        assert "# dyno@10.0.0.11 — head" in dlg.commands.toPlainText()
        assert "# dyno@10.0.0.12:2222 — headless, rank 1" in dlg.commands.toPlainText()
        assert dlg.launch_button.isEnabled() and dlg.launch_button.text() == "Launch, reachable from other machines"
        out = dlg.export(tmp_path / "rig.sh")
        assert out.read_text() == script(plan) and plan[1].ssh_line() + " &" in out.read_text().splitlines()
        blocked = tmp_path / "a-folder.sh"
        blocked.mkdir()
        with pytest.raises(OSError):  # cannot replace a folder: nothing half-written, no temporary left
            dlg.export(blocked)
        assert sorted(x.name for x in tmp_path.iterdir()) == ["a-folder.sh", "rig.sh"]
        return click_button(dlg, dlg.buttons.button(QDialogButtonBox.Cancel))

    w._run_dialog = answer
    w.launch()
    assert len(seen) == 1
    assert w.controller.core.rig is None and not w.controller.server_running
    assert "Not launched: the launch plan over 2 hosts was not confirmed" in w.statusBar().currentMessage()


def test_a_layout_the_hosts_cannot_run_shows_its_fix_and_launches_nothing(main_window, qtbot):
    """TP 8 over two hosts of the sim's 8 cards: the tensor-parallel group would span the
    hosts (app.hosts.plan.PlanError): the dialog says so with the fix, shows no commands,
    Launch and Export… are disabled, and even an accepted dialog starts nothing. A head on
    this machine's loopback with a remote other host is refused the same way (a finding)."""
    w = main_window
    load_rig_profile(w, qtbot, ["dyno@10.0.0.11", "dyno@10.0.0.12"], tensor_parallel_size=8, pipeline_parallel_size=1)
    seen = []

    def answer(dlg):
        said = html.unescape(re.sub("<[^>]+>", "", " ".join(x.text() for x in dlg.findChildren(QLabel))))
        seen.append((said, dlg.commands.isHidden(), dlg.launch_button.isEnabled(), dlg.export_button.isEnabled()))
        dlg.show()
        dlg.accept()  # the dialog's own Launch is disabled; accepted anyway, the window still refuses
        return dlg.result()

    w._run_dialog = answer
    w.launch()
    text, hidden, can_launch, can_export = seen[0]
    assert "would span hosts" in text and "pipeline_parallel_size 2" in text
    assert hidden and not can_launch and not can_export
    assert w.controller.core.rig is None and not w.controller.server_running
    assert w.statusBar().currentMessage().startswith("Cannot launch over 2 hosts: a tensor-parallel group of 8")

    load_rig_profile(w, qtbot, ["localhost", "dyno@10.0.0.12"], tensor_parallel_size=4, pipeline_parallel_size=2)
    w._run_dialog = answer
    seen.clear()
    w.launch()
    text, hidden, can_launch, can_export = seen[0]
    assert "error: host localhost: it is reached at 127.0.0.1, which dyno@10.0.0.12 cannot reach" in text
    assert not hidden and not can_launch and can_export  # a plan to look at and export, not to launch
    assert w.controller.core.rig is None and not w.controller.server_running


def test_save_as_under_a_new_name_keeps_the_hosts(main_window, qtbot):
    """The rig's hosts: (no form field holds them) survive every save of the form under
    another name — the window's Save dialog, the Profiles tab's Save as and New — and a
    profile saved so launches its rig again."""
    from widgets import profiles

    w = main_window
    load_rig_profile(w, qtbot, ["dyno@10.0.0.11", {"ssh": "dyno@10.0.0.12", "gpus": [1], "link": "25gbe"}],
                 tensor_parallel_size=4, pipeline_parallel_size=2)
    want = [h.model_dump() for h in w.current_profile.hosts]
    w.save_profile("rig copy")
    w.profile_manager.save_as("rig copy 2")
    w.profile_manager.new_profile("rig new")
    lib = profiles.library()
    for name in ("rig copy", "rig copy 2", "rig new"):
        assert [h.model_dump() for h in lib.entry(name).profile.hosts] == want, name
    assert w.load_profile("rig copy 2")
    assert w.current_profile.name == "rig copy 2" and w.build_request().multi_host
    assert w.load_profile(profiles.DEMO_NAME)  # a profile without hosts saves none
    w.save_profile("no rig")
    assert lib.entry("no rig").profile.hosts == [] and not w.build_request().multi_host


def test_the_window_launches_a_rig_and_shows_its_hosts_ready_then_lost(main_window, qtbot):
    """Launch through the window with a profile of two local hosts (TP 4 × PP 2 over the
    sim's 8 cards: one stage per host, app.hosts.plan.mp_plan): the Hosts view fills
    from the controller's snapshot; the headless host's agent killed, its row says lost
    with the reason in red and the run fails naming it."""
    w = main_window
    w.sim_time_scale = 4.0
    load_rig_profile(w, qtbot, [{"ssh": "localhost"}, {"ssh": "127.0.0.1"}], tensor_parallel_size=4,
                 pipeline_parallel_size=2)
    shown = []
    w._run_dialog = lambda dlg: shown.append(dlg.commands.toPlainText()) or click_button(dlg, dlg.launch_button)
    w.launch()
    assert len(shown) == 1 and "# 127.0.0.1 — headless, rank 1" in shown[0]  # the plan came first
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


