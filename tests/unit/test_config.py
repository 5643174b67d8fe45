import json

import pytest
import yaml
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from app.config import (INTERNAL_FIELDS, VLLM_OPTIONS, ConfigError, ServerConfig, VllmOption, add_server_options,
                        check_model_path, config_from_namespace, dict_to_extra_args, extra_args_to_dict)

#: a non-default value for EVERY vLLM option (adding an option to ServerConfig = adding
#: its value here; test_every_option_has_a_round_trip_value fails until then)
ALL_OPTIONS = dict(
    served_model_name="llama", tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2,
    disable_custom_all_reduce=True, max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=32000,
    max_num_active_seqs=8, max_num_queued_reqs=256, max_num_queued_tokens=65536,
    quantization="awq", dtype="half", kv_cache_dtype="fp8", gpu_memory_utilization=0.85,
    distributed_executor_backend="ray", enable_prefix_caching=False, enforce_eager=True, host="0.0.0.0", port=8123,
    speculative_config={"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-70B", "num_speculative_tokens": 3,
                        "draft_tensor_parallel_size": 1},
)


def full_config(**kw):
    base = dict(
        model="/models/llama", served_model_name="llama", tensor_parallel_size=4,
        pipeline_parallel_size=1, data_parallel_size=1, max_num_seqs=64,
        max_num_batched_tokens=8192, max_model_len=8192, gpu_memory_utilization=0.9,
        quantization="awq", dtype="half", kv_cache_dtype="fp8", enable_prefix_caching=False,
        enforce_eager=True, disable_custom_all_reduce=True, gpus=[0, 1, 2, 3],
        env={"NCCL_P2P_DISABLE": "1"}, extra_args=["--seed", "7", "--trust-remote-code"],
    )
    base.update(kw)
    return ServerConfig(**base)


def test_unset_options_are_omitted():
    argv = ServerConfig(model="m").to_argv("/py", "serve")
    assert argv == ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "m", "--host", "127.0.0.1"]


def test_argv_forms():
    c = full_config(port=8123)
    serve = c.to_argv("/py", "serve")
    assert serve[:5] == ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "/models/llama"]
    api = c.to_argv("/py", "api_server")
    assert api[:5] == ["/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/llama"]
    for argv in (serve, api):
        assert argv[argv.index("--max-num-seqs") + 1] == "64"
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"
        assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv
        assert argv[-3:] == ["--seed", "7", "--trust-remote-code"]
        assert argv[argv.index("--port") + 1] == "8123"
        assert "--swap-space" not in argv
    with pytest.raises(ConfigError):
        c.to_argv("/py", "bogus")


def test_environ_has_gpus_and_env_but_no_key_on_argv():
    c = full_config(env={"VLLM_API_KEY": "s3cret"})
    e = c.to_environ({})
    assert e["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and e["VLLM_API_KEY"] == "s3cret"
    assert e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "s3cret" not in " ".join(c.to_argv("/py", "serve"))
    assert "s3cret" not in c.shell_command()
    with pytest.raises(ValidationError, match="VLLM_API_KEY"):
        ServerConfig(model="m", extra_args=["--api-key", "x"])


def test_vllm_config_yaml_round_trip_is_lossless():
    c = full_config()
    text = c.to_vllm_config_yaml()
    d = yaml.safe_load(text)
    assert d["max-num-seqs"] == 64 and d["enable-prefix-caching"] is False and d["seed"] == 7
    assert d["trust-remote-code"] is True and "port" not in d
    back = ServerConfig.from_vllm_config_yaml(text, gpus=c.gpus, env=c.env)
    assert back == c


def test_vllm_config_accepts_underscored_keys_and_keeps_unknown_as_extra():
    c = ServerConfig.from_vllm_config({"model": "m", "max_num_seqs": 8, "swap-space": 4, "enforce_eager": True})
    assert c.max_num_seqs == 8 and c.enforce_eager is True and c.extra_args == ["--swap-space", "4"]
    with pytest.raises(ConfigError, match="model"):
        ServerConfig.from_vllm_config({"max-num-seqs": 8})


def test_command_line_round_trip():
    c = full_config()
    back = ServerConfig.from_command_line(c.shell_command())
    assert back == c
    c2 = ServerConfig.from_command_line("python -m vllm.entrypoints.openai.api_server --model /m --max-num-seqs 8")
    assert c2.model == "/m" and c2.max_num_seqs == 8


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(gpus=[0, 1], tensor_parallel_size=4), "select 4 GPUs"),
        (dict(gpus=[0, 1, 2, 3], tensor_parallel_size=2, pipeline_parallel_size=2, data_parallel_size=2), "8"),
        (dict(max_num_seqs=256, max_num_batched_tokens=128), "max_num_batched_tokens to at least 256"),
        (dict(gpu_memory_utilization=1.5), "outside (0, 1]"),
        (dict(gpu_memory_utilization=0.0), "outside (0, 1]"),
        (dict(dtype="fp4"), "dtype"),
        (dict(extra_args=["--max-num-seqs", "3"]), "set max_num_seqs"),
        (dict(gpus=[0, 0]), "twice"),
    ],
)
def test_invalid_combinations_name_field_and_fix(kw, needle):
    with pytest.raises(ValidationError) as e:
        ServerConfig(model="m", **kw)
    assert needle in str(e.value)


