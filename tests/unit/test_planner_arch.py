"""Model architecture: hand calculations, catalog, config.json, the local HF cache."""
from __future__ import annotations

import json

import pytest

from app.planner.models import ModelArch, ModelNotFoundError, from_catalog, quant_bytes_per_param, resolve_model


def test_llama3_70b_kv_and_awq_weights_match_hand_calculation():
    m = from_catalog("meta-llama/Meta-Llama-3-70B-Instruct")
    # 2 · 80 layers · 8 KV heads · 128 head_dim · 2 bytes
    assert m.kv_bytes_per_token() == 327_680
    assert m.kv_bytes_per_token(tp=4) == 81_920  # 80 KiB per GPU at TP4
    assert abs(m.total_params() / 1e9 - 70.55) < 0.05
    # AWQ g128: linear layers at 0.5 + 2/128 + 0.5/128 B, embeddings and lm_head 16-bit ≈ 39.8 GB
    assert quant_bytes_per_param("awq", 4, 128) == pytest.approx(0.51953125)
    assert m.weight_bytes("awq") / 1e9 == pytest.approx(39.8, abs=0.05)
    assert m.weight_bytes() / 1e9 == pytest.approx(141.1, abs=0.1)  # bf16


def test_deepseek_v3_mla_and_moe():
    m = from_catalog("DeepSeek-V3")
    assert m.is_mla and m.is_moe
    # MLA: 61 layers · (kv_lora_rank 512 + qk_rope_head_dim 64) · 2 bytes, not split by TP
    assert m.kv_bytes_per_token() == 70_272
    assert m.kv_bytes_per_token(tp=8) == 70_272
    assert m.total_params() / 1e9 == pytest.approx(671, abs=2)
    assert m.active_params() / 1e9 == pytest.approx(37, abs=1.5)
    assert m.quant_method == "fp8"


def test_moe_total_vs_active():
    mx = from_catalog("Mixtral-8x7B")
    assert mx.total_params() / 1e9 == pytest.approx(46.7, abs=0.3)
    assert mx.active_params() / 1e9 == pytest.approx(12.9, abs=0.3)
    q = from_catalog("Qwen/Qwen3-30B-A3B")
    assert q.kv_bytes_per_token() == 98_304
    assert q.total_params() / 1e9 == pytest.approx(30.5, abs=0.3)
    assert 2.5 < q.active_params() / 1e9 < 3.5


@pytest.mark.parametrize("mid", ["Llama-3.1-8B-Instruct", "Llama-3-70B", "Llama-2-70B", "Qwen2.5-7B", "Qwen2.5-32B",
                                 "Qwen2.5-72B-Instruct", "Qwen3-32B", "Qwen3-30B-A3B", "Mistral-7B", "Mixtral-8x7B",
                                 "deepseek-ai/DeepSeek-R1", "DeepSeek-V3", "DeepSeek-R1-Distill-Llama-70B"])
def test_catalog_has_the_issue_models(mid):
    assert from_catalog(mid).layers > 0


def test_quantization_from_repack_id():
    m = from_catalog("hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4")
    assert (m.quant_method, m.quant_bits, m.quant_group_size) == ("awq", 4, 128)
    assert from_catalog("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int8").quant_bits == 8


def test_local_dir_and_quantization_config(tmp_path):
    cfg = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 64, "hidden_size": 5120,
           "num_attention_heads": 40, "num_key_value_heads": 8, "intermediate_size": 27392, "vocab_size": 152064,
           "max_position_embeddings": 32768, "torch_dtype": "float16",
           "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = resolve_model(str(tmp_path))
    assert m.source.startswith("config.json") and m.quant_method == "awq" and m.head_dim == 128


def test_tiny_model_dir(tiny_model):
    m = resolve_model(str(tiny_model))
    assert m.kv_bytes_per_token() == 1024  # 2 layers · 2 KV heads · 64 · 2 K/V · 2 bytes


def test_hf_cache_is_read_offline(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--acme--Tiny-7B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (tmp_path / "hub" / "models--acme--Tiny-7B" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--Tiny-7B" / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text(json.dumps({"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
                                                  "vocab_size": 100, "intermediate_size": 128}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    m = resolve_model("acme/Tiny-7B")
    assert m.layers == 3 and m.source.startswith("HF cache")


def test_unknown_model_names_the_fix():
    with pytest.raises(ModelNotFoundError, match="built-in catalog"):
        resolve_model("nobody/Nothing-13B")


def test_config_without_fields_is_a_clear_error():
    with pytest.raises(ValueError, match="hidden_size"):
        ModelArch.from_config({"num_hidden_layers": 2}, "broken")
