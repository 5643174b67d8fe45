"""``vllm-dyno compare``: two or more recorded runs side by side (scaling efficiency,
J/token, cost per million tokens), as a table, CSV or SVG.

Exit status: 0 success; 2 bad input (unknown run, a bad price).
"""
from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from app.cli.common import err, fmt, non_negative, output_file, run_number


def cmd_compare(a: argparse.Namespace) -> int:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.comparison import compare_runs
    from app.history import RunNotFound
    from app.settings import load_settings
    from app.store import RunStore

    try:
        saved = load_settings().pricing  # the prices from Settings, unless given here
        pricing = saved.model_validate({
            "gpu_hour": a.gpu_hour_price if a.gpu_hour_price is not None else saved.gpu_hour,
            "kwh": a.kwh_price if a.kwh_price is not None else saved.kwh,
            "currency": a.currency if a.currency is not None else saved.currency})
        with RunStore() as store:
            cmp = compare_runs(store, a.ids, pricing)
    except ValidationError as e:  # a bad price: the option and the fix, not pydantic's report
        flags = {"gpu_hour": "--gpu-hour-price", "kwh": "--kwh-price", "currency": "--currency"}
        return err("; ".join(f"{flags.get(str(x['loc'][0]), x['loc'][0])}: {x['msg'].removeprefix('Value error, ')}"
                             for x in e.errors()))
    except (RunNotFound, ValueError) as e:
        return err(str(e))
    cur = pricing.currency
    print(f"baseline: {cmp.series[cmp.baseline].label} ({cmp.series[cmp.baseline].gpus} GPUs)")
    for sr in cmp.series:
        if sr.verdict:
            print(f"{sr.label}: {sr.verdict}")
    for sr in cmp.series:
        if not sr.levels:
            print(f"note: {sr.label} has no completed level (status {sr.status}): it has no rows below")
    for w in cmp.warnings:
        print(f"warning: not comparable — {w}; no scaling efficiency is shown")
    if cmp.diff:
        print("\nwhat differs:")
        ids = [sr.label.split(" ")[0] for sr in cmp.series]
        for sec, key, vals in cmp.diff:
            print(f"  {sec:<13} {key:<28} " + "   ".join(f"{i} {v}" for i, v in zip(ids, vals)))
    head = (f"{'run':<28} {'GPUs':>4} {'level':>6} {'tok/s':>9} {'tok/s/GPU':>9} {'TTFT p99':>9} {'scaling':>8} "
            f"{'power W':>8} {'J/tok':>7} {cur + '/Mtok rent':>12} {cur + '/Mtok power':>13}")
    for title, rows in (("per level", cmp.rows), ("at each run's best level", cmp.peak_rows())):
        print(f"\n{title}:\n{head}\n" + "-" * len(head))
        for r in rows:
            print(f"{r.label[:28]:<28} {r.gpus:>4} {r.level:>6g} {r.output_tps:>9.1f} {r.tps_per_gpu:>9.1f} "
                  f"{fmt(r.ttft_p99, 0, 1e3):>7}ms {fmt(r.scaling_efficiency, 2):>8} {fmt(r.power_w, 0):>8} "
                  f"{fmt(r.j_per_token, 3):>7} {fmt(r.cost_per_mtok_rented, 3):>12} "
                  f"{fmt(r.cost_per_mtok_energy, 4):>13}")
    if a.csv:
        # deferred: only this command needs it (vllm-dyno starts light)
        from app.profiles.io import write_atomic

        write_atomic(a.csv, cmp.to_csv())
        print(f"wrote {a.csv}", file=sys.stderr)
    if a.svg:
        # deferred: only this command needs it (vllm-dyno starts light)
        from app.profiles.io import write_atomic

        write_atomic(a.svg, cmp.to_svg())
        print(f"wrote {a.svg}", file=sys.stderr)
    if a.html:
        # deferred: only this command needs it (vllm-dyno starts light)
        from app.profiles.io import write_atomic
        from app.report import compare_report

        write_atomic(a.html, compare_report(cmp))
        print(f"wrote {a.html}", file=sys.stderr)
    return 0


def register(sub) -> None:
    c = sub.add_parser("compare", help="compare two or more runs: scaling efficiency, J/token, cost per Mtok")
    c.add_argument("ids", type=run_number, nargs="+", metavar="ID")
    c.add_argument("--gpu-hour-price", type=non_negative, help="price per GPU-hour (rented cards)")
    c.add_argument("--kwh-price", type=non_negative,
                   help="electricity price per kWh (owned cards; uses measured power)")
    c.add_argument("--currency", help="label of the prices (default: Settings, else $)")
    c.add_argument("--csv", type=output_file, help="write the per-level table as CSV here")
    c.add_argument("--svg", type=output_file, help="write both overlay charts as SVG here")
    c.add_argument("--html", type=output_file, help="write the comparison as one self-contained HTML report here")
    c.set_defaults(func=cmd_compare)
