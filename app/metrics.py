"""The per-level metric vocabulary: each figure of a ramp level declared once (issue 33, item 3).

A :class:`Metric` names one figure of a level — a :class:`app.loadgen.stats.StepStats`
field (its JSON key, CSV column and SQL column: ``name``), or a figure a view derives from
several fields (``text``) or from elsewhere (``field=False``: the GUI's J/token) — with its
heading (``label`` and display ``unit``), the display ``scale`` (shown = stored × scale;
stored values are in s, tokens/s, requests/s, fractions; latencies shown in ms as ``vllm
bench serve`` reports them — its keys are declared in app.planner.benchserve.BENCH_KEYS),
its ``fmt`` and the views that show it.

Every per-level view is generated from :data:`LEVEL_METRICS`, in its order:

- :data:`RESULTS` — the GUI's Results table (``widgets.results``),
- :data:`CLI` — the CLI's per-level table (``app.cli.common.level_table``: ``ramp``,
  ``run``, ``runs show``),
- :data:`CSV` — ``ramp --csv`` and ``runs export --format csv`` (one shape:
  :func:`levels_csv`; the open-loop columns close it, as they always have),
- :data:`REPORT` — the HTML report's per-level table (``app.report``),
- :data:`STORE` — the run store's SQL columns of the ``levels`` table (``app.store``:
  a declared column an existing database lacks is added with ``ALTER TABLE``).

The JSON (``ramp --json``'s ``steps``, ``runs export``) is the StepStats model itself:
every field is there. ``tests/unit/test_metrics.py`` fails on a StepStats field that is
not declared here, and on a view with a column that is not declared here.

Recipe, a new per-level figure: add the field to StepStats and compute it
(``app.loadgen.stats``), then one :class:`Metric` here naming the views that show it.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

#: the views of a level (see the module docstring)
RESULTS, CLI, CSV, REPORT, STORE = "results", "cli", "csv", "report", "store"
VIEWS = (RESULTS, CLI, CSV, REPORT, STORE)
#: the tables that show a level to a reader (a heading and a formatted cell per figure)
TABLES = (RESULTS, CLI, REPORT)
#: what a cell without a value shows
NONE_TEXT = "–"


def get(level: Any, key: str, default: Any = None) -> Any:
    """``key`` of a level: a StepStats (attribute) or its dict (as stored, as dumped)."""
    if isinstance(level, Mapping):
        return level.get(key, default)
    return getattr(level, key, default)


#: stop reasons of a level cut short — stopped by the user, a signal or a dead load generator
#: (``aborted``), or the ramp's total cap (``total_cap``): its figures come from part of its
#: planned window (a *partial* level, kept and marked as such; issue 15, item 9)
PARTIAL_STOPS = ("aborted", "total_cap")


def is_partial(st: Any) -> bool:
    """Whether a level (StepStats, or a mapping with ``stop_reason``) was cut short
    (:data:`PARTIAL_STOPS`)."""
    reason = st.get("stop_reason") if isinstance(st, dict) else getattr(st, "stop_reason", None)
    return reason in PARTIAL_STOPS


@dataclass(frozen=True)
class Metric:
    """One per-level figure (see the module docstring)."""

    name: str
    label: str
    unit: str = ""
    scale: float = 1.0
    fmt: str = "{:g}"
    views: frozenset[str] = frozenset(VIEWS)
    #: the CLI's narrow heading (default: :attr:`heading` without its unit: the CLI's legend says them)
    abbr: Optional[str] = None
    #: the SQL type of its store column
    sql: str = "REAL"
    #: the value written when a level lacks it (the store's NOT NULL columns)
    default: Any = None
    #: an open-loop figure: the tables show it only when a level is a request rate
    rate: bool = False
    #: a tail percentile: the CLI marks it when judged on few requests
    tail: bool = False
    #: a figure only some runs have (TTFA: a reasoning model's): the CLI's and the report's
    #: tables show it only when a level has it
    sparse: bool = False
    #: a StepStats field (False: a figure the view supplies, e.g. the GUI's J/token)
    field: bool = True
    #: the cell's text from the whole level, when it is not the formatted value (a derived figure, words)
    text: Optional[Callable[[Any], str]] = None
    help: str = ""

    @property
    def heading(self) -> str:
        """The column's heading: the label, and the unit unless the label says it (``TTFT p99 ms``, ``out tok/s``)."""
        if not self.unit or self.unit == "%" or self.label.endswith(self.unit):
            return self.label
        return f"{self.label} {self.unit}"

    @property
    def cli_heading(self) -> str:
        return self.abbr or self.label

    def value(self, level: Any) -> Any:
        return get(level, self.name, self.default)

    def cell(self, level: Any) -> str:
        """The figure of ``level`` as a table shows it (scaled, formatted; :data:`NONE_TEXT` when missing)."""
        if self.text is not None:
            return self.text(level)
        return self.format(self.value(level))

    def format(self, v: Any) -> str:
        if v is None:
            return NONE_TEXT
        try:
            if self.fmt.endswith("d}"):
                return self.fmt.format(int(v))
            return self.fmt.format(v * self.scale)
        except (TypeError, ValueError):
            return str(v)

    def csv_value(self, level: Any) -> Any:
        """The raw stored value as a CSV cell: a mapping as ``k=v;…``, a list joined by ``; ``, None as ""."""
        v = self.value(level)
        if v is None:
            return ""
        if isinstance(v, Mapping):
            return ";".join(f"{k}={n}" for k, n in sorted(v.items()))
        if isinstance(v, (list, tuple)):
            return "; ".join(map(str, v))
        return v


