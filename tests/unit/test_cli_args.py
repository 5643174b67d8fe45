"""Issue 15 item 12: every option of every subcommand fed bad values — message naming the
option, exit 2, never a traceback; and a failed run exits non-zero.

The table :data:`BAD` holds, per subcommand and option (a positional by its name), the
bad values tried; :func:`test_table_covers_every_option` walks the real parser so that a
new option without an entry (or an exemption saying why it has no bad value) fails.
Each case runs ``app.cli.main`` in this process: the checks happen while the options are
parsed or before anything starts, so no case launches, connects or writes.
"""
from __future__ import annotations

import argparse
import io
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from app.cli import build_parser, main

#: a real vllm bench serve result (tests/cases/benchserve/), for calibrate's and predict's cases
BENCH_RESULT = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "cases" / "benchserve"
                   / "cpu-tiny-llama-c4.json")

#: arguments every case of a subcommand starts with (the rest valid), then option + bad value
BASE: dict[str, list[str]] = {
    "serve": ["--model", "Llama-3-8B", "--engine", "sim", "--sim-gpu", "RTX 4090"],
    "cleanup": [],
    "plan": ["--model", "Llama-3-8B", "--gpu", "RTX 4090"],
    "diagnose": [],
    "calibrate": ["--bench-result", BENCH_RESULT, "--model", "Llama-3-8B", "--gpu", "RTX 4090"],
    "predict": ["--model", "Llama-3-8B", "--gpu", "RTX 4090"],
    "ramp": ["--url", "http://127.0.0.1:9", "--levels", "1"],
    "telemetry": ["--no-gpu", "--seconds", "1"],
    "runs list": [],
    "runs show": [],
    "runs export": ["1"],
    "runs delete": [],
    "run": ["Sim demo: 8x RTX 4090 Llama-3-70B AWQ"],
    "compare": ["1", "2"],
    "profiles list": [],
    "profiles show": [],
    "profiles export": ["CPU tiny model"],
    "profiles import": [],
    "profiles delete": [],
    "profiles save-run": [],
    "agent": [],
    "hosts check": ["localhost"],
    "hosts plan": ["a@h1", "b@h2", "--model", "/m", "--pipeline-parallel-size", "2"],
    "tune": ["--engine", "sim", "--sim-gpu", "RTX 4090", "--sim-gpu-count", "8", "--model", "Llama-3-8B",
             "--slo-ttft-p99", "2", "--dry-run"],
}

#: the vLLM options, shared by serve, plan and run (checked by their ServerConfig field)
SERVER_BAD: dict[str, list[str]] = {
    "--model": [""],
    "--tensor-parallel-size": ["abc", "0", "-2", "1.5"],
    "--pipeline-parallel-size": ["abc", "0"],
    "--data-parallel-size": ["abc", "0"],
    "--max-num-seqs": ["abc", "0", "-1"],
    "--max-num-batched-tokens": ["abc", "0"],
    "--max-num-active-seqs": ["abc", "0", "-1"],
    "--max-num-queued-reqs": ["abc", "-1", "1.5"],
    "--max-num-queued-tokens": ["abc", "-1"],
    "--max-model-len": ["abc", "inf", "1e400", "nan", "-5", "0"],
    "--dtype": ["float7"],
    "--gpu-memory-utilization": ["abc", "0", "1.5", "-0.5", "nan", "inf"],
    "--host": ["999.1.1.1", "not a host", ""],
    "--port": ["abc", "0", "70000", "-1"],
    "--gpus": ["abc", "0,x", "-1"],
    "--env": ["NOEQUALS", "VLLM_API_KEY=sk-123", "1BAD=x"],
    "--extra": ['--foo "bar', "positional", "--api-key=sk-1"],
    "--api-key-file": ["/nonexistent/key"],
    "--speculative-config": ['{"method": "lookahead", "num_speculative_tokens": 2}',
                             '{"method": "eagle", "num_speculative_tokens": 3}', "{not json", "[1]"],
}

