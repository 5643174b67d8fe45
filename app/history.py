"""Run history over the run store: list, show, delete, export (JSON, CSV), and turn a
finished run back into a profile with its results.

A run recorded by :class:`app.run.controller.RunController` (through
:class:`app.run.record.RunRecorder`) keeps the profile snapshot under
``runs.config.profile``; runs from ``vllm-dyno ramp`` have none (``profile_from_run``
then needs a ``server`` mapping from the caller).
"""
from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass
from typing import Any

from app import metrics
from app.loadgen.capacity import answer_text
from app.engines import Engine
from app.profiles.io import profile_from_data
from app.profiles.model import HardwareFingerprint, Profile, ResultsSummary

#: level columns of the CSV export: ``ramp --csv``'s (one shape, declared in app.metrics)
LEVEL_COLUMNS = metrics.csv_columns()
#: request columns of the CSV export (``ramp --requests-csv``'s, app.loadgen.export, less its tpot):
#: ``turn`` is a multi-turn request's turn of its conversation (0: none; empty: not recorded)
REQUEST_COLUMNS = ["level_idx", "level", "t_start", "ttft", "e2e", "prompt_tokens", "output_tokens",
                   "tokens_source", "status", "error", "n_chunks", "turn"]

#: the run list's columns (History tab): (heading, tooltip). The tok/s column is the run's
#: *peak* (app.loadgen.stats.peak_level: the best level that met the SLO), so it says "at SLO"
#: (issue 37: it read "Peak out tok/s")
RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Run", "the run's number in the run store"), ("When", "when it was recorded"), ("Name", "the run's name"),
    ("Engine", "vllm, sim, ray or attach"), ("Status", "how the ramp ended"),
    ("Users at SLO", "the verdict's users at the SLO (app.run.verdict)"),
    ("Out tok/s at SLO", "output tokens/s of the best level that met the SLO; without an SLO, the best level's; "
                         "'(SLO not met)': no level met it, the best of all levels"),
    ("at level", "that level: users (requests in flight), or requests/s for an open-loop ramp"),
    ("GPUs", "the cards the server used"))


def peak_text(row: "RunRow") -> str:
    """The tok/s cell of :data:`RUN_COLUMNS`: ``1,234``; ``1,234 (SLO not met)`` when the
    run had an SLO and no level met it (its peak is then the best of all levels); ``–``
    without a figure."""
    if row.peak_output_tps is None:
        return "–"
    return f"{row.peak_output_tps:,.0f}" + (" (SLO not met)" if row.users_at_slo == 0 else "")


class RunNotFound(LookupError):
    """No run with that id in the store."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class RunRow:
    """One line of the run list. ``created`` Unix time; ``peak_output_tps`` tokens/s;
    ``users_at_slo`` and ``verdict`` the run's answer (app.run.verdict; None without an SLO
    or for runs recorded before verdicts)."""

    id: int
    created: float
    name: str
    engine: str
    status: str
    peak_output_tps: float | None
    peak_level: float | None
    gpu_count: int | None
    users_at_slo: float | None = None
    verdict: str | None = None
    #: the answer came from a fixed ramp's short levels (app.run.verdict.is_indicative)
    indicative: bool = False

    @property
    def users_text(self) -> str:
        """The "Users at SLO" cell: app.loadgen.capacity.answer_text's figure."""
        return answer_text(self.users_at_slo, indicative=self.indicative, cell=True)

    @property
    def created_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created))


def cards_text(hw: dict[str, Any] | None) -> str:
    """A stored hardware fingerprint (a run's ``summary.hardware``, a profile's
    ``hardware``) in short: ``4× RTX 4090``, ``2 hosts × 1× CPU (2 cores)``
    (:meth:`HardwareFingerprint.cards_text`); ``""`` without one."""
    if not hw or not hw.get("gpu"):
        return ""
    try:
        return HardwareFingerprint.model_validate(hw).cards_text()
    except ValueError:  # a fingerprint of another version of the app: its two main fields
        return f"{hw.get('count', 1)}× {hw['gpu']}"


def list_runs(store) -> list[RunRow]:
    """All runs, newest first."""
    out = []
    for r in store.list_runs():
        s = r.get("summary") or {}
        v = s.get("verdict") or {}
        out.append(RunRow(r["id"], r["created"], r["name"], r["engine"], r["status"], s.get("peak_output_tps"),
                          s.get("peak_level"), s.get("gpu_count"), v.get("users"), v.get("sentence"),
                          bool(v.get("indicative"))))
    return out


def get_run(store, run_id: int) -> dict[str, Any]:
    """The run's row (JSON fields decoded) plus ``levels`` (StepStats dicts). Raises
    :class:`RunNotFound`."""
    r = store.get_run(run_id)
    if r is None:
        ids = ", ".join(str(x["id"]) for x in store.list_runs()[:20]) or "none"
        raise RunNotFound(f"no run {run_id} in {store.path} (runs: {ids}); see `vllm-dyno runs list`")
    r["levels"] = store.levels(run_id)
    return r