# ---- derived cells (text) ------------------------------------------------------------------------------------

def _cap_text(level: Any) -> str:
    """Requests the max_concurrency cap delayed / held back (never sent), a rate level."""
    if get(level, "achieved_rps") is None:
        return NONE_TEXT
    return f"{get(level, 'n_delayed', 0)} / {get(level, 'n_held', 0)}"


def _turns_text(level: Any) -> str:
    """A multi-turn level's TTFT p50 per conversation turn, ms: ``66 · 101 · 106`` (turn 1, 2, 3 …;
    the first 8); "–" for other ramps."""
    turns = get(level, "turns") or []
    if not turns:
        return NONE_TEXT
    p50 = [get(t, "ttft_p50") for t in turns[:8]]
    return " · ".join(NONE_TEXT if v is None else f"{v * 1e3:.0f}" for v in p50) + (" …" if len(turns) > 8 else "")


def _slo_text(level: Any) -> str:
    broken = get(level, "slo_broken") or []
    return "broken: " + "; ".join(map(str, broken)) if broken else "met"


def _stop_text(level: Any) -> str:
    reason = str(get(level, "stop_reason") or "") + ("; partial level (cut short)" if is_partial(level) else "")
    return reason if get(level, "steady", True) is not False else f"{reason}; transient (window < e2e p50)"


_ALL = frozenset(VIEWS)
_CSV = frozenset({CSV})
_CSV_STORE = frozenset({CSV, STORE})
_GUI_CSV_STORE = frozenset({RESULTS, CSV, STORE})
_JSON = frozenset()  # in the JSON (the StepStats dump) only


def _ms(name: str, label: str, views: frozenset[str], tail: bool = False, sparse: bool = False) -> Metric:
    """A latency: stored in s, shown in ms (as ``vllm bench serve`` reports it)."""
    return Metric(name, label, "ms", 1000.0, "{:,.1f}", views, tail=tail, sparse=sparse)


