"""LoadGenerator: runs a RampSpec in its own process and collects what it reports.

The ramp runs in ``helper_argv("app.loadgen.worker")`` (asyncio + aiohttp), so that the
GUI's rendering cannot skew its timings. A reader thread here receives record batches
and level events over the pipe, keeps them and calls the subscriber callables (on that
thread) — it never writes the run store: :mod:`app.run.controller` records what it
reports.
Subscribers: ``on_records(list[RequestRecord])``, ``on_level_start(dict)``,
``on_level(StepStats)`` (wall seconds) and ``on_done(RampResult)``.

The process runs in its own process group and ignores SIGINT (a Ctrl-C at the terminal
is the app's: issue 15, item 9). When it dies in the middle of a level (killed), the
level is still reported — from the records received so far, with stop reason
``aborted`` (a partial level, :func:`app.loadgen.stats.is_partial`) — and the ramp ends
as ``error`` saying how the process ended; only the requests in flight are lost.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import collections
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from app.clock import SessionClock
from app.helper_process import helper_argv, signal_name
from app.loadgen.records import RequestRecord
from app.loadgen.spec import RampSpec
from app.loadgen.stats import Knee, StepStats, compute_step_stats
from app.loadgen.worker import read_frame

log = logging.getLogger(__name__)


@dataclass
class RampResult:
    """What a ramp produced.

    ``status``: ``done`` (every level ran), ``slo_broken``, ``failed`` (failure-rate
    stop), ``stopped`` (total-duration cap), ``aborted``, or ``error`` (nothing ran:
    ``error`` holds the message, e.g. a failed pre-flight check). ``stop_reason``: one
    line for humans. ``model``: the served model that was ramped.
    """

    status: str = "running"
    stop_reason: str = ""
    error: Optional[str] = None
    model: Optional[str] = None
    steps: list[StepStats] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    knee: Optional[Knee] = None

    @property
    def ok(self) -> bool:
        """True when the ramp ran to an orderly end (all levels, or an SLO stop)."""
        return self.status in ("done", "slo_broken")


class LoadGenerator:
    """Start with :meth:`start`, stop early with :meth:`abort`, collect with :meth:`wait`.

    ``spec``: the RampSpec. ``clock``: the session clock (records' times are relative to
    ``clock.t0``). ``api_key``: passed to the process through its
    environment (never argv). Use as a context manager to be sure the process ends.
    """

    def __init__(self, spec: RampSpec, *, clock: SessionClock | None = None, api_key: str | None = None,
                 on_records: Callable[[list[RequestRecord]], None] | None = None,
                 on_level_start: Callable[[dict], None] | None = None,
                 on_level: Callable[[StepStats], None] | None = None,
                 on_done: Callable[[RampResult], None] | None = None) -> None:
        self.spec = spec
        self.clock = clock or SessionClock()
        self.api_key = api_key
        self.on_records, self.on_level_start, self.on_level, self.on_done = on_records, on_level_start, on_level, on_done
        self.result = RampResult()
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._err_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._lock = threading.Lock()
        self._open_level: dict | None = None  # the level_start event of the level in progress

    # ---- control ---------------------------------------------------------------------
    def start(self) -> "LoadGenerator":
        """Start the generator process; returns self. Raises RuntimeError if started twice."""
        if self.proc is not None:
            raise RuntimeError("LoadGenerator already started")
        env = dict(os.environ)
        if self.api_key:
            env["DYNO_API_KEY"] = self.api_key
        # its own process group: a Ctrl-C at the terminal reaches the app, which stops the ramp
        proc = subprocess.Popen(helper_argv("app.loadgen.worker"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, process_group=0)
        self.proc = proc
        assert proc.stdin is not None  # every stream a pipe
        msg = json.dumps({"spec": self.spec.model_dump(mode="json"), "t0": self.clock.t0}) + "\n"
        proc.stdin.write(msg.encode())
        proc.stdin.flush()
        self._reader = threading.Thread(target=self._read, name="loadgen-reader", daemon=True)
        self._reader.start()
        threading.Thread(target=self._read_err, name="loadgen-stderr", daemon=True).start()
        return self

    def abort(self) -> None:
        """Ask the ramp to stop now; records already completed are kept (idempotent)."""
        p = self.proc
        if p is None or p.poll() is not None or p.stdin is None:
            return
        try:
            p.stdin.write(b"abort\n")
            p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    @property
    def running(self) -> bool:
        return self.proc is not None and self._reader is not None and self._reader.is_alive()

    def wait(self, timeout: float | None = None) -> RampResult:
        """Wait for the ramp to end (``timeout`` s; None = forever) and return its result.

        On timeout the result has status ``running`` and the process keeps going.
        """
        if self._reader is not None:
            self._reader.join(timeout)
            if not self._reader.is_alive():
                self._reap()
        return self.result

    def stop(self, grace: float = 5.0) -> RampResult:
        """Abort, wait up to ``grace`` s, then kill the process; returns the result."""
        self.abort()
        self.wait(grace)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        if self._reader is not None:
            self._reader.join(5)
        self._reap()
        if self.result.status == "running":
            self.result.status = "aborted"
        return self.result

    def __enter__(self) -> "LoadGenerator":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop()

    def _reap(self) -> None:
        p = self.proc
        if p is None:
            return
        try:
            if p.stdin is not None:
                p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    # ---- reader ----------------------------------------------------------------------
    def _read_err(self) -> None:
        proc = self.proc
        if proc is None or proc.stderr is None:  # started with the process, every stream a pipe
            return
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self._err_tail.append(line)
            log.debug("loadgen: %s", line)

    def _read(self) -> None:
        r = self.result
        proc = self.proc
        assert proc is not None and proc.stdout is not None  # started with the process, every stream a pipe
        f = proc.stdout
        try:
            while True:
                fr = read_frame(f)
                if fr is None:
                    break
                kind, payload = fr
                if kind == "records":
                    recs = [RequestRecord.from_tuple(t) for t in payload]
                    r.records.extend(recs)
                    if self.on_records:
                        self.on_records(recs)
                elif kind == "event":
                    self._event(payload)
                elif kind == "error":
                    r.status, r.error, r.stop_reason = "error", payload, payload
        except Exception as e:  # a subscriber failed: stop the ramp, keep what we have
            log.exception("load generator reader failed")
            r.status, r.error = "error", f"{type(e).__name__}: {e}"
            self.abort()
        finally:
            rc: int | None
            try:
                rc = proc.wait(10)
            except subprocess.TimeoutExpired:
                rc = None
            if r.status == "running":
                tail = "\n".join(list(self._err_tail)[-10:])
                r.status = "error"
                how = (f"was killed (signal {-rc}, {signal_name(-rc)})" if rc is not None and rc < 0
                       else f"ended unexpectedly (exit {rc})")
                r.error = r.stop_reason = f"the load generator process {how}" + (f":\n{tail}" if tail else "")
                self._partial_level()
            elif rc:  # its ramp ended and every frame arrived, but the process did not exit cleanly
                log.warning("the load generator process exited with %s after its ramp ended: %s", rc,
                            "\n".join(list(self._err_tail)[-10:]))
            if self.on_done:
                self.on_done(r)

    def _event(self, ev: dict) -> None:
        r = self.result
        t = ev.get("type")
        if t == "preflight":
            r.model = ev.get("model")
        elif t == "level_start":
            self._open_level = ev
            if self.on_level_start:
                self.on_level_start(ev)
        elif t == "level_end":
            self._open_level = None
            st = StepStats.model_validate(ev["stats"])
            r.steps.append(st)
            if self.on_level:
                self.on_level(st)
        elif t == "done":
            r.status = ev["status"]
            r.stop_reason = ev["stop_reason"]
            r.knee = Knee.model_validate(ev["knee"]) if ev.get("knee") else None


    def _partial_level(self) -> None:
        """The process died in a level: report it from the records received (a partial
        level, stop reason ``aborted``; session-clock seconds, its window from the end of
        the warm-up to the last request received)."""
        ev, self._open_level = self._open_level, None
        if ev is None:
            return
        idx, t0 = int(ev.get("idx", 0)), float(ev.get("t", 0.0))
        recs = [x for x in self.result.records if x.level_idx == idx]
        if not recs:
            return
        t1 = max(x.t_end for x in recs)
        w0 = min(t0 + self.spec.warmup_seconds, t1)
        st = compute_step_stats(recs, idx=idx, level=float(ev.get("level", recs[0].level)),
                                mode=ev.get("mode", self.spec.mode), t_start=t0, t_end=t1, window_start=w0,
                                window_end=t1, slo=self.spec.slo, stop_reason="aborted")
        self.result.steps.append(st)
        if self.on_level:
            self.on_level(st)



def run_ramp(spec: RampSpec, timeout: float | None = None, **kw: Any) -> RampResult:
    """Run a ramp to its end in a generator process and return the result (blocking).

    Keyword arguments go to :class:`LoadGenerator`. On ``timeout`` (s) the ramp is
    aborted and what it had completed is returned.
    """
    gen = LoadGenerator(spec, **kw).start()
    try:
        res = gen.wait(timeout)
        if gen.running:
            res = gen.stop()
        return res
    finally:
        gen.stop()
