"""One session's telemetry: GPU, host and ``/metrics`` samplers on one clock.

:class:`Telemetry` starts the samplers it is given, feeds every sample to a
:class:`SeriesBank` (live plots), to an optional :class:`StoreWriter` (run store) and
to any extra subscriber, and stops them all on :meth:`stop`.
"""
from __future__ import annotations

from typing import Any, Sequence

from app.clock import SessionClock
from app.telemetry.gpu_sampler import GpuSampler
from app.telemetry.gpu_source import GpuSource
from app.telemetry.host_sampler import HostSampler
from app.telemetry.http_source import HttpGpuSource
from app.telemetry.metrics_scraper import MetricsScraper
from app.telemetry.nvml_source import NvmlSource
from app.telemetry.periodic import PeriodicSampler
from app.telemetry.series import SeriesBank, Subscriber
from app.telemetry.store_writer import StoreWriter


def default_gpu_source(gpus: Sequence[int] | None = None, sim_url: str | None = None,
                       server_pgid: int | None = None) -> GpuSource:
    """The sim rig's HTTP source when ``sim_url`` is given, else NVML for ``gpus`` (all when None)."""
    if sim_url:
        return HttpGpuSource(sim_url)

    return NvmlSource(gpus, server_pgid=server_pgid)


class Telemetry:
    """Owns the samplers of a session.

    ``gpu_source``: a GpuSource or None (no GPU sampling). ``metrics_url``: the server's
    base URL or None. ``pgid`` / ``root_pid``: the server tree for the host sampler.
    ``store`` + ``run_id``: write samples to the run store. Rates in seconds between
    rounds: ``gpu_interval`` 0.25 (4 Hz), ``metrics_interval`` 0.5 (2 Hz),
    ``host_interval`` 1.0.
    """

    def __init__(self, *, clock: SessionClock | None = None, gpu_source: GpuSource | None = None,
                 metrics_url: str | None = None, pgid: int | None = None, root_pid: int | None = None,
                 host: bool = True, store: Any = None, run_id: int | None = None, bank: SeriesBank | None = None,
                 gpu_interval: float = 0.25, metrics_interval: float = 0.5, host_interval: float = 1.0) -> None:
        self.clock = clock or SessionClock()
        self.bank = bank or SeriesBank()
        self.writer = StoreWriter(store, run_id) if store is not None and run_id is not None else None
        self.gpu = GpuSampler(gpu_source, gpu_interval, self.clock) if gpu_source is not None else None
        self.metrics = MetricsScraper(metrics_url, metrics_interval, self.clock) if metrics_url else None
        self.host = HostSampler(pgid, root_pid, host_interval, self.clock) if host else None
        for s in self.samplers:
            s.subscribe(self.bank)
            if self.writer is not None:
                s.subscribe(self.writer)

    @property
    def samplers(self) -> list[PeriodicSampler]:
        return [s for s in (self.gpu, self.host, self.metrics) if s is not None]

    def subscribe(self, cb: Subscriber) -> None:
        """Add ``cb`` to every sampler (called on the samplers' threads)."""
        for s in self.samplers:
            s.subscribe(cb)

    def start(self) -> "Telemetry":
        for s in self.samplers:
            s.start()
        return self

    def stop(self) -> None:
        for s in self.samplers:
            s.stop(join=False)
        for s in self.samplers:
            s.stop(join=True)
        if self.writer is not None:
            self.writer.close()

    def __enter__(self) -> "Telemetry":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
