"""Issue 15 item 10 in the window: a read-only home (a tmpfs remounted read-only; root
only, skipped otherwise — tests/integration/test_disk_faults.py covers the logic without root). The
window opens on it, History lists the runs recorded before, nothing raises."""
from __future__ import annotations

import subprocess

import pytest

from app.store import RunStore
from tests.integration.test_disk_faults import tmpfs
from tests.plugins.qt import pump


def test_window_opens_on_a_read_only_home_and_lists_its_runs(gui_guard, qtbot, tmp_path, monkeypatch):
    from widgets.main_window import MainWindow

    with tmpfs(tmp_path / "fs", "4m") as fs:
        with RunStore(fs / "runs.sqlite") as s:
            rid = s.create_run("recorded before", "sim")
            s.finish_run(rid, "done")
        r = subprocess.run(["mount", "-o", "remount,ro", str(fs)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot remount read-only: {r.stderr.strip()}")
        monkeypatch.setenv("VLLM_DYNO_HOME", str(fs))
        w = MainWindow()
        w.show()
        try:
            w.tabs.setCurrentWidget(w.history)  # History reads the store when first shown
            pump(qtbot, lambda: w.history.run_ids() == [rid], 20, "History lists the run of the read-only store")
            assert w.run_store().read_only and str(fs / "runs.sqlite") in w.run_store().read_only
        finally:
            w.close()
            w.shutdown()
            w.deleteLater()
