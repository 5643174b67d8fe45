"""Issue 15, "Done when": the kill-order matrix against the sim. ``vllm-dyno run`` of a sim
profile (a real app process, with its real reaper, sim server and load generator) is
hit with SIGTERM, SIGINT or SIGKILL aimed at the app, the reaper, the server or the load
generator, while the server loads, just as it is ready (the load generator: as soon as
it runs), or mid-ramp. Every cell asserts:

- zero processes of the app left within the grace period + 5 s (the reaper's grace
  :data:`app.server.reaper.EOF_GRACE_S` = 3 s is the longest: nothing here waits for the
  20 s stop grace, the sim stops at once on SIGTERM);
- the app's output has no traceback, ``Fatal Python error`` or ``KeyboardInterrupt``;
- the run store holds the run with the status the fault deserves, every stored level
  has its requests, a level cut short is kept as partial (``aborted``), and a SIGKILLed
  app lost no completed record older than the store's bound (:data:`LOSS_BOUND_S` plus the
  load generator's batch, :data:`app.loadgen.worker.BATCH_SECONDS`: records not yet
  received by the app are not its to lose) — the run then reads ``interrupted``. What
  completed is read from the server itself (:class:`CompletionWatch`: its
  ``vllm:request_success_total`` polled through the run), never inferred from the store:
  the newest stored completion can be seconds old with nothing lost, when the kill falls
  between levels (a level's drain, its /metrics reading and the prefix-cache reset send
  nothing).

A helper that ignores the signal (the reaper: SIGTERM and SIGINT; the load generator:
SIGINT) must leave the run to finish as if nothing happened. The three phases of one
(target, signal) run at once (threads driving processes): 33 cells in ≈ 2–3 min on 2
cores. The main cells run against the real CPU build of vLLM in
tests/e2e/test_kill_matrix_e2e.py.
"""
from __future__ import annotations

import re
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.loadgen.worker import BATCH_SECONDS, SIGTERM_REASON
from app.server.reaper import EOF_GRACE_S
from app.store import LOSS_BOUND_S, RunStore
from app.telemetry.metrics_parse import parse_metrics
from tests.app_process import CRASH_RE, AppProcess, sim_profile

#: the cells judge a loss bound in tenths of a second and run three phases at once: alone
pytestmark = pytest.mark.serial

TARGETS = ("app", "reaper", "server", "loadgen")
PHASES = ("loading", "ready", "mid-ramp")
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGKILL": signal.SIGKILL}
#: zero processes within this many seconds of the kill (the longest grace + 5 s)
GONE_WITHIN_S = EOF_GRACE_S + 5.0
#: scheduling slack on a loaded 2-core machine for the loss bound (the app's reader thread
#: and the kill are not instantaneous)
LOSS_SLACK_S = 0.3


