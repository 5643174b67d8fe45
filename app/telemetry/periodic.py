"""A sampler that runs ``tick()`` at a fixed rate on its own daemon thread.

Subclasses implement :meth:`PeriodicSampler.tick` (one sampling round → list of
samples) and may override :meth:`setup` (once, on the thread, before the first tick;
return False to stop). Samples go to the subscribers (plain callables taking a list of
:class:`~app.telemetry.series.Sample`). The schedule does not drift: round k starts at
``start + k·interval``; a round that overran skips the missed slots instead of
bunching up. Callers never block: :meth:`start` and :meth:`stop` return at once
(``stop(join=True)`` waits for the current round).
"""
from __future__ import annotations

import logging
import threading
import time

from app.clock import SessionClock
from app.telemetry.series import Sample, Subscriber, publish

log = logging.getLogger(__name__)


class PeriodicSampler:
    """Base class. ``interval``: seconds between rounds (> 0). ``clock``: the session clock."""

    name = "sampler"

    def __init__(self, interval: float, clock: SessionClock | None = None) -> None:
        if not interval > 0:
            raise ValueError(f"{type(self).__name__}: interval must be > 0 seconds, got {interval!r}")
        self.interval = float(interval)
        self.clock = clock or SessionClock()
        self._subs: list[Subscriber] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.overruns = 0

    def subscribe(self, cb: Subscriber) -> Subscriber:
        """Add a subscriber (called on the sampler's thread with each round's samples)."""
        self._subs.append(cb)
        return cb

    def unsubscribe(self, cb: Subscriber) -> None:
        try:
            self._subs.remove(cb)
        except ValueError:
            pass

    def emit(self, samples: list[Sample]) -> None:
        if samples:
            publish(self._subs, samples)

    # ------------------------------------------------------------------ to override
    def setup(self) -> bool:
        return True

    def teardown(self) -> None:
        pass

    def tick(self) -> list[Sample]:
        raise NotImplementedError

    # ------------------------------------------------------------------ thread
    def start(self) -> "PeriodicSampler":
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._thread = threading.Thread(target=self._run, name=f"dyno-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, join: bool = True, timeout: float = 5.0) -> None:
        self._stop.set()
        if join and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            if not self.setup():
                return
            nxt = time.monotonic()
            while not self._stop.is_set():
                try:
                    self.emit(self.tick())
                except Exception:  # a sampler must not die from one bad round
                    log.exception("%s: sampling round failed", self.name)
                self.rounds += 1
                nxt += self.interval
                now = time.monotonic()
                if now > nxt:
                    self.overruns += 1
                    nxt = now + self.interval - ((now - nxt) % self.interval)
                self._stop.wait(nxt - now)
        finally:
            try:
                self.teardown()
            except Exception:
                log.exception("%s: teardown failed", self.name)
