"""RunStore on real SQLite files."""
from __future__ import annotations

import sqlite3
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


# ---------------------------------------------------------------- layout versions / migrations
import app.store as store_mod  # noqa: E402
from app.store import SCHEMA_VERSION, StoreVersionError  # noqa: E402


def _user_version(path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


def _old_layout(path):
    """A store from before user_version was written: v0, some columns not there yet."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL,
                           name TEXT NOT NULL DEFAULT '', engine TEXT NOT NULL DEFAULT '',
                           config TEXT, spec TEXT, plan TEXT, capacity TEXT, summary TEXT,
                           status TEXT NOT NULL DEFAULT 'running');
        CREATE TABLE levels (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
                             idx INTEGER NOT NULL, level REAL NOT NULL, output_tps REAL,
                             stats TEXT NOT NULL, PRIMARY KEY (run_id, idx));
        CREATE TABLE samples (run_id INTEGER NOT NULL, t REAL NOT NULL, source TEXT NOT NULL,
                              name TEXT NOT NULL, value REAL);
    """)
    db.execute("INSERT INTO runs(created, name, engine, config, status) VALUES (?,?,?,?,?)",
               (1700000000.0, "old run", "vllm", '{"model": "m"}', "done"))
    db.execute("INSERT INTO levels(run_id, idx, level, output_tps, stats) VALUES (1, 0, 4, 123.0, ?)",
               ('{"idx": 0, "level": 4, "output_tps": 123.0}',))
    db.execute("INSERT INTO samples VALUES (1, 0.5, 'gpu0', 'power_w', 250.0)")
    db.commit()
    db.close()
    assert _user_version(path) == 0


def test_new_store_writes_user_version(tmp_path):
    p = tmp_path / "r.sqlite"
    with RunStore(p) as s:
        assert s.migrated_from == 0
    assert _user_version(p) == SCHEMA_VERSION == len(store_mod.MIGRATIONS) == 4
    with RunStore(p) as s:
        assert s.migrated_from == SCHEMA_VERSION  # nothing to do the second time


def test_migration_from_v0_keeps_rows(tmp_path):
    p = tmp_path / "old.sqlite"
    _old_layout(p)
    with RunStore(p) as s:
        assert s.migrated_from == 0
        run = s.get_run(1)
        assert run["name"] == "old run" and run["config"] == {"model": "m"} and run["status"] == "done"
        assert run["clock_wall0"] is None and run["finished"] is None  # columns added
        assert s.levels(1) == [{"idx": 0, "level": 4, "output_tps": 123.0}]
        assert s.samples(1) == [(0.5, "gpu0", "power_w", 250.0)]
        # the migrated store takes new writes in every table
        s.finish_run(1, "done", summary={"knee": 4})
        s.add_level(1, {"idx": 1, "level": 8, "mode": "rate", "output_tps": 200.0})
        s.add_requests(1, [{"level_idx": 0, "level": 4, "t_start": 1.0, "status": "ok"}])
        s.add_log_lines(1, [(0.1, "stdout", "hi")])
        assert s.get_run(1)["summary"] == {"knee": 4} and len(s.levels(1)) == 2
        assert len(s.requests(1)) == 1 and s.log_lines(1) == [(0.1, "stdout", "hi")]
    assert _user_version(p) == SCHEMA_VERSION
    with sqlite3.connect(p) as db:
        cols = {r[1] for r in db.execute("PRAGMA table_info(levels)")}
    assert {"mode", "ttft_p99", "failure_rate"} <= cols


def test_newer_store_is_refused_untouched(tmp_path):
    p = tmp_path / "future.sqlite"
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, shiny TEXT)")
    db.execute("INSERT INTO runs VALUES (1, 'x')")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    before = p.read_bytes()
    with pytest.raises(StoreVersionError) as e:
        RunStore(p)
    msg = str(e.value)
    assert str(p) in msg and "newer vLLM Dyno" in msg and "Upgrade vLLM Dyno" in msg
    assert isinstance(e.value, sqlite3.DatabaseError)
    assert p.read_bytes() == before and _user_version(p) == SCHEMA_VERSION + 1


def test_migrations_run_step_by_step_in_one_transaction(tmp_path, monkeypatch):
    p = tmp_path / "r.sqlite"
    with RunStore(p) as s:
        s.create_run("kept")
    calls = []
    v = SCHEMA_VERSION

    def add_note(db):  # the next step (v → v + 1)
        calls.append("next")
        if "note" not in {r[1] for r in db.execute("PRAGMA table_info(runs)")}:
            db.execute("ALTER TABLE runs ADD COLUMN note TEXT")

    def broken(db):  # a v + 1 → v + 2 step that fails half-way
        db.execute("ALTER TABLE runs ADD COLUMN other TEXT")
        raise RuntimeError("boom")

    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, add_note, broken])
    with pytest.raises(StoreVersionError, match=f"from layout version {v} to {v + 2} failed.*boom") as e:
        RunStore(p)
    assert str(p) in str(e.value)
    assert _user_version(p) == v  # rolled back: no column, no version, the row still there
    with sqlite3.connect(p) as db:
        assert "note" not in {r[1] for r in db.execute("PRAGMA table_info(runs)")}
        assert db.execute("SELECT name FROM runs").fetchall() == [("kept",)]
    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS[:v + 1]])
    calls.clear()
    with RunStore(p) as s:
        assert s.migrated_from == v and calls == ["next"]
        assert s.list_runs()[0]["name"] == "kept"
    assert _user_version(p) == v + 1


def test_a_v3_store_gains_the_requests_turn_and_keeps_its_rows(tmp_path, monkeypatch):
    """v3 → v4: ``requests.turn`` is added; a request stored before has no turn (None:
    not recorded, not 0), the ones stored after keep theirs, in the store and its CSV."""
    from app import history

    p = tmp_path / "v3.sqlite"
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:3])
    with RunStore(p) as s:  # the v3 layout, written by the v3 code's columns
        rid = s.create_run("before v4")
        s.finish_run(rid, "done")
    assert _user_version(p) == 3
    with sqlite3.connect(p) as db:
        assert "turn" not in {r[1] for r in db.execute("PRAGMA table_info(requests)")}
        db.execute("INSERT INTO requests(run_id, level_idx, level, t_start, status) VALUES (?, 0, 2, 1.0, 'ok')",
                   (rid,))
    monkeypatch.undo()
    with RunStore(p) as s:
        assert s.migrated_from == 3
        (old,) = s.requests(rid)
        assert old["turn"] is None and old["status"] == "ok"
        s.add_requests(rid, [{"level_idx": 0, "level": 2, "t_start": 2.0, "status": "ok", "turn": 3},
                             {"level_idx": 0, "level": 2, "t_start": 3.0, "status": "ok"}])
        assert [q["turn"] for q in s.requests(rid)] == [None, 3, 0]
        rows = history.requests_csv(s, rid).splitlines()
        assert rows[0].split(",")[-1] == "turn" and [r.split(",")[-1] for r in rows[1:]] == ["", "3", "0"]
    assert _user_version(p) == SCHEMA_VERSION == 4
