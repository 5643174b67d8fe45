"""RunStore on real SQLite files."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from app.store import RunStore


def test_default_path_is_in_data_dir(dyno_home):
    with RunStore() as s:
        assert s.path == dyno_home / "runs.sqlite"
        assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_run_lifecycle(tmp_path):
    with RunStore(tmp_path / "r.sqlite") as s:
        rid = s.create_run("first", "vllm", config={"model": "m", "max_num_seqs": 8}, plan={"ok": True},
                           clock_wall0=1000.0)
        rid2 = s.create_run("second", "sim")
        assert [r["id"] for r in s.list_runs()] == [rid2, rid]
        run = s.get_run(rid)
        assert run["config"] == {"model": "m", "max_num_seqs": 8} and run["status"] == "running"
        s.finish_run(rid, "done", summary={"knee": 8}, capacity={"kv_tokens": 1024})
        run = s.get_run(rid)
        assert run["status"] == "done" and run["summary"] == {"knee": 8} and run["capacity"]["kv_tokens"] == 1024
        assert run["finished"] > 0
        with pytest.raises(ValueError, match="unknown run field"):
            s.update_run(rid, colour="red")
        assert s.delete_run(rid) and s.get_run(rid) is None
        assert not s.delete_run(rid)


def test_samples_logs_levels_requests(tmp_path):
    with RunStore(tmp_path / "r.sqlite") as s:
        rid = s.create_run("x")
        s.add_samples(rid, [(1.0, "gpu0", "memory_used_bytes", 5e9), (0.5, "host", "cpu_percent", 12.0),
                            (2.0, "gpu0", "memory_used_bytes", 6e9)])
        assert s.samples(rid, "gpu0", "memory_used_bytes") == [(1.0, "gpu0", "memory_used_bytes", 5e9),
                                                                (2.0, "gpu0", "memory_used_bytes", 6e9)]
        assert [r[0] for r in s.samples(rid)] == [0.5, 1.0, 2.0]
        s.add_log_lines(rid, [(0.1, "stdout", "INFO hello"), (0.2, "stderr", "WARN x")])
        assert s.log_lines(rid)[1] == (0.2, "stderr", "WARN x")
        s.add_level(rid, {"idx": 0, "level": 1, "mode": "concurrency", "output_tps": 100.0, "ttft_p99": 0.05,
                          "n_measured": 10, "failures": {"timeout": 1}})
        assert s.levels(rid)[0]["failures"] == {"timeout": 1}
        s.add_requests(rid, [{"level_idx": 0, "level": 1, "t_start": 3.0, "ttft": 0.1, "e2e": 0.5,
                              "prompt_tokens": 5, "output_tokens": 3, "tokens_source": "server_usage",
                              "status": "ok", "error": None,
                              "chunk_offsets": np.array([0.1, 0.2, 0.5], dtype=np.float32)}])
        req = s.requests(rid)[0]
        assert req["status"] == "ok" and req["chunk_offsets"].dtype == np.float32
        np.testing.assert_allclose(req["chunk_offsets"], [0.1, 0.2, 0.5], rtol=1e-6)
        s.delete_run(rid)
        assert s.samples(rid) == [] and s.requests(rid) == []


def test_threads_write_concurrently(tmp_path):
    with RunStore(tmp_path / "r.sqlite") as s:
        rid = s.create_run("x")

        def writer(k):
            for i in range(200):
                s.add_samples(rid, [(i * 0.01, f"src{k}", "v", float(i))])

        ts = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert len(s.samples(rid)) == 800


def test_background_flush_is_visible_to_other_connections(tmp_path):
    path = tmp_path / "r.sqlite"
    with RunStore(path, flush_interval=0.1) as s:
        rid = s.create_run("x")
        s.add_samples(rid, [(0.0, "host", "cpu", 1.0)])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            n = sqlite3.connect(path).execute("SELECT count(*) FROM samples").fetchone()[0]
            if n == 1:
                break
            time.sleep(0.05)
        assert n == 1


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


def test_closed_store_raises(tmp_path):
    s = RunStore(tmp_path / "r.sqlite")
    s.close()
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.list_runs()


def test_not_a_database(tmp_path):
    p = tmp_path / "junk.sqlite"
    p.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(sqlite3.DatabaseError):
        RunStore(p)
