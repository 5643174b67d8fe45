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


def test_a_multi_turn_runs_export_has_each_requests_turn(tmp_path, dyno_home, capsys):
    """A multi-turn ramp through the run controller, recorded; ``runs export ID`` (JSON)
    and ``--what requests`` (CSV) carry each request's turn of its conversation, as the
    load generator sent them (``ramp --requests-csv`` has them too)."""
    import csv
    import io
    import json

    from app.cli import main
    from app.config import ServerConfig
    from app.loadgen.spec import RampSpec
    from app.run.controller import LaunchTarget, RecordSpec, RunController
    from tests.loadgen_server import Script, ScriptedServer

    with RunStore() as store, ScriptedServer(Script(ttft=0.01, itl=0.002)) as srv:
        ctl = RunController(store=store)
        ctl.launch(LaunchTarget("attach", ServerConfig(model="m"), attach_url=srv.url, telemetry=False))
        spec = RampSpec(url=srv.url, levels=[2], step_seconds=1.5, prompt_tokens=16, output_tokens=4,
                        length_spread=0, multi_turn={"turns": 3})
        out = ctl.ramp(spec, record=RecordSpec(name="conversations"), timeout=60)
        ctl.close()
        store.flush()
    assert out.status == "done" and out.run_id is not None, out.stop_reason
    sent = sorted((r.t_start, r.turn) for r in out.records)
    assert {t for _, t in sent} == {1, 2, 3}
    assert main(["runs", "export", str(out.run_id)]) == 0
    exported = json.loads(capsys.readouterr().out)["requests"]
    assert sorted((q["t_start"], q["turn"]) for q in exported) == sent
    assert main(["runs", "export", str(out.run_id), "--format", "csv", "--what", "requests"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert sorted(int(r["turn"]) for r in rows) == sorted(t for _, t in sent)
