"""Parse time and peak memory of the worst YAML inputs, before and after the limits.

Issue 15 item 13: a 359-byte "billion laughs" settings.yaml took 38 s and 5.5 GB, a
profile with 50,000 levels of nesting or a 5,000-digit integer broke every command.
Each input is read in a fresh child process, twice:

- before: PyYAML's ``yaml.safe_load`` (the old readers), then ``repr()`` of the result
  — what the old settings loader did with a value it dropped (``_short``), and what any
  walk of the result (pydantic, a copy, a log line) costs;
- after: :func:`app.fileio.load_yaml` (the one loader, default limits) then the same
  ``repr()`` of whatever it returned (nothing when it refused).

The child runs under an address-space cap (``--cap-gib``, default 2) and a timeout
(``--timeout``, default 60 s), so "before" ends in MemoryError or a timeout instead of
taking the machine; the figures then say so. Printed per input: outcome, wall seconds,
peak RSS (MiB). Also the worst inputs the limits still accept (a 1 MiB scalar, 20,000
values, 63 levels, 100 aliases), parsed by the loader and loaded as settings.yaml.

Usage: ``python benchmarks/yaml_limits.py [--cap-gib 2] [--timeout 60]``
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, os, resource, sys, time
sys.setrecursionlimit(1000)
cap = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
mode, path = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
outcome = "ok"
try:
    if mode == "before":
        import yaml
        with open(path, encoding="utf-8") as f:
            v = yaml.safe_load(f.read())
        n = len(repr(v))
    elif mode == "after":
        from app.fileio import YamlError, read_yaml
        try:
            v = read_yaml(path)
            n = len(repr(v))
        except YamlError as e:
            outcome = "refused: " + e.reason[:70]
    else:  # settings: the whole settings loader of the app
        os.environ["VLLM_DYNO_HOME"] = os.path.dirname(path)
        from app.settings import load_settings_report
        rep = load_settings_report(upgrade_file=False)
        outcome = ("warning: " + rep.messages[0].split(": ", 1)[1][:70]) if rep.messages else "ok"
except BaseException as e:  # noqa: BLE001 - the point is to see what the old readers raise
    outcome = f"{type(e).__name__}: {str(e)[:60]}"
dt = time.perf_counter() - t0
print(json.dumps({"outcome": outcome, "s": dt,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def billion_laughs(levels: int) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghij"
    for prev, cur in zip(names[:levels - 1], names[1:levels]):
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def worst_inputs() -> dict[str, str]:
    return {
        "billion laughs, 7 levels (10^7 values)": billion_laughs(7),
        "billion laughs, 9 levels (10^9 values)": billion_laughs(9),
        "50,000 levels of [": "notes: " + "[" * 50_000 + "]" * 50_000 + "\n",
        "5,000-digit integer": "gpu_sample_hz: " + "9" * 5_000 + "\n",
        "8 MiB file": "notes: [" + "1," * (4 * 2**20) + "1]\n",
    }


def accepted_inputs() -> dict[str, str]:
    return {
        "1 MiB string": "notes: " + "x" * (2**20 - 16) + "\n",
        "19,990 values": "notes: [" + ",".join(["1"] * 19_990) + "]\n",
        "63 levels": "notes: " + "[" * 63 + "]" * 63 + "\n",
        "100 aliases of 190 values": "a: &a [" + ",".join(["1"] * 190) + "]\nb: [" + ",".join(["*a"] * 100) + "]\n",
    }


def run(mode: str, path: Path, cap: int, timeout: float) -> dict:
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), str(cap)], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"outcome": f"still running after {timeout:.0f} s (killed)", "s": timeout, "rss_mib": float("nan")}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"outcome": f"died (exit {r.returncode}) {r.stderr.strip()[-60:]}", "s": float("nan"),
                "rss_mib": float("nan")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap-gib", type=float, default=2.0, help="address-space cap of each child (GiB)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a child is killed")
    a = ap.parse_args(argv)
    cap = int(a.cap_gib * 2**30)
    d = Path(tempfile.mkdtemp(prefix="dyno-yaml-bench-"))
    path = d / "settings.yaml"
    print(f"each child: address space ≤ {a.cap_gib:g} GiB, ≤ {a.timeout:.0f} s; RSS = peak resident MiB")
    print(f"{'input':<42} {'bytes':>9}  {'reader':<9} {'s':>7} {'RSS':>7}  outcome")
    for title, rows in (("worst inputs", worst_inputs()), ("accepted at the limits", accepted_inputs())):
        print(f"-- {title}")
        for name, text in rows.items():
            path.write_text(text, encoding="utf-8")
            modes = ("before", "after", "settings") if title == "worst inputs" else ("after", "settings")
            for mode in modes:
                res = run(mode, path, cap, a.timeout)
                print(f"{name if mode == modes[0] else '':<42} {len(text.encode()) if mode == modes[0] else '':>9}  "
                      f"{mode:<9} {res['s']:>7.3f} {res['rss_mib']:>7.0f}  {res['outcome']}", flush=True)
    path.unlink()
    os.rmdir(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
