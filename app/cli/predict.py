"""``vllm-dyno predict``: a ``vllm bench serve`` run predicted, in its own terms.

The model, the cards (``--gpu``, ``--count``), ``--vllm-version`` and every ``vllm
serve`` option (generated from ServerConfig, :func:`app.config.add_server_options`),
and the benchmark as ``vllm bench serve`` takes it, with its defaults (generated from
:class:`app.planner.benchserve.BenchArgs`: ``--random-input-len``, ``--num-prompts``,
``--request-rate`` …, plus ``--lengths-file``). Prints the figures ``vllm bench serve``
prints, or writes them under its ``--save-result`` keys (``--json F``, ``-``: stdout).
``--sim-truth FILE`` predicts the simulated rig of a truth (docs/sim-truth.md) — a
what-if: "my cards' all-reduce is 2× worse than the model's".
``--compare RESULT.json`` lays a real result file beside the prediction, figure by
figure with the error in %, predicting its own requests' lengths when the file has
them (``--save-detailed``); a file measured with other traffic settings than the flags
is refused. Exit status: 0 predicted, 1 vLLM would not serve the configuration (the
plan's error and fix), 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from app.cli.common import BadInput, cards_from_args, config_from_args, executable, input_file, output_file, \
    positive_int, vllm_version, write_or_print


def _json_target(text: str) -> str:
    """``--json``: ``-`` (stdout) or a file to write."""
    return text if text == "-" else output_file(text)


def _result_file(text: str) -> str:
    """``--compare``: an existing result file (not stdin)."""
    if text == "-":
        raise argparse.ArgumentTypeError("-: give the result file's path (vllm bench serve --save-result)")
    return input_file(text)


def _truth_file(text: str) -> Any:
    """``--sim-truth``: a truth file (app.profiles.truth), read and validated."""
    from app.profiles.truth import TruthError, load_truth  # deferred: only with a truth

    try:
        return load_truth(text)
    except TruthError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(sub: argparse._SubParsersAction) -> None:
    # deferred: only this command needs them (vllm-dyno starts light)
    from app.config import add_server_options
    from app.planner.benchserve import add_bench_options

    p = sub.add_parser("predict", help="predict a vllm bench serve run: its figures under its own keys",
                       description="Predict what `vllm bench serve` would report against `vllm serve` with these "
                                   "options on these cards: the step-level engine of the planner serves the "
                                   "benchmark's requests as vLLM's client sends them (its lengths, arrivals and "
                                   "concurrency cap).")
    add_server_options(p)
    p.add_argument("--gpu", action="append", default=[], metavar="NAME[:GIB[:CC]]",
                   help="card name (catalog or NVML name; vllm-dyno plan --list-gpus shows the catalog); repeat once "
                        "per card for mixed cards; NAME:GIB:CC for a card the catalog does not know; 'CPU' for the "
                        "CPU build; default: the cards NVML sees")
    p.add_argument("--count", type=positive_int, help="number of cards of a single --gpu (default TP × PP)")
    p.add_argument("--vllm-version", type=vllm_version,
                   help="predict for this vLLM version (default: the installed one, else the newest known)")
    p.add_argument("--python", type=executable, help="interpreter with vLLM (to read its version)")
    add_bench_options(p.add_argument_group("vllm bench serve options (its flags and defaults)"))
    p.add_argument("--sim-truth", type=_truth_file, metavar="FILE",
                   help="predict the simulated rig of this truth (how its cards differ from the model; "
                        "docs/sim-truth.md) instead of the model: a what-if")
    p.add_argument("--json", type=_json_target, metavar="FILE",
                   help="write the prediction under vllm bench serve --save-result's keys to FILE ('-': stdout)")
    p.add_argument("--compare", type=_result_file, metavar="RESULT.json",
                   help="a real vllm bench serve --save-result file: measured vs predicted per figure (its "
                        "per-request lengths with --save-detailed); its num_prompts, request_rate, burstiness and "
                        "max_concurrency must be the flags'")
    p.set_defaults(func=cmd_predict)


def _num(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    return f"{v:.2f}" if math.isfinite(v) else str(v)


def render(pred, measured: dict[str, Any] | None = None, compare_name: str | None = None) -> str:
    """The prediction as ``vllm bench serve`` prints its result (its lines, in its
    order); with ``measured`` (a result file's keys) three columns and the error."""
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.planner.benchserve import BENCH_KEYS, compare_rows
    from app.planner.calibrate import hardware_fingerprint

    p = pred.plan
    lines = [f"vllm bench serve, predicted: {p.config.model} on {hardware_fingerprint(p.cards)}, "
             f"vLLM {p.rules.version}; parameters: {p.perf.params.source if p.perf else '—'}",
             f"  {pred.bench.describe()}", f"  request lengths: {pred.lengths_source}"]
    if measured is None:
        lines.append(f"{'':<2}{'figure':<36} {'predicted':>12}")
        for key, label in BENCH_KEYS.items():
            lines.append(f"  {label + ':':<36} {_num(pred.metrics[key]):>12}")
    else:
        lines.append(f"  measured: {compare_name}")
        lines.append(f"  {'figure':<36} {'measured':>12} {'predicted':>12} {'error':>9}")
        for _key, label, m, v, err in compare_rows(measured, pred.metrics):
            e = "—" if err is None else f"{err:+.1f} %"
            lines.append(f"  {label + ':':<36} {_num(m):>12} {_num(v):>12} {e:>9}")
        missing = [k for k in BENCH_KEYS if k not in measured]
        if missing:
            lines.append(f"  not in the file: {', '.join(missing)} (vllm bench serve --percentile-metrics "
                         "ttft,tpot,itl,e2el writes the E2EL figures)")
    lines += [f"  note: {n}" for n in pred.notes]
    err = pred.model_error()
    if err:
        lines.append(f"  {err}")
    return "\n".join(x for x in lines if x)


def cmd_predict(a: argparse.Namespace) -> int:
    # deferred: only this command needs them (vllm-dyno starts light)
    from pydantic import ValidationError
    # deferred: only this command needs them, as above
    from app.planner.benchserve import (BENCH_OPTIONS, BenchInputError, NotServable, bench_args_from,
                                        bench_prediction, check_traffic, compare_rows, lengths_note, read_result,
                                        result_lengths)
    from app.planner.models import ModelNotFoundError  # deferred: as above
    from app.planner.versions import installed_version  # deferred: as above

    try:
        bench = bench_args_from(a)
    except ValidationError as e:
        msgs = "; ".join((f"{BENCH_OPTIONS[str(err['loc'][0])].flag}: " if err["loc"] and str(err["loc"][0]) in
                          BENCH_OPTIONS else "") + err["msg"].removeprefix("Value error, ") for err in e.errors())
        raise BadInput(f"invalid benchmark options: {msgs}") from None
    cfg = config_from_args(a)
    measured = lengths = source = None
    if a.compare:
        try:
            measured = read_result(a.compare)
            check_traffic(measured, bench, a.compare)
        except BenchInputError as e:
            raise BadInput(f"--compare {e}") from None
        lengths = result_lengths(measured)
        if lengths is not None:
            source = f"the {len(lengths)} requests of {a.compare} (--save-detailed)"
    cards = cards_from_args(a.gpu, a.count, cfg.world_size)
    try:
        pred = bench_prediction(cfg, cards, bench, vllm_version=a.vllm_version or installed_version(a.python),
                                lengths=lengths, lengths_source=source,
                                under=a.sim_truth.apply if a.sim_truth is not None else None)
    except NotServable as e:
        print(f"vllm-dyno predict: {e}", file=sys.stderr)
        return 1
    except (BenchInputError, ModelNotFoundError) as e:
        raise BadInput(str(e)) from None
    except ValueError as e:  # a model the planner cannot read
        raise BadInput(f"--model {cfg.model}: {e}") from None
    if measured is not None and (note := lengths_note(measured, pred.lengths)):
        pred.notes.append(note)
    if a.json:
        out = pred.result()
        if measured is not None:
            out["compare"] = {"file": a.compare, "figures": {
                k: {"measured": m, "predicted": v, "error_pct": err} for k, _l, m, v, err in
                compare_rows(measured, pred.metrics)}}
        write_or_print(json.dumps(out, indent=1), None if a.json == "-" else a.json)
        if a.json != "-":
            print(render(pred, measured, a.compare))
    else:
        print(render(pred, measured, a.compare))
    return 0