#: the sim rig's options (app.profiles.model.SIM_RIG_OPTIONS), shared by serve, run and tune
SIM_BAD: dict[str, list[str]] = {
    "--sim-gpu": ["No Such GPU"],
    "--sim-gpu-count": ["abc", "0", "-8", "65"],
    "--sim-hosts": ["abc", "0", "-2"],
    "--sim-link": ["eth0", "", "infiniband"],
    "--sim-time-scale": ["abc", "0", "-1", "inf"],
    "--sim-seed": ["abc", "-1", "1.5"],
    "--sim-perturb": ["abc", "-1"],
    "--sim-truth": ["/nonexistent/truth.yaml", "/"],
    "--sim-spec-acceptance": ["abc", "1.5", "-0.1", "nan"],
    "--sim-cooling": ["arctic", "0.1", "9", "nan", ""],
    "--sim-ambient-c": ["abc", "-5", "99", "nan", "inf"],
}

#: (subcommand, option) → bad values; positionals by their dest
BAD: dict[tuple[str, str], list[str]] = {
    ("agent", "--gpus"): ["abc", "-1"],
    ("hosts check", "destinations"): ["u@h:99999", "u@bad_host!"],
    ("hosts check", "--dyno"): ["", "'unclosed"],
    ("hosts check", "--known-hosts"): ["/nonexistent/known_hosts"],
    ("hosts check", "--identity"): ["/nonexistent/id_ed25519"],
    ("hosts check", "--seconds"): ["abc", "0"],
    ("hosts check", "--ssh-config"): ["/nonexistent/ssh_config"],
    ("hosts check", "--tensor-parallel-size"): ["abc", "0"],
    ("hosts check", "--pipeline-parallel-size"): ["abc", "0"],
    ("hosts check", "--data-parallel-size"): ["abc", "0"],
    ("hosts check", "--gpus-per-host"): ["abc", "0"],
    ("hosts check", "--backend"): ["tcp"],
    ("hosts check", "--port"): ["abc", "0", "70000"],
    ("hosts check", "--ray-address"): ["no-port", "h:99999"],
    ("hosts plan", "--backend"): ["tcp"],
    ("hosts plan", "--port"): ["abc", "0", "70000"],
    ("hosts plan", "--ray-address"): ["no-port", "h:99999"],
    ("run", "--known-hosts"): ["/nonexistent/known_hosts"],
    ("run", "--identity"): ["/nonexistent/id_ed25519"],
    ("run", "--ssh-config"): ["/nonexistent/ssh_config"],
    ("tune", "--known-hosts"): ["/nonexistent/known_hosts"],
    ("tune", "--identity"): ["/nonexistent/id_ed25519"],
    ("tune", "--ssh-config"): ["/nonexistent/ssh_config"],
    ("hosts plan", "destinations"): ["u@h:99999"],
    ("hosts plan", "--model"): [""],
    ("hosts plan", "--tensor-parallel-size"): ["abc", "0"],
    ("hosts plan", "--pipeline-parallel-size"): ["abc", "0", "3"],
    ("hosts plan", "--data-parallel-size"): ["abc", "0", "3"],
    ("hosts plan", "--gpus-per-host"): ["abc", "0"],
    ("serve", "--startup-timeout"): ["-5", "0", "abc", "nan", "inf"],
    ("serve", "--grace"): ["-1", "0", "abc"],
    ("serve", "--sim-engine-dies-at-request"): ["abc", "0"],
    ("serve", "--engine"): ["warp"],
    ("serve", "--python"): ["/nonexistent/python3"],
    ("plan", "--gpu"): ["No Such GPU", "X:abc:8.9", "X:16:zz"],
    ("plan", "--count"): ["abc", "0", "4,x"],
    ("plan", "--nodes"): ["abc", "0", "1,x", ",", "-4"],
    ("plan", "--cards-per-node"): ["abc", "0", "-1"],
    ("plan", "--link"): ["eth", "ib", ""],
    ("plan", "--from-run"): ["abc", "0", "999"],
    ("plan", "--busy-gib"): ["abc", "-1", "nan"],
    ("plan", "--prompt-tokens"): ["abc", "0", "-5"],
    ("plan", "--spec-acceptance"): ["abc", "1.5", "-1"],
    ("plan", "--output-tokens"): ["abc", "0"],
    ("plan", "--levels"): ["abc", "0", "1,x", ",", "1.5"],
    ("plan", "--seed"): ["abc", "-1"],
    ("plan", "--warmup-seconds"): ["abc", "-1"],
    ("plan", "--step-seconds"): ["abc", "0", "-1"],
    ("plan", "--slo-ttft-p99"): ["abc", "0", "-2"],
    ("plan", "--slo-tpot-p99"): ["0"],
    ("plan", "--slo-e2e-p99"): ["-1"],
    ("plan", "--vllm-version"): ["abc"],
    ("plan", "--python"): ["/nonexistent/python3"],
    ("plan", "--iommu"): ["maybe"],
    ("plan", "--acs"): ["maybe"],
    ("diagnose", "logfile"): ["/nonexistent/vllm.log", "/"],
    ("diagnose", "--silent-for"): ["abc", "-1"],
    ("calibrate", "run_id"): ["abc", "0", "999"],
    ("calibrate", "--bench-result"): ["/nonexistent/result.json", "/"],
    ("calibrate", "--gpu"): ["No Such GPU", "X:abc:8.9"],
    ("calibrate", "--count"): ["abc", "0"],
    ("calibrate", "--vllm-version"): ["abc"],
    ("calibrate", "--python"): ["/nonexistent/python3"],
    ("predict", "--gpu"): ["No Such GPU", "X:abc:8.9", "X:16:zz"],
    ("predict", "--count"): ["abc", "0", "-1"],
    ("predict", "--sim-truth"): ["/nonexistent/truth.yaml", "/"],
    ("predict", "--vllm-version"): ["abc"],
    ("predict", "--python"): ["/nonexistent/python3"],
    ("predict", "--dataset-name"): ["sharegpt"],  # without --lengths-file
    ("predict", "--random-input-len"): ["abc", "0", "-5", "1.5"],
    ("predict", "--random-output-len"): ["abc", "0"],
    ("predict", "--prefix-repetition-prefix-len"): ["abc", "0", "-5", "1.5"],
    ("predict", "--prefix-repetition-suffix-len"): ["abc", "0"],
    ("predict", "--prefix-repetition-num-prefixes"): ["x", "0", "2.5"],
    ("predict", "--prefix-repetition-output-len"): ["abc", "-1"],
    ("predict", "--random-range-ratio"): ["abc", "1", "-0.1", "nan", '{"input": 0.3}', '{"input": 2, "output": 0}'],
    ("predict", "--num-prompts"): ["abc", "0"],
    ("predict", "--request-rate"): ["abc", "0", "-1", "nan"],
    ("predict", "--burstiness"): ["abc", "0", "nan"],
    ("predict", "--max-concurrency"): ["abc", "0"],
    ("predict", "--seed"): ["abc", "-1"],
    ("predict", "--lengths-file"): ["/nonexistent/lengths.jsonl", "/"],
    ("predict", "--json"): ["/nonexistent/dir/p.json", "/"],
    ("predict", "--compare"): ["/nonexistent/result.json", "/", "-"],
    ("ramp", "--url"): ["notaurl", "http://", "ftp://x", "http://h:99999"],
    ("ramp", "--levels"): ["a,b", "0", "-1", ","],
    ("ramp", "--max-level"): ["abc", "0"],
    ("ramp", "--rate"): ["abc", "0", "-1"],
    ("ramp", "--start"): ["abc", "0"],
    ("ramp", "--max-users"): ["abc", "0"],
    ("ramp", "--resolution"): ["abc", "-0.1", "1.5"],
    ("ramp", "--repeat"): ["abc", "0"],
    ("ramp", "--min-requests"): ["abc", "0"],
    ("ramp", "--max-concurrency"): ["abc", "0"],
    ("ramp", "--burstiness"): ["abc", "0", "-1", "inf", "nan"],
    ("ramp", "--step-seconds"): ["abc", "-5", "0"],
    ("ramp", "--requests-per-level"): ["abc", "0"],
    ("ramp", "--warmup-seconds"): ["abc", "-1"],
    ("ramp", "--endpoint"): ["embeddings"],
    ("ramp", "--prompt-tokens"): ["abc", "0", "-5", "10-5"],
    ("ramp", "--output-tokens"): ["abc", "0"],
    ("ramp", "--prompts-file"): ["/nonexistent/prompts.jsonl", "builtin:nope", "hf:nobody/no-such-dataset"],
    ("ramp", "--prompts-format"): ["yaml"],
    ("ramp", "--prompts-column"): ["text"],  # without a --prompts-file
    ("run", "--prompts-file"): ["/nonexistent/prompts.jsonl", "builtin:nope", "hf:nobody/no-such-dataset"],
    ("run", "--prompts-format"): ["yaml"],
    ("run", "--prompts-column"): ["text"],  # without a --prompts-file
    ("plan", "--prompts-file"): ["/nonexistent/prompts.jsonl", "builtin:nope", "hf:nobody/no-such-dataset"],
    ("plan", "--prompts-format"): ["yaml"],
    ("plan", "--prompts-column"): ["text"],  # without a --prompts-file
    ("tune", "--prompts-file"): ["/nonexistent/prompts.jsonl", "builtin:nope", "hf:nobody/no-such-dataset"],
    ("tune", "--prompts-format"): ["yaml"],
    ("tune", "--prompts-column"): ["text"],  # without a --prompts-file
    ("ramp", "--multi-turn"): ["abc", "0", "4:-1", "nan", "inf", "4:2:1"],
    ("ramp", "--shared-prefix"): ["abc", "1024", "1024:0", "1024:2", "0:0.5", "1024:0.5:0", "1024:nan"],
    ("ramp", "--temperature"): ["abc", "-1", "nan"],
    ("ramp", "--request-timeout"): ["abc", "0"],
    ("ramp", "--max-failure-rate"): ["abc", "-0.1", "2"],
    ("ramp", "--max-total-seconds"): ["abc", "0"],
    ("ramp", "--slo-ttft-p99"): ["abc", "0"],
    ("ramp", "--slo-tpot-p99"): ["-1"],
    ("ramp", "--slo-e2e-p99"): ["0"],
    ("ramp", "--slo-failure-rate"): ["abc", "1.5"],
    ("ramp", "--slo-rejection-rate"): ["abc", "-0.1", "1.5"],
    ("ramp", "--slo-ttfa-p99"): ["abc", "0"],
    ("ramp", "--seed"): ["abc", "-1"],
    ("ramp", "--json"): ["/nonexistent/dir/out.json", "/"],
    ("ramp", "--csv"): ["/nonexistent/dir/steps.csv"],
    ("ramp", "--requests-csv"): ["/nonexistent/dir/requests.csv"],
    ("ramp", "--api-key-file"): ["/nonexistent/key"],
    ("telemetry", "--url"): ["notaurl"],
    ("telemetry", "--seconds"): ["abc", "0", "-1"],
    ("telemetry", "--refresh"): ["abc", "0", "-1"],
    ("telemetry", "--gpus"): ["abc", "-1", ","],
    ("telemetry", "--sim-url"): ["notaurl"],
    ("telemetry", "--pgid"): ["abc", "0", "-1"],
    ("telemetry", "--pid"): ["abc", "0"],
    ("runs show", "id"): ["abc", "0", "999"],
    ("runs export", "id"): ["abc", "999"],
    ("runs export", "--format"): ["xml"],
    ("runs export", "--what"): ["everything"],
    ("runs export", "--output"): ["/nonexistent/dir/x.json", "/"],
    ("runs delete", "id"): ["abc", "0", "999"],
    ("run", "profile"): ["no such profile", "/nonexistent/p.yaml"],
    ("run", "--levels"): ["a,b", "0"],
    ("run", "--rate"): ["abc", "0", "-1"],
    ("run", "--burstiness"): ["abc", "0", "nan"],
    ("run", "--prompt-tokens"): ["abc", "0", "10-5"],
    ("run", "--output-tokens"): ["abc", "-3"],
    ("run", "--max-concurrency"): ["abc", "0"],
    ("run", "--seed"): ["abc", "-1"],
    ("run", "--multi-turn"): ["abc", "0"],
    ("plan", "--multi-turn"): ["abc", "0"],
    ("plan", "--shared-prefix"): ["1024", "1024:0"],
    ("run", "--shared-prefix"): ["1024", "1024:0"],
    ("run", "--step-seconds"): ["abc", "0", "-1"],
    ("run", "--max-total-seconds"): ["abc", "0"],
    ("run", "--startup-timeout"): ["-5", "0", "abc"],
    ("run", "--python"): ["/nonexistent/python3"],
    ("run", "--json"): ["/nonexistent/dir/run.json", "/"],
    ("compare", "ids"): ["abc", "0", "999"],
    ("compare", "--gpu-hour-price"): ["abc", "-3", "nan"],
    ("compare", "--kwh-price"): ["-1", "inf"],
    ("compare", "--csv"): ["/nonexistent/dir/c.csv"],
    ("compare", "--svg"): ["/"],
    ("compare", "--html"): ["/nonexistent/dir/c.html", "/"],
    ("profiles show", "name"): ["no such profile"],
    ("profiles export", "name"): ["no such profile"],
    ("profiles export", "--format"): ["pdf"],
    ("profiles export", "--output"): ["/nonexistent/dir/p.sh", "/"],
    ("profiles import", "file"): ["/nonexistent/p.yaml", "/"],
    ("profiles delete", "name"): ["no such profile", "CPU tiny model"],
    ("profiles save-run", "run_id"): ["abc", "0", "999"],
    ("profiles save-run", "--which"): ["worst"],
    ("tune", "profile"): ["no such profile", "/nonexistent/p.yaml"],
    ("tune", "--engine"): ["warp"],
    ("tune", "--sim-engine-dies-at-request"): ["abc", "0"],
    ("tune", "--python"): ["/nonexistent/python3"],
    ("tune", "--startup-timeout"): ["-5", "0", "abc"],
    ("tune", "--grace"): ["-1", "0"],
    ("tune", "--prompt-tokens"): ["abc", "0"],
    ("tune", "--multi-turn"): ["abc", "0"],
    ("tune", "--shared-prefix"): ["1024", "1024:0"],
    ("tune", "--output-tokens"): ["abc", "-3"],
    ("tune", "--seed"): ["abc", "-1"],
    ("tune", "--slo-ttft-p99"): ["abc", "0", "-1", "nan"],
    ("tune", "--slo-tpot-p99"): ["abc", "0"],
    ("tune", "--slo-e2e-p99"): ["0", "inf"],
    ("tune", "--slo-failure-rate"): ["abc", "-0.1", "1.5"],
    ("tune", "--slo-rejection-rate"): ["abc", "2"],
    ("tune", "--slo-ttfa-p99"): ["-1"],
    ("tune", "--objective"): ["speed"],
    ("tune", "--tp"): ["abc", "0", "2,x", ","],
    ("tune", "--pp"): ["0"],
    ("tune", "--dp"): ["1,-2"],
    ("tune", "--checkpoint"): ["awq", "=ID", "awq="],
    ("tune", "--mnbt"): ["abc", "0"],
    ("tune", "--kv-cache-dtypes"): ["fp3", ","],
    ("tune", "--cuda-graphs"): ["maybe", ","],
    ("tune", "--vary"): ["block_size", "max_num_seqs=8,16", "Bad Name=1", "api_key=x"],
    ("tune", "--max-launches"): ["abc", "0"],
    ("tune", "--max-minutes"): ["abc", "0", "-5"],
    ("tune", "--requests-per-level"): ["abc", "0"],
    ("tune", "--resolution"): ["abc", "0", "1", "1.5"],
    ("tune", "--max-users"): ["abc", "0"],
    ("tune", "--json"): ["/nonexistent/dir/t.json", "/"],
    ("tune", "--export-config"): ["/nonexistent/dir/c.yaml"],
    ("tune", "--html"): ["/nonexistent/dir/t.html", "/"],
    ("tune", "--resume"): ["abc", "0", "999"],
    ("tune", "--show"): ["abc", "0", "999"],
}
for cmd in ("serve", "plan", "run", "tune", "predict", "calibrate"):
    for opt, vals in SERVER_BAD.items():
        BAD.setdefault((cmd, opt), vals)