#: every per-level figure, in the tables' reading order (the CSV's too; its open-loop columns last)
LEVEL_METRICS: tuple[Metric, ...] = (
    Metric("idx", "level #", fmt="{:d}", views=frozenset({CSV, STORE}), sql="INTEGER NOT NULL",
           help="the level's index in the ramp (0, 1, …)"),
    Metric("level", "level", fmt="{:g}", views=_ALL, sql="REAL NOT NULL",
           help="concurrent users (a closed-loop level) or the offered request rate, req/s (mode \"rate\")"),
    Metric("mode", "mode", fmt="{}", views=_CSV_STORE, sql="TEXT NOT NULL DEFAULT 'concurrency'",
           default="concurrency", help="\"concurrency\" (closed loop) or \"rate\" (open loop)"),
    Metric("t_start", "start", "s", views=frozenset({STORE}), help="the level's start, session clock"),
    Metric("t_end", "end", "s", views=frozenset({STORE}), help="the level's end, session clock"),
    Metric("offered_rps", "offered req/s", "req/s", fmt="{:g}", views=_CSV, rate=True,
           help="the level's request rate (open loop)"),
    Metric("achieved_rps", "sent req/s", "req/s", fmt="{:.2f}", views=frozenset({RESULTS, CLI, REPORT, CSV}),
           rate=True, abbr="sent/s", help="requests sent ÷ the seconds the level sent for (open loop)"),
    Metric("n_scheduled", "scheduled", fmt="{:d}", views=_CSV, rate=True,
           help="arrivals the seeded draw placed in the sending time"),
    Metric("n_delayed", "cap delayed", fmt="{:d}", views=_CSV, rate=True,
           help="arrivals that found the max_concurrency cap full and waited"),
    Metric("n_held", "cap held", fmt="{:d}", views=_CSV, rate=True,
           help="arrivals still waiting for the cap when the level stopped sending (never sent)"),
    Metric("cap", "cap delayed / held", views=frozenset({RESULTS}), rate=True, field=False, text=_cap_text,
           help="n_delayed / n_held"),
    Metric("rate_short", "short", fmt="{}", views=_CSV, rate=True,
           help="why a rate level fell short of its offered rate: server, client or draw"),
    Metric("n_measured", "requests", fmt="{:d}", views=_ALL, sql="INTEGER", abbr="reqs",
           help="requests sent in the measuring window (the latencies are theirs)"),
    Metric("n_ok", "OK", fmt="{:d}", views=frozenset({RESULTS, CSV}),
           help="of those, the successful"),
    Metric("failure_rate", "failures", "%", 100.0, "{:.1f} %", _ALL, abbr="fail",
           help="failed ÷ the measured requests the server admitted (a rejection is not a failure)"),
    Metric("failures", "failures by status", views=_CSV, help="failed requests by status (CSV: status=n;…)"),
    Metric("rejected", "rejected", fmt="{:d}", views=_ALL, sql="INTEGER", abbr="rej",
           help="measured requests the server refused with HTTP 503 (vLLM's admission control: "
                "--max-num-queued-reqs / --max-num-queued-tokens), not failures"),
    Metric("rejection_rate", "rejected %", "%", 100.0, "{:.1f} %", frozenset({RESULTS, REPORT, CSV, STORE}),
           help="rejected ÷ measured requests (the attempts), bounded by --slo-rejection-rate"),
    Metric("output_tps", "out tok/s", "tok/s", fmt="{:,.1f}", views=_ALL,
           help="output tokens that arrived in the window ÷ its length"),
    Metric("total_tps", "total tok/s", "tok/s", fmt="{:,.1f}", views=_GUI_CSV_STORE, help="output tokens plus the prompt tokens of requests sent in the window"),
    Metric("rps", "req/s", "req/s", fmt="{:.2f}", views=_ALL,
           help="successful requests that ended in the window ÷ its length"),
    Metric("goodput_rps", "goodput req/s", "req/s", fmt="{:.2f}", views=frozenset({RESULTS, REPORT, CSV, STORE}), help="those that also met every SLO bound"),
    _ms("ttft_p50", "TTFT p50", _ALL),
    _ms("ttft_p90", "TTFT p90", _CSV_STORE),
    _ms("ttft_p99", "TTFT p99", _ALL, tail=True),
    _ms("ttft_max", "TTFT max", _CSV),
    _ms("ttft_mean", "TTFT mean", _CSV),
    _ms("ttfa_p50", "TTFA p50", _GUI_CSV_STORE),
    _ms("ttfa_p99", "TTFA p99", frozenset({RESULTS, CLI, REPORT, CSV, STORE}), tail=True, sparse=True),
    Metric("reasoning_tokens_mean", "reasoning tok", "tokens", fmt="{:,.0f}", views=frozenset({RESULTS, REPORT, CSV, STORE}),
           help="mean reasoning tokens per successful request (delta.reasoning chunks; 0: no reasoning)"),
    _ms("tpot_p50", "TPOT p50", _ALL),
    _ms("tpot_p99", "TPOT p99", _ALL, tail=True),
    _ms("tpot_mean", "TPOT mean", _CSV),
    _ms("itl_p50", "ITL p50", _ALL),
    _ms("itl_p99", "ITL p99", _GUI_CSV_STORE),
    _ms("itl_mean", "ITL mean", _CSV),
    Metric("e2e_p50", "E2E p50", "s", fmt="{:.2f}", views=_GUI_CSV_STORE),
    Metric("e2e_p99", "E2E p99", "s", fmt="{:.2f}", views=_ALL, tail=True),
    Metric("e2e_mean", "E2E mean", "s", fmt="{:.2f}", views=_CSV),
    Metric("turns", "TTFT p50 by turn", "ms", views=frozenset({RESULTS}), text=_turns_text,
           help="a multi-turn ramp's TTFT per conversation turn (StepStats.turns)"),
    Metric("max_in_flight", "max in flight", fmt="{:d}", views=_CSV, help="the most requests in flight at once"),
    Metric("window_s", "window", "s", fmt="{:.3g}", views=_CSV, help="the measuring window's length"),
    Metric("energy_j_per_token", "J/token", "J/token", fmt="{:.3f}", views=frozenset({RESULTS}), field=False,
           help="the GPUs' energy over the window ÷ the output tokens (from the telemetry: the view supplies it)"),
    Metric("slo_broken", "SLO", views=frozenset({RESULTS, CLI, REPORT, CSV}), text=_slo_text,
           help="the SLO bounds the level broke (met when none)"),
    Metric("stop_reason", "stop", fmt="{}", views=frozenset({RESULTS, CSV}), text=_stop_text,
           help="why the level ended: duration, count, failure_rate, aborted, total_cap"),
    # in the JSON only (the StepStats dump): the window's bounds, flags and the server's own figures
    Metric("window_start", "window start", "s", views=_JSON),
    Metric("window_end", "window end", "s", views=_JSON),
    Metric("steady", "steady", views=_JSON, help="False: the window measured a start-up transient"),
    Metric("repeat", "repeat", views=_JSON, help="a capacity search's repeat that probed the level"),
    Metric("server", "server", views=_JSON, help="the server's own figures (app.loadgen.server_stats)"),
    Metric("server_problem", "server problem", views=_JSON, help="why `server` is None"),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in LEVEL_METRICS}


