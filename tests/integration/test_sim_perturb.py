"""The hidden "true rig" over HTTP (``--sim-perturb SEED``, issue 18 item 8): the sim
measures what ``app.sim.perturb.true_params`` predicts, not what the planner's defaults
predict, and ``/sim/info`` does not give the parameters away. Needs the sim server and
the load generator, no vLLM."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from app.config import ServerConfig
from app.planner.plan import Workload
from app.sim.perturb import PERTURBED, factors, true_params
from app.sim.server import main as sim_main
from tests.unit.test_sim_rig_options import rig_plan
from tests.integration.test_sim_server import sim_args, start, stop_and_check

MODEL = "Qwen/Qwen2.5-7B-Instruct"
K = 10.0


def _seed() -> int:
    """The first seed whose η_mem factor is far below 1: a memory-bound 7B model's
    throughput follows η_mem, so the true rig is clearly slower than the planner thinks."""
    return next(s for s in range(1, 1000) if factors(s)["eta_mem"] < 0.75)


def test_a_negative_seed_is_refused():
    assert sim_main(["--model", MODEL, "--sim-perturb", "-2"]) == 2


def test_the_perturbed_sim_measures_the_true_rig_and_hides_it(tmp_path):
    seed = _seed()
    cfg = ServerConfig(model=MODEL, max_model_len=2048, max_num_seqs=64)
    w = Workload.of(256, 128, (8,), length_spread=0.0, step_s=20.0)
    p0 = rig_plan(cfg, workload=w)
    pt = rig_plan(cfg, workload=w, params=true_params(p0.perf.params, seed))
    planned, true = p0.curve.points[0].output_tps, pt.curve.points[0].output_tps
    assert abs(true - planned) > 0.2 * true  # the perturbation matters here
    sup = start(cfg, sim_args(count=1, k=K, extra=("--sim-perturb", str(seed))))
    try:
        assert sup.wait_ready(60), "\n".join(sup.log_tail())
        with urllib.request.urlopen(sup.url + "/sim/info", timeout=10) as r:
            info = json.loads(r.read())
        assert info["perturbed"] is True and info["perturb_seed"] == seed and "perf" not in info
        text = json.dumps(info) + "\n".join(sup.log_tail(200))
        tp = true_params(p0.perf.params, seed)
        assert not any(repr(getattr(tp, n)) in text for n in PERTURBED)  # no true value shown or logged
        out = tmp_path / "ramp.json"
        r = subprocess.run([sys.executable, "-m", "app.cli", "ramp", "--url", sup.url, "--levels", "8",
                            "--step-seconds", "20", "--prompt-tokens", "256", "--output-tokens", "128",
                            "--fixed-lengths", "--json", str(out), "--no-store"], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        stop_and_check(sup)
    measured = json.loads(out.read_text())["steps"][0]["output_tps"]
    assert measured == pytest.approx(true, rel=0.06), (measured, true, planned)
    assert abs(measured - planned) > 0.15 * measured, (measured, true, planned)


def test_the_seed_travels_from_a_profile_and_from_serve(capsys):
    """A profile's ``sim: {perturb: N}`` and ``vllm-dyno serve --engine sim
    --sim-perturb N`` reach the sim server as --sim-perturb N; a bad seed is a CLI error."""
    from app.cli import build_parser  # deferred: the CLI only for this test
    from app.cli.common import sim_args_from
    from app.profiles.io import parse_profile
    from app.sim.server import build_parser as sim_parser

    prof = parse_profile("name: t\nengine: sim\nserver: {model: m}\nsim: {gpu: RTX 4090, count: 2, perturb: 7}\n")
    assert sim_parser().parse_known_args(["--model", "m", *prof.sim.argv()])[0].sim_perturb == 7
    a = build_parser().parse_args(["serve", "--model", "m", "--engine", "sim", "--sim-perturb", "7"])
    assert sim_args_from(a) == ["--sim-perturb", "7"]
    assert sim_parser().parse_known_args(["--model", "m"])[0].sim_perturb == 0  # absent: none
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--model", "m", "--engine", "sim", "--sim-perturb", "-1"])
    assert e.value.code == 2 and "give a seed ≥ 1" in capsys.readouterr().err