def delete_run(store, run_id: int) -> None:
    """Delete a run and everything recorded with it. Raises :class:`RunNotFound`."""
    if not store.delete_run(run_id):
        raise RunNotFound(f"no run {run_id} to delete; see `vllm-dyno runs list`")


def export_json(store, run_id: int, *, requests: bool = True, samples: bool = True, log: bool = True) -> dict:
    """Everything about a run as one JSON-ready mapping: the run row, ``levels``,
    ``requests`` (chunk offsets as lists, s; ``turn``: of its multi-turn conversation),
    ``samples`` ([t, source, name, value]) and ``server_log`` ([t, stream, line]). Times
    in session-clock seconds."""
    r = get_run(store, run_id)
    if requests:
        reqs = store.requests(run_id)
        for q in reqs:
            q["chunk_offsets"] = [round(float(x), 6) for x in q["chunk_offsets"]]
        r["requests"] = reqs
    if samples:
        r["samples"] = [list(s) for s in store.samples(run_id)]
    if log:
        r["server_log"] = [list(x) for x in store.log_lines(run_id)]
    return r


def _csv(rows: list[list[Any]], header: list[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for row in rows:
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


def levels_csv(store, run_id: int) -> str:
    """CSV of the run's levels (:func:`app.metrics.levels_csv`, as ``ramp --csv``: :data:`LEVEL_COLUMNS`;
    seconds, tokens/s, fractions)."""
    return metrics.levels_csv(get_run(store, run_id)["levels"])


def requests_csv(store, run_id: int) -> str:
    """CSV of the run's requests (:data:`REQUEST_COLUMNS`; no chunk times)."""
    get_run(store, run_id)
    rows = [[int(q["chunk_offsets"].size) if c == "n_chunks" else q.get(c) for c in REQUEST_COLUMNS]
            for q in store.requests(run_id)]
    return _csv(rows, REQUEST_COLUMNS)


def results_of(store, run_id: int, which: str = "latest") -> ResultsSummary:
    """The :class:`ResultsSummary` of a recorded run (from its levels)."""
    r = get_run(store, run_id)
    s = r.get("summary") or {}
    knee = s.get("knee")
    return ResultsSummary.from_levels(r["levels"], run_id=run_id, status=r["status"],
                                      knee=knee.get("level") if isinstance(knee, dict) else None,
                                      recorded_at=r.get("finished") or r["created"], which=which)


def best_run(store, profile_name: str) -> int | None:
    """The finished run of ``profile_name`` with the highest peak output tokens/s."""
    best, best_tps = None, -1.0
    for r in store.list_runs():
        s = r.get("summary") or {}
        if r["name"] == profile_name and s.get("peak_output_tps") is not None and s["peak_output_tps"] > best_tps:
            best, best_tps = r["id"], s["peak_output_tps"]
    return best


def profile_from_run(store, run_id: int, name: str | None = None, *, which: str = "latest",
                     server: dict[str, Any] | None = None) -> Profile:
    """The settings of a run as a profile with its results and hardware fingerprint.

    ``name``: the new profile's name (default: the run's). ``server``: a ``--config``
    mapping for runs recorded without a profile (``vllm-dyno ramp``). Raises
    :class:`RunNotFound`, ValueError when the run carries no settings and none are
    given, ``pydantic.ValidationError`` for bad settings.
    """
    r = get_run(store, run_id)
    cfg = r.get("config") or {}
    data = dict(cfg.get("profile") or {})
    if not data:
        if server is None:
            raise ValueError(f"run {run_id} was recorded without a profile (e.g. by `vllm-dyno ramp`): "
                             "give the server settings (a vLLM --config mapping) to make one")
        data = {"engine": r.get("engine") or Engine.VLLM.value}
        if r.get("spec"):
            data["ramp"] = {k: v for k, v in r["spec"].items() if k not in ("url", "model")}
    if server is not None:
        data["server"] = server
    data["name"] = name or data.get("name") or r["name"] or f"run {run_id}"
    engine = Engine.parse(data.get("engine") or Engine.VLLM)
    if engine is not None and not engine.launches and not data.get("attach_url"):
        data["attach_url"] = (r.get("spec") or {}).get("url", "http://127.0.0.1:8000")
    data["results"] = results_of(store, run_id, which).model_dump(mode="json")
    hw = (r.get("summary") or {}).get("hardware")
    if hw:
        data["hardware"] = HardwareFingerprint.model_validate(hw).model_dump(exclude_none=True)
        if engine is not None and engine.simulated and not data.get("sim"):  # a `ramp` run against a sim: its rig
            data["sim"] = {"gpu": data["hardware"]["gpu"], "count": data["hardware"].get("count", 1)}

    return profile_from_data(data, f"run {run_id}")
