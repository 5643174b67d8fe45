"""`vllm-dyno predict` as a user runs it (a process): ``--json -`` writes ``vllm bench
serve --save-result``'s keys, ``--compare`` lays the recorded CPU-build result
(tests/cases/benchserve/) beside the prediction, a file measured with other traffic is
refused with exit 2, and ``calibrate --bench-result`` fits to the same file, after which
``predict`` uses the fit. No vLLM is launched: the recording is replayed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.planner.benchserve import BENCH_KEYS

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "cases" / "benchserve" / "cpu-tiny-llama-c4.json"
#: the server and benchmark of the recording (tests/cases/README.md)
SERVER = ["--model", str(ROOT / "tests" / "cases" / "tiny-llama"), "--served-model-name", "tiny", "--max-num-seqs", "8",
          "--distributed-executor-backend", "uni", "--env", "VLLM_CPU_KVCACHE_SPACE=1", "--env", "HF_HUB_OFFLINE=1",
          "--env", "VLLM_CPU_OMP_THREADS_BIND=0", "--env", "VLLM_ENABLE_V1_MULTIPROCESSING=0", "--gpu", "CPU",
          "--vllm-version", "0.32.0"]
BENCH = ["--random-input-len", "32", "--random-output-len", "32", "--num-prompts", "40", "--max-concurrency", "4"]


def dyno(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "VLLM_DYNO_HOME": str(home)})


def test_predict_json_and_compare_on_the_recorded_result(dyno_home):
    r = dyno("predict", *SERVER, *BENCH, "--json", "-", home=dyno_home)
    assert r.returncode == 0, r.stderr
    pred = json.loads(r.stdout)
    assert set(BENCH_KEYS) <= set(pred) and pred["completed"] == 40
    assert (pred["num_prompts"], pred["request_rate"], pred["burstiness"], pred["max_concurrency"]) == (40, "inf", 1.0, 4)
    assert all(isinstance(pred[k], (int, float)) and pred[k] > 0 for k in BENCH_KEYS)

    r = dyno("predict", *SERVER, *BENCH, "--compare", str(RECORDED), home=dyno_home)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for label in BENCH_KEYS.values():  # every figure: measured, predicted, error
        row = next(ln for ln in lines if ln.strip().startswith(label + ":"))
        assert row.rstrip().endswith("%"), row
    assert "the 40 requests of" in r.stdout  # the file's own lengths (--save-detailed)
    print("\n" + r.stdout)

    r = dyno("predict", *SERVER, *BENCH, "--compare", str(RECORDED), "--json", "-", home=dyno_home)
    cmp = json.loads(r.stdout)["compare"]["figures"]
    measured = json.loads(RECORDED.read_text())
    assert all(cmp[k]["measured"] == measured[k] for k in BENCH_KEYS)


def test_a_mismatched_file_is_refused_with_exit_2(dyno_home):
    r = dyno("predict", *SERVER, "--random-input-len", "32", "--num-prompts", "40", "--compare", str(RECORDED),
             home=dyno_home)
    assert r.returncode == 2
    assert "max_concurrency 4" in r.stderr and "give --max-concurrency 4" in r.stderr and "Traceback" not in r.stderr


def test_calibrate_from_the_result_file_then_predict_with_it(dyno_home):
    r = dyno("calibrate", "--bench-result", str(RECORDED), *SERVER, home=dyno_home)
    assert r.returncode == 0, r.stderr
    assert "calibrated on 1 vllm bench serve result" in r.stdout and "saved to" in r.stdout
    r = dyno("predict", *SERVER, *BENCH, "--compare", str(RECORDED), "--json", "-", home=dyno_home)
    figs = json.loads(r.stdout)["compare"]["figures"]
    assert abs(figs["output_throughput"]["error_pct"]) < 15  # the fitted level, through the full run
