"""HTTP sides against real aiohttp servers: the sim's /sim/telemetry shape, the /metrics
scraper (gaps and recovery), and the ``vllm-dyno telemetry`` table."""
from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time

import pytest
from aiohttp import web

from app.cli import main as cli_main
from app.telemetry.gpu_sampler import GpuSampler
from app.telemetry.gpu_source import GpuReading, SessionInfo, SourceStatus, TelemetryDocument
from app.telemetry.http_source import HttpGpuSource
from app.telemetry.metrics_scraper import MetricsScraper
from tests.nvml_double import NvmlDouble
from app.telemetry.nvml_source import NvmlSource

METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.125
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} %d
"""


class ServerThread:
    """A real aiohttp server on 127.0.0.1 (ephemeral port) running in its own thread."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> "ServerThread":
        self.thread.start()

        async def up():
            self.runner = web.AppRunner(self.app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return site._server.sockets[0].getsockname()[1]

        self.port = asyncio.run_coroutine_threadsafe(up(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sim_document(n: int = 2) -> TelemetryDocument:
    """What a sim rig would serve: the NVML double's readings in the shared JSON shape."""
    src = NvmlSource(nvml=NvmlDouble(n))
    st = src.open()
    return TelemetryDocument(status=st, session=src.session_info(), readings=src.read())


@pytest.fixture
def rig():
    state = {"metrics": METRICS % 1000, "status": 200, "doc": sim_document(2)}

    async def metrics(request):
        return web.Response(text=state["metrics"], status=state["status"])

    async def telemetry(request):
        return web.Response(text=state["doc"].to_json(), content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/sim/telemetry", telemetry)
    with ServerThread(app) as srv:
        srv.state = state
        yield srv


def test_telemetry_document_round_trip():
    doc = sim_document(3)
    back = TelemetryDocument.model_validate_json(doc.to_json())
    assert back == doc and '"schema":"vllm-dyno.gpu-telemetry/1"' in doc.to_json()
    r = GpuReading.model_validate({"index": 0, "power_w": None, "unknown_field": 1})
    assert r.power_w is None


def test_http_gpu_source(rig):
    src = HttpGpuSource(rig.url)
    assert src.open().ok and src.session_info().cuda_version == "12.4"
    rs = src.read()
    assert [r.index for r in rs] == [0, 1] and rs[1].power_w == 30.0
    s = GpuSampler(src)
    assert s.open()
    out = s.tick()
    assert {x.source for x in out} == {"gpu0", "gpu1"}
    rig.state["doc"] = TelemetryDocument(status=SourceStatus(state="no_gpu", message="rig has no GPUs"),
                                         session=SessionInfo())
    assert HttpGpuSource(rig.url).open().state == "no_gpu"


def test_http_gpu_source_unreachable_and_malformed(rig, caplog):
    src = HttpGpuSource(f"http://127.0.0.1:{free_port()}", timeout=1)
    st = src.open()
    assert st.state == "error" and "cannot read GPU telemetry" in st.message
    assert src.read() == []
    src = HttpGpuSource(rig.url + "/metrics")  # not JSON
    src.url = rig.url + "/metrics"
    assert src.open().state == "error"


def test_scraper_gap_and_recovery(rig, caplog):
    s = MetricsScraper(rig.url)
    first = {x.name: x.value for x in s.tick()}
    assert first["up"] == 1.0 and first["running"] == 3 and first["kv_cache_usage"] == 0.125
    assert s.latest["running"] == 3
    rig.state["metrics"] = METRICS % 1500
    time.sleep(0.2)
    second = {x.name: x.value for x in s.tick()}
    assert second["generation_tokens_per_s"] > 0
    with caplog.at_level(logging.WARNING):
        rig.state["status"] = 500
        gap = {x.name: x.value for x in s.tick()}
        s.tick()
        rig.state["status"] = 200
        rig.state["metrics"] = "vllm:num_requests_running{engine=\"0\" 3\n"
        bad = {x.name: x.value for x in s.tick()}
    assert gap["up"] == 0.0 and math.isnan(gap["running"])
    assert bad["up"] == 0.0 and "malformed" in s.last_error
    assert sum("HTTP Error 500" in r.getMessage() for r in caplog.records) == 1  # logged once, not per tick
    rig.state["metrics"] = METRICS % 2000
    again = {x.name: x.value for x in s.tick()}
    assert again["up"] == 1.0 and s.last_error is None
    # the rate spans the gap: counter delta over the time since the last good scrape
    assert again["generation_tokens_per_s"] > 0


def test_scraper_unreachable():
    s = MetricsScraper(f"http://127.0.0.1:{free_port()}", timeout=1)
    out = {x.name: x.value for x in s.tick()}
    assert out["up"] == 0.0 and s.last_error


def test_cli_table_shows_server_gpus_and_host(rig, capsys):
    rc = cli_main(["telemetry", "--url", rig.url, "--sim-url", rig.url, "--seconds", "1.2", "--refresh", "0.5"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "server: running 3, waiting 1, KV 12.5%" in out
    assert "host: CPU" in out
    assert "CUDA 12.4" in out and "24.0 GiB" in out and "P2P no" in out
    assert "idle" in out


def test_hub_feeds_bank_and_run_store(rig, tmp_path):
    from app.store import RunStore
    from app.telemetry.hub import Telemetry

    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run()
        tel = Telemetry(gpu_source=NvmlSource(nvml=NvmlDouble(2)), metrics_url=rig.url, store=store, run_id=run,
                        gpu_interval=0.05, metrics_interval=0.05, host_interval=0.05)
        with tel:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not all(s.rounds >= 3 for s in tel.samplers):
                time.sleep(0.05)
        assert not any(s.running for s in tel.samplers)
        assert tel.bank.last("gpu1", "power_w")[1] == 30.0
        assert tel.bank.last("metrics", "running")[1] == 3
        for src, name in (("gpu0", "memory_used_bytes"), ("metrics", "kv_cache_usage"), ("host", "cpu_pct")):
            assert store.samples(run, src, name), (src, name)


def test_cli_bad_input(capsys):
    for argv, opt in ((["--url", "localhost:8000"], "--url"), (["--gpus", "a,b"], "--gpus")):
        with pytest.raises(SystemExit) as ei:  # argparse's error: the option, exit 2 (tests/unit/test_cli_args.py)
            cli_main(["telemetry", *argv, "--seconds", "1"])
        assert ei.value.code == 2
        assert f"argument {opt}:" in capsys.readouterr().err
