"""Profiles: model, built-ins, loading that never blocks, hostile files, migration,
atomic writes, import/export round trips."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from app.profiles import (
    Profile,
    ProfileError,
    ProfileLibrary,
    ProfileNotFound,
    dump_profile,
    import_command_line,
    import_text,
    import_vllm_config_yaml,
    parse_profile,
    read_profile,
    resolve_model_path,
    to_command_line,
    to_vllm_config_yaml,
)
from app.profiles.io import MAX_PROFILE_BYTES

ROOT = Path(__file__).resolve().parents[2]

GOOD = textwrap.dedent("""\
    schema_version: 1
    name: my rig
    engine: vllm
    server:
      model: Qwen/Qwen2.5-7B-Instruct
      tensor-parallel-size: 2
      max-num-seqs: 32
      enable-prefix-caching: false
    env: {NCCL_P2P_DISABLE: "1"}
    gpus: [2, 3]
    ramp: {levels: [1, 2, 4], step_seconds: 5, slo: {ttft_p99: 0.5}}
    notes: fast
""")


@pytest.fixture
def lib(dyno_home) -> ProfileLibrary:
    return ProfileLibrary()


# ---------------------------------------------------------------------- model
def test_profile_basics():
    p = parse_profile(GOOD)
    assert p.server["tensor-parallel-size"] == 2
    assert p.gpu_indices() == [2, 3]
    assert p.slo.ttft_p99 == 0.5
    cfg = p.server_config()
    assert cfg.tensor_parallel_size == 2 and cfg.gpus == [2, 3] and cfg.env == {"NCCL_P2P_DISABLE": "1"}
    assert cfg.port is None  # never stored, chosen at launch
    spec = p.ramp_spec("http://127.0.0.1:9", "m", levels=[8])
    assert spec.levels == [8.0] and spec.url == "http://127.0.0.1:9" and spec.model == "m"


def test_first_n_gpus_and_underscore_keys():
    p = parse_profile("name: x\nserver: {model: m, max_num_seqs: 4, --enforce-eager: true}\ngpus: 3\n")
    assert p.server == {"model": "m", "max-num-seqs": 4, "enforce-eager": True}
    assert p.gpu_indices() == [0, 1, 2]


def test_yaml_round_trip_every_builtin_and_full_profile(lib):
    entries = lib.scan().entries
    assert len(entries) >= 6
    full = parse_profile(GOOD + textwrap.dedent("""\
        hardware: {gpu: RTX 4090, count: 2, driver: "560.35", vllm_version: 0.11.0, recorded_at: 1700000000.5}
        results:
          run_id: 7
          status: done
          knee: 16
          best_level: 16
          peak_output_tps: 1234.5
          levels: [{level: 1, output_tps: 100.0, ttft_p99: 0.05, tpot_p99: 0.01, failure_rate: 0.0}]
    """))
    for p in [e.profile for e in entries] + [full]:
        again = parse_profile(dump_profile(p))
        assert again == p, p.name


def test_port_dropped_with_warning_and_secrets_refused():
    warns: list[str] = []
    p = parse_profile("name: x\nserver: {model: m, port: 8000}\n", "f.yaml", warns)
    assert "port" not in p.server
    assert any("server.port" in w for w in warns)
    with pytest.raises(ProfileError, match=r"server\.api-key.*VLLM_API_KEY"):
        parse_profile("name: x\nserver: {model: m, api-key: s3cret}\n")
    with pytest.raises(ProfileError, match="env.VLLM_API_KEY"):
        parse_profile("name: x\nserver: {model: m}\nenv: {VLLM_API_KEY: s3cret}\n")


# ---------------------------------------------------------------------- built-ins
def test_builtins_pass_the_planner_for_their_own_hardware(lib, monkeypatch):
    from app.run.profile_run import plan_profile

    # the CPU profile's model: the tiny Llama's config in tests/cases (no `make model` here)
    monkeypatch.setenv("VLLM_DYNO_TINY_MODEL", str(ROOT / "tests" / "cases" / "tiny-llama"))

    entries = [e for e in lib.scan().entries if e.source == "builtin"]
    names = {e.name for e in entries}
    for want in ("Sim demo: 8x RTX 4090 Llama-3-70B AWQ", "4x RTX 5090 Llama-3-70B AWQ",
                 "8x RTX 5090 Llama-3-70B AWQ", "4x RTX 4090 Qwen2.5-32B AWQ", "8x H100 Llama-3-70B FP8",
                 "CPU tiny model"):
        assert want in names
    for e in entries:
        assert e.profile.hardware is not None, e.name
        plan = plan_profile(e.profile)
        assert plan is not None
        assert plan.verdict != "error", (e.name, [(f.problem, f.message) for f in plan.findings])
        # information (e.g. no P2P on consumer cards: NCCL and vLLM handle it) is not a problem
        assert [f.problem for f in plan.findings if f.verdict in ("warn", "error")] == [], (e.name, plan.problems())
        assert len(plan.cards) == e.profile.server_config().world_size


def test_cpu_builtin_model_resolves_to_repo_or_user_path(lib, monkeypatch, tmp_path):
    import app.profiles.model as profile_model

    p = lib.get("CPU tiny model")
    checkout = tmp_path / "checkout"  # a checkout whose `make model` has run
    (checkout / "build" / "tiny-llama").mkdir(parents=True)
    monkeypatch.setattr(profile_model, "repo_root", lambda: checkout)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the checkout: falls back to the checkout's root
    assert resolve_model_path(p.model) == str(checkout / "build" / "tiny-llama")
    mine = tmp_path / "my-model"
    mine.mkdir()
    monkeypatch.setenv("VLLM_DYNO_TINY_MODEL", str(mine))
    assert p.server_config().model == str(mine)


def test_builtin_is_read_only_saving_makes_a_copy(lib):
    b = lib.entry("8x H100 Llama-3-70B FP8")
    assert b.read_only
    before = Path(b.path).read_bytes() if Path(b.path).exists() else None
    changed = b.profile.updated(notes="mine now")
    path = lib.save(changed)
    assert path.parent == lib.directory
    e = lib.entry("8x H100 Llama-3-70B FP8")
    assert e.source == "user" and e.shadows_builtin and e.profile.notes == "mine now"
    if before is not None:
        assert Path(b.path).read_bytes() == before
    lib.delete("8x H100 Llama-3-70B FP8")  # the copy goes; the built-in is back
    assert lib.entry("8x H100 Llama-3-70B FP8").read_only
    with pytest.raises(PermissionError, match="built-in"):
        lib.delete("8x H100 Llama-3-70B FP8")


def test_save_as_rename_and_not_found(lib):
    p = parse_profile(GOOD)
    lib.save(p)
    copy, path = lib.save_as(p, "my rig 2")
    assert path.exists() and lib.get("my rig 2").server == p.server
    with pytest.raises(FileExistsError):
        lib.save_as(p, "my rig 2")
    newp = lib.rename("my rig 2", "renamed rig")
    assert newp.exists() and not path.exists() and lib.get("renamed rig").name == "renamed rig"
    with pytest.raises(ProfileNotFound, match="renamed rig"):
        lib.get("nope")


# ---------------------------------------------------------------------- loading never blocks
def test_unknown_keys_dropped_with_warning(lib):
    (lib.directory / "a.yaml").write_text(GOOD.replace("notes: fast", "notes: fast\ncolour: blue\n")
                                          .replace("step_seconds: 5", "step_seconds: 5, turbo: true"))
    res = lib.scan()
    e = res.get("my rig")
    assert e is not None and not res.errors
    assert "unknown key colour dropped" in e.warnings
    assert "unknown key ramp.turbo dropped" in e.warnings


def test_bad_files_name_file_key_reason_and_others_still_load(lib):
    d = lib.directory
    (d / "good.yaml").write_text(GOOD)
    (d / "badvalue.yaml").write_text(GOOD.replace("name: my rig", "name: bad")
                                     .replace("max-num-seqs: 32", "gpu-memory-utilization: 1.5"))
    (d / "broken.yaml").write_text("name: x\nserver: {model: m\n  : :\n")
    (d / "wrongtype.yaml").write_text("name: wt\nserver: {model: m}\nramp: {step_seconds: soon}\n")
    (d / "listy.yaml").write_text("- a\n- b\n")
    (d / "empty.yaml").write_text("")
    (d / ".good.yaml.x1.tmp").write_text("junk from a crash")
    res = lib.scan()
    assert "my rig" in res.names()
    errs = {Path(e.file).name: e for e in res.errors}
    assert set(errs) == {"badvalue.yaml", "broken.yaml", "wrongtype.yaml", "listy.yaml", "empty.yaml"}
    assert errs["badvalue.yaml"].key == "server.gpu-memory-utilization"
    assert "outside (0, 1]" in errs["badvalue.yaml"].reason
    assert "broken YAML" in errs["broken.yaml"].reason and "line" in errs["broken.yaml"].reason
    assert errs["wrongtype.yaml"].key == "ramp.step_seconds" and "number" in errs["wrongtype.yaml"].reason
    assert "not a mapping" in errs["listy.yaml"].reason
    assert "empty" in errs["empty.yaml"].reason
    assert str(d / "badvalue.yaml") in str(errs["badvalue.yaml"])


@pytest.mark.parametrize("text,key", [
    ("name: x\nserver: [model, m]\n", "server"),
    ("name: x\nserver: {model: m}\ngpus: abc\n", "gpus"),
    ("name: x\nserver: {model: m}\nengine: warp\n", "engine"),
    ("name: x\nserver: {max-num-seqs: 4}\n", "server"),
    ("name: 5\nserver: {model: m}\n", "name"),
    ("name: x\nserver: {model: m, max-num-seqs: lots}\n", "server.max-num-seqs"),
    ("name: x\nserver: {model: m}\nenv: {A: [1, 2]}\n", "env"),
    ("name: x\nserver: {model: m}\nschema_version: 99\n", "schema_version"),
])
def test_wrong_types_are_clear_errors(text, key):
    with pytest.raises(ProfileError) as ei:
        parse_profile(text, "t.yaml")
    assert ei.value.key is not None and ei.value.key.startswith(key), str(ei.value)
    assert str(ei.value).startswith("t.yaml: ")


def test_yaml_tags_that_build_python_objects_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    for tag in (f"!!python/object/apply:os.system ['touch {marker}']",
                f"!!python/object/new:subprocess.Popen [['touch', '{marker}']]",
                "!!python/name:os.system"):
        f = tmp_path / "evil.yaml"
        f.write_text(f"name: evil\nserver:\n  model: {tag}\n")
        with pytest.raises(ProfileError, match="YAML tag not allowed") as ei:
            read_profile(f)
        assert str(f) in str(ei.value)
    time.sleep(0.2)
    assert not marker.exists()


def test_alias_bomb_refused():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n" \
           "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nname: x\nserver: {model: m}\n"
    with pytest.raises(ProfileError, match="anchors|aliases"):
        parse_profile(bomb)


def test_10_mb_file_refused_unread(tmp_path, lib):
    big = lib.directory / "big.yaml"
    big.write_text("name: big\nserver: {model: m}\nnotes: " + "x" * (10 * 2**20) + "\n")
    t = time.monotonic()
    with pytest.raises(ProfileError, match="larger than") as ei:
        read_profile(big)
    assert ei.value.file == str(big)
    (lib.directory / "good.yaml").write_text(GOOD)
    res = lib.scan()
    assert res.names().count("my rig") == 1 and len(res.errors) == 1
    assert time.monotonic() - t < 30  # generous: a loaded 2-core box; it reads nothing of the file
    with pytest.raises(ProfileError, match="larger than"):
        parse_profile("notes: " + "x" * (MAX_PROFILE_BYTES + 1))


def test_migration_from_v0_file(tmp_path):
    v0 = tmp_path / "old.yaml"
    v0.write_text(textwrap.dedent("""\
        name: old rig
        config:
          model: meta-llama/Llama-3.1-8B-Instruct
          tensor_parallel_size: 2
          max_num_seqs: 64
          enforce_eager: true
          port: 8011
          host: 127.0.0.1
          gpus: [0, 1]
          env: {NCCL_P2P_DISABLE: "1"}
          extra_args: ["--seed", "7"]
        slo: {ttft_p99: 1.5}
        ramp: {max_level: 32}
        hardware: 2x RTX 4090
        notes: from 2024
    """))
    warns: list[str] = []
    p = read_profile(v0, warns)
    assert p.schema_version == 1
    assert p.server == {"model": "meta-llama/Llama-3.1-8B-Instruct", "tensor-parallel-size": 2,
                        "max-num-seqs": 64, "enforce-eager": True, "seed": 7}
    assert p.env == {"NCCL_P2P_DISABLE": "1"} and p.gpus == [0, 1]
    assert p.slo.ttft_p99 == 1.5 and p.ramp.max_level == 32
    assert p.hardware.gpu == "RTX 4090" and p.hardware.count == 2
    assert any("migrated" in w for w in warns) and any("port" in w for w in warns)
    # what is written back is v1 and loads without migration
    warns2: list[str] = []
    again = parse_profile(dump_profile(p), "v1", warns2)
    assert again == p and not any("migrated" in w for w in warns2)


# ---------------------------------------------------------------------- atomic writes
_SAVER = textwrap.dedent("""\
    import os, sys, time
    from app.profiles import parse_profile
    from app.profiles.io import write_profile
    import app.fileio as fileio
    base = parse_profile(open(sys.argv[2]).read())
    mode = sys.argv[3]
    if mode == "hang-before-replace":
        real = os.replace
        def slow_replace(a, b):
            print("temp written", flush=True)
            time.sleep(60)
            real(a, b)
        fileio.os.replace = slow_replace
        write_profile(sys.argv[1], base.updated(notes="NEW " * 200000))
    else:  # save again and again until killed
        print("saving", flush=True)
        i = 0
        while True:
            i += 1
            write_profile(sys.argv[1], base.updated(notes=("v%d " % i) * (i % 50000 + 1)))