def sigint_ignored(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT now (bit 2 of ``SigIgn`` in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    except OSError:
        pass
    return False


def continues(target: str, sig: int) -> bool:
    """The helpers that ignore the signal: the run goes on to its end."""
    return (target == "reaper" and sig != signal.SIGKILL) or (target == "loadgen" and sig == signal.SIGINT)


@dataclass
class Cell:
    target: str
    phase: str
    sig: int
    problems: list[str] = field(default_factory=list)
    output: str = ""
    gone_s: float | None = None  # seconds from the kill until nothing of the app was left
    lost_s: float | None = None  # app SIGKILL mid-ramp: the kill time minus the newest stored completion
    #: app SIGKILL mid-ramp: requests the server had finished by the kill minus the store's
    #: bound, counted from the ramp's start, and the requests stored
    finished: int | None = None
    stored: int | None = None

    @property
    def name(self) -> str:
        return f"{self.target} × {self.phase} × {signal.Signals(self.sig).name}"


def reach(app: AppProcess, target: str, phase: str, startup_s: float = 90.0, mid_s: float = 1.2) -> int:
    """Wait for the phase (``startup_s``: the most a launch may take; mid-ramp: ``mid_s``
    seconds into the second level, far enough from the first level's end, whose records
    are all written with it, for a store that held rows back too long to lose some),
    then return the pid to hit."""
    if phase == "loading":
        app.wait_line(r"^\[loading\]", startup_s)
        time.sleep(0.3)  # the sim loads for ≈ 3 s at time scale 10
    elif phase == "ready":
        app.wait_line(r"^\[ready\]", startup_s)
    else:
        app.wait_line(r"^  level 2: ", startup_s + 30)  # the first level is done; the second runs ≈ 2 s
        time.sleep(mid_s)
    if target == "app":
        return app.pid
    if target == "reaper":
        return app.wait_pid(app.reaper)
    if target == "server":
        return app.wait_pid(app.server)
    pid = app.wait_pid(app.loadgen, 60)
    if phase == "ready":  # as soon as it runs: its SIGINT disposition is set up
        deadline = time.monotonic() + 10
        while not sigint_ignored(pid) and time.monotonic() < deadline:
            time.sleep(0.005)
    return pid


def expected_status(target: str, phase: str, sig: int) -> set[str]:
    if continues(target, sig):
        return {"done"}
    if target == "app":
        return {"interrupted"} if sig == signal.SIGKILL else {"aborted"}
    if target in ("reaper", "server"):
        return {"launch_failed"} if phase == "loading" else (
            {"launch_failed", "server_failed"} if phase == "ready" else {"server_failed"})
    if sig == signal.SIGTERM:  # the load generator stops the ramp (at its very start it may not have the handler yet)
        return {"aborted"} if phase == "mid-ramp" else {"aborted", "error"}
    return {"error"}


def expected_reason(target: str, phase: str, sig: int) -> str | None:
    """A phrase the run's stop reason must hold."""
    if target == "reaper" and sig == signal.SIGKILL:
        return "the reaper process"
    if target == "server":  # the sim stops on SIGTERM/SIGINT once it serves (exit 0, as vLLM's API server)
        if sig == signal.SIGKILL:
            return "killed (signal 9 — out of memory?)"
        return f"ended by signal {sig} ({signal.Signals(sig).name})" if phase == "loading" else "exited with code 0"
    if target == "loadgen" and sig == signal.SIGKILL:
        return "the load generator process was killed (signal 9, SIGKILL)"
    return None


class CompletionWatch:
    """The server's own count of finished requests through a run: ``vllm:request_success_total``
    (summed over ``finished_reason``; the sim exports it under the same name) read from
    ``url``/metrics every ``every`` s on a thread. ``samples``: ``[(wall time, count), …]``,
    the wall time (``time.time()``) taken just before each request was sent."""

    def __init__(self, url: str, every: float = 0.05):
        self.url, self.every = url.rstrip("/") + "/metrics", every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            t = time.time()
            try:
                with urllib.request.urlopen(self.url, timeout=2.0) as r:
                    n = parse_metrics(r.read().decode("utf-8", "replace")).counter("request_success_total")
            except Exception:  # the server is gone (the kill) or busy: no sample
                n = None
            if n is not None:
                self.samples.append((t, n))
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def count_before(self, t: float) -> float | None:
        """The count of the last sample taken before wall time ``t``; None if none was."""
        before = [n for ts, n in self.samples if ts < t]
        return before[-1] if before else None


def run_cell(target: str, phase: str, sig: int, where: Path, args: list[str] | None = None,
             gone_within: float = GONE_WITHIN_S, startup_s: float = 90.0, mid_s: float = 1.2) -> Cell:
    """One cell: ``vllm-dyno run`` (``args``; default: a sim profile) in ``where``, hit in
    ``phase``; nothing of it may be left ``gone_within`` s after the kill."""
    cell = Cell(target, phase, sig)
    where.mkdir(parents=True, exist_ok=True)
    app = AppProcess(args or ["run", str(sim_profile(where / "p.yaml"))], where / "home")
    watch = None
    try:
        if (target, sig, phase) == ("app", signal.SIGKILL, "mid-ramp"):
            app.wait_line(r"^\[ready\] http", startup_s)
            url = next(m.group(1) for _, line in list(app.lines)
                       if (m := re.match(r"^\[ready\] (http\S+)", line)))
            watch = CompletionWatch(url)
        pid = reach(app, target, phase, startup_s, mid_s)
        t_kill = app.ctrl_c() if target == "app" and sig == signal.SIGINT else app.signal(pid, sig)
        if watch is not None:
            watch.stop()
        t0 = time.monotonic()
        wait = 120.0 if continues(target, sig) else gone_within
        try:
            app.proc.wait(wait)
        except Exception:
            cell.problems.append(f"the app did not exit within {wait:g} s of the kill")
        left, _ = app.wait_gone(max(0.5, (gone_within if not continues(target, sig) else 5.0)
                                        - (time.monotonic() - t0 if not continues(target, sig) else 0.0)))
        cell.gone_s = time.monotonic() - t0
        if left:
            cell.problems.append("left: " + ", ".join(f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in left))
        time.sleep(0.2)  # the last output lines
        cell.output = app.text
        rc = app.proc.returncode
        want_rc = (0 if continues(target, sig) else -9 if (target, sig) == ("app", signal.SIGKILL)
                   else 130 if target == "app" else 1)
        if rc != want_rc:
            cell.problems.append(f"exit code {rc}, expected {want_rc}")
        if CRASH_RE.search(cell.output):
            cell.problems.append("a traceback / fatal error in the output")
        check_store(cell, where / "home" / "runs.sqlite", t_kill, watch)
    except AssertionError as e:
        cell.problems.append(str(e)[:2000])
    finally:
        if watch is not None:
            watch.stop()
        app.kill_everything()
        cell.output = cell.output or app.text
    return cell


def check_store(cell: Cell, db: Path, t_kill: float, watch: CompletionWatch | None = None) -> None:
    target, phase, sig = cell.target, cell.phase, cell.sig
    with RunStore(db) as store:  # opening it marks a run whose app is gone "interrupted"
        runs = store.list_runs()
        if len(runs) != 1:
            cell.problems.append(f"{len(runs)} runs stored, expected 1")
            return
        run = store.get_run(runs[0]["id"])
        levels = store.levels(run["id"])
        reqs = store.requests(run["id"])
    want = expected_status(target, phase, sig)
    if run["status"] not in want:
        cell.problems.append(f"run status {run['status']!r}, expected {sorted(want)}: "
                             f"{(run['summary'] or {}).get('stop_reason')}")
    reason = (run["summary"] or {}).get("stop_reason") or ""
    phrase = expected_reason(target, phase, sig)
    if phrase and phrase not in reason:
        cell.problems.append(f"stop reason lacks {phrase!r}: {reason[:300]!r}")
    if (target, sig, phase) == ("loadgen", signal.SIGTERM, "mid-ramp") and SIGTERM_REASON not in reason:
        cell.problems.append(f"stop reason lacks the SIGTERM: {reason[:300]!r}")
    for lv in levels:  # every level's measured requests are stored with it
        n = sum(1 for q in reqs if q["level_idx"] == lv["idx"])
        if n < lv.get("n_measured", 0):
            cell.problems.append(f"level {lv['idx']}: {n} requests stored, {lv['n_measured']} measured")
    if phase == "mid-ramp" and not continues(target, sig) and (target == "loadgen" or (
            target == "app" and sig != signal.SIGKILL)):
        if not any(lv["stop_reason"] == "aborted" for lv in levels):
            cell.problems.append(f"no partial level kept: {[(lv['idx'], lv['stop_reason']) for lv in levels]}")
    if (target, sig, phase) == ("app", signal.SIGKILL, "mid-ramp"):
        ends = [q["t_start"] + q["e2e"] for q in reqs if q["e2e"] is not None]
        if not ends:
            cell.problems.append("no request stored before the kill")
            return
        cell.lost_s = (t_kill - run["clock_wall0"]) - max(ends)  # shown, not judged: see CompletionWatch
        bound = LOSS_BOUND_S + BATCH_SECONDS + LOSS_SLACK_S
        ramp0 = run["clock_wall0"] + min(q["t_start"] for q in reqs)
        base, cut = watch.count_before(ramp0), watch.count_before(t_kill - bound)
        if base is None or cut is None:
            cell.problems.append(f"the server's finished-request count was not read before the ramp and {bound:g} s "
                                 f"before the kill ({len(watch.samples)} readings)")
            return
        cell.finished, cell.stored = int(cut - base), len(reqs)
        if cell.stored < cell.finished:
            cell.problems.append(
                f"the server had finished {cell.finished} of the ramp's requests {bound:g} s before the kill "
                f"(its vllm:request_success_total), the store holds {cell.stored}: more than {LOSS_BOUND_S} s "
                f"(+{BATCH_SECONDS} s batch, +{LOSS_SLACK_S} s slack) lost")


@pytest.mark.parametrize("sig", list(SIGNALS), ids=list(SIGNALS))
@pytest.mark.parametrize("target", TARGETS)
def test_kill_order_leaves_nothing_and_loses_nothing(target, sig, tmp_path):
    phases = [ph for ph in PHASES if not (target == "loadgen" and ph == "loading")]  # it starts with the ramp
    with ThreadPoolExecutor(len(phases)) as ex:
        cells = list(ex.map(lambda ph: run_cell(target, ph, SIGNALS[sig], tmp_path / ph), phases))
    for c in cells:
        if c.finished is not None:
            print(f"{c.name}: the server had finished {c.finished} of the ramp's requests by the kill minus the "
                  f"bound, {c.stored} stored; newest stored completion {c.lost_s:.3f} s before the kill")
    bad = [c for c in cells if c.problems]
    assert not bad, "\n\n".join(f"{c.name}:\n  " + "\n  ".join(c.problems) + "\n--- output ---\n"
                                + c.output[-2500:] for c in bad)
