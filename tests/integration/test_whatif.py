"""Four cards or eight? (issue 17 item 5): a recorded run's verdict predicted on other
counts and kinds of cards — refusals without processes, then a capacity search recorded
against the simulated rig and its what-if through the core, the CLI and the Compare tab."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from app.engine.steptime import PerfParams
from app.loadgen.spec import SLO
from app.planner.calibrate import FIT_DEFAULT
from app.settings import Pricing
from app.store import RunStore
from app.telemetry.derived import cost_per_mtok
from app.whatif import WhatIfError, transfer_params, what_if
from tests.plugins.qt import pump
from tests.plugins.shared import once_per_run

SIM = """\
schema_version: 1
name: sim 4x5090
engine: sim
sim: {gpu: RTX 5090, count: 4, time_scale: 10, seed: 1}
server:
  model: hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4
  served-model-name: llama-3-70b-awq
  tensor-parallel-size: 4
  quantization: awq_marlin
  max-model-len: 8192
  max-num-seqs: 64
  gpu-memory-utilization: 0.92
  disable-custom-all-reduce: true
ramp: {max_level: 64, prompt_tokens: 512, output_tokens: 128, slo: {ttft_p99: 2.0, tpot_p99: 0.06}}
hardware: {gpu: RTX 5090, count: 4}
"""


# ------------------------------------------------------------------ no processes
def _record(store, *, hardware=True, mode="concurrency", slo=True, profile=True):
    from app.profiles import parse_profile

    spec = {"mode": mode, "prompt_tokens": 512, "output_tokens": 128, "levels": [1, 2],
            "slo": {"ttft_p99": 2.0} if slo else {}}
    cfg = {"profile": parse_profile(SIM).to_data()} if profile else {}
    rid = store.create_run("r", "sim", config=cfg, spec=spec)
    store.add_level(rid, {"idx": 0, "level": 1, "t_start": 0, "t_end": 10, "window_start": 0, "window_end": 10,
                          "window_s": 10, "n_measured": 3, "n_ok": 3, "output_tps": 40.0, "ttft_p99": 0.5})
    hw = {"gpu": "RTX 5090", "count": 4} if hardware else None
    store.finish_run(rid, "done", summary={"hardware": hw, "time_scale": 1.0})
    return rid


@pytest.mark.parametrize("kw, words", [
    (dict(hardware=False), "recorded no cards"),
    (dict(profile=False), "no server options"),
    (dict(mode="rate"), "rate ramp"),
    (dict(slo=False), "had no SLO"),
])
def test_runs_it_cannot_use_say_why(tmp_path, kw, words):
    with RunStore(tmp_path / "runs.sqlite") as store:
        rid = _record(store, **kw)
        with pytest.raises(WhatIfError, match=words):
            what_if(store, rid, [("RTX 5090", 8)])
        with pytest.raises(WhatIfError, match="no run 99"):
            what_if(store, 99, [])
        if "slo" in kw:  # an SLO given for the what-if is judged instead
            wi = what_if(store, rid, [], slo=SLO(ttft_p99=2.0))
            assert wi.slo == {"ttft_p99": 2.0} and wi.rows[0].measured


def test_unknown_card_is_named(tmp_path):
    with RunStore(tmp_path / "runs.sqlite") as store:
        rid = _record(store)
        with pytest.raises(WhatIfError, match="'RTX 9999'"):
            what_if(store, rid, [("RTX 9999", 4)])


def test_a_calibration_carries_over_as_corrections():
    a = PerfParams(eta_mem=0.6, eta_compute=0.5, t_cpu_s=0.002, t_cpu_seq_s=2e-5, t_request_s=0.005,
                   allreduce_alpha_s=60e-6, link_gbs=16.0)
    b = replace(a, eta_mem=0.75, allreduce_alpha_s=25e-6, link_gbs=900.0)
    cal = replace(a, eta_mem=0.48, t_cpu_s=0.003, source="calibrated on 5 levels")
    got = transfer_params(cal, a, b)
    assert got.eta_mem == pytest.approx(0.75 * 0.8) and got.t_cpu_s == pytest.approx(0.003)
    assert (got.allreduce_alpha_s, got.link_gbs) == (25e-6, 900.0)  # the new cards' links
    assert all(getattr(got, n) == pytest.approx(getattr(b, n) * getattr(cal, n) / getattr(a, n)) for n in FIT_DEFAULT)
    assert "carried over" in got.source


# ------------------------------------------------------------------ a run recorded against the sim
def _record_sim_run(home):
    """A capacity search (TTFT p99 ≤ 2 s, TPOT p99 ≤ 60 ms; about 12 users) recorded by `vllm-dyno run`'s
    ProfileRun against a simulated 4× RTX 5090 at 10× time in ``home``'s store: (home, run id)."""
    from app.profiles import parse_profile  # deferred: the run layer only for the recording
    from app.run.profile_run import ProfileRun  # deferred: as above

    with RunStore(home / "runs.sqlite") as store:
        res = ProfileRun(parse_profile(SIM), store=store, startup_timeout=120, grace=5, telemetry=False,
                         ramp_overrides={"search": {"start": 8}, "requests_per_level": 100,
                                         "step_seconds": 300}).run()
    assert res.ok, res.reason
    return home, res.run_id


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    """The recorded capacity search (:func:`_record_sim_run`), recorded once per test run
    (tests/plugins/shared.py: xdist's workers share it; it was recorded once per worker
    that ran one of these tests) and copied into a home of this module's own: (home, run id)."""
    shared, rid = once_per_run(tmp_path_factory, "whatif-sim-run", _record_sim_run)
    home = tmp_path_factory.mktemp("whatif-home")
    shutil.copytree(shared, home, dirs_exist_ok=True)
    return home, rid


