"""A simulated rig's truth over HTTP (``--sim-truth FILE``, issue 35 item 1): the sim
served with a truth is slower where its rule says (steps of 8 decoding sequences pay
20 ms more) and as fast as the model where it does not (one user), and ``/sim/info``
says only that a truth is set. Needs the sim server and the load generator, no vLLM."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from app.config import ServerConfig
from app.planner.plan import Workload
from tests.unit.test_sim_rig_options import rig_plan
from tests.integration.test_sim_server import sim_args, start, stop_and_check

MODEL = "Qwen/Qwen2.5-7B-Instruct"
K = 10.0
TRUTH = "name: secret rig 7\nrules:\n  - when: {decode_batch: {min: 4}}\n    add_step_s: 0.02\n"


def _ramp(url: str, out) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "app.cli", "ramp", "--url", url, "--levels", "1,8",
                        "--step-seconds", "20", "--prompt-tokens", "256", "--output-tokens", "128",
                        "--fixed-lengths", "--json", str(out), "--no-store"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text())["steps"]


def test_a_sim_served_with_a_truth_is_slower_where_the_rule_says_and_hides_it(tmp_path):
    cfg = ServerConfig(model=MODEL, max_model_len=2048, max_num_seqs=64)
    p = rig_plan(cfg, workload=Workload.of(256, 128, (1, 8), length_spread=0.0, step_s=20.0))
    one, eight = (pt.output_tps for pt in p.curve.points)
    f = tmp_path / "truth.yaml"
    f.write_text(TRUTH)
    sup = start(cfg, sim_args(count=1, k=K, extra=("--sim-truth", str(f))))
    try:
        assert sup.wait_ready(60), "\n".join(sup.log_tail())
        with urllib.request.urlopen(sup.url + "/sim/info", timeout=10) as r:
            info = json.loads(r.read())
        assert info["truth"] is True and "perf" not in info
        text = json.dumps(info) + "\n".join(sup.log_tail(200))
        assert "secret rig" not in text and "add_step_s" not in text  # nothing of the truth shown or logged
        steps = _ramp(sup.url, tmp_path / "ramp.json")
    finally:
        stop_and_check(sup)
    m1, m8 = steps[0]["output_tps"], steps[1]["output_tps"]
    assert m1 == pytest.approx(one, rel=0.08), (m1, one)            # one user: no rule holds
    # 8 users: each step of ≥ 4 decodes pays 20 ms more than the model's ≈ 23 ms
    assert m8 < 0.7 * eight, (m8, eight)
    plain_step = p.perf.step_time_decode(8, 256 + 64)
    assert m8 == pytest.approx(eight * plain_step / (plain_step + 0.02), rel=0.15), (m8, eight)
