"""Export a ramp's result: JSON (summary + steps) and CSV (steps; requests).

Files are written to a temporary sibling and renamed into place, so a crash never
leaves a half-written file.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Iterable

from app import metrics
from app.fileio import write_atomic
from app.loadgen.generator import RampResult
from app.loadgen.prompts import dataset_lengths
from app.loadgen.records import RequestRecord
from app.loadgen.spec import RampSpec
from app.loadgen.stats import StepStats, peak_level

#: the levels CSV's columns (one shape with ``runs export --format csv``: app.metrics, the figures in view CSV)
STEP_COLUMNS = metrics.csv_columns()
REQUEST_COLUMNS = ["level_idx", "level", "t_start", "ttft", "tpot", "e2e", "prompt_tokens", "output_tokens",
                   "tokens_source", "status", "error", "n_chunks", "turn"]


def summary(result: RampResult) -> dict:
    """Summary dict: status, stop reason, model, knee (with evidence), the peak (the one
    definition, :func:`app.loadgen.stats.peak_level`), request counts by status."""
    by_status: dict[str, int] = {}
    for r in result.records:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    best = peak_level(result.steps)
    return {"status": result.status, "stop_reason": result.stop_reason, "error": result.error,
            "model": result.model, "knee": result.knee.model_dump() if result.knee else None,
            "knee_text": result.knee.describe() if result.knee else None,
            "peak_output_tps": best.output_tps if best else None, "peak_level": best.level if best else None,
            "requests": len(result.records), "requests_by_status": by_status}


def _lengths(spec: RampSpec | None) -> dict | None:
    """A dataset ramp's length histograms (:func:`app.loadgen.prompts.dataset_lengths`);
    None without a dataset, or when it can no longer be read."""
    try:
        return dataset_lengths(spec) if spec is not None else None
    except ValueError:
        return None


def to_json(result: RampResult, spec: RampSpec | None = None, time_scale: float = 1.0) -> dict:
    """``{"spec", "summary", "steps"}`` (``summary.lengths``: a dataset ramp's prompt and
    output length histograms, :func:`app.loadgen.prompts.dataset_lengths`) and, when the run controller computed them,
    ``"capacity"`` (users at the SLO) and ``"verdict"``, ready for json.dump (times in s). ``time_scale``:
    the sim's k when the steps are in rig seconds (``summary.time_scale``; 1 otherwise)."""
    out = {"spec": spec.model_dump(mode="json") if spec else None,
           "summary": {**summary(result), "time_scale": time_scale, "shape": spec.shape if spec else None,
                       "lengths": _lengths(spec)},
           "steps": [s.model_dump(mode="json") for s in result.steps]}
    capacity = getattr(result, "capacity", None)
    if capacity is not None:  # users at the SLO (app.loadgen.capacity.Capacity)
        out["capacity"] = capacity.model_dump(mode="json")
    verdict = getattr(result, "verdict", None)
    if verdict is not None:  # the one-sentence answer (app.run.verdict.Verdict)
        out["verdict"] = verdict.model_dump(mode="json")
    return out


def write_json(path: Path | str, result: RampResult, spec: RampSpec | None = None, time_scale: float = 1.0) -> None:
    """Write :func:`to_json` to ``path`` (atomically)."""
    write_atomic(path, json.dumps(to_json(result, spec, time_scale), indent=2))


def steps_csv(steps: Iterable[StepStats]) -> str:
    """CSV text of the step stats, one row per level (:func:`app.metrics.levels_csv`: columns
    :data:`STEP_COLUMNS`)."""
    return metrics.levels_csv(steps)


def requests_csv(records: Iterable[RequestRecord]) -> str:
    """CSV text of per-request records (columns :data:`REQUEST_COLUMNS`; no chunk times)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(REQUEST_COLUMNS)
    for r in records:
        row = [r.level_idx, r.level, r.t_start, r.ttft, r.tpot, r.e2e, r.prompt_tokens, r.output_tokens,
               r.tokens_source, r.status, r.error, int(r.chunk_offsets.size), r.turn]
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


def write_steps_csv(path: Path | str, steps: Iterable[StepStats]) -> None:
    write_atomic(path, steps_csv(steps))


def write_requests_csv(path: Path | str, records: Iterable[RequestRecord]) -> None:
    write_atomic(path, requests_csv(records))
