"""Issue 19, item 4: safe edits. The title marks unsaved edits; switching profile with
them asks (Cancel keeps them, Discard drops them, Save saves then switches); closing the
window while a server runs asks first; Tab leaves the Environment box; a typed 0 in
max_num_seqs is refused, not turned into "default"."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from widgets import profiles
from tests.plugins.qt import pump


def _planned(w, qtbot):
    pump(qtbot, lambda: w.plan is not None and not w.planner.busy, 30, "the demo profile is planned")


def test_unsaved_edits_are_marked_and_a_profile_switch_asks(main_window, qtbot, monkeypatch):
    w = main_window
    _planned(w, qtbot)
    qtbot.wait(300)  # whatever the form fills in after the load (version probe, plan) is not an edit
    assert not w.is_modified() and not w.isWindowModified() and w.windowTitle().endswith("[*]")
    other = next(n for n in profiles.list_profiles() if n != w.profile_name)
    # no edits: a switch does not ask
    asked = []
    monkeypatch.setattr(w, "_ask", lambda *a: asked.append(a) or QMessageBox.Cancel)
    assert w.switch_profile(other) and not asked and w.profile_name == other
    assert w.switch_profile(profiles.DEMO_NAME)
    w.config.max_num_seqs.setValue(48)
    assert w.is_modified() and w.isWindowModified()
    # Cancel: nothing changes, the box shows the loaded profile again
    assert not w.switch_profile(other)
    assert asked and "not saved to profile" in asked[-1][1] and w.profile_name == profiles.DEMO_NAME
    assert w.config.profile.currentText() == profiles.DEMO_NAME and w.config.max_num_seqs.value() == 48
    # Save: the dialog saves a user copy, then it switches
    monkeypatch.setattr(w, "_ask", lambda *a: QMessageBox.Save)
    monkeypatch.setattr(w, "save_profile_dialog", lambda: w.save_profile("demo with 48"))
    assert w.switch_profile(other) and w.profile_name == other
    saved = profiles.library().entry("demo with 48").profile
    assert saved.server_config(resolve=False).max_num_seqs == 48
    # Discard: the edits go, the switch happens
    w.load_profile("demo with 48")
    assert not w.is_modified()
    w.config.max_num_seqs.setValue(96)
    monkeypatch.setattr(w, "_ask", lambda *a: QMessageBox.Discard)
    assert w.switch_profile(profiles.DEMO_NAME) and w.config.max_num_seqs.value() != 96
    assert not w.isWindowModified()
    # undoing an edit by hand is not an edit
    v = w.config.max_num_seqs.value()
    w.config.max_num_seqs.setValue(v + 16)
    assert w.isWindowModified()
    w.config.max_num_seqs.setValue(v)
    assert not w.isWindowModified()


def test_closing_with_a_running_server_asks_first(main_window, qtbot, monkeypatch):
    w = main_window
    w.sim_time_scale = 20.0
    _planned(w, qtbot)
    assert w.close_question() is None
    w.act_launch.trigger()
    pump(qtbot, lambda: w.controller.state == "ready", 60, "the sim is ready")
    asked = []
    monkeypatch.setattr(w, "_ask", lambda *a: asked.append(a[1]) or QMessageBox.Cancel)
    w.close()
    assert asked and "server is ready and will be stopped" in asked[0]
    assert w.isVisible() and w.controller.state == "ready"  # cancelled: nothing stopped
    monkeypatch.setattr(w, "_ask", lambda *a: QMessageBox.Close)
    w.close()
    assert not w.isVisible() and w.controller.supervisor is None  # closed: everything stopped


def test_tab_leaves_the_environment_box_and_zero_is_refused(main_window, qtbot):
    w = main_window
    _planned(w, qtbot)
    env = w.config.env
    env.clear()
    env.setFocus()
    qtbot.keyClicks(env, "NCCL_P2P_DISABLE=1")
    qtbot.keyClick(env, Qt.Key_Tab)
    assert "\t" not in env.toPlainText() and env.toPlainText() == "NCCL_P2P_DISABLE=1"
    box = w.config.max_num_seqs
    box.setValue(32)
    box.lineEdit().selectAll()
    qtbot.keyClicks(box, "0")
    assert box.lineEdit().text() == "32"  # refused: the text stays
    from PySide6.QtWidgets import QToolTip

    QToolTip.hideText()  # the reason, shown beside the box while it has the focus
    box.lineEdit().selectAll()
    qtbot.keyClicks(box, "64")
    box.interpretText()
    assert box.value() == 64 and w.config.build_config().max_num_seqs == 64
    box.setValue(1)
    qtbot.keyClick(box, Qt.Key_Down)  # stepping below 1 is how to unset it
    assert box.text() == "default" and w.config.build_config().max_num_seqs is None


def test_another_profile_or_engine_starts_from_clean_views(main_window, qtbot):
    """Issue 19, item 7: the last session's ramp progress, results and plots go when the
    user loads another profile or picks another engine (nothing runs meanwhile)."""
    from app.loadgen.stats import StepStats

    w = main_window
    w.ramp.progress.setText("<b>Ramp done</b>: 5 levels")
    w.results.add_step(StepStats(idx=0, level=4.0, t_start=0.0, t_end=10.0, window_start=1.0, window_end=10.0, window_s=9.0, n_ok=5, output_tps=100.0))
    w.run_label.setText("ramp: done")
    assert w.results.table.rowCount() == 1
    w.config.set_engine("vllm", "RTX 4090", 8)  # another engine
    assert w.results.table.rowCount() == 0 and w.ramp.progress.text() == "" and w.run_label.text() == ""
    w.results.add_step(StepStats(idx=0, level=4.0, t_start=0.0, t_end=10.0, window_start=1.0, window_end=10.0, window_s=9.0, n_ok=5, output_tps=100.0))
    w.ramp.progress.setText("<b>Ramp done</b>")
    w._ask = lambda *a, **k: QMessageBox.Discard  # unsaved edits (the engine): discard them
    assert w.switch_profile(w.config.profile.itemText(0) if w.config.profile.itemText(0) != w.profile_name
                            else w.config.profile.itemText(1))
    assert w.results.table.rowCount() == 0 and w.ramp.progress.text() == ""


def test_switching_profile_leaves_no_text_of_the_last_session(main_window, qtbot):
    """Issue 37, item 8: "sim: stopped" stayed in the status bar under a vLLM profile, and
    the previous server's VRAM headroom in the Live tab's title. The session clock's axis
    reads as a clock (never "ks")."""
    w = main_window
    _planned(w, qtbot)
    w._show_state("stopped", "")
    w.dashboard._set_title("vram", "VRAM per GPU, headroom 3.20 GiB")
    assert "sim: <b>stopped</b>" in w.state_label.text()
    w.config.set_engine("vllm", "RTX 4090", 8)  # another engine: a new session's views
    assert "stopped" not in w.state_label.text() and "idle" in w.state_label.text()
    assert w.dashboard.plots["vram"].titleLabel.text == "VRAM used per GPU"
    axis = w.dashboard.plots["power"].getAxis("bottom")
    assert axis.tickStrings([0.0, 1020.0, 3723.0], 1.0, 300.0) == ["0:00", "17:00", "1:02:03"]
    assert "ks" not in axis.labelString() and "m:ss" in axis.labelString()


def test_closing_with_unsaved_edits_offers_save(main_window, qtbot, monkeypatch):
    """Issue 37, item 8: the close dialog offered no Save for unsaved edits. Save saves the
    form (then closes); a cancelled save keeps the window open."""
    w = main_window
    _planned(w, qtbot)
    qtbot.wait(300)
    w.config.max_num_seqs.setValue(48)
    assert w.is_modified()
    asked = []
    monkeypatch.setattr(w, "_ask", lambda title, text, buttons, default: asked.append(buttons) or QMessageBox.Save)
    monkeypatch.setattr(w, "save_profile_dialog", lambda: None)  # the name dialog cancelled
    w.close()
    assert asked and asked[0] & QMessageBox.Save and w.isVisible()  # not saved: still open
    monkeypatch.setattr(w, "save_profile_dialog", lambda: w.save_profile("kept edits"))
    w.close()
    assert not w.isVisible() and "kept edits" in profiles.list_profiles()
    assert profiles.library().entry("kept edits").profile.server.get("max-num-seqs") == 48
