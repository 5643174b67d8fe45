"""Issue 32: every caller of the run controller's ``start_ramp`` — the window's Ramp
button, the Tune tab, ``vllm-dyno run``, ``ramp`` and ``tune`` — runs with the user's
safety stops, and a hot simulated rig stops each for heat in the controller's words.

One hot rig for all: a 7B model on one simulated RTX 4090 with poor cooling in a warm
room (``--sim-cooling 2 --sim-ambient-c 45``), 20× faster than the wall clock: under
load a card reaches its slowdown temperature within a minute of rig time (a few wall
seconds). Settings are the defaults (a fresh data directory: safety on, 3 °C margin);
no caller passes the limits itself. The CLI callers run as subprocesses at once; the
window's two share one main window."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from app.profiles import ProfileLibrary, parse_profile
from app.run.safety import thermal_stop_reason
from app.store import RunStore
from app.telemetry.series import Sample, SeriesBank
from tests.plugins.qt import pump

ROOT = Path(__file__).resolve().parents[2]
K = 20.0
#: the rig's heat, as every front end takes it
HOT = ["--sim-cooling", "2", "--sim-ambient-c", "45"]
#: the hot rig's profile; its ramp runs long enough (120 rig s a level) that only heat ends it
PROFILE = f"""\
schema_version: 1
name: hot rig
engine: sim
sim: {{gpu: RTX 4090, count: 1, time_scale: {K:g}, seed: 1}}
server:
  model: Qwen/Qwen2.5-7B-Instruct
  served-model-name: q7
  max-num-seqs: 16
  max-model-len: 4096
ramp: {{levels: [8, 16], step_seconds: 120, warmup_seconds: 1, prompt_tokens: 128, output_tokens: 64,
       slo: {{ttft_p99: 30.0}}}}
