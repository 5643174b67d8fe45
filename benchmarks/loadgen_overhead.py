"""How fast can the load generator consume streams, and what latency does it add?

A local server streams as fast as it can: a raw asyncio protocol (uvloop when
installed) with pre-encoded vLLM-shaped SSE chunks, ``--events-per-write`` events per
write, no JSON work at all. The server is pinned to one core, the client to another;
the server's CPU share is measured during every run and must stay under 50 % (else the
figure measures the server). For each of 64, 256 and 1024 concurrent streams both our
generator (``app.loadgen``) and the peer client — ``vllm bench serve`` from
``.venv-vllm``, run with the metadata shim of docs/vllm-facts.md ("The CPU build") — stream the same
requests from the same server in the same run. Figures: streamed chunks/s (one token
per chunk) and TTFT p99 (= added latency: the server answers at once).

Usage: ``.venv/bin/python benchmarks/loadgen_overhead.py [--levels 64,256,1024]
[--output-tokens 256] [--requests-per-stream 16] [--no-peer]``
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

CHUNK = (b'data: {"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"tiny",'
         b'"choices":[{"index":0,"text":" a","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n')
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 1 << 20}]}).encode()
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: keep-alive\r\n\r\n")
MAXTOK = re.compile(rb'"max_tokens"\s*:\s*(\d+)')


def _hchunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# ---------------------------------------------------------------------------------------
# the server (runs in its own process: ``loadgen_overhead.py --serve PORT_FILE``)

class SSEServer(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server: GET /v1/models, POST /v1/completions."""

    per_write = 32
    _groups: dict[int, bytes] = {}

    def connection_made(self, transport):
        self.t = transport
        self.buf = b""
        self.left = 0
        self.paused = False
        self.loop = asyncio.get_running_loop()

    def data_received(self, data):
        self.buf += data
        self._next()

    def _next(self):
        while self.left == 0:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = self.buf[:i]
            m = re.search(rb"(?i)content-length:\s*(\d+)", head)
            n = int(m.group(1)) if m else 0
            if len(self.buf) < i + 4 + n:
                return
            body = self.buf[i + 4:i + 4 + n]
            self.buf = self.buf[i + 4 + n:]
            if head.startswith(b"GET"):
                self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(MODELS), MODELS))
                continue
            m = MAXTOK.search(body)
            self.left = int(m.group(1)) if m else 16
            self.total = self.left
            self.t.write(HEAD)
            self.loop.call_soon(self._pump)

    def _group(self, k: int) -> bytes:
        g = self._groups.get(k)
        if g is None:
            g = self._groups[k] = _hchunk(CHUNK * k)
        return g

    def _pump(self):
        if self.paused or self.left == 0 or self.t.is_closing():
            return
        k = min(self.per_write, self.left)
        self.left -= k
        if self.left:
            self.t.write(self._group(k))
            self.loop.call_soon(self._pump)
        else:
            usage = (b'data: {"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"tiny",'
                     b'"choices":[],"usage":{"prompt_tokens":16,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                     % (self.total, self.total + 16))
            self.t.write(self._group(k) + _hchunk(usage + b"data: [DONE]\n\n") + b"0\r\n\r\n")
            self._next()

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self.loop.call_soon(self._pump)


def serve(port_file: str, per_write: int) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    SSEServer.per_write = per_write

    async def main():
        srv = await asyncio.get_running_loop().create_server(SSEServer, "127.0.0.1", 0, backlog=4096)
        Path(port_file).write_text(str(srv.sockets[0].getsockname()[1]))
        await asyncio.Event().wait()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------
# the clients

def run_ours(url: str, level: int, n_requests: int, out_tokens: int) -> dict:
    from app.loadgen.generator import run_ramp
    from app.loadgen.spec import RampSpec

    spec = RampSpec(url=url, model="tiny", levels=[level], step_seconds=None, requests_per_level=n_requests,
                    prompt_tokens=16, output_tokens=out_tokens, request_timeout=600)
    res = run_ramp(spec, timeout=900)
    if not res.steps:
        return {"error": f"{res.status}: {res.stop_reason or res.error}"}
    st = res.steps[0]
    fails = sum(1 for r in res.records if not r.ok)
    chunks = sum(r.chunk_offsets.size for r in res.records if r.t_start >= st.window_start)
    return {"chunks_per_s": chunks / st.window_s, "ttft_p99_ms": (st.ttft_p99 or 0) * 1e3,
            "itl_p99_ms": (st.itl_p99 or 0) * 1e3, "failures": fails, "status": res.status,
            "duration_s": st.window_s}


def vllm_shim() -> str:
    d = tempfile.mkdtemp(prefix="vllm-shim-")
    mdir = Path(d) / "vllm-0.32.0+cpu.dist-info"
    mdir.mkdir()
    (mdir / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    return d


def run_peer(port: int, level: int, n_requests: int, out_tokens: int, shim: str) -> dict:
    py = ROOT / ".venv-vllm" / "bin" / "python"
    rdir = tempfile.mkdtemp(prefix="vllm-bench-")
    env = dict(os.environ, PYTHONPATH=shim, HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING")
    argv = [str(py), "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
            "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions", "--model", "tiny",
            "--tokenizer", str(ROOT / "build" / "tiny-llama"), "--dataset-name", "random",
            "--random-input-len", "16", "--random-output-len", str(out_tokens), "--num-prompts", str(n_requests),
            "--max-concurrency", str(level), "--request-rate", "inf", "--ignore-eos", "--disable-tqdm",
            "--percentile-metrics", "ttft,itl", "--metric-percentiles", "99", "--save-result",
            "--result-dir", rdir, "--result-filename", "r.json"]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    f = Path(rdir) / "r.json"
    if p.returncode != 0 or not f.exists():
        return {"error": (p.stderr or p.stdout)[-1500:]}
    r = json.loads(f.read_text())
    return {"chunks_per_s": r["total_output_tokens"] / r["duration"], "ttft_p99_ms": r.get("p99_ttft_ms"),
            "itl_p99_ms": r.get("p99_itl_ms"), "failures": r["num_prompts"] - r["completed"],
            "duration_s": r["duration"]}


class BusyMeter:
    """CPU share (0–1 of one core) of a process over a span of wall time."""

    def __init__(self, pid: int) -> None:
        self.p = psutil.Process(pid)

    def __enter__(self):
        c = self.p.cpu_times()
        self.c0, self.t0 = c.user + c.system, time.monotonic()
        return self

    def __exit__(self, *exc):
        c = self.p.cpu_times()
        self.busy = (c.user + c.system - self.c0) / (time.monotonic() - self.t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--levels", default="64,256,1024")
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--requests-per-stream", type=int, default=16)  # ≥ 1 s of streaming per client
    ap.add_argument("--events-per-write", type=int, default=32)
    ap.add_argument("--no-peer", action="store_true")
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.events_per_write)
        return 0
    ncpu = os.cpu_count() or 1
    server_cpu, client_cpu = ({ncpu - 1}, {0}) if ncpu > 1 else ({0}, {0})
    port_file = tempfile.mktemp(prefix="sse-port-")
    srv = subprocess.Popen([sys.executable, __file__, "--serve", port_file, "--events-per-write",
                            str(a.events_per_write)], preexec_fn=lambda: os.sched_setaffinity(0, server_cpu))
    os.sched_setaffinity(0, client_cpu)  # our generator process inherits it, so does the peer
    shim = vllm_shim()
    try:
        for _ in range(100):
            if Path(port_file).exists() and Path(port_file).read_text():
                break
            time.sleep(0.1)
        port = int(Path(port_file).read_text())
        url = f"http://127.0.0.1:{port}"
        print(f"server pid {srv.pid} on cpu {sorted(server_cpu)}, clients on cpu {sorted(client_cpu)}; "
              f"{a.output_tokens} tokens/request, {a.events_per_write} events per write; "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'streams':>7} {'client':>10} {'chunks/s':>10} {'TTFT p99 ms':>11} {'ITL p99 ms':>10} "
              f"{'server busy':>11} {'fail':>4}")
        rows = []
        for level in [int(x) for x in a.levels.split(",")]:
            n = level * a.requests_per_stream
            clients = [("dyno", lambda: run_ours(url, level, n, a.output_tokens))]
            if not a.no_peer:
                clients.append(("vllm-bench", lambda: run_peer(port, level, n, a.output_tokens, shim)))
            for name, fn in clients:
                with BusyMeter(srv.pid) as bm:
                    r = fn()
                if "error" in r:
                    print(f"{level:>7} {name:>10}  failed: {r['error']}")
                    continue
                # busy over the whole call (includes client start-up idle time): scale to the
                # measured span so the figure is the server's share while streaming
                span = r["duration_s"]
                busy = bm.busy * (time.monotonic() - bm.t0) / span if span else bm.busy
                rows.append((level, name, r, busy))
                print(f"{level:>7} {name:>10} {r['chunks_per_s']:>10.0f} {r['ttft_p99_ms']:>11.1f} "
                      f"{r['itl_p99_ms']:>10.2f} {min(busy, 9.99):>10.0%} {r['failures']:>4}", flush=True)
        by = {(lv, nm): r for lv, nm, r, _ in rows}
        for lv in sorted({lv for lv, *_ in rows}):
            if (lv, "dyno") in by and (lv, "vllm-bench") in by:
                print(f"{lv} streams: dyno / vllm bench chunks/s = "
                      f"{by[(lv, 'dyno')]['chunks_per_s'] / by[(lv, 'vllm-bench')]['chunks_per_s']:.2f}× (one core each)")
    finally:
        srv.terminate()
        srv.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