for cmd in ("serve", "run", "tune"):
    for opt, vals in SIM_BAD.items():
        BAD.setdefault((cmd, opt), vals)

#: vLLM's own lists, which change with its version (and the executor may be a class's
#: qualified name, vllm/v1/executor/abstract.py resolve_obj_by_qualname): the planner
#: judges them for its version (plan: exit 1, tests/unit/test_planner_quantization.py) and
#: vLLM at launch (its words, app.planner.diagnose)
VLLM_JUDGES = ("--distributed-executor-backend", "--quantization", "--kv-cache-dtype")

#: options with no bad value, and why
EXEMPT: dict[tuple[str, str], str] = {
    **{(cmd, opt): "vLLM's list (VLLM_JUDGES)" for cmd in ("serve", "plan", "run", "tune", "predict", "calibrate")
       for opt in VLLM_JUDGES},
    ("predict", "--served-model-name"): "any name",
    ("calibrate", "--served-model-name"): "any name",
    ("tune", "--served-model-name"): "any name",
    ("tune", "--save-profile"): "any name (checked when saved)",
    ("serve", "--served-model-name"): "any name",
    ("plan", "--served-model-name"): "any name",
    ("run", "--served-model-name"): "any name",
    ("ramp", "--model"): "the server decides which names it serves",
    ("compare", "--currency"): "a label",
    ("profiles export", "--program"): "how the user runs vLLM",
    ("profiles import", "--name"): "any name",
    ("profiles save-run", "--name"): "any name",
    ("hosts check", "--python"): "a path on the hosts, checked there (the probe's vLLM finding)",
    ("hosts check", "--model"): "a path on the hosts, checked there (the probe's model finding)",
}
#: where the subcommand needs no base: ``plan``'s api-key-file is not an option of plan
NOT_OPTIONS = {("plan", "--api-key-file"), ("predict", "--api-key-file"), ("calibrate", "--api-key-file")}

