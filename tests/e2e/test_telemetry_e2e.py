"""Telemetry against the real CPU vLLM (shared ``vllm_server``): /metrics idle and under
load, the generation-token rate against the tokens the load really received, the
server tree's RSS, the run store, and the ``vllm-dyno telemetry`` table."""
from __future__ import annotations

import asyncio
import json
import subprocess
import time

import aiohttp
import numpy as np
import pytest

from app.clock import SessionClock
from app.helper_process import helper_argv
from app.store import RunStore
from app.telemetry.http_source import fetch_text
from app.telemetry.hub import Telemetry
from app.telemetry.metrics_parse import parse_metrics
from app.telemetry.nvml_source import NvmlSource


CONCURRENCY = 6
LOAD_SECONDS = 30.0


async def _stream(session, url, clock, received, stop_at):
    body = {"model": "tiny", "prompt": "The quick brown fox jumps over the lazy dog", "max_tokens": 64,
            "ignore_eos": True, "stream": True, "temperature": 0.0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    while clock.now() < stop_at:
        async with session.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            seen = 0
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    n = usage["completion_tokens"] - seen
                    seen = usage["completion_tokens"]
                else:
                    n = sum(1 for c in chunk.get("choices", []) if c.get("text"))
                    seen += n
                if n > 0:
                    received.append((clock.now(), n))


async def _load(url, clock, received, metrics_during):
    stop_at = clock.now() + LOAD_SECONDS
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks = [asyncio.create_task(_stream(session, url, clock, received, stop_at)) for _ in range(CONCURRENCY)]
        await asyncio.sleep(5)
        for _ in range(20):  # capture /metrics under load
            async with session.get(url + "/metrics") as r:
                text = await r.text()
            if (parse_metrics(text).total("num_requests_running") or 0) > 0:
                metrics_during.append(text)
                break
            await asyncio.sleep(0.5)
        await asyncio.gather(*tasks)


def test_telemetry_under_real_load(vllm_server, tmp_path):
    url = vllm_server.url
    idle = parse_metrics(fetch_text(url + "/metrics", 10))
    assert idle.total("num_requests_running") == 0 and idle.total("num_requests_waiting") == 0
    assert idle.mean("kv_cache_usage_perc") is not None  # new name on 0.32
    assert idle.counter("generation_tokens") is not None
    assert idle.histogram("time_to_first_token_seconds") is not None

    clock = SessionClock()
    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run("telemetry-e2e", "vllm", clock_wall0=clock.wall0)
        tel = Telemetry(clock=clock, gpu_source=NvmlSource(), metrics_url=url, pgid=vllm_server.pgid,
                        store=store, run_id=run)
        received: list[tuple[float, int]] = []
        during: list[str] = []
        tel.start()
        try:
            t_load0 = clock.now()
            asyncio.run(_load(url, clock, received, during))
            t_load1 = clock.now()
            time.sleep(1.0)
        finally:
            tel.stop()

        # every token the load received is in the counter (idle before, idle after)
        after = parse_metrics(fetch_text(url + "/metrics", 10)).counter("generation_tokens")
        total_received = sum(n for _, n in received)
        print(f"\ngeneration_tokens_total grew by {after - idle.counter('generation_tokens'):.0f}; "
              f"the load received {total_received} tokens")
        assert after - idle.counter("generation_tokens") == pytest.approx(total_received, rel=0.02)
        assert tel.gpu.status.state != "ok" or tel.gpu.latest  # no GPU here: a state, no crash
        # /metrics captured under load parses and shows the load
        assert during, "no /metrics capture with running > 0 during the load"
        busy = parse_metrics(during[0])
        assert busy.total("num_requests_running") > 0
        assert busy.counter("generation_tokens") > idle.counter("generation_tokens")

        bank = tel.bank
        t_run, running = bank.get("metrics", "running")
        assert running[(t_run > t_load0) & (t_run < t_load1)].max() > 0

        # generation-token rate vs the tokens the load received, over the same steady window
        t, g = bank.get("metrics", "generation_tokens_total")
        win = (t >= t_load0 + 4.0) & (t <= t_load1 - 2.0)
        ta, tb = t[win][0], t[win][-1]
        assert tb - ta > 10
        scraped = (g[win][-1] - g[win][0]) / (tb - ta)
        got = sum(n for tr, n in received if ta < tr <= tb) / (tb - ta)
        tr, rates = bank.get("metrics", "generation_tokens_per_s")
        mean_rate = float(np.nanmean(rates[(tr > ta) & (tr <= tb)]))
        print(f"\ngeneration tokens/s: /metrics {scraped:.1f}, load received {got:.1f} "
              f"(window {tb - ta:.1f} s, {len(received)} chunks); mean of rate samples {mean_rate:.1f}")
        assert got > 0
        assert abs(scraped - got) / got < 0.15

        # the host sampler sees the server tree
        _, rss = bank.get("server", "rss_bytes")
        _, nproc = bank.get("server", "processes")
        assert rss.max() > 100 * 2**20 and nproc.max() >= 2
        print(f"server tree: {int(nproc.max())} processes, RSS {rss.max() / 2**30:.2f} GiB")

        # written to the run store
        assert store.samples(run, "metrics", "running")
        assert store.samples(run, "server", "rss_bytes")
        assert store.samples(run, "host", "cpu_pct")


def test_cli_live_table_against_real_vllm(vllm_server):
    r = subprocess.run(helper_argv("app.cli") + ["telemetry", "--url", vllm_server.url, "--seconds", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "server: running 0, waiting 0, KV" in r.stdout
    assert "host: CPU" in r.stdout
    assert "server tree:" in r.stdout
