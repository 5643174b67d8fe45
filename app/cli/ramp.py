"""``vllm-dyno ramp``: drive a running OpenAI-compatible server through a load ramp.

Prints a live progress line per level, a final table and the knee; stores the run in
the run store; optional JSON/CSV export. Exit status: 0 ramp completed (or stopped by
its SLO), 1 the ramp failed (failure-rate stop, generator error) or could not be saved
in the run store (a full disk: the table is printed, --json exports it), 2 bad input or the
pre-flight check failed (unreachable URL, wrong model), 130 interrupted (Ctrl-C; the
completed records are kept).
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

from pydantic import ValidationError

from app.cli.common import (
    add_security_options,
    add_workload_options,
    apply_api_key_file,
    fraction,
    http_url,
    level_table,
    server_table,
    non_negative,
    number_list,
    output_file,
    positive_int,
    positive_number,
    positive_seconds,
    seconds,
    unsaved_text,
    workload_kw,
)
from app.engines import Engine
from app.loadgen.capacity import P99_MIN_REQUESTS, SEARCH_STEP_CAP_S, slo_text
from app.loadgen.datasets import summary_text, text_histogram
from app.loadgen.prompts import dataset_lengths
from app.loadgen.spec import RampSpec
from app.loadgen.stats import StepStats, turns_text
from app.run.events import RunListener


def register(sub) -> None:
    p = sub.add_parser("ramp", help="run a concurrency (or request-rate) ramp against a running server",
                       description="Ramp load on an OpenAI-compatible server (vLLM) and report throughput, "
                                   "TTFT, TPOT, ITL per level and the knee. The API key, if any, is read from "
                                   "VLLM_API_KEY or OPENAI_API_KEY, or from --api-key-file.")
    p.add_argument("--url", type=http_url, default="http://127.0.0.1:8000", help="server base URL (default %(default)s)")
    p.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--levels", type=number_list(), help="concurrency levels, e.g. 1,2,4,8,16")
    g.add_argument("--max-level", type=positive_int, help="geometric levels 1,2,4,… up to this")
    g.add_argument("--rate", type=number_list(what="request rates (req/s)", example="0.5,1,2,4"),
                   help="open-loop mode: request rates in req/s, e.g. 0.5,1,2,4 (Poisson arrivals; see --burstiness)")
    g.add_argument("--find-capacity", action="store_true",
                   help="find the most concurrent users that meet the SLO (--slo-…): probe 1, 2, 4 … then bisect")
    g.add_argument("--find-rate", action="store_true",
                   help="open loop: find the highest request rate (req/s) that meets the SLO")
    p.add_argument("--start", type=positive_number,
                   help="capacity search: first level probed (default 1 user, 1 req/s)")
    p.add_argument("--max-users", type=positive_number, default=1024.0,
                   help="capacity search: highest level it may probe (default %(default)g)")
    p.add_argument("--resolution", type=fraction, default=0.10,
                   help="capacity search: stop within this fraction (default %(default)g) or 1 user / 0.1 req/s")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="capacity search: run it N times (mean and spread)")
    p.add_argument("--min-requests", type=positive_int,
                   help="capacity search: completed requests each level is judged on (default 100: a p99 from "
                        "fewer is marked); --step-seconds is then the time cap (default 600)")
    p.add_argument("--step-seconds", type=positive_seconds, help="measured seconds per level (default 20 unless "
                                                                 "--requests-per-level is given)")
    p.add_argument("--requests-per-level", type=positive_int, help="measured requests per level")
    p.add_argument("--warmup-seconds", type=seconds, default=0.0,
                   help="seconds per level left out of the statistics")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    add_workload_options(p, "ramp")  # the workload's kinds: lengths, --prompts-file …, --multi-turn …, --seed
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="let the model stop at EOS")
    p.add_argument("--temperature", type=non_negative, default=0.0)
    p.add_argument("--request-timeout", type=positive_seconds, default=300.0, help="seconds (default 300)")
    p.add_argument("--max-failure-rate", type=fraction,
                   help="abort when a level's failures pass this fraction (default: Settings' safety limit, "
                        "0.2 unless changed there)")
    p.add_argument("--max-total-seconds", type=positive_seconds, help="cap on the whole ramp")
    p.add_argument("--slo-ttft-p99", type=positive_seconds, help="stop after a level whose TTFT p99 exceeds this (s)")
    p.add_argument("--slo-tpot-p99", type=positive_seconds, help="… TPOT p99 (s/token)")
    p.add_argument("--slo-e2e-p99", type=positive_seconds, help="… end-to-end p99 (s)")
    p.add_argument("--slo-failure-rate", type=fraction, help="… failure rate, a fraction (0.01 = 1 %%)")
    p.add_argument("--slo-ttfa-p99", type=positive_seconds,
                   help="… time to first answer token p99 (after a reasoning model's reasoning), s")
    p.add_argument("--slo-rejection-rate", type=fraction,
                   help="… share of requests the server refused with HTTP 503 (vLLM's --max-num-queued-reqs / "
                        "--max-num-queued-tokens), a fraction; a rejection is never a failure")
    p.add_argument("--json", type=output_file, help="write summary + steps as JSON here")
    p.add_argument("--csv", type=output_file, help="write the steps table as CSV here")
    p.add_argument("--requests-csv", type=output_file, help="write every request as CSV here")
    p.add_argument("--no-store", action="store_true", help="do not record the run in the run store")
    add_security_options(p, expose=False)
    p.set_defaults(func=run)


def spec_from_args(a: argparse.Namespace) -> RampSpec:
    """Build the RampSpec; raises ValueError/ValidationError with the option named."""
    kw: dict = {"url": a.url, "model": a.model, "warmup_seconds": a.warmup_seconds,
                "endpoint": "/v1/chat/completions" if a.endpoint == "chat" else "/v1/completions",
                "ignore_eos": a.ignore_eos, "temperature": a.temperature, "request_timeout": a.request_timeout,
                "max_total_seconds": a.max_total_seconds,
                "slo": {"ttft_p99": a.slo_ttft_p99, "tpot_p99": a.slo_tpot_p99, "e2e_p99": a.slo_e2e_p99,
                        "failure_rate": a.slo_failure_rate, "rejection_rate": a.slo_rejection_rate,
                        "ttfa_p99": a.slo_ttfa_p99},
                "requests_per_level": a.requests_per_level, **workload_kw(a, "ramp")}
    if a.max_failure_rate is not None:
        kw["max_failure_rate"] = a.max_failure_rate
    search = a.find_capacity or a.find_rate
    if not search:
        for opt, val, default in (("--start", a.start, None), ("--repeat", a.repeat, 1),
                                  ("--min-requests", a.min_requests, None)):
            if val != default:
                raise ValueError(f"{opt} is an option of the capacity search: add --find-capacity or --find-rate")
    else:
        if a.requests_per_level is not None and a.min_requests is not None:
            raise ValueError("--min-requests and --requests-per-level set the same floor: give one")
        if all(v is None for v in (a.slo_ttft_p99, a.slo_tpot_p99, a.slo_e2e_p99, a.slo_failure_rate,
                                   a.slo_rejection_rate, a.slo_ttfa_p99)):
            raise ValueError("a capacity search needs an SLO to judge levels on: give --slo-ttft-p99, "
                             "--slo-tpot-p99, --slo-e2e-p99, --slo-failure-rate and/or --slo-rejection-rate")
        kw["requests_per_level"] = a.min_requests or a.requests_per_level or P99_MIN_REQUESTS
        kw["step_seconds"] = a.step_seconds if a.step_seconds is not None else SEARCH_STEP_CAP_S
        kw["search"] = {"start": a.start or 1.0, "max_level": a.max_users, "resolution": a.resolution,
                        "repeat": a.repeat}
        if a.find_rate:
            kw["mode"] = "rate"
        return RampSpec(**kw)
    if a.step_seconds is not None or a.requests_per_level is None:
        kw["step_seconds"] = a.step_seconds if a.step_seconds is not None else 20.0
    else:
        kw["step_seconds"] = None
    if a.rate:
        kw.update(mode="rate", levels=a.rate)
    elif a.levels:
        kw["levels"] = a.levels
    else:
        kw["max_level"] = a.max_level or 16
    return RampSpec(**kw)


def dataset_text(spec: RampSpec) -> str:
    """The lengths a dataset ramp will send, before it runs: the summary (mean, p50, p90,
    max) and a compact histogram of the prompt and output tokens."""
    h = dataset_lengths(spec)
    ds = spec.dataset()
    head = (f"dataset {spec.prompts_name}: {h['entries']} entries ({h['format']})"
            + (f", {h['skipped']} records without a prompt skipped" if h["skipped"] else "")
            + (f"; {ds.note}" if ds.note else "") + f"; the first {h['prompt']['n']} requests:")
    return "\n".join([head, summary_text(h), "prompt tokens:", text_histogram(h["prompt"], rows=8),
                      "output tokens:", text_histogram(h["output"], rows=8)])


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.0f}"


def _fmt_level(st: StepStats) -> str:
    return f"{st.level:g}" + ("/s" if st.mode == "rate" else "")


class _Progress:
    """Live one-line progress per level (rewritten in place on a terminal)."""

    def __init__(self, out) -> None:
        self.out = out
        self.tty = out.isatty()
        self.lock = threading.Lock()
        self.level = None
        self.t_level = 0.0
        self.done = self.failed = self.rejected = self.tokens = 0
        self.last = 0.0

    def level_start(self, ev: dict) -> None:
        with self.lock:
            self.level = ev["level"]
            self.t_level = time.monotonic()
            self.done = self.failed = self.rejected = self.tokens = 0
            self._line(force=True)

    def records(self, recs) -> None:
        with self.lock:
            for r in recs:
                self.done += 1
                self.failed += 1 if r.failed else 0
                self.rejected += 1 if r.rejected else 0
                self.tokens += r.output_tokens if r.ok else 0
            self._line()

    def _line(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.tty or (not force and now - self.last < 0.5):
            return
        self.last = now
        el = max(now - self.t_level, 1e-3)
        rej = f"{self.rejected} rejected, " if self.rejected else ""
        self.out.write(f"\r  level {self.level:g}: {el:5.1f} s, {self.done} done, {self.failed} failed, {rej}"
                       f"~{self.tokens / el:.0f} tok/s   ")
        self.out.flush()

    def level_end(self, st: StepStats) -> None:
        with self.lock:
            if self.tty:
                self.out.write("\r\033[K")
            fails = ", ".join(f"{k} {v}" for k, v in sorted(st.failures.items()))
            self.out.write(f"  level {_fmt_level(st)}: {st.output_tps:.1f} out tok/s, TTFT p99 {_ms(st.ttft_p99)} ms, "
                           f"TPOT p50 {_ms(st.tpot_p50)} ms, {st.n_measured} requests"
                           + (f", sent {st.achieved_rps:.2f}/s" + (f" (short: {st.rate_short})" if st.rate_short else "")
                              if st.achieved_rps is not None else "")
                           + (f", failures: {fails}" if fails else "")
                           + (f", {st.rejected} rejected (HTTP 503)" if st.rejected else "") + (f" [{st.stop_reason}]" if st.stop_reason not in ("duration", "count") else "")
                           + "\n")
            self.out.flush()


def print_result(res, out=None, *, slo: bool = True) -> None:
    """The final table, the knee, a capacity search's answer and the stop reason, to
    ``out`` (default: the ``sys.stdout`` of the call, not of the import)."""
    out = sys.stdout if out is None else out
    if res.steps:
        out.write("\n" + level_table([st.model_dump() for st in res.steps], slo=slo) + "\n")
        for st in res.steps:
            if not st.steady:
                out.write(f"* {st.unsteady_reason}\n")
        server = server_table([st.model_dump() for st in res.steps])
        if server:
            out.write("\nthe server's own figures (/metrics):\n" + server + "\n")
        last = next((st for st in reversed(res.steps) if st.server is not None and st.server.notes), None)
        if last is not None:
            out.write(f"level {_fmt_level(last)}, client vs server: " + "; ".join(last.server.notes) + "\n")
        if any(st.turns for st in res.steps):
            out.write("\nTTFT p50/p99 by conversation turn:\n")
            for st in res.steps:
                if st.turns:
                    out.write(f"  {_fmt_level(st)}: {turns_text(st.turns)}\n")
    out.write("\n" + (res.knee.describe() if res.knee else "no knee found in these levels") + "\n")
    out.write(f"ramp {res.status}: {res.stop_reason}\n")
    verdict = getattr(res, "verdict", None)
    if verdict is not None:
        out.write(f"\n{verdict.sentence}\n")


def flag_of(loc: tuple) -> str:
    """The command-line option a RampSpec validation error is about: ``("step_seconds",)``
    → ``--step-seconds``, ``("slo", "ttft_p99")`` → ``--slo-ttft-p99``."""
    parts = [str(x) for x in loc if not isinstance(x, int)]
    if not parts:
        return "ramp"
    flag = "--" + "-".join(parts).replace("_", "-")
    return {"--mode": "--levels/--rate"}.get(flag, flag)


class _Listener(RunListener):
    """The controller's news → the live progress lines."""

    def __init__(self, prog: _Progress) -> None:
        self.prog = prog

    def on_level_start(self, ev: dict) -> None:
        self.prog.level_start(ev)

    def on_records(self, records: list) -> None:
        self.prog.records(records)

    def on_level(self, st: StepStats) -> None:
        self.prog.level_end(st)

    def on_safety_stop(self, reason: str) -> None:
        print(f"\n{reason}", flush=True)


