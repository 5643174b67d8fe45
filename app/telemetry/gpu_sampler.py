"""The GPU sampler: reads a :class:`~app.telemetry.gpu_source.GpuSource` at a set rate.

Samples: source ``gpu<index>``, names = :data:`~app.telemetry.gpu_source.SERIES_FIELDS`
plus ``vram_headroom_bytes`` (NVML's free memory: total − used − reserved, see
:attr:`~app.telemetry.gpu_source.GpuReading.vram_headroom_bytes`). A field the card does not give yields no
sample (``latest[i].unavailable`` says why); a lost card yields ``lost`` = 1 and a NaN
gap for every field it had. When the source cannot open (no driver, no GPU, version
mismatch) the sampler reports that state once — log line and ``on_status`` callbacks —
and stops; the rest of the app works on without GPU data.
"""
from __future__ import annotations

import logging
import math
from typing import Callable

from app.clock import SessionClock
from app.telemetry.gpu_source import SERIES_FIELDS, GpuReading, GpuSource, SessionInfo, SourceStatus
from app.telemetry.names import LOST, VRAM_HEADROOM_BYTES
from app.telemetry.periodic import PeriodicSampler
from app.telemetry.series import Sample

log = logging.getLogger(__name__)


def reading_samples(t: float, r: GpuReading, seen: set[str] | None = None) -> list[Sample]:
    """Samples of one reading at session time ``t`` (seconds). ``seen``: fields this card
    gave before (updated in place) — a lost card gets a NaN gap for each."""
    src = f"gpu{r.index}"
    if r.state == "lost":
        out = [Sample(t, src, LOST, 1.0)]
        if seen:
            out += [Sample(t, src, f, math.nan) for f in sorted(seen)]
        return out
    d = r.__dict__  # pydantic v2 keeps field values here; avoids per-field attribute lookups
    out = [Sample(t, src, f, float(d[f])) for f in SERIES_FIELDS if d[f] is not None]
    head = r.vram_headroom_bytes
    if head is not None:
        out.append(Sample(t, src, VRAM_HEADROOM_BYTES, float(head)))
    if seen is not None and len(seen) < len(out):
        seen.update(s.name for s in out)
    return out


class GpuSampler(PeriodicSampler):
    """Samples every selected card each ``interval`` seconds (default 0.25 s = 4 Hz).

    Attributes read by the GUI/CLI: ``status`` (:class:`SourceStatus`), ``session``
    (:class:`SessionInfo`, once per session), ``latest`` (index → :class:`GpuReading`).
    """

    name = "gpu-sampler"

    def __init__(self, source: GpuSource, interval: float = 0.25, clock: SessionClock | None = None) -> None:
        super().__init__(interval, clock)
        self.source = source
        self.status = SourceStatus(state="closed", message="not started")
        self.session = SessionInfo()
        self.latest: dict[int, GpuReading] = {}
        self._seen: dict[int, set[str]] = {}
        self._status_subs: list[Callable[[SourceStatus], None]] = []

    def on_status(self, cb: Callable[[SourceStatus], None]) -> None:
        """``cb(status)`` once when the source opens (or fails to)."""
        self._status_subs.append(cb)

    def open(self) -> bool:
        """Open the source and read the session facts; report a failure once. Returns ok."""
        self.status = self.source.open()
        if self.status.ok:
            try:
                self.session = self.source.session_info()
            except Exception:
                log.exception("GPU session facts not available")
        else:
            log.warning("GPU telemetry off: %s", self.status.message)
        for cb in list(self._status_subs):
            try:
                cb(self.status)
            except Exception:
                log.exception("GPU status subscriber failed")
        return self.status.ok

    def setup(self) -> bool:
        return self.open()

    def teardown(self) -> None:
        self.source.close()

    def tick(self) -> list[Sample]:
        """One round: read every card, update ``latest``, return its samples."""
        readings = self.source.read()
        t = self.clock.now()
        out: list[Sample] = []
        for r in readings:
            self.latest[r.index] = r
            out += reading_samples(t, r, self._seen.setdefault(r.index, set()))
        return out
