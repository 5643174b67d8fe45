"""How many concurrent streams can the sim serve on ONE core and keep rig time honest?

Starts ``app.sim.server`` pinned to one CPU core (default: 8× RTX 4090, Llama-3-70B
AWQ, TP 8, time scale 1, max_num_seqs as large as the KV cache allows for the
workload), then for each level N runs N closed-loop streaming users from a client
process pinned to the other cores, and measures over a window:

- pace = rig seconds the engine advanced ÷ (k × wall seconds) — must stay within 5 %;
- behind = how far the engine's clock trails the wall clock at the end (wall s);
- p99 / max lag of step deliveries, steps coalesced (several tokens per write), the
  server's CPU use (% of one core) and the tokens the clients received per second.

Usage: ``.venv/bin/python benchmarks/sim_capacity.py [--levels 250,500,1000,1400]``.
Prints one row per level and the largest passing N. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from app.config import ServerConfig  # noqa: E402
from app.helper_process import helper_argv  # noqa: E402
from app.server.launch import free_port  # noqa: E402
from app.sim import model_adapter as ma  # noqa: E402


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def client_proc(url: str, users: int, prompt: int, output: int, seconds: float, out, cores) -> None:
    """N closed-loop users for ``seconds``; counts tokens received, reads and errors in
    the shared array ``out``."""
    if cores:
        os.sched_setaffinity(0, cores)
    import aiohttp

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def main() -> None:
        body = {"prompt": list(range(prompt)), "max_tokens": output, "ignore_eos": True, "stream": True}
        stop = time.monotonic() + seconds
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as s:
            async def user(i: int) -> None:
                await asyncio.sleep(i * 0.002)  # stagger the first requests a little
                while time.monotonic() < stop:
                    try:
                        async with s.post(url + "/v1/completions", json=body) as r:
                            async for chunk in r.content.iter_any():
                                out[1] += 1
                                out[0] += chunk.count(b'"text"')
                                if time.monotonic() >= stop:
                                    return
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        out[2] += 1
                        await asyncio.sleep(0.1)

            await asyncio.gather(*(user(i) for i in range(users)))

    asyncio.run(main())


def start_sim(args, port: int, max_num_seqs: int) -> subprocess.Popen:
    argv = helper_argv("app.sim.server") + [
        "--model", args.model, "-tp", str(args.count), "--max-num-seqs", str(max_num_seqs),
        "--max-model-len", str(args.max_model_len), "--port", str(port), "--enforce-eager",
        "--sim-gpu", args.gpu, "--sim-gpu-count", str(args.count), "--sim-time-scale", str(args.time_scale)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen(argv, stdout=open(args.log, "w"), stderr=subprocess.STDOUT, env=env,
                         start_new_session=True)
    os.sched_setaffinity(p.pid, {args.server_core})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            get(f"http://127.0.0.1:{port}/sim/info")
            return p
        except OSError:
            if p.poll() is not None:
                raise SystemExit(f"sim exited: see {args.log}")
            time.sleep(0.3)
    p.kill()
    raise SystemExit("sim did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="RTX 4090")
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--model", default="meta-llama/Meta-Llama-3-70B-Instruct-AWQ")
    ap.add_argument("--prompt", type=int, default=100)
    ap.add_argument("--output", type=int, default=200)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--levels", default="250,500,1000,1400")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--settle", type=float, default=20.0, help="wall s before each window")
    ap.add_argument("--max-settle", type=float, default=300.0, help="extra wall s to wait for all N running")
    ap.add_argument("--window", type=float, default=20.0, help="wall s measured per level")
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--log", default="/tmp/sim_capacity.log")
    args = ap.parse_args()

    cfg = ServerConfig(model=args.model, tensor_parallel_size=args.count, max_model_len=args.max_model_len,
                       max_num_seqs=1, enforce_eager=True)
    p = ma.plan_rig(cfg, args.gpu, args.count)
    per_seq = math.ceil((args.prompt + args.output) / ma.BLOCK_SIZE)
    max_seqs = p.num_blocks // per_seq
    levels = [int(x) for x in args.levels.split(",")]
    cores = sorted(set(os.sched_getaffinity(0)) - {args.server_core}) or None
    print(f"rig: {args.count}x {args.gpu}, {args.model}, KV {p.kv_tokens:,} tokens → max_num_seqs {max_seqs} "
          f"for {args.prompt} in / {args.output} out; time scale {args.time_scale}; server on core "
          f"{args.server_core}, clients on {cores}")
    port = free_port()
    sim = start_sim(args, port, max_seqs)
    url = f"http://127.0.0.1:{port}"
    proc = psutil.Process(sim.pid)
    rows = []
    try:
        for n in levels:
            q = mp.Array("d", 3, lock=False)
            c = mp.Process(target=client_proc, args=(url, n, args.prompt, args.output, args.settle + args.max_settle + args.window + 5,
                                                     q, cores))
            c.start()
            t_settle = time.monotonic() + args.settle
            want = min(n, max_seqs)
            while time.monotonic() < t_settle or get(url + "/sim/info")["engine"]["running"] < want:
                if time.monotonic() > t_settle + args.max_settle:
                    break
                time.sleep(1.0)
            a = get(url + "/sim/info?reset=1")["engine"]
            proc.cpu_percent(None)
            c0 = list(q)
            w0 = time.monotonic()
            time.sleep(args.window)
            b = get(url + "/sim/info")["engine"]
            wall = time.monotonic() - w0
            cpu = proc.cpu_percent(None)
            c1 = list(q)
            c.terminate()  # the users stop; their requests are aborted by the server
            c.join(30)
            toks, reads, errs = (c1[i] - c0[i] for i in range(3))
            pace = (b["sim_now_s"] - a["sim_now_s"]) / (args.time_scale * (b["wall_time_s"] - a["wall_time_s"]))
            ok = abs(pace - 1) <= 0.05 and b["behind_s"] <= 0.05 * args.window
            row = dict(n=n, running=b["running"], waiting=b["waiting"], pace=pace, behind=b["behind_s"],
                       p99=b["p99_lag_s"], max=b["max_lag_s"], coalesced=b["coalesced_steps"], steps=b["steps"] - a["steps"],
                       cpu=cpu, tps=toks / wall, tpr=toks / max(reads, 1), errors=int(errs), ok=ok)
            rows.append(row)
            print(f"N={n:5d} running={row['running']:5d} waiting={row['waiting']:4d} pace={pace:6.3f} "
                  f"behind={row['behind']:.3f}s lag p99={row['p99'] * 1e3:6.1f}ms max={row['max'] * 1e3:6.1f}ms "
                  f"steps={row['steps']:5d} coalesced={row['coalesced']:4d} server CPU={cpu:5.1f}% "
                  f"client tok/s={row['tps']:7.0f} tok/read={row['tpr']:.2f} errors={row['errors']} "
                  f"{'PASS' if ok else 'FAIL'}", flush=True)
            time.sleep(3)  # let aborted requests drain
    finally:
        sim.terminate()
        try:
            sim.wait(15)
        except subprocess.TimeoutExpired:
            sim.kill()
    passing = [r["n"] for r in rows if r["ok"]]
    print(f"largest passing N: {max(passing) if passing else 'none'} (within 5 % of the wall clock)")
    coalesce_lines = [l for l in open(args.log) if "coalescing" in l]
    print(f"sim log lines about coalescing: {len(coalesce_lines)}" + (f" — e.g. {coalesce_lines[0].strip()}"
                                                                       if coalesce_lines else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
