"""A tune against the HTTP sim served with a truth (``tune --engine sim --sim-truth FILE``,
issue 35 item 3): the tuner launches the sim with the truth it never reads, measures over
HTTP, and its pick is the best of ``tune --grid --offline`` under the same truth — the
exhaustive grid of the same space on the sim's engine without HTTP. The truth makes data
parallel replicas pay 20 ms a step more than the model allows (it did not invert the two
layouts' order on this case: TP4 × DP2 stays ahead, 25 users). Small: two candidates, the
sim at 10× its clock."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main

ROOT = Path(__file__).resolve().parents[2]

AWQ70 = "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"
TRUTH = ("name: replicas pay\nrules:\n  - when: {data_parallel_size: {min: 2}}\n    add_step_s: 0.02\n"
         "    scale: {t_cpu_s: 2.0}\n")
SPACE = ["--engine", "sim", "--sim-gpu", "RTX 4090", "--sim-gpu-count", "8", "--model", AWQ70,
         "--served-model-name", "llama70", "--quantization", "awq_marlin", "--max-model-len", "8192",
         "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.1", "--tp", "8,4", "--pp", "1", "--kv-cache-dtypes", "auto",
         "--cuda-graphs", "on", "--mnbt", "2048"]


@pytest.mark.long(150)  # seconds on 2 cores: opens an xdist chunk (tests/plugins/order.py)
def test_a_tune_over_http_under_a_truth_picks_the_grids_best(tmp_path):
    truth = tmp_path / "truth.yaml"
    truth.write_text(TRUTH)
    env = dict(os.environ, VLLM_DYNO_HOME=str(tmp_path / "home"))
    grid, out = tmp_path / "grid.json", tmp_path / "tune.json"
    g = subprocess.run([sys.executable, "-m", "app.cli", "tune", *SPACE, "--sim-truth", str(truth), "--grid",
                        "--offline", "--json", str(grid)], env=env, capture_output=True, text=True, timeout=300)
    assert g.returncode == 0, g.stdout[-3000:] + g.stderr[-3000:]
    rows = {r["key"]: r for r in json.loads(grid.read_text())["candidates"]}
    assert len(rows) == 2 and all(r["true_users"] for r in rows.values())
    best = max(rows, key=lambda k: rows[k]["true_users"])
    other = next(k for k in rows if k != best)
    assert rows[best]["true_users"] > 1.15 * rows[other]["true_users"], rows  # a pick that can be wrong
    assert all(r["searches"] >= 1 for r in rows.values())

    t = subprocess.run([sys.executable, "-m", "app.cli", "tune", *SPACE, "--sim-truth", str(truth),
                        "--sim-time-scale", "10", "--max-launches", "3", "--grace", "5", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert t.returncode == 0, t.stdout[-3000:] + t.stderr[-3000:]
    res = json.loads(out.read_text())
    rec = res["recommendation"]
    assert rec["key"] == best, (rec["key"], rows)
    assert res["launches"] <= 3
    # what the tuner measured over HTTP agrees with the offline grid within the searches' resolution
    measured = {c["key"]: c["measured_users"] for c in res["candidates"] if c["measured_users"] is not None}
    assert measured[best] == pytest.approx(rows[best]["true_users"], rel=0.15, abs=1.5), (measured, rows)
    assert "replicas pay" not in t.stdout  # the truth is the sim's, never shown


def test_the_offline_grid_measures_every_candidate_under_the_truth_deterministically(dyno_home, tmp_path):
    argv = ["tune", "--model", "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4", "--quantization",
            "awq_marlin", "--max-model-len", "8192", "--engine", "sim", "--sim-gpu", "RTX 4090", "--sim-gpu-count",
            "8", "--sim-truth", str(ROOT / "resources/truths/pcie-4090-allreduce.yaml"), "--slo-ttft-p99", "2",
            "--slo-tpot-p99", "0.1", "--tp", "1,4,8", "--pp", "1", "--kv-cache-dtypes", "auto", "--cuda-graphs", "on",
            "--mnbt", "2048", "--grid", "--offline", "--json"]
    outs = []
    for i in range(2):
        assert main([*argv, str(tmp_path / f"g{i}.json")]) == 0
        outs.append(json.loads((tmp_path / f"g{i}.json").read_text()))
    for o in outs:  # the timings vary run to run; the figures are seeded
        assert o.pop("cpu_seconds") >= 0 and o.pop("wall_seconds") >= 0
    assert outs[0] == outs[1]  # seeded: the same figures every time
    g = outs[0]
    assert g["mode"] == "grid"
    rows = {r["key"].split(" · ")[0]: r for r in g["candidates"]}
    assert set(rows) == {"TP1 PP1 DP8", "TP4 PP1 DP2", "TP8 PP1 DP1"}
    assert rows["TP1 PP1 DP8"]["true_users"] is None and "weights_do_not_fit" in rows["TP1 PP1 DP8"]["error"]
    assert rows["TP8 PP1 DP1"]["server"]["tensor_parallel_size"] == 8
    assert rows["TP4 PP1 DP2"]["true_users"] > rows["TP8 PP1 DP1"]["true_users"] > 0
    assert g["best"]["key"] == rows["TP4 PP1 DP2"]["key"]
    for r in (rows["TP4 PP1 DP2"], rows["TP8 PP1 DP1"]):  # the mean of enough searches: 1 user ≤ 2 % of it
        assert r["searches"] >= math.ceil(1 / (0.02 * r["true_users"]) - 1e-9), r
        assert r["users_low"] <= r["true_users"] <= r["users_high"]
