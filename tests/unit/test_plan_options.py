"""Every option accounted for (issue 36 item 4): chunked prefill off with a short batch,
an FP8 E4M3 KV cache by compute capability and on the CPU build, the ``--extra`` options
the plan does not model, ``--extra`` with one flag, and a vLLM option ``plan`` does not
know as its own."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.config import ServerConfig
from app.planner.diagnose import diagnose
from app.planner.gpus import cpu_device, lookup_gpu
from app.planner.models import from_catalog
from app.planner.plan import plan

MODEL = "Llama-3.1-8B-Instruct"


def _plan(gpu, **kw):
    cfg = ServerConfig(model=MODEL, **kw)
    return plan(cfg, [gpu], from_catalog(MODEL), vllm_version="0.32.0", use_calibration=False)


def _finding(p, code):
    return next((f for f in p.findings if f.problem == code), None)


def test_chunked_prefill_off_with_a_short_batch_is_refused_as_vllm_does():
    # vllm/config/scheduler.py SchedulerConfig.verify_max_model_len, 0.32.0
    p = _plan(lookup_gpu("H100 SXM"), max_model_len=8192, max_num_batched_tokens=2048,
              extra_args=["--no-enable-chunked-prefill"])
    f = _finding(p, "batched_tokens_below_max_model_len")
    assert f.verdict == "error" and "max_num_batched_tokens (2048) is smaller than max_model_len (8192)" in f.message
    assert f.fix == {"max_num_batched_tokens": 8192}
    # chunked prefill on (vLLM's default), or a batch as long as the context: no finding
    assert _finding(_plan(lookup_gpu("H100 SXM"), max_model_len=8192, max_num_batched_tokens=2048),
                    "batched_tokens_below_max_model_len") is None
    assert _finding(_plan(lookup_gpu("H100 SXM"), max_model_len=8192, max_num_batched_tokens=8192,
                          extra_args=["--no-enable-chunked-prefill"]), "batched_tokens_below_max_model_len") is None


def test_chunked_prefill_refusal_in_a_log():
    line = ("ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (8192). This effectively limits "
            "the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
            "increase max_num_batched_tokens or decrease max_model_len.")  # vllm/config/scheduler.py, 0.32.0
    d = diagnose([line])
    assert d.problem == "batched_tokens_below_max_model_len" and d.fix == {"max_num_batched_tokens": 8192}


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3"])
def test_fp8_e4m3_kv_cache_below_89_is_refused(dtype):
    p = _plan(lookup_gpu("T4"), kv_cache_dtype=dtype, dtype="half", max_model_len=4096)
    f = _finding(p, "kv_cache_dtype_unsupported_by_gpu")
    assert f.verdict == "error" and "fp8e4nv" in f.message and f.fix == {"kv_cache_dtype": "fp8_e5m2"}


def test_fp8_kv_cache_passes_where_it_compiles():
    assert _finding(_plan(lookup_gpu("T4"), kv_cache_dtype="fp8_e5m2", dtype="half", max_model_len=4096),
                    "kv_cache_dtype_unsupported_by_gpu") is None
    assert _finding(_plan(lookup_gpu("L4"), kv_cache_dtype="fp8"), "kv_cache_dtype_unsupported_by_gpu") is None
    # the CPU build takes fp8 (vllm/v1/attention/backends/cpu_attn.py supported_kv_cache_dtypes, 0.32.0)
    assert _finding(_plan(cpu_device(64.0, 8), kv_cache_dtype="fp8", max_model_len=4096),
                    "kv_cache_dtype_unsupported_by_gpu") is None


def test_triton_fp8e4nv_refusal_in_a_log():
    # triton/language/core.py, 3.9.0 (the supported list from triton/backends/nvidia/compiler.py below 8.9)
    d = diagnose(["ValueError: type fp8e4nv not supported in this architecture. The supported fp8 dtypes are "
                  "('fp8e4b15', 'fp8e5')"])
    assert d.problem == "kv_cache_dtype_unsupported_by_gpu" and d.fix == {"kv_cache_dtype": "fp8_e5m2"}


def test_unmodelled_extra_options_are_named():
    p = _plan(lookup_gpu("RTX 4090"), extra_args=["--enable-lora", "--max-loras", "32", "--max-lora-rank", "256",
                                                  "--seed", "1"])
    f = _finding(p, "options_not_modelled")
    assert f.verdict == "info"
    assert f.message.startswith("not modelled: --enable-lora, --max-loras 32, --max-lora-rank 256 — their memory")
    assert "--seed" not in f.message


def test_extra_takes_one_flag(capsys):
    rc = main(["plan", "--model", MODEL, "--gpu", "H100 SXM", "--max-model-len", "8192", "--max-num-batched-tokens",
               "2048", "--extra", "--no-enable-chunked-prefill", "--vllm-version", "0.32.0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and "batched_tokens_below_max_model_len" in json.dumps(out)


def test_a_vllm_option_plan_lacks_gets_the_extra_hint(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["plan", "--model", MODEL, "--gpu", "H100 SXM", "--swap-space", "4"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --swap-space 4" in err and '--extra "--swap-space 4"' in err