def test_model_path_checks(tmp_path):
    with pytest.raises(ConfigError, match="does-not-exist"):
        check_model_path(ServerConfig(model=str(tmp_path / "does-not-exist")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="config.json"):
        check_model_path(ServerConfig(model=str(tmp_path / "empty")))
    check_model_path(ServerConfig(model="meta-llama/Llama-3.1-8B-Instruct"))  # HF id: not checked


_key = st.from_regex(r"[a-z][a-z0-9]{0,8}(-[a-z0-9]{1,6}){0,2}", fullmatch=True).filter(lambda k: not k.startswith("no-"))
_val = st.one_of(st.booleans(), st.integers(-10**6, 10**6), st.from_regex(r"[A-Za-z_/][A-Za-z0-9_./]{0,12}", fullmatch=True))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_key, _val, max_size=6))
def test_extra_args_dict_round_trip(d):
    d = {k: v for k, v in d.items() if not (isinstance(v, str) and v.lower() in ("true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"))}
    assert extra_args_to_dict(dict_to_extra_args(d)) == d


# ---------------------------------------------------------------------- declared once
def all_options_config(**kw) -> ServerConfig:
    """Every option set (ALL_OPTIONS) plus the internal fields."""
    base = dict(model="/models/llama", gpus=list(range(8)), env={"NCCL_P2P_DISABLE": "1"},
                extra_args=["--seed", "7", "--trust-remote-code"], **ALL_OPTIONS)
    base.update(kw)
    return ServerConfig(**base)


def test_every_field_is_an_option_or_listed_internal():
    fields = set(ServerConfig.model_fields)
    unlisted = fields - set(VLLM_OPTIONS) - set(INTERNAL_FIELDS)
    assert not unlisted, (f"ServerConfig fields {sorted(unlisted)} are neither vLLM options (annotate them with "
                          "VllmOption) nor listed in app.config.INTERNAL_FIELDS")
    assert not set(VLLM_OPTIONS) & set(INTERNAL_FIELDS)
    assert set(INTERNAL_FIELDS) <= fields, "INTERNAL_FIELDS names a field ServerConfig does not have"


def test_option_declarations_are_complete():
    from app.planner.versions import version_tuple

    flags = [s.flag for s in VLLM_OPTIONS.values()] + [a for s in VLLM_OPTIONS.values() for a in s.aliases]
    assert len(flags) == len(set(flags)), "two options share a flag"
    for field, spec in VLLM_OPTIONS.items():
        assert spec.flag.startswith("--") and spec.flag == spec.flag.lower() and " " not in spec.flag, field
        assert spec.key == spec.flag[2:]
        assert len(spec.help) > 10, f"{field}: give help text with the unit"
        if spec.kind == "choice":
            assert spec.choices, f"{field}: a choice needs its choices"
        assert ServerConfig.model_fields[field].default is None or not spec.is_bool, field
        if spec.min_vllm:
            assert version_tuple(spec.min_vllm), f"{field}: min_vllm {spec.min_vllm!r} is not a version"


def test_every_option_has_a_round_trip_value():
    assert set(ALL_OPTIONS) == set(VLLM_OPTIONS), "add the new option's value to ALL_OPTIONS"
    for field, v in ALL_OPTIONS.items():
        assert v != ServerConfig.model_fields[field].default, f"{field}: use a non-default value"


def test_every_option_is_on_the_argv_and_in_the_vllm_config():
    c = all_options_config()
    argv = c.option_argv()
    yaml_cfg = c.to_vllm_config(include_port=True)
    for field, spec in VLLM_OPTIONS.items():
        v = getattr(c, field)
        if v is False:
            assert "--no-" + spec.key in argv, field
        elif v is True:
            assert spec.flag in argv, field
        elif isinstance(v, dict):  # a JSON-valued option (--speculative-config): one JSON argument, JSON in the file
            assert json.loads(argv[argv.index(spec.flag) + 1]) == v, field
            assert json.loads(yaml_cfg[spec.key]) == v, field
            continue
        else:
            assert argv[argv.index(spec.flag) + 1] == str(v), field
        assert yaml_cfg[spec.key] == v, field
    assert "--port" not in c.option_argv(include_port=False) and "port" not in c.to_vllm_config()