#: a bad value whose message names something other than the option (what it names)
NAMED = {
    ("run", "profile"): "profile",
    ("profiles show", "name"): "profile",
    ("profiles export", "name"): "profile",
    ("profiles delete", "name"): "profile",
    ("profiles import", "file"): "p.yaml|/:",
    ("compare", "ids"): "run|ID",
    ("calibrate", "run_id"): "run",
    ("runs show", "id"): "run|id",
    ("runs export", "id"): "run|id",
    ("runs delete", "id"): "run|id",
    ("profiles save-run", "run_id"): "run",
    ("plan", "--from-run"): "run|--from-run",
    ("diagnose", "logfile"): "logfile|vllm.log|/:",
    ("serve", "--model"): "--model|model",
    ("plan", "--model"): "--model|model",
    ("run", "--model"): "--model|model",
    ("tune", "profile"): "profile",
    ("tune", "--model"): "--model|model",
    ("tune", "--vary"): "vary|--vary",
    ("tune", "--resume"): "tune|--resume",
    ("tune", "--show"): "tune|--show",
    ("hosts check", "destinations"): "SSH destination|destinations",
    ("hosts check", "--dyno"): "dyno",
    ("hosts plan", "destinations"): "SSH destination|destinations",
    ("hosts plan", "--model"): "model",
    ("hosts plan", "--tensor-parallel-size"): "--tensor-parallel-size|tensor_parallel_size",
    ("hosts plan", "--pipeline-parallel-size"): "--pipeline-parallel-size|pipeline_parallel_size",
    ("hosts plan", "--data-parallel-size"): "--data-parallel-size|data_parallel_size",
}