""")


def saver_script(tmp_path, target, mode):
    src = tmp_path / "src.yaml"
    src.write_text(GOOD)
    script = tmp_path / "saver.py"
    script.write_text(_SAVER)
    return subprocess.Popen([sys.executable, str(script), str(target), str(src), mode], cwd=str(ROOT),
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


# ---------------------------------------------------------------------- import / export
def test_command_line_round_trip():
    p = parse_profile(GOOD)
    line = to_command_line(p)
    assert line.startswith("NCCL_P2P_DISABLE=1 CUDA_VISIBLE_DEVICES=2,3 vllm serve Qwen/Qwen2.5-7B-Instruct ")
    assert "--no-enable-prefix-caching" in line and "--port" not in line
    back = import_command_line(line, "my rig", base=p)
    assert back == p
    bare = import_command_line(line, "x")
    assert bare.server == p.server and bare.env == p.env and bare.gpus == p.gpus


def test_command_line_quoting_and_other_forms():
    p = parse_profile("name: q\nserver: {model: /models/my model, served-model-name: \"it's\"}\n"
                      "env: {WEIRD: 'a b;$(rm -rf /)'}\n")
    line = to_command_line(p)
    assert "'a b;$(rm -rf /)'" in line and "'/models/my model'" in line
    back = import_command_line(line, "q")
    assert back.server == p.server and back.env == p.env
    api = "python3 -m vllm.entrypoints.openai.api_server --model /m -tp 2 -q awq --max-model-len=4096 \\\n --enforce-eager"
    q = import_command_line(api, "api")
    assert q.server == {"model": "/m", "tensor-parallel-size": 2, "quantization": "awq",
                        "max-model-len": 4096, "enforce-eager": True}
    with pytest.raises(ProfileError, match="quotes"):
        import_command_line("vllm serve m --served-model-name 'open", "x")


def test_vllm_config_yaml_round_trip_equal_up_to_order():
    text = textwrap.dedent("""\
        max-num-seqs: 48
        model: Qwen/Qwen2.5-32B-Instruct-AWQ
        tensor-parallel-size: 4
        quantization: awq_marlin
        enable-prefix-caching: true
        disable-custom-all-reduce: true
        max-model-len: 8192
        seed: 3
        host: 10.0.0.5
    """)
    p = import_vllm_config_yaml(text, "imported")
    out = to_vllm_config_yaml(p)
    assert yaml.safe_load(out) == yaml.safe_load(text)
    assert list(yaml.safe_load(out)) == list(yaml.safe_load(text))  # order kept as well
    # and profile → YAML → profile
    assert import_vllm_config_yaml(out, "imported") == p


def test_import_text_detects_the_form():
    assert import_text(GOOD).name == "my rig"
    assert import_text(GOOD, name="renamed").name == "renamed"
    assert import_text("model: org/Foo-7B\nmax-num-seqs: 4\n").name == "Foo-7B"
    p = import_text("CUDA_VISIBLE_DEVICES=1 vllm serve org/Bar --max-num-seqs 2\n")
    assert p.name == "Bar" and p.gpus == [1]
    with pytest.raises(ProfileError):
        import_text("!!python/object/apply:os.system ['true']")
