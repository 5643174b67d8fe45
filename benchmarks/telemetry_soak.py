"""Telemetry soak: 72 hours of 8-GPU samples at 4 Hz, time-compressed.

Feeds every sampling round of the whole path — NvmlSource over the pynvml-shaped
double (:mod:`tests.nvml_double`), GpuSampler → SeriesBank (ring buffers) and
StoreWriter (decimated) → RunStore (a real SQLite file in a temp dir) — as fast as it
goes, with a simulated session clock advancing 1/rate s per round. Prints:

- RSS growth of this process after a warm-up (target: under 200 MB for 72 h),
- the cost of one 8-GPU sampling round (NVML calls through the double + building the
  readings and samples) and of a full round including the ring buffers and the writer.

On real cards each NVML call is a driver round trip (tens of µs; PCIe throughput
≈20 ms, which is why it is read for one card per round) — the double measures the
app's own overhead, not the driver's.

Usage: ``python benchmarks/telemetry_soak.py [--hours 72] [--gpus 8] [--rate 4]``
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

# the repository root: the app, and the pynvml-shaped double kept with the tests
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.store import RunStore  # noqa: E402
from app.telemetry.gpu_sampler import GpuSampler  # noqa: E402
from app.telemetry.nvml_source import NvmlSource  # noqa: E402
from app.telemetry.store_writer import StoreWriter  # noqa: E402
from app.telemetry.series import SeriesBank  # noqa: E402
from tests.nvml_double import NvmlDouble  # noqa: E402

MB = 1e6


class SimClock:
    """Session clock stand-in: ``now()`` returns the simulated seconds."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=72.0, help="simulated hours (default 72)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--rate", type=float, default=4.0, help="sampling rate in Hz (default 4)")
    ap.add_argument("--capacity", type=int, default=16384, help="ring buffer points per series")
    a = ap.parse_args(argv)
    if a.hours <= 0 or a.gpus <= 0 or a.rate <= 0:
        ap.error("--hours, --gpus and --rate must be > 0")

    proc = psutil.Process()
    dt = 1.0 / a.rate
    rounds = int(a.hours * 3600 * a.rate)
    warmup = min(rounds // 10, int(600 * a.rate))  # 10 simulated minutes fill every buffer's first pages
    nv = NvmlDouble(a.gpus)
    for g in nv.gpus:
        g.temp_memory = 60
        g.processes = [(os.getpid(), 20 * 2**30)]
    clock = SimClock()
    src = NvmlSource(nvml=nv, monotonic=clock.now)
    sampler = GpuSampler(src, interval=dt, clock=clock)
    if not sampler.open():
        print(f"source did not open: {sampler.status.message}")
        return 1
    bank = SeriesBank(capacity=a.capacity)
    tmp = tempfile.TemporaryDirectory(prefix="dyno-soak-")
    store = RunStore(Path(tmp.name) / "runs.sqlite")
    run = store.create_run("soak", "double")
    # time-compressed: hand rows to the store from the loop once per simulated minute (at
    # real speed the writer's thread does it every second)
    writer = StoreWriter(store, run, thread=False)
    sampler.subscribe(bank)
    sampler.subscribe(writer)

    sample_cost: list[float] = []
    round_cost: list[float] = []
    rss0 = None
    rss_max = 0
    rss_by_hour: list[tuple[float, float]] = []
    wall0 = time.perf_counter()
    n_samples = 0
    every = max(1, int(3600 * a.rate))
    for k in range(rounds):
        clock.t = k * dt
        load = (k // 2400) % 5  # a 10-minute "ramp level" pattern
        for g in nv.gpus:
            g.power_mw = 80_000 + load * 70_000 + (k % 7) * 1000
            g.util_gpu = 20 * load
            g.memory_used = (2 + 4 * load) * 2**30
            g.throttle = 0x4 if load == 4 else 0x0
        c0 = time.perf_counter()
        samples = sampler.tick()
        c1 = time.perf_counter()
        sampler.emit(samples)
        c2 = time.perf_counter()
        n_samples += len(samples)
        if k % 97 == 0:
            sample_cost.append(c1 - c0)
            round_cost.append(c2 - c0)
        if k % int(60 * a.rate) == 0:
            writer.flush()
        if k == warmup:
            gc.collect()
            rss0 = proc.memory_info().rss
        if k % every == 0 or k == rounds - 1:
            rss = proc.memory_info().rss
            rss_max = max(rss_max, rss)
            rss_by_hour.append((clock.t / 3600, rss / MB))
            if k and (clock.t / 3600) % 6 == 0:
                print(f"  {clock.t / 3600:3.0f} h simulated: RSS {rss / MB:.1f} MB (after warm-up "
                      f"{(rss0 or rss) / MB:.1f} MB), {time.perf_counter() - wall0:.0f} s wall", flush=True)
    wall = time.perf_counter() - wall0
    writer.close()
    store.flush()
    gc.collect()
    rss_end = proc.memory_info().rss
    stored = len(store.samples(run, "gpu0", "power_w"))
    db_mb = sum(p.stat().st_size for p in Path(tmp.name).iterdir()) / MB
    store.close()
    tmp.cleanup()

    growth = (max(rss_max, rss_end) - rss0) / MB if rss0 is not None else float("nan")
    print(f"telemetry soak: {a.hours:g} h of {a.gpus} GPUs at {a.rate:g} Hz = {rounds:,} rounds, "
          f"{n_samples:,} samples, in {wall:.0f} s wall ({rounds / wall:,.0f} rounds/s)")
    print(f"RSS after warm-up {rss0 / MB:.1f} MB, peak {rss_max / MB:.1f} MB, end {rss_end / MB:.1f} MB → "
          f"growth {growth:.1f} MB (target < 200 MB) {'OK' if growth < 200 else 'OVER'}")
    print("RSS by simulated hour: " + ", ".join(f"{h:.0f} h {m:.0f} MB" for h, m in rss_by_hour[:: max(1, len(rss_by_hour) // 8)]))
    print(f"ring buffers: {len(bank.keys())} series × {a.capacity} points = {bank.nbytes() / MB:.1f} MB")
    print(f"one {a.gpus}-GPU sampling round (NVML double + readings + samples): median "
          f"{statistics.median(sample_cost) * 1e6:.0f} µs, p99 {statistics.quantiles(sample_cost, n=100)[98] * 1e6:.0f} µs")
    print(f"full round incl. ring buffers and store writer: median {statistics.median(round_cost) * 1e6:.0f} µs, "
          f"p99 {statistics.quantiles(round_cost, n=100)[98] * 1e6:.0f} µs "
          f"(budget at {a.rate:g} Hz: {dt * 1e6:,.0f} µs)")
    print(f"run store: {writer.rows_written:,} rows written (decimated), {stored:,} for gpu0/power_w, "
          f"{writer.dropped} dropped, file {db_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
