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
    p = _plan(lookup_gpu("RTX 4090"), extra_args=["--cpu-offload-gb", "4", "--max-cpu-loras", "2", "--seed", "1"])
    f = _finding(p, "options_not_modelled")
    assert f.verdict == "info"
    assert f.message.startswith("not modelled: --cpu-offload-gb 4 — its memory")
    assert "--seed" not in f.message and "lora" not in f.message


def test_lora_buffers_are_sized_as_vllm_allocates_them():
    """vllm/lora/layers/base_linear.py create_lora_weights (0.32.0), Llama-3.1-8B (H 4096, 32 heads, 8 KV
    heads of 128, intermediate 14336, 32 layers), bf16, per adapter slot and layer on one card:
    qkv 3·r·4096 + (4096 + 2·1024)·r, gate_up 2·r·4096 + 2·14336·r, o r·4096 + 4096·r, down r·14336 + 4096·r
    = 81,920·r elements; the defaults (1 slot, rank 16): 1,310,720 × 32 layers × 2 B = 80 MiB, as a PEFT
    all-linear rank-16 adapter of this model (41.9 M parameters)."""
    from app.planner.memory import lora_gib

    def _plan(gpu, **kw):  # memory only: no predicted ramp
        return plan(ServerConfig(model=MODEL, **kw), [gpu], from_catalog(MODEL), vllm_version="0.32.0",
                    use_calibration=False, predict=False)

    base = _plan(lookup_gpu("H100 SXM"), max_model_len=8192)
    p = _plan(lookup_gpu("H100 SXM"), max_model_len=8192, extra_args=["--enable-lora"])
    assert (p.effective.lora_slots, p.effective.lora_rank) == (1, 16)
    assert p.ranks[0].lora_gib == pytest.approx(81_920 * 16 * 32 * 2 / 2**30) == pytest.approx(0.078125)
    assert p.ranks[0].weights_gib == pytest.approx(base.ranks[0].weights_gib + 0.078125)
    assert p.ranks[0].kv_gib == pytest.approx(base.ranks[0].kv_gib - 0.078125)
    f = _finding(p, "lora_memory")
    assert f.verdict == "info" and "1 adapter slot of rank ≤ 16 take 0.08 GiB on each GPU" in f.message
    assert _finding(p, "options_not_modelled") is None
    # 32 slots of rank 256: 81,920 · 256 · 32 layers · 32 slots · 2 B = 40 GiB — more than a 4090 has
    big = _plan(lookup_gpu("RTX 4090"), max_model_len=8192,
                extra_args=["--enable-lora", "--max-loras", "32", "--max-lora-rank", "256"])
    assert big.ranks[0].lora_gib == pytest.approx(40.0)
    assert big.verdict == "error"
    # TP 2: the column layers' B and the row layers' A halve, their A and B stay whole (not fully sharded)
    tp2 = plan(ServerConfig(model=MODEL, max_model_len=8192, tensor_parallel_size=2, extra_args=["--enable-lora"]),
               [lookup_gpu("H100 SXM")] * 2, from_catalog(MODEL), vllm_version="0.32.0", use_calibration=False,
               predict=False)
    per_layer = (3 * 16 * 4096 + (2048 + 2 * 512) * 16) + (2 * 16 * 4096 + 2 * 7168 * 16) \
        + (16 * 2048 + 4096 * 16) + (16 * 7168 + 4096 * 16)
    assert tp2.ranks[0].lora_gib == pytest.approx(per_layer * 32 * 2 / 2**30)
    sharded = tp2.effective.__class__(**{**tp2.effective.__dict__, "lora_fully_sharded": True})
    assert lora_gib(tp2.model, sharded, 32) < tp2.ranks[0].lora_gib
    # --lora-dtype float32: twice the bytes
    f32 = _plan(lookup_gpu("H100 SXM"), max_model_len=8192, extra_args=["--enable-lora", "--lora-dtype", "float32"])
    assert f32.ranks[0].lora_gib == pytest.approx(2 * 0.078125)


def test_extra_takes_one_flag(capsys):
    rc = main(["plan", "--model", MODEL, "--gpu", "H100 SXM", "--max-model-len", "8192", "--max-num-batched-tokens",
               "2048", "--extra", "--no-enable-chunked-prefill", "--vllm-version", "0.32.0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and "batched_tokens_below_max_model_len" in json.dumps(out)


def test_extra_takes_several_loose_tokens_or_one_string(capsys):
    """``--extra --enable-lora --max-loras 4 --max-lora-rank 64`` (loose tokens, up to the next
    option of plan's own) plans the same LoRA memory as the same flags in one string; a token
    after one of plan's own options is still refused with the hint."""
    base = ["plan", "--model", MODEL, "--gpu", "H100 SXM", "--max-model-len", "8192", "--vllm-version", "0.32.0",
            "--json"]
    rc = main(base[:7] + ["--extra", "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"] + base[7:])
    loose = json.loads(capsys.readouterr().out)
    rc2 = main(base + ["--extra", "--enable-lora --max-loras 4 --max-lora-rank 64"])
    one = json.loads(capsys.readouterr().out)
    assert rc == rc2 and loose["ranks"][0]["weights_gib"] == one["ranks"][0]["weights_gib"]
    assert loose["effective"] == one["effective"] and (one["effective"]["lora_slots"], one["effective"]["lora_rank"]) == (4, 64)
    with pytest.raises(SystemExit):
        main(base + ["--extra", "--enable-lora", "--vllm-version", "0.32.0", "--max-loras", "4"])
    assert '--extra "--max-loras 4"' in capsys.readouterr().err


def test_a_vllm_option_plan_lacks_gets_the_extra_hint(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["plan", "--model", MODEL, "--gpu", "H100 SXM", "--swap-space", "4"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --swap-space 4" in err and '--extra "--swap-space 4"' in err