"""
#: the controller's sentence (app.run.safety.thermal_stop_reason), checked against it below
STOP = re.compile(r"safety stop: GPU \d+ reached \d+ °C, within 3 °C of its slowdown temperature \d+ °C")


def test_the_sentence_is_the_controllers():
    bank = SeriesBank()
    bank([Sample(1.0, "gpu0", "temp_gpu_c", 86.0), Sample(1.0, "gpu0", "temp_slowdown_c", 88.0)])
    assert STOP.fullmatch(thermal_stop_reason(bank, 3.0))


def _stored_stop(store: RunStore, run_id: int) -> str:
    run = store.get_run(run_id)
    assert run["status"] == "safety", (run_id, run["status"], (run["summary"] or {}).get("stop_reason"))
    reason = run["summary"]["stop_reason"]
    assert STOP.fullmatch(reason), reason
    return reason


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    pytest.fail(f"the hot sim at {url} did not become ready in {timeout:g} s")


@pytest.mark.timeout(420)
def test_run_ramp_and_tune_stop_for_heat_in_the_controllers_words(tmp_path, dyno_home):
    """``run PROFILE --sim-cooling 2 --sim-ambient-c 45``, ``tune PROFILE … --json F``
    and ``ramp --url`` against ``serve --engine sim … --sim-cooling 2 --sim-ambient-c 45``:
    each stops for heat (exit 1), says so in the controller's words, and its stored run
    has status ``safety`` with that sentence; the tune's JSON has it as its stop reason
    and launches no more after it."""
    prof = tmp_path / "hot.yaml"
    prof.write_text(PROFILE)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    serve = _cli("serve", "--engine", "sim", "--model", "Qwen/Qwen2.5-7B-Instruct", "--served-model-name", "q7",
                 "--max-num-seqs", "16", "--max-model-len", "4096", "--port", str(port), "--sim-gpu", "RTX 4090",
                 "--sim-gpu-count", "1", "--sim-time-scale", f"{K:g}", *HOT, "--quiet-log", "--grace", "5")
    run = _cli("run", str(prof), *HOT, "--json", str(tmp_path / "run.json"))
    tune_json = tmp_path / "tune.json"
    tune = _cli("tune", str(prof), *HOT, "--slo-ttft-p99", "30", "--tp", "1", "--kv-cache-dtypes", "auto",
                "--cuda-graphs", "on", "--mnbt", "2048", "--max-launches", "2", "--max-users", "64",
                "--output-tokens", "512", "--json", str(tune_json))  # ≥ 100 long requests a level: ≈ 40 rig s
    try:
        _wait_healthy(url, serve)
        ramp = _cli("ramp", "--url", url, "--levels", "8,16", "--step-seconds", "120", "--prompt-tokens", "128",
                    "--output-tokens", "64", "--json", str(tmp_path / "ramp.json"))
        outs = {name: (p, *p.communicate(timeout=300)) for name, p in (("ramp", ramp), ("run", run), ("tune", tune))}
    finally:
        for p in (serve, run, tune):
            if p.poll() is None:
                p.send_signal(2)  # Ctrl-C: the server is stopped and checked
        for p in (serve, run, tune):
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    for name, (p, out, err) in outs.items():
        assert "Traceback" not in err, f"{name}:\n{err}"
        assert p.returncode == 1, f"{name} exited {p.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
        assert STOP.search(out), f"{name} did not say why it stopped:\n{out[-3000:]}"
    res = json.loads(tune_json.read_text())
    assert STOP.fullmatch(res["stop_reason"]) and res["safety_stop"] == res["stop_reason"], res["stop_reason"]
    assert res["launches"] == 1 and res["recommendation"] is None
    (launch,) = res["launch_log"]
    assert launch["status"] == "safety" and launch["error"] == res["stop_reason"]
    with RunStore() as store:
        assert _stored_stop(store, launch["run_id"]) == res["stop_reason"]
        runs = {r["name"]: r["id"] for r in store.list_runs()}
        _stored_stop(store, runs["hot rig"])
        _stored_stop(store, runs[f"ramp {url}"])
        # the run's own rig got the heat from its command line; ramp's from the server it attached to
        assert store.get_run(runs["hot rig"])["config"]["argv"][-4:] == [*HOT[:3], "45.0"]


@pytest.mark.long(50)  # seconds on 2 cores: opens an xdist chunk (tests/plugins/order.py)
@pytest.mark.timeout(420)
def test_the_windows_ramp_and_tune_tab_stop_for_heat(main_window, qtbot, dyno_home):
    """The profile's sim: block carries the heat (cooling 2, 45 °C): the form shows it,
    the window's Ramp (the user's Settings, as the window passes them) and the Tune tab
    (which hands the tuner the bare run controller: the controller applies the Settings
    itself) both stop for heat, in the controller's words, in the stored runs."""
    prof = parse_profile(PROFILE.replace(f"seed: 1}}", "seed: 1, cooling: 2, ambient_c: 45}"))
    assert (prof.sim.cooling, prof.sim.ambient_c) == ("2", 45.0)
    ProfileLibrary().save(prof)
    w = main_window
    w.sim_time_scale = K
    assert w.load_profile("hot rig", quiet=True)
    assert w.config.sim_options["cooling"].currentText() == "2" and w.config.sim_options["ambient_c"].text() == "45.0"
    pump(qtbot, lambda: w.plan is not None and not w.planner.busy and not w.planner._timer.isActive(), 30,
         "the profile is planned")
    stops: list[str] = []
    w.controller.safety_stop.connect(stops.append)
    recorded: list[int] = []
    w.controller.run_recorded.connect(recorded.append)
    # the window's Ramp
    w.act_launch.trigger()
    pump(qtbot, lambda: w.controller.state in ("ready", "failed"), 60, "the hot sim becomes ready")
    assert w.controller.state == "ready", w.controller.core.failure_text
    w.act_ramp.trigger()
    pump(qtbot, lambda: bool(recorded), 180, "the window's ramp ends and is recorded")
    assert stops and STOP.fullmatch(stops[0]), stops
    assert _stored_stop(w.run_store(), recorded[0]) == stops[0]
    w.act_stop.trigger()
    pump(qtbot, lambda: w.controller.state == "stopped", 60, "the server stops")
    # the Tune tab: one candidate, two launches allowed; the first one's heat ends the tune
    w.tabs.setCurrentWidget(w.tune)
    t = w.tune
    pump(qtbot, lambda: bool(t.boxes), 30, "the space is planned")
    for field, keep in (("kv_cache_dtype", ["auto"]), ("enforce_eager", [False]), ("max_num_batched_tokens", [2048])):
        for v, box in t.boxes.get(field, {}).items():
            if box.isEnabled():
                box.setChecked(v in keep)
    t.slo_ttft.setValue(30000.0)
    t.output_tokens.setValue(512)  # ≥ 100 long requests a search level: ≈ 40 rig s of load
    t.max_launches.setValue(2)
    pump(qtbot, lambda: t.start_btn.isEnabled(), 30, "the tune can start")
    t.start_btn.click()
    pump(qtbot, lambda: not t.running, 240, "the tune ends")
    res = t.res
    assert res is not None and STOP.fullmatch(res["stop_reason"] or ""), (res or {}).get("stop_reason")
    assert res["launches"] == 1 and res["launch_log"][0]["status"] == "safety"
    assert _stored_stop(w.run_store(), res["launch_log"][0]["run_id"]) == res["stop_reason"]
    assert STOP.search(t.progress.text()), t.progress.text()