def test_round_trip_config_vllm_config_yaml_all_options():
    c = all_options_config()
    back = ServerConfig.from_vllm_config_yaml(c.to_vllm_config_yaml(include_port=True), gpus=c.gpus, env=c.env)
    assert back == c
    assert ServerConfig.from_command_line(c.shell_command()) == c.model_copy(update={"port": None})


def test_round_trip_config_profile_yaml_config():
    from app.profiles.io import dump_profile, parse_profile
    from app.profiles.model import Profile

    c = all_options_config(port=None)  # a profile never stores the port (chosen at launch)
    prof = Profile(name="all options", server=c.to_vllm_config(), env=dict(c.env), gpus=list(c.gpus))
    back = parse_profile(dump_profile(prof)).server_config(resolve=False)
    assert back == c


def _serve_parse(argv):
    from app.cli import build_parser

    return build_parser().parse_args(argv)


def test_round_trip_config_serve_argparse_config():
    import shlex

    from app.cli.common import config_from_args

    c = all_options_config()
    ns = _serve_parse(["serve", "--model", c.model, *c.option_argv()[:-len(c.extra_args)],
                       "--gpus", ",".join(map(str, c.gpus)), *[f"--env={k}={v}" for k, v in c.env.items()],
                       "--extra", shlex.join(c.extra_args)])
    assert config_from_args(ns) == c
    assert config_from_namespace(ns) == c
    bare = _serve_parse(["serve", "--model", "m"])
    assert config_from_args(bare) == ServerConfig(model="m")  # not given = vLLM's default, not argparse's


def test_serve_help_has_every_option_with_its_unit(capsys):
    with pytest.raises(SystemExit):
        _serve_parse(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for field, spec in VLLM_OPTIONS.items():
        assert spec.flag in out, field
        assert " ".join(spec.help.split()) in out, f"{field}: the help text (with the unit) is not in --help"
    assert "tokens" in VLLM_OPTIONS["max_model_len"].help and "fraction" in VLLM_OPTIONS["gpu_memory_utilization"].help


def test_server_options_over_a_base_config_for_run():
    """What `run PROFILE --max-num-seqs 8` needs: options given replace the profile's,
    the rest are kept, --env adds."""
    import argparse

    p = argparse.ArgumentParser()
    add_server_options(p, model_required=False)
    base = all_options_config()
    ns = p.parse_args(["--max-num-seqs", "8", "--env", "A=1", "--no-enforce-eager", "-tp", "1"])
    c = config_from_namespace(ns, base)
    assert c.max_num_seqs == 8 and c.enforce_eager is False and c.tensor_parallel_size == 1
    assert c.env == {**base.env, "A": "1"} and c.gpus == base.gpus and c.extra_args == base.extra_args
    assert c.model_copy(update=dict(max_num_seqs=64, enforce_eager=True, tensor_parallel_size=2,
                                    env=base.env)) == base
    with pytest.raises(ConfigError, match="--model"):
        config_from_namespace(p.parse_args([]))
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        config_from_namespace(p.parse_args(["--model", "m", "--env", "oops"]))
    with pytest.raises(ConfigError, match="--gpus"):
        config_from_namespace(p.parse_args(["--model", "m", "--gpus", "a,b"]))
    assert p.parse_args(["--max-model-len", "32k"]).max_model_len == 32000


def test_short_aliases_are_named_options_too():
    with pytest.raises(ValidationError, match="set tensor_parallel_size"):
        ServerConfig(model="m", extra_args=["-tp", "2"])


def test_version_acceptance():
    from app.planner.versions import known_versions, option_accepted

    newest = known_versions()[-1]
    for field, spec in VLLM_OPTIONS.items():
        assert option_accepted(spec, newest), f"{field} is not accepted by vLLM {newest}: do not declare it"
    newer = VllmOption("--new-knob", "opt_int", "a knob, tokens", min_vllm="0.33")
    assert not option_accepted(newer, "0.32.0") and option_accepted(newer, "0.33.1+cpu")
    swap = VllmOption("--swap-space", "opt_int", "CPU swap space per GPU, GiB")
    assert option_accepted(swap, "0.11.0") and not option_accepted(swap, "0.32.0")  # removed_options of 0.32
