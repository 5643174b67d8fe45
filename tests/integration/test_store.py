"""The process-starting half of tests/unit/test_store.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import subprocess
import sys
from app.store import RunStore


def test_crash_keeps_flushed_rows(tmp_path):
    """A writer killed without close() keeps what was flushed before (≤ 1 s lost)."""
    path = tmp_path / "r.sqlite"
    code = f"""
import os, time
from app.store import RunStore
s = RunStore({str(path)!r}, flush_interval=0.2)
rid = s.create_run('crash')
s.add_samples(rid, [(float(i), 'host', 'x', 1.0) for i in range(100)])
time.sleep(1.0)
os._exit(0)  # no close(), no flush at exit
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with RunStore(path) as s:
        assert len(s.samples(1)) == 100
