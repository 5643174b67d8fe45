"""Issue 19, item 2: the first-run strip — shown on a first start, its steps ticked in
order (a later step ticks the earlier ones), gone for good once dismissed (gui.ini), and
a window closed while it waits to hide counts it done. The whole flow (launch → search →
verdict ticking each step) is in tests/integration/test_gui_session.py::test_find_capacity_through_the_window."""
from __future__ import annotations

from widgets.main_window import MainWindow


def test_the_strip_shows_once_and_stays_dismissed(main_window, qtbot):
    w = main_window
    s = w.first_run
    assert s.isVisible() and s.done == set()
    s.mark("ramp")  # a tune or ramp started on an attached server: the launch step counts too
    assert s.done == {"launch", "ramp"} and "✓" in s.labels["launch"].text() and "✓" not in s.labels["verdict"].text()
    s.mark("nonsense")
    assert s.done == {"launch", "ramp"}
    s.close_btn.click()
    assert not s.isVisible()
    assert str(w.qsettings.value("onboarding/done")).lower() == "true"
    w.qsettings.sync()
    again = MainWindow(restore=True)  # the same data directory: the next start
    try:
        again.show()
        assert not again.first_run.isVisible()
    finally:
        again.shutdown()
        again.close()
        again.deleteLater()


def test_closing_while_it_waits_to_hide_counts_it_done(main_window, qtbot):
    w = main_window
    w.first_run.mark("verdict")
    assert w.first_run.waiting_to_hide  # shown ticked for a few seconds
    w.shutdown()  # the window closes meanwhile: no timer left running, and it is done
    assert not w.first_run.waiting_to_hide
    assert str(w.qsettings.value("onboarding/done")).lower() == "true"