def run(a: argparse.Namespace) -> int:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.run.controller import RecordSpec, RunController
    from app.run.target import launch_target
    from app.settings import load_settings

    apply_api_key_file(a)
    try:
        spec = spec_from_args(a)
    except ValidationError as e:
        print("vllm-dyno ramp: invalid ramp:\n" + "\n".join(
            f"  {flag_of(err['loc'])}: {err['msg'].removeprefix('Value error, ')}" for err in e.errors()),
            file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"vllm-dyno ramp: {e}", file=sys.stderr)
        return 2
    # the safety stops from Settings, as in the window; --max-failure-rate: this ramp's own limit
    safety = load_settings().safety
    if a.max_failure_rate is not None:
        if not safety.enabled:
            print(f"note: the safety limits are off in Settings: --max-failure-rate {a.max_failure_rate:g} is not "
                  "applied (settings.yaml: safety.enabled; the window: Settings → Safety limits)", file=sys.stderr)
        safety = safety.model_copy(update={"max_failure_rate": a.max_failure_rate})
    prog = _Progress(sys.stdout)
    ctl = RunController(listener=_Listener(prog))
    target = launch_target(Engine.ATTACH, attach_url=spec.url, attach_model=spec.model)
    interrupted = False
    try:
        ctl.launch(target)
        k = ctl.time_scale
        if k != 1.0:
            print(f"simulated rig at time scale {k:g}: durations, times and rates are in rig seconds "
                  f"(a {spec.step_seconds or 0:g} s step takes {(spec.step_seconds or 0) / k:.3g} s of wall time)")
        if spec.search is not None:
            sr = spec.search
            print(f"capacity search ({'users' if spec.mode == 'concurrency' else 'req/s'} from {sr.start:g} up to "
                  f"{sr.max_level:g}, {sr.repeat} repeat{'s' if sr.repeat > 1 else ''}) at "
                  f"{slo_text(spec.slo.model_dump(exclude_none=True))}, ≥ {spec.requests_per_level} requests a level "
                  f"(cap {spec.step_seconds:g} s) against {spec.url}{spec.endpoint}")
        else:
            levels = ", ".join(f"{x:g}" for x in spec.levels)
            print(f"ramp {spec.mode} levels [{levels}] against {spec.url}{spec.endpoint}")
        if spec.mode == "rate":
            print(f"open loop: {'Poisson' if spec.burstiness == 1 else f'gamma (burstiness {spec.burstiness:g})'} "
                  "arrivals" + (f", at most {spec.max_concurrency} in flight" if spec.max_concurrency else ""))
        print(f"requests: {spec.shape}")
        if spec.prompts_file is not None:
            print(dataset_text(spec))
        record = None if a.no_store else RecordSpec(name=f"ramp {spec.url}")
        try:
            ctl.start_ramp(spec, record=record, safety=safety)
            res = None
            while res is None:
                res = ctl.wait_ramp(0.2)
        except KeyboardInterrupt:
            interrupted = True
            ctl.abort_ramp("interrupted (Ctrl-C); completed requests kept")
            res = ctl.wait_ramp()
    finally:
        ctl.close()
    assert res is not None
    if res.status == "error":
        print(f"vllm-dyno ramp: {res.error}", file=sys.stderr)
        return 2 if not res.records else 1
    print_result(res, slo=not spec.slo.is_empty())
    if res.run_id is not None:
        print(f"recorded as run {res.run_id} (vllm-dyno runs show {res.run_id})")
    unsaved = res.unsaved  # the run store could not take the run (a full disk, a read-only home)
    exported = None
    try:
        # deferred: only this command needs it (vllm-dyno starts light)
        from app.loadgen import export

        if a.json:
            export.write_json(a.json, res, spec, time_scale=k)
            exported = a.json
        if a.csv:
            export.write_steps_csv(a.csv, res.steps)
        if a.requests_csv:
            export.write_requests_csv(a.requests_csv, res.records)
    except OSError as e:
        print(f"vllm-dyno ramp: cannot write the export ({e})", file=sys.stderr)
        return 1
    finally:
        if unsaved:
            print(f"vllm-dyno ramp: {unsaved_text(unsaved, exported)}", file=sys.stderr)
    if interrupted:
        return 130
    if not res.ok:
        print(f"vllm-dyno ramp: {res.stop_reason}", file=sys.stderr)
        return 1
    return 1 if unsaved else 0
