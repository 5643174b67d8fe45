"""The diagnosis in the window (issue 16, items 3 and 9): the Log tab scrolls to the line the
diagnosis names as the cause and marks it; the banner shows it without pydantic's tail, says
when the server died after it was ready, and **Show in log** brings the line back.
pytest-qt, real widgets, offscreen; the sim rig through the Supervisor for the death after ready.
"""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QPushButton

from app.planner.diagnose import diagnose
from tests.unit.test_diagnose_config import AWQ_032
from widgets.log_pane import EVIDENCE_COLOR
from tests.plugins.qt import pump

K = 10.0


def _cause_in_view(pane) -> bool:
    """The marked cause is the cursor's block and lies inside the visible viewport."""
    n = pane.evidence_line()
    if n is None or pane.view.textCursor().blockNumber() != n:
        return False
    r = pane.view.cursorRect()
    return 0 <= r.top() and r.bottom() <= pane.view.viewport().height()


def _marked(pane, n: int) -> list[str]:
    return [s.format.background().color().name() for s in pane.view.extraSelections()
            if s.cursor.blockNumber() == n]


def test_a_config_refusal_scrolls_the_log_to_the_value_error_line(main_window, qtbot):
    """vLLM 0.32's ValidationError for VllmConfig (tests/unit/test_diagnose_config.py AWQ_032: awq on an
    unquantized checkpoint, the quantization_mismatch rule reads vLLM's message inside it) at the
    end of a long log: the launch fails, the Log tab scrolls the `Value error, …` line into view
    and marks it; the banner shows vLLM's words without the [type=…] tail."""
    w = main_window
    log = [f"(APIServer pid=23177) INFO 12-01 05:21:09 [api_utils.py:347] startup line {i}" for i in range(400)]
    log += AWQ_032.splitlines() + [f"(APIServer pid=23177) INFO 12-01 05:21:10 [x.py:1] after {i}" for i in range(60)]
    core = w.controller.core.listener  # the run controller's news, as its worker threads deliver it
    for line in log:
        core.on_line("stderr", line, 0.0)
    diag = diagnose(log, after_ready=False)
    assert diag.problem == "quantization_mismatch"
    core.on_launch_failed("the server exited with code 1 during startup", diag)
    pump(qtbot, lambda: w.banner.isVisible(), 5, "the banner")
    pane = w.log_pane
    assert w.tabs.currentWidget() is pane
    cause = log.index(diag.evidence[0])
    assert pane.evidence_line() == cause and pane.view.document().findBlockByNumber(cause).text() == diag.evidence[0]
    pump(qtbot, lambda: _cause_in_view(pane), 5, "the cause line is in view")
    assert not pane.follow.isChecked()  # later lines do not scroll it away
    assert EVIDENCE_COLOR in _marked(pane, cause)
    header = log.index("pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig")
    assert _marked(pane, header)  # the header naming the class is marked too
    assert "Launch failed — quantization_mismatch" in w.banner.title.text()
    assert "Cannot find the config file for awq" in w.banner.evidence.text()
    assert "[type=" not in w.banner.evidence.text() and "input_value" not in w.banner.evidence.text()
    # scrolled away, then Show in log brings it back
    pane.view.verticalScrollBar().setValue(0)
    assert not _cause_in_view(pane)
    w.tabs.setCurrentWidget(w.dashboard)
    w.banner.findChild(QPushButton, "showDiagnosisEvidence").click()
    assert w.tabs.currentWidget() is pane
    pump(qtbot, lambda: _cause_in_view(pane), 5, "Show in log scrolls back to the cause")
    # the errors-only filter keeps the mark on the cause
    pane.errors_only.setChecked(True)
    n = pane.evidence_line()
    assert n is not None and pane.view.document().findBlockByNumber(n).text() == diag.evidence[0]
    pane.errors_only.setChecked(False)
    core.on_launch_failed("the server exited with code 1 during startup", None)  # no diagnosis: no Show in log
    pump(qtbot, lambda: "No known cause" in w.banner.evidence.text(), 5, "the banner without a diagnosis")
    assert not w.banner.findChild(QPushButton, "showDiagnosisEvidence").isVisible()


@pytest.fixture
def sim_window(main_window, qtbot, monkeypatch):
    from app.profiles.model import SimRig

    argv = SimRig.argv  # the rig's engine dies on its first request (app/sim/server.py)
    monkeypatch.setattr(SimRig, "argv", lambda self: argv(self) + ["--sim-engine-dies-at-request", "1"])
    w = main_window
    w.sim_time_scale = K
    pump(qtbot, lambda: w.plan is not None and not w.planner.busy and not w.planner._timer.isActive(), 30,
         "the demo profile is planned")
    return w


def test_an_engine_that_dies_after_ready_is_shown_as_such(sim_window, qtbot):
    """The sim's engine dies on the ramp's first request: the banner says the server died after
    it was ready, with the CUDA error of the engine's traceback, and the Log tab marks that line."""
    w = sim_window
    w.act_launch.trigger()
    pump(qtbot, lambda: w.controller.state in ("ready", "failed"), 60, "the sim becomes ready")
    assert w.controller.state == "ready", w.log_pane.text()[-2000:]
    w.ramp.find.setChecked(False)  # a fixed ramp: it stops on the failures (a search would judge them and go on)
    w.ramp.levels.setText("1,2")
    w.ramp.step.setValue(15)
    w.act_ramp.trigger()
    pump(qtbot, lambda: w.controller.state == "failed" and w.banner.isVisible(), 60, "the banner")
    assert "The server died after it was ready — engine_runtime_error" in w.banner.title.text()
    assert "cannot serve any more" in w.banner.title.text()
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in w.banner.evidence.text()
    pane = w.log_pane
    pump(qtbot, lambda: _cause_in_view(pane), 10, "the cause line is in view")
    n = pane.evidence_line()
    assert pane.view.document().findBlockByNumber(n).text().endswith(
        "RuntimeError: CUDA error: an illegal memory access was encountered")
    pump(qtbot, lambda: not w.controller.ramp_running, 30, "the ramp ends")
    assert "server_failed" in w.run_label.text(), w.run_label.text()


def test_evidence_that_repeats_a_line_marks_each_one(gui_guard, qtbot):
    """Two field errors with the same message (tests/unit/test_diagnose_config.py PARALLEL_TWO_032):
    both message lines and both field names are marked, the first field's name is the cause."""
    from tests.unit.test_diagnose_config import PARALLEL_TWO_032
    from widgets.log_pane import EVIDENCE_OTHER_COLOR, LogPane

    log = PARALLEL_TWO_032.splitlines()
    feed = [[(0.0, "stderr", l) for l in log]]
    pane = LogPane(lambda: feed.pop() if feed else [])
    qtbot.addWidget(pane)
    pane.show()
    pane.pull()
    d = diagnose(log)
    assert pane.show_evidence(d.evidence)
    assert pane.evidence_line() == 1  # "pipeline_parallel_size"
    marked = {s.cursor.blockNumber(): s.format.background().color().name() for s in pane.view.extraSelections()}
    assert marked == {1: EVIDENCE_COLOR, 2: EVIDENCE_OTHER_COLOR, 4: EVIDENCE_OTHER_COLOR, 5: EVIDENCE_OTHER_COLOR,
                      0: EVIDENCE_OTHER_COLOR}
    pane.close()
