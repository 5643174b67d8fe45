"""`vllm-dyno tune` on the real CPU build of vLLM (tiny model): with two launches it
measures the profile's configuration, confirms it with max_num_seqs from the measured
capacity, and recommends flags that were launched and verified (issue 18)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


import pytest

from app.store import RunStore

#: it starts its own vLLM twice and judges request counts, not latency (Makefile: `make test`)
pytestmark = pytest.mark.launches

ROOT = Path(__file__).resolve().parents[2]


def test_tune_the_cpu_build_in_two_launches(tmp_path):
    out = tmp_path / "tune.json"
    r = subprocess.run([sys.executable, "-m", "app.cli", "tune", str(ROOT / "profiles" / "cpu-tiny-llama.yaml"),
                        "--slo-ttft-p99", "1.0", "--prompt-tokens", "16", "--output-tokens", "32", "--mnbt", "2048",
                        "--max-users", "48", "--max-launches", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=1500, cwd=ROOT)
    print(r.stdout[-5000:])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["launches"] == 2 and [x["purpose"] for x in res["launch_log"]] == ["measure", "confirm"]
    assert all(x["status"] == "done" for x in res["launch_log"]), res["launch_log"]
    rec = res["recommendation"]
    assert rec["verified"] and rec["measured"] and rec["users"] >= 1 and rec["output_tps"] > 0
    server = rec["server"]
    assert all(v is not None for v in server.values())
    assert server["max_num_batched_tokens"] == 2048 and server["distributed_executor_backend"] == "uni"
    assert server["max_num_seqs"] <= 48 + 7 or server["max_num_seqs"] == 512  # from the capacity, or kept as measured
    assert rec["sentence"].startswith("1× CPU serves ") and rec["sentence"] in r.stdout
    with RunStore(Path(os.environ["VLLM_DYNO_HOME"]) / "runs.sqlite") as store:
        runs = {x["id"]: x for x in store.list_runs()}
        for x in res["launch_log"]:
            assert runs[x["run_id"]]["name"].startswith("tune 1 · ")
            levels = store.levels(x["run_id"])
            # each level on its request floor, or stopped once its verdict was decided (issue 37)
            assert levels and all(lv["n_measured"] >= 100 or lv.get("stop_reason") == "decided" for lv in levels), [
                (lv["level"], lv["n_measured"], lv.get("stop_reason")) for lv in levels]