def in_view(view: str, metrics: Sequence[Metric] | None = None) -> list[Metric]:
    """The figures ``view`` shows, in order (a CSV's open-loop figures last)."""
    ms = [m for m in (LEVEL_METRICS if metrics is None else metrics) if view in m.views]
    if view == CSV:
        ms = [m for m in ms if not m.rate] + [m for m in ms if m.rate]
    return ms


def table_columns(view: str, levels: Iterable[Any] = (), metrics: Sequence[Metric] | None = None) -> list[Metric]:
    """A table's columns for ``levels``: its figures, less the open-loop ones unless a level
    is a rate, and less the :attr:`Metric.sparse` ones no level has."""
    levels = list(levels)
    rate = any(get(d, "mode") == "rate" for d in levels)
    return [m for m in in_view(view, metrics) if (rate or not m.rate)
            and (not m.sparse or any(get(d, m.name) is not None for d in levels))]


def csv_columns(metrics: Sequence[Metric] | None = None) -> list[str]:
    return [m.name for m in in_view(CSV, metrics)]


def levels_csv(levels: Iterable[Any], metrics: Sequence[Metric] | None = None) -> str:
    """CSV text of levels (StepStats or their dicts), one row per level: the :data:`CSV` figures, raw
    (seconds, tokens/s, fractions; failures as ``status=n;…``, the broken SLO bounds joined by ``; ``)."""
    cols = in_view(CSV, metrics)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([m.name for m in cols])
    for d in levels:
        w.writerow([m.csv_value(d) for m in cols])
    return buf.getvalue()


def store_columns(metrics: Sequence[Metric] | None = None) -> list[Metric]:
    """The ``levels`` table's figure columns (after ``run_id``, before ``stats``)."""
    return in_view(STORE, metrics)