def test_what_if_on_a_sim_run(sim_run):
    """The measured run and the prediction for the same cards agree within the
    calibration's accuracy; 8 cards predict more users at the SLO than 4; TP 4 × DP 2
    about twice; the cost is app.telemetry.derived.cost_per_mtok of each row."""
    home, rid = sim_run
    pricing = Pricing(gpu_hour=1.2)
    with RunStore(home / "runs.sqlite") as store:
        wi = what_if(store, rid, [("RTX 5090", 8), ("RTX 4090", 4)], pricing)
    meas, twin, *rest = wi.rows
    assert meas.measured and not twin.measured and twin.gpus == meas.gpus == 4
    assert wi.params_source.startswith("the sim's") and wi.accuracy and wi.accuracy_pct < 5
    # same cards: users within 15 % or inside the measured interval; output tok/s within the
    # accuracy at that level (the engine re-running it) plus the spread of another draw of
    # 100 requests of ±25 % lengths (3 %)
    assert abs(twin.users - meas.users) <= 0.15 * meas.users or meas.users <= twin.users <= meas.next_users
    if twin.users == meas.users:
        at = next(a for a in wi.accuracy if a.users == meas.users)
        assert abs(twin.output_tps - meas.output_tps) / meas.output_tps * 100 <= abs(at.tps_error_pct) + 3
    by = {(r.gpu, r.gpus, r.layout_text): r for r in rest}
    tp8 = by[("RTX 5090", 8, "TP 8")]
    dp2 = by[("RTX 5090", 8, "TP 4 × DP 2")]
    slow = by[("RTX 4090", 4, "TP 4")]
    # two replicas serve about twice the users (1.7×: requests are spread over the replicas one by
    # one, so one replica queues a little more than a lone server at the same share)
    assert tp8.users > twin.users and dp2.users >= 1.7 * twin.users
    assert slow.users < twin.users  # the slower card serves fewer
    assert dp2.scaling_efficiency == pytest.approx((dp2.output_tps / twin.output_tps) / 2)
    for r in wi.rows:
        assert (r.cost_per_mtok_rented, r.cost_per_mtok_energy) == cost_per_mtok(r.output_tps, r.gpus, None, pricing)
    text = wi.table()
    assert "8× RTX 5090 (predicted)" in text and "TP 4 × DP 2" in text and "accuracy" in text


def test_cli_plan_from_run(sim_run):
    home, rid = sim_run
    env = {**__import__("os").environ, "VLLM_DYNO_HOME": str(home)}
    cmd = [sys.executable, "-m", "app.cli", "plan", "--from-run", str(rid), "--gpu", "RTX 5090", "--count", "4,8"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert f"run #{rid}" in r.stdout and "8× RTX 5090 (predicted)" in r.stdout
    j = json.loads(subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=300, env=env).stdout)
    assert j["run_id"] == rid and j["rows"][0]["measured"] and j["accuracy_pct"] is not None
    assert {(x["gpus"], x["layout"]["tensor_parallel_size"]) for x in j["rows"]} >= {(4, 4), (8, 8), (8, 4)}
    bad = subprocess.run([sys.executable, "-m", "app.cli", "plan", "--from-run", "4242"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "no run 4242" in bad.stderr
    many = subprocess.run([sys.executable, "-m", "app.cli", "plan", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu",
                           "RTX 4090", "--count", "1,2"], capture_output=True, text=True, timeout=120, env=env)
    assert many.returncode == 2 and "--from-run" in many.stderr


def test_compare_tab_adds_what_if_rows(gui_guard, qtbot, sim_run):
    from widgets.compare_view import CompareView

    home, rid = sim_run
    store = RunStore(home / "runs.sqlite")
    try:
        v = CompareView(lambda: store)
        qtbot.addWidget(v)
        v.show()
        pump(qtbot, lambda: v._loaded, 5, "runs listed when shown")
        v.whatif_run.setCurrentIndex(v.whatif_run.findData(rid))
        v.whatif_gpu.setCurrentText("RTX 5090")
        v.whatif_count.setValue(8)
        v.add_what_if()
        pump(qtbot, lambda: v.whatif is not None, 60, "the what-if predicted")
        rows = [v.whatif_table.item(i, 0).text() for i in range(v.whatif_table.rowCount())]
        assert rows[0] == f"4× RTX 5090 (measured #{rid})" and rows.count("8× RTX 5090 (predicted)") == 2
        assert "accuracy" in v.whatif_msg.text()
        v.whatif_thread.join(5)
        v.clear_what_if()
        assert v.whatif_table.rowCount() == 0
    finally:
        store.close()
