"""Ring buffers, the run-store writer with decimation, derived series."""
from __future__ import annotations

import math

import numpy as np
import pytest

from app.store import RunStore
from app.telemetry.derived import counter_delta, energy_per_token, integrate, throttle_events, vram_headroom
from app.telemetry.store_writer import StoreWriter
from app.telemetry.series import RingBuffer, Sample, SeriesBank, publish


def test_ring_buffer_wraps_in_order():
    rb = RingBuffer(4)
    assert rb.last() is None and len(rb) == 0
    for i in range(6):
        rb.append(float(i), float(i * 10))
    t, v = rb.view()
    assert t.tolist() == [2, 3, 4, 5] and v.tolist() == [20, 30, 40, 50]
    assert rb.last() == (5.0, 50.0)
    with pytest.raises(ValueError, match="capacity"):
        RingBuffer(1)


def test_bank_is_bounded():
    bank = SeriesBank(capacity=8, max_series=3)
    for i in range(100):
        bank([Sample(float(i), "gpu0", "power_w", 1.0), Sample(float(i), "gpu0", "temp_gpu_c", 2.0),
              Sample(float(i), "host", "cpu_pct", 3.0), Sample(float(i), "host", "extra", 4.0)])
    assert len(bank.keys()) == 3
    assert bank.nbytes() == 3 * 2 * 8 * 8
    t, v = bank.get("gpu0", "power_w")
    assert len(t) == 8 and t[-1] == 99
    assert bank.get("nope", "x")[0].size == 0


def test_publish_survives_a_failing_subscriber(caplog):
    got = []
    publish([lambda s: 1 / 0, got.append], [Sample(0, "a", "b", 1.0)])
    assert got and "subscriber" in caplog.text


def test_store_writer_full_rate_then_decimated(tmp_path):
    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run("t", "vllm")
        w = StoreWriter(store, run, schedule=((10.0, 0.0), (math.inf, 5.0)), thread=False)
        for i in range(0, 160):  # 40 s at 4 Hz
            t = i * 0.25
            w([Sample(t, "gpu0", "power_w", 100.0 + (i % 2) * 100.0),
               Sample(t, "gpu0", "throttle_reasons", 4.0 if i == 100 else 1.0)])
        w([Sample(40.0, "metrics", "running", math.nan)])
        w.close()
        rows = store.samples(run, "gpu0", "power_w")
        early = [r for r in rows if r[0] < 10]
        late = [r for r in rows if r[0] >= 10]
        assert len(early) == 40  # full rate for the first 10 s
        assert 5 <= len(late) <= 7  # 5 s buckets afterwards
        assert all(r[3] == pytest.approx(150.0) for r in late[:-1])  # means keep the energy
        thr = [r[3] for r in store.samples(run, "gpu0", "throttle_reasons") if r[0] >= 10]
        assert 5.0 in thr  # OR-ed: the event survives decimation
        gap = store.samples(run, "metrics", "running")
        assert gap == [(40.0, "metrics", "running", None)]
        assert w.dropped == 0


def test_store_writer_thread_hands_over(tmp_path):
    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run()
        w = StoreWriter(store, run, flush_interval=0.05)
        w([Sample(0.0, "host", "cpu_pct", 5.0)])
        w.close()
        assert store.samples(run, "host") == [(0.0, "host", "cpu_pct", 5.0)]


def test_store_writer_bounds_pending_rows():
    class Slow:
        def add_samples(self, run, rows):
            pass

    w = StoreWriter(Slow(), 1, max_pending=10, thread=False)
    w([Sample(float(i), "h", "x", 1.0) for i in range(25)])
    assert w.dropped == 15


def test_integrate_and_energy_per_token():
    t = np.arange(0.0, 21.0)
    p0 = (t, np.full_like(t, 200.0))
    p1 = (t, np.where(t < 10, 100.0, 300.0))
    assert integrate(p0, 0, 10) == pytest.approx(2000.0)
    assert integrate((t, np.where(t == 5, np.nan, 200.0)), 0, 10) == pytest.approx(2000.0)  # gap ignored
    counter = (t, t * 50.0)  # 50 tokens/s
    assert counter_delta(counter, 2.5, 7.5) == pytest.approx(250.0)
    levels = [(1, 0.0, 10.0), (2, 10.0, 20.0), (4, 30.0, 40.0)]
    got = energy_per_token({"gpu0": p0, "gpu1": p1}, levels, generation_counter=counter)
    # level 1: (2000 + 100·9 + 200·1·0.5·... ) — trapezoid over p1: 9 s at 100 + the 9→10 ramp (100→300) = 1100
    assert got[1] == pytest.approx((2000.0 + 1100.0) / 500.0)
    assert got[2] == pytest.approx((2000.0 + 3000.0) / 500.0)
    assert got[4] is None
    assert energy_per_token({"gpu0": p0}, levels[:1], tokens={1: 1000})[1] == pytest.approx(2.0)
    assert vram_headroom(np.array([24.0]), np.array([20.0])).tolist() == [4.0]


def test_throttle_events_per_level():
    t = np.arange(0.0, 10.0)
    m = np.array([1, 1, 4, 4, 1, 0, 0x40, 0x44, 0x44, 0x44], dtype=float)  # idle, power cap, …, thermal
    levels = [("c1", 0.0, 4.0), ("c2", 4.0, 7.0), ("c4", 7.0, 10.0)]
    ev = throttle_events({"gpu0": (t, m), "gpu1": (t, np.ones(10))}, levels)
    assert [(e.t, e.reasons) for e in ev["c1"]] == [(2.0, ("power cap",))]
    assert [(e.t, e.reasons) for e in ev["c2"]] == [(6.0, ("thermal (hardware)",))]
    assert [(e.t, e.reasons, e.at_level_start) for e in ev["c4"]] == [(7.0, ("power cap", "thermal (hardware)"), True)]
