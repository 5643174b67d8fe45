"""`vllm-dyno tune` against the simulated rig over HTTP (issue 18): a perturbed 8× RTX
4090 (the tuner does not know its step times), interrupted with Ctrl-C during its second
launch — no process left, the tune saved as interrupted — and resumed to its end: a
recommendation measured and confirmed within the budget, every run recorded."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from app.store import RunStore

AWQ70 = "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"
TUNE = ["tune", "--engine", "sim", "--sim-gpu", "RTX 4090", "--sim-gpu-count", "8", "--sim-time-scale", "20",
        "--sim-perturb", "3", "--model", AWQ70, "--served-model-name", "llama70", "--quantization", "awq_marlin",
        "--max-model-len", "8192", "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.1", "--tp", "8,4,2",
        "--kv-cache-dtypes", "auto", "--cuda-graphs", "on", "--mnbt", "2048", "--max-launches", "3", "--grace", "5",
        "--resolution", "0.1"]  # a lone search's resolution: the test judges the resume, not the pick


def ours(home: str) -> list[psutil.Process]:
    """Processes started for this test (they inherit its VLLM_DYNO_HOME)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get("VLLM_DYNO_HOME") == home:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


@pytest.mark.long(170)  # seconds on 2 cores: opens an xdist chunk (tests/plugins/order.py)
def test_tune_is_interrupted_and_resumed_against_the_perturbed_sim(tmp_path):
    home = str(tmp_path / "home")
    env = dict(os.environ, VLLM_DYNO_HOME=home)
    out = tmp_path / "tune.json"
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", *TUNE], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "launch 2 of ≤ 3" in line:
                time.sleep(1.0)  # the second server is starting
                proc.send_signal(signal.SIGINT)
                break
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + rest
    assert proc.returncode == 130, text[-3000:]
    assert "resume with: vllm-dyno tune --resume 1" in text and "Traceback" not in text
    deadline = time.monotonic() + 10
    while ours(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ours(home), [p.cmdline() for p in ours(home)]
    with RunStore(tmp_path / "home" / "runs.sqlite") as store:
        row = store.get_tune(1)
    assert row["status"] == "interrupted"
    first = [c for c in row["state"]["candidates"] if c["measured_users"] is not None]
    assert len(first) == 1

    r = subprocess.run([sys.executable, "-m", "app.cli", "tune", "--resume", "1", "--json", str(out)], env=env,
                       capture_output=True, text=True, timeout=900)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["launches"] <= 3 and res["rig_seconds"] > 0
    rec = res["recommendation"]
    assert rec["measured"] and rec["users"] >= 4 and rec["output_tps"] > 0
    assert rec["sentence"].startswith("8× RTX 4090 (sim) serves ") and rec["sentence"] in r.stdout
    assert all(v is not None for v in rec["server"].values()) and isinstance(rec["server"]["enforce_eager"], bool)
    assert first[0]["key"] in [c["key"] for c in res["candidates"] if c["measured_users"] is not None]
    runs = [x["run_id"] for x in res["launch_log"] if x["run_id"]]
    assert runs
    with RunStore(tmp_path / "home" / "runs.sqlite") as store:
        names = {x["id"]: x["name"] for x in store.list_runs()}
        assert store.get_tune(1)["status"] == "done"
    assert all(names[i].startswith("tune 1 · ") for i in runs)
    assert not ours(home)
    shown = subprocess.run([sys.executable, "-m", "app.cli", "tune", "--show", "1"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0 and "recommended" in shown.stdout
    again = subprocess.run([sys.executable, "-m", "app.cli", "tune", "--resume", "1"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 2 and "tune 1 is finished" in again.stderr


def test_a_tune_killed_mid_launch_leaves_no_process_and_reads_interrupted(tmp_path):
    """SIGKILL of `vllm-dyno tune` while its server starts: the reaper ends the server
    (nothing of the tune left within the reaper's grace + 5 s), and the next open of the
    run store marks the tune whose writer is gone as interrupted, resumable."""
    from app.server.reaper import EOF_GRACE_S

    home = str(tmp_path / "home")
    env = dict(os.environ, VLLM_DYNO_HOME=home)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", *TUNE], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "launch 1 of ≤ 3" in line:
                break
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(ours(home)) < 2:  # the reaper and the sim server run
            time.sleep(0.1)
        assert len(ours(home)) >= 2, [p.cmdline() for p in ours(home)]
        proc.kill()
        proc.wait(10)
        t0 = time.monotonic()
        while ours(home) and time.monotonic() - t0 < EOF_GRACE_S + 5:
            time.sleep(0.1)
        assert not ours(home), [p.cmdline() for p in ours(home)]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    r = subprocess.run([sys.executable, "-m", "app.cli", "tune", "--list"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "interrupted" in r.stdout.splitlines()[0], r.stdout + r.stderr