def _options(parser: argparse.ArgumentParser, path: str = ""):
    """(subcommand path, option or positional, action) for every argument with a value."""
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            for name, sp in act.choices.items():
                yield from _options(sp, f"{path} {name}".strip())
        elif path and act.nargs != 0 and not isinstance(act, argparse._HelpAction):
            yield path, (max(act.option_strings, key=len) if act.option_strings else act.dest), act


def test_table_covers_every_option():
    missing = []
    for cmd, opt, act in _options(build_parser()):
        if (cmd, opt) not in BAD and (cmd, opt) not in EXEMPT:
            missing.append(f"{cmd} {opt}")
    assert missing == [], "options without bad values in BAD (or a reason in EXEMPT): " + ", ".join(missing)
    assert set(BASE) >= {c for c, _, _ in _options(build_parser())}


def _argv(cmd: str, opt: str, bad: str) -> list[str]:
    base = BASE[cmd]
    head = cmd.split()
    if opt.startswith("-"):
        return [*head, *base, f"{opt}={bad}" if bad.startswith("-") or not bad else opt, *(
            [] if bad.startswith("-") or not bad else [bad])]
    return [*head, bad, *base]


CASES = [(cmd, opt, bad) for (cmd, opt), vals in BAD.items() for bad in vals if (cmd, opt) not in NOT_OPTIONS]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``app.cli.main(argv)`` in this process: (exit status, stdout, stderr); an exception
    that escapes is returned as its traceback text with status -1."""
    out, errs = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(errs):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (1 if e.code else 0)
            if not isinstance(e.code, int) and e.code:
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the point: no exception may escape main
            import traceback

            return -1, out.getvalue(), "Traceback (escaped main):\n" + traceback.format_exc()
    return code, out.getvalue(), errs.getvalue()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cmd,opt,bad", CASES, ids=[f"{c}|{o}={b}" for c, o, b in CASES])
def test_bad_value_is_a_message_naming_the_option_and_exit_2(cmd, opt, bad, dyno_home, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    argv = _argv(cmd, opt, bad)
    code, out, err = run_cli(argv)
    assert "Traceback" not in err + out, f"{argv}:\n{err}"
    assert code == 2, f"{argv}: exit {code}\n{err}{out}"
    named = NAMED.get((cmd, opt), opt)
    import re

    assert re.search("|".join(re.escape(n) for n in named.split("|")), err), f"{argv}: {err!r} names no {named}"


def test_every_base_command_line_is_valid(dyno_home):
    """The bases are valid: a case fails because of its one bad value (checked by
    parsing only: the bases would start servers and ramps)."""
    p = build_parser()
    for cmd, base in BASE.items():
        extra = {"diagnose": ["-"], "calibrate": ["1"], "runs show": ["1"], "runs delete": ["1"],
                 "profiles show": ["x"], "profiles import": ["x"], "profiles delete": ["x"],
                 "profiles save-run": ["1"]}.get(cmd, [])
        p.parse_args([*cmd.split(), *extra, *base])


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def cli_main(*args: str, timeout: float = 180):
    import subprocess

    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


