"""How long does ``vllm-dyno predict`` take per call, on one core? (issue 34: ≤ 5 s for
1,000 requests.)

For 100, 1,000 and 5,000 requests (``--num-prompts``) of ``vllm bench serve``'s default
random dataset (1024 in / 128 out) against Llama-3.1-8B on one H100 SXM, in three
traffic shapes — every request at once (``--request-rate inf``, vLLM's default), a
closed loop of 16 (``--max-concurrency 16``) and Poisson arrivals at 20 requests/s —
it times:

- ``call``: :func:`app.planner.benchserve.predict_bench` in this process (planning, the
  lengths, the arrivals, the engine run, the figures), best of 3;
- ``cli``: the whole command (``python -m app.cli predict … --json -``: interpreter start,
  imports, the same work), once, as a user runs it.

Everything runs pinned to one CPU core (``os.sched_setaffinity``; the command inherits
it). Usage: ``.venv/bin/python benchmarks/predict_speed.py [--counts 100,1000,5000]``.
Prints one row per count and shape. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL, GPU = "meta-llama/Llama-3.1-8B", "H100 SXM"
SHAPES = {"inf rate": {}, "max conc 16": {"max_concurrency": 16}, "20 req/s": {"request_rate": 20.0}}


def _flags(kw: dict) -> list[str]:
    return [x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="100,1000,5000", help="numbers of requests, e.g. 100,1000,5000")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    from app.planner.benchserve import BenchArgs, predict_bench

    print(f"vllm-dyno predict, {MODEL} on 1x {GPU}, random 1024 in / 128 out, one core")
    print(f"{'requests':>8} {'traffic':<12} {'call s':>7} {'cli s':>7} {'duration s':>11} {'out tok/s':>10}")
    for n in [int(x) for x in args.counts.split(",")]:
        for shape, kw in SHAPES.items():
            bench = BenchArgs(num_prompts=n, **kw)
            best, fig = float("inf"), {}
            for _ in range(3):
                t = time.perf_counter()
                fig = predict_bench(MODEL, GPU, 1, "0.32.0", None, bench, use_calibration=False)
                best = min(best, time.perf_counter() - t)
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "app.cli", "predict", "--model", MODEL, "--gpu", GPU,
                                "--vllm-version", "0.32.0", "--num-prompts", str(n), *_flags(kw), "--json", "-"],
                               cwd=ROOT, capture_output=True, text=True)
            cli = time.perf_counter() - t
            if r.returncode != 0:
                raise SystemExit(f"predict failed ({r.returncode}): {r.stderr}")
            print(f"{n:>8} {shape:<12} {best:>7.2f} {cli:>7.2f} {fig['duration']:>11.1f} "
                  f"{fig['output_throughput']:>10,.0f}")


if __name__ == "__main__":
    main()
