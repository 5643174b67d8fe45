"""Issue 15 item 13 in the window: a deeply nested settings.yaml and hostile profile
files (tests/unit/test_hostile_files.py has the attacks) no longer stop the window's start."""
from __future__ import annotations

from tests.unit.test_hostile_files import GOOD, PROFILE_ATTACKS, SETTINGS_ATTACKS


def test_window_opens_with_hostile_settings_and_profiles(gui_guard, qtbot, dyno_home):
    """Before: a deeply nested settings.yaml or profile crashed the window's start."""
    from widgets.main_window import MainWindow

    (dyno_home / "settings.yaml").write_text(SETTINGS_ATTACKS["deep"][0])
    pdir = dyno_home / "profiles"
    pdir.mkdir()
    (pdir / "good.yaml").write_text(GOOD)
    for attack in ("deep-flow", "huge-int", "dup-nested"):
        (pdir / f"{attack}.yaml").write_text(PROFILE_ATTACKS[attack][0])
    w = MainWindow()
    w.show()
    try:
        msg = w.statusBar().currentMessage()
        assert msg.startswith("Settings: ") and "settings.yaml: safety" in msg, msg
        names = [w.config.profile.itemText(i) for i in range(w.config.profile.count())]
        assert "good rig" in names
        w.tabs.setCurrentWidget(w.profile_manager)  # the Profiles tab scans when first shown
        assert "good rig" in w.profile_manager.names()
        err = w.profile_manager.error_label.text()
        assert all(f"{a}.yaml" in err for a in ("deep-flow", "huge-int", "dup-nested")), err
    finally:
        w.close()
        w.shutdown()
        w.deleteLater()
