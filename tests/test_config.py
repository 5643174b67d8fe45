import pytest
import yaml
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from app.config import ConfigError, ServerConfig, check_model_path, dict_to_extra_args, extra_args_to_dict


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
