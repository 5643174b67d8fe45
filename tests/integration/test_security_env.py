"""Issue 15, items 1 and 2, as attacks: a shared profile's ``env:`` must not load code into
the server or the app's helpers unconfirmed, and its ``${VAR}`` must not pull secrets out of
the environment (app.profiles.env_policy). The servers here are the sim (a real process)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.profiles import ProfileError, ProfileLibrary, parse_profile
from app.profiles.env_policy import EnvRefused, allocator_preload_problem, env_problem, screen_env
from app.profiles.model import expand_vars
from app.run.controller import LaunchTarget, RunController
from app.run.profile_run import ProfileRun
from app.server.procs import group_members
from app.helper_process import start_ticks
from app.server.reaper import OWNER_ENV

SECRET = "sk-dyno-test-SECRET-4242"

HOSTILE_ENV = {"LD_PRELOAD": "/tmp/evil.so", "PYTHONPATH": "/tmp/evil", "PATH": "/tmp/evil:/usr/bin"}


def _sim_profile(env: dict, name: str = "hostile") -> dict:
    return {"schema_version": 1, "name": name, "engine": "sim",
            "sim": {"gpu": "RTX 4090", "count": 1, "time_scale": 20.0, "seed": 1},
            "server": {"model": "meta-llama/Llama-3.1-8B-Instruct", "max-model-len": 4096},
            "env": env, "ramp": {"levels": [1], "step_seconds": 1.0}}


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(kv.split("=", 1) for kv in raw.decode("utf-8", "replace").split("\0") if "=" in kv)


# ----------------------------------------------------------------------------- the policy
@pytest.mark.parametrize("name", [
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "PYTHONPATH", "PYTHONSTARTUP",
    "PYTHONHOME", "PYTHONWARNINGS", "PATH", "PERL5LIB", "BASH_ENV", "ENV", "IFS", "NODE_OPTIONS", "TMPDIR", "HOME",
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_CONF_FILE", "CUDA_INJECTION64_PATH", "VLLM_NCCL_SO_PATH",
    "VLLM_PLUGINS", "VLLM_CACHE_ROOT", "HF_ENDPOINT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY",
    "HTTPS_PROXY", "SOME_RANDOM_NAME", "ld_preload", "Path",
    # found by a trial: names that choose a file, folder or settings source the server reads or loads
    "VLLM_LOGGING_CONFIG_PATH", "NCCL_DEBUG_FILE", "VLLM_CONFIG_ROOT", "VLLM_RPC_BASE_PATH", "HF_HOME",
    "HF_HUB_CACHE", "CUDA_CACHE_PATH", "VLLM_TORCH_PROFILER_DIR", "TORCH_HOME", "VLLM_DYNO_OWNER",
])
def test_loader_interpreter_and_unlisted_names_are_refused(name):
    assert env_problem(name) is not None
    scr = screen_env({name: "x"})
    assert name in scr.refused and name not in scr.env
    with pytest.raises(EnvRefused, match=name):
        scr.check()


@pytest.mark.parametrize("name", [
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL", "NCCL_P2P_DISABLE",
    "NCCL_DEBUG", "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_HUB_OFFLINE",
    "TORCH_CUDA_ARCH_LIST", "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM",
])
def test_server_configuration_is_allowed(name):
    assert env_problem(name) is None
    assert screen_env({name: "1"}).env == {name: "1"}


def test_an_allowed_name_may_not_carry_a_file_path():
    """Whatever its name, a variable whose value is a path chooses what the server reads
    or loads (vLLM's logging config file runs code through dictConfig's "()" factory)."""
    for value in ("/tmp/trial/log.json", "~/x", "./x", "a/b"):
        scr = screen_env({"VLLM_SOME_NEW_SETTING": value})
        assert "VLLM_SOME_NEW_SETTING" in scr.refused and "file path" in scr.refused["VLLM_SOME_NEW_SETTING"][1]
    assert screen_env({"VLLM_SOME_NEW_SETTING": "FLASH_ATTN"}).env == {"VLLM_SOME_NEW_SETTING": "FLASH_ATTN"}


def test_a_logging_config_profile_is_refused_before_anything_runs(tmp_path, dyno_home, capsys):
    """The trial's attack: a profile sets VLLM_LOGGING_CONFIG_PATH to a JSON whose filter
    factory is os.system; `run` refuses it (exit 2) and nothing is executed."""
    from app.cli import main

    marker = tmp_path / "PWNED"
    cfg = tmp_path / "log.json"
    cfg.write_text('{"version": 1, "filters": {"x": {"()": "os.system", "command": "id > %s"}}}' % marker)
    prof = tmp_path / "logcfg.yaml"
    prof.write_text("name: logcfg\nengine: sim\nsim: {gpu: RTX 4090, count: 1, time_scale: 20}\n"
                    "server: {model: Qwen/Qwen2.5-7B-Instruct}\n"
                    f"env: {{VLLM_LOGGING_CONFIG_PATH: {cfg}}}\nramp: {{levels: [1], step_seconds: 5}}\n")
    assert main(["run", str(prof)]) == 2
    err = capsys.readouterr().err
    assert "VLLM_LOGGING_CONFIG_PATH" in err and "--trust-env" in err
    assert not marker.exists()


def test_confirmation_is_for_the_exact_value():
    scr = screen_env(HOSTILE_ENV, trusted={"LD_PRELOAD": "/tmp/evil.so", "PYTHONPATH": "/tmp/other"})
    assert scr.env == {"LD_PRELOAD": "/tmp/evil.so"}
    assert set(scr.refused) == {"PYTHONPATH", "PATH"}


def test_builtin_ld_preload_only_for_a_verified_allocator(tmp_path):
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"\x7fELF")
    lib.chmod(0o644)
    tmp_path.chmod(0o755)
    assert allocator_preload_problem(str(lib)) is None
    assert screen_env({"LD_PRELOAD": str(lib)}, builtin=True).env == {"LD_PRELOAD": str(lib)}
    assert "LD_PRELOAD" in screen_env({"LD_PRELOAD": str(lib)}).refused  # a user's profile still asks
    for bad in ("/tmp/evil.so", str(tmp_path / "libtcmalloc.so.4"), "libtcmalloc.so.4", f"{lib}:/tmp/evil.so"):
        scr = screen_env({"LD_PRELOAD": bad}, builtin=True)
        assert scr.env == {} and not scr.refused and "LD_PRELOAD" in scr.notes[0], bad
    os.chmod(lib, 0o666)
    assert "writable" in allocator_preload_problem(str(lib))


def test_builtin_profiles_pass_the_policy():
    for e in ProfileLibrary(builtin=True).builtin_entries():
        scr = screen_env(e.profile.env, builtin=True)
        assert not scr.refused, (e.name, scr.refused)


# ----------------------------------------------------------------------------- item 1: refused
def test_cli_run_refuses_a_hostile_env_naming_each_key(tmp_path, dyno_home, capsys):
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(_sim_profile(HOSTILE_ENV)))
    before = {p.pid for p in group_members(os.getpgid(0))}
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    for k, v in HOSTILE_ENV.items():
        assert f"{k}={v}" in err
    assert "--trust-env" in err and "Traceback" not in err
    assert {p.pid for p in group_members(os.getpgid(0))} <= before  # nothing was started
    assert not (dyno_home / "runs.sqlite").exists() or b"evil" not in (dyno_home / "runs.sqlite").read_bytes()


def test_profile_run_refuses_before_anything_starts(tmp_path):
    prof = parse_profile(yaml.safe_dump(_sim_profile(HOSTILE_ENV)))
    res = ProfileRun(prof, telemetry=False, use_planner=False, grace=2.0).run()
    assert res.status == "launch_failed" and res.run_id is None
    assert all(k in res.reason for k in HOSTILE_ENV)


# ----------------------------------------------------------------------------- item 1: trusted
def test_trusted_env_reaches_the_server_never_the_reaper(tmp_path):
    """With the values confirmed the server gets them; the reaper runs in the app's own
    environment (its /proc environ has none of them) and marks the server as its own."""
    evil = {"LD_PRELOAD": str(tmp_path / "evil.so"), "PYTHONPATH": str(tmp_path / "evil"),
            "PATH": f"{tmp_path / 'evil'}:/usr/bin"}
    env = dict(evil, VLLM_TEST_MARK="allowlisted")
    prof = parse_profile(yaml.safe_dump(_sim_profile(env)))
    screened = screen_env(prof.env, trusted=evil).check()
    assert screened == env
    ctl = RunController(store=lambda: None)
    try:
        assert ctl.launch(LaunchTarget.from_profile(prof, telemetry=False, grace=2.0), check_leftovers=False) == []
        assert ctl.wait_ready(60), ctl.failure
        sup = ctl.supervisor
        reaper, server = sup.pgid, sup.server_pid
        s_env, r_env = _environ(server), _environ(reaper)
        for k, v in env.items():
            assert s_env.get(k) == v, k
        for k in ("LD_PRELOAD", "PYTHONPATH", "VLLM_TEST_MARK"):
            assert r_env.get(k) == os.environ.get(k), k
        assert r_env.get("PATH") == os.environ.get("PATH")
        assert s_env[OWNER_ENV] == f"{reaper}:{start_ticks(reaper)}" and OWNER_ENV not in r_env
    finally:
        assert ctl.close() == []


def test_reaper_without_header_starts_nothing():
    import subprocess
    import sys

    from app.helper_process import helper_argv

    p = subprocess.run(helper_argv("app.server.reaper") + ["--env-stdin", "--", sys.executable, "-c", "print(1)"],
                       input=b"not json\n", capture_output=True, timeout=30)
    assert p.returncode == 2 and b"no environment header" in p.stderr and p.stdout == b""


# ----------------------------------------------------------------------------- item 2: secrets
@pytest.mark.parametrize("server", [
    {"model": "meta-llama/${VLLM_API_KEY}"},
    {"model": "${HF_TOKEN}"},
    {"model": "m", "tokenizer": "${VLLM_DYNO_API_KEY}"},
    {"model": "${VLLM_DYNO_X:-${VLLM_API_KEY}}"},
    {"model": "m", "served-model-name": ["a", "${AWS_SECRET_ACCESS_KEY}"]},
    {"model": "x/${MY_PASSWORD}"},
    {"model": "x/${GITHUB_PAT}"},
])
def test_profile_cannot_read_secrets_from_the_environment(server, monkeypatch):
    for k in ("VLLM_API_KEY", "HF_TOKEN", "VLLM_DYNO_API_KEY", "AWS_SECRET_ACCESS_KEY", "MY_PASSWORD", "GITHUB_PAT"):
        monkeypatch.setenv(k, SECRET)
    with pytest.raises(ProfileError) as e:
        parse_profile(yaml.safe_dump({"name": "leak", "server": server}), "leak.yaml")
    assert "leak.yaml: server." in str(e.value) and "${" in str(e.value) and SECRET not in str(e.value)


def test_only_project_and_path_variables_expand(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    monkeypatch.setenv("VLLM_DYNO_TINY_MODEL", str(tmp_path))
    monkeypatch.setenv("SOME_VAR", "x")
    assert expand_vars("${VLLM_DYNO_TINY_MODEL:-./build/tiny-llama}") == str(tmp_path)
    assert expand_vars("${HOME}/m") == os.path.expanduser("~") + "/m"
    for text in ("${VLLM_API_KEY}", "${SOME_VAR}"):
        with pytest.raises(ValueError, match=text.strip("${}")):
            expand_vars(text)


def test_secret_reference_is_refused_and_stored_nowhere(dyno_home, tmp_path, monkeypatch, capsys):
    """The issue's attack: ``model: meta-llama/${VLLM_API_KEY}`` in a shared profile. The
    library lists it as unreadable naming the variable, ``run`` refuses it, and the key is in
    no file vLLM Dyno wrote (profile library, run store)."""
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    lib = ProfileLibrary()
    lib.directory.mkdir(parents=True, exist_ok=True)
    data = _sim_profile({}, name="leaky")
    data["server"]["model"] = "meta-llama/${VLLM_API_KEY}"
    (lib.directory / "leaky.yaml").write_text(yaml.safe_dump(data))
    res = lib.scan()
    assert "leaky" not in res.names()
    assert any("VLLM_API_KEY" in str(e) and e.key == "server.model" for e in res.errors)
    assert main(["run", "leaky"]) == 2
    out = capsys.readouterr()
    assert "VLLM_API_KEY" in out.err and SECRET not in out.err + out.out and "Traceback" not in out.err
    assert main(["profiles", "list"]) in (0, 1)
    capsys.readouterr()
    written = [p for p in dyno_home.rglob("*") if p.is_file()]
    for p in written:
        assert SECRET.encode() not in p.read_bytes(), p


# ----------------------------------------------------------------------------- item 1: the window
def test_window_asks_before_loading_a_hostile_env(main_window, dyno_home, monkeypatch):
    """Loading a profile whose env: holds refused keys shows them with their exact values;
    declined, the form gets only the allowed keys; confirmed, all of them."""
    from PySide6.QtWidgets import QMessageBox

    import widgets.main_window as mw

    env = dict(HOSTILE_ENV, VLLM_LOGGING_LEVEL="DEBUG")
    lib = ProfileLibrary()
    lib.directory.mkdir(parents=True, exist_ok=True)
    (lib.directory / "hostile.yaml").write_text(yaml.safe_dump(_sim_profile(env)))
    asked: list[str] = []
    answer = {"v": QMessageBox.No}

    def question(parent, title, text, *a, **k):
        asked.append(text)
        return answer["v"]

    monkeypatch.setattr(mw.QMessageBox, "question", staticmethod(question))
    w = main_window
    assert w.load_profile("hostile")
    assert len(asked) == 1 and all(f"{k}={v}" in asked[0] for k, v in HOSTILE_ENV.items())
    assert "VLLM_LOGGING_LEVEL" not in asked[0]
    assert w.current_profile.env == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert "LD_PRELOAD" not in w.config.env.toPlainText() and "VLLM_LOGGING_LEVEL" in w.config.env.toPlainText()
    answer["v"] = QMessageBox.Yes
    assert w.load_profile("hostile")
    assert w.current_profile.env == env and "LD_PRELOAD=/tmp/evil.so" in w.config.env.toPlainText()
