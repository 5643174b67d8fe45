"""Fidelity of the sim against the reference curves of docs/perf-model.md, the seed
scenario, and the time-scale invariance check. Prints tables; asserts nothing.

- ``offline`` (default): closed-loop ramps in rig time through the sim's own scheduler
  and step model (app.engine.offline) — the same code the server runs, without HTTP.
- ``--http``: the time-scale check through the real stack: the sim started by the
  Supervisor at time scale 1 and 10, ``vllm-dyno ramp`` against it; the ramp command
  itself reports a time-scaled sim in rig time (wall times × k, throughput ÷ k).

Usage: ``.venv/bin/python benchmarks/sim_fidelity.py [--http]``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import ServerConfig  # noqa: E402
from app.helper_process import helper_argv  # noqa: E402
from app.sim import model_adapter as ma  # noqa: E402
from app.engine.offline import sim_level  # noqa: E402


def curve(cfg: ServerConfig, gpu: str, count: int, levels, prompt: int, output: int, duration=180.0, warmup=60.0):
    p = ma.plan_rig(cfg, gpu, count)
    sm = ma.StepModel(p)
    return [sim_level(p, sm, u, prompt, output, duration, warmup) for u in levels]


def table(title: str, levels, ref, got, note: str = "") -> None:
    print(f"\n{title}" + (f"  ({note})" if note else ""))
    print(f"{'users':>6} {'reference':>10} {'sim':>8} {'error':>7} {'TTFT mean s':>12} {'ITL ms':>7}")
    for u, r, g in zip(levels, ref, got):
        err = "" if not isinstance(r, (int, float)) else f"{100 * (g.throughput - r) / r:+6.1f}%"
        print(f"{u:>6} {str(r):>10} {g.throughput:8.0f} {err:>7} {g.ttft_mean:12.2f} {1e3 * g.itl_mean:7.1f}")


def offline() -> None:
    lv = [1, 4, 16, 64]
    for pr, out in ((512, 128), (1024, 256)):
        got = curve(ServerConfig(model="meta-llama/Meta-Llama-3-8B-Instruct"), "H100 SXM", 1, lv, pr, out)
        table("H100 SXM, Llama-3-8B bf16 (vLLM defaults)", lv, [122, 580, 1384, 1312], got,
              f"workload not published; assumed {pr} in / {out} out")
    lv = [4, 8, 16, 32, 48]
    for pr, out in ((512, 128), (1024, 256)):
        got = curve(ServerConfig(model="mistralai/Mistral-7B-Instruct-v0.3", max_model_len=8192), "RTX 4090", 1, lv,
                    pr, out)
        table("RTX 4090, Mistral-7B bf16", lv, [210, 377, 644, 975, 1190], got,
              f"workload not published; assumed {pr} in / {out} out")
    lv = [1, 10, 30]
    m = "meta-llama/Meta-Llama-3-70B-Instruct-AWQ"
    g4 = curve(ServerConfig(model=m, tensor_parallel_size=4), "RTX 5090", 4, lv, 512, 128)
    g8 = curve(ServerConfig(model=m, tensor_parallel_size=8), "RTX 5090", 8, lv, 512, 128)
    print("\nSeed scenario: Llama-3-70B AWQ, 512 in / 128 out, closed-loop users, output tok/s")
    print(f"{'users':>6} {'article 4x':>11} {'sim 4x':>8} {'article 8x':>11} {'sim 8x':>8} {'TTFT 4x/8x s':>14}")
    for u, a4, a8, x, y in zip(lv, (37, 162, "OOM"), (39, 307, 583), g4, g8):
        print(f"{u:>6} {str(a4):>11} {x.throughput:8.0f} {str(a8):>11} {y.throughput:8.0f} "
              f"{x.ttft_mean:6.2f}/{y.ttft_mean:.2f}")
    p4 = ma.plan_rig(ServerConfig(model=m, tensor_parallel_size=4), "RTX 5090", 4)
    print(f"  4x RTX 5090: {p4.weights_bytes / ma.GIB:.1f} GiB weights per card, {p4.kv_tokens:,} KV tokens "
          f"(30 users x 640 tokens need {30 * 640:,}) — no OOM at 30 users")


def http(levels: str, k_values=(1.0, 10.0), rig_step_s: float = 120.0, rig_warmup_s: float = 40.0) -> None:
    from app.server.supervisor import Supervisor

    m = "meta-llama/Meta-Llama-3-70B-Instruct-AWQ"
    cfg = ServerConfig(model=m, served_model_name="llama70", tensor_parallel_size=8, max_num_seqs=64,
                       max_model_len=4096, enforce_eager=True)
    res = {}
    for k in k_values:
        sup = Supervisor(cfg, engine="sim", sim_args=["--sim-gpu", "RTX 4090", "--sim-gpu-count", "8",
                                                       "--sim-time-scale", str(k)], startup_timeout=120)
        sup.start()
        try:
            assert sup.wait_ready(120), sup.failure and sup.failure.reason
            with tempfile.TemporaryDirectory() as d:
                out = Path(d) / "ramp.json"
                subprocess.run(helper_argv("app.cli") + [
                    "ramp", "--url", sup.url, "--levels", levels, "--step-seconds", str(rig_step_s),
                    "--warmup-seconds", str(rig_warmup_s), "--prompt-tokens", "128", "--output-tokens", "256",
                    "--json", str(out), "--no-store"], check=True, stdout=subprocess.DEVNULL)
                doc = json.loads(out.read_text())
                # `vllm-dyno ramp` works in rig seconds against a time-scaled sim (steps run ÷ k)
                assert doc["summary"]["time_scale"] == k, doc["summary"].get("time_scale")
                res[k] = doc["steps"]
        finally:
            left = sup.stop()
            assert not left, left
    print("\nTime-scale check: 8x RTX 4090, Llama-3-70B AWQ, max_num_seqs 64, 128 in / 256 out (rig units)")
    ks = list(res)
    print(f"{'users':>6} " + " ".join(f"{'tok/s k=' + str(k):>12} {'TTFT s k=' + str(k):>12}" for k in ks)
          + f" {'tok/s diff':>10}")
    for i, st in enumerate(res[ks[0]]):
        row = [(s[i]["output_tps"], s[i]["ttft_mean"] or 0) for s in (res[k] for k in ks)]
        diff = 100 * (row[-1][0] - row[0][0]) / row[0][0] if row[0][0] else float("nan")
        print(f"{st['level']:>6.0f} " + " ".join(f"{a:12.1f} {b:12.2f}" for a, b in row) + f" {diff:+9.1f}%")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--http", action="store_true", help="also run the time-scale check through HTTP (minutes)")
    ap.add_argument("--levels", default="1,16,64,96")
    ap.add_argument("--rig-step-s", type=float, default=120.0)
    a = ap.parse_args()
    offline()
    if a.http:
        http(a.levels, rig_step_s=a.rig_step_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
