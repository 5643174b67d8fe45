"""Quantization against the checkpoint and the card (issue 16, items 2 and 4).

Checkpoints are written as their tools write config.json (``quantization_config``), and
the expectations come from vLLM's source of each version the planner knows (the wheel's
files named in each test): ModelConfig._verify_quantization with every config's
override_quantization_method, weight_utils.get_quant_config, each config's and each
compressed-tensors scheme's get_min_capability(), and the scheme choice of
CompressedTensorsConfig._get_scheme_from_parts.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.config import ServerConfig
from app.planner.gpus import cpu_device, lookup_gpu
from app.planner.models import (ModelArch, checkpoint_quant_method, compressed_tensors_scheme, from_catalog)
from app.planner.plan import apply_fix, plan
from app.planner.versions import rules_for

VERSIONS = ("0.10.2", "0.11.0", "0.32.0", "0.33.0")

# Qwen2.5-7B's shape; the quantization_config is what each test adds
QWEN7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
          "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
          "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
          "torch_dtype": "bfloat16"}
QWEN1_5B = {**QWEN7B, "hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
            "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True}
# AutoAWQ / transformers AwqConfig as saved in config.json
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
# AutoGPTQ / GPTQModel
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}


def checkpoint(tmp_path: Path, qc: dict | None = None, files: tuple[str, ...] = (), name: str = "ckpt") -> ModelArch:
    d = tmp_path / name
    d.mkdir()
    cfg = dict(QWEN7B)
    if qc is not None:
        cfg["quantization_config"] = qc
    (d / "config.json").write_text(json.dumps(cfg))
    for f in files:
        (d / f).write_text("{}")
    return ModelArch.from_dir(d)


def run(model: ModelArch, quantization: str | None, gpu: str = "RTX 4090", version: str = "0.32.0", **kw):
    cards = [cpu_device(24, 2)] if gpu == "cpu" else [lookup_gpu(gpu)]
    return plan(ServerConfig(model="m", quantization=quantization, **kw), cards, model, vllm_version=version,
                use_calibration=False)


def finding(p, code):
    return next((f for f in p.findings if f.problem == code), None)


# ------------------------------------------------------------------ item 2: method vs checkpoint
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("given", ["gptq", "fp8", "compressed-tensors", "gptq_marlin", "modelopt"])
def test_another_method_on_an_awq_checkpoint_is_refused(tmp_path, version, given):
    """vllm/config/model.py _verify_quantization (0.11, 0.32, 0.33; vllm/config/__init__.py in
    0.10.2): only the AWQ configs' override accepts another value; anything else raises
    "Quantization method specified in the model config (awq) does not match the quantization
    method specified in the `quantization` argument (gptq)."."""
    m = checkpoint(tmp_path, AWQ)
    p = run(m, given, version=version)
    assert p.verdict == "error" and p.problem == "quantization_mismatch", p.findings
    f = finding(p, "quantization_mismatch")
    assert "(awq) does not match the quantization method specified in the `quantization` argument " \
           f"({given})" in f.message
    assert f.fix == {"quantization": None}
    fixed = run(m, None, version=version)
    assert "quantization_mismatch" not in fixed.problems() and fixed.effective.quantization == "awq"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_checkpoints_own_method_and_its_kernels_pass(tmp_path, version):
    """awq_marlin.py / gptq_marlin.py override_quantization_method (0.10.2, 0.11): a user value
    of None, "marlin" or "awq_marlin"/"gptq_marlin" converts; auto_awq.py / auto_gptq.py (0.32,
    0.33) accept awq, awq_marlin, auto_awq, marlin (gptq likewise); moe_wna16.py accepts
    moe_wna16 for both."""
    awq, gptq = checkpoint(tmp_path, AWQ, name="awq"), checkpoint(tmp_path, GPTQ, name="gptq")
    for m, values in ((awq, ["awq", "awq_marlin", "moe_wna16", None]),
                      (gptq, ["gptq", "gptq_marlin", "moe_wna16", None])):
        for q in values:
            p = run(m, q, version=version)
            assert "quantization_mismatch" not in p.problems(), (m.quant_method, q, p.findings)
    for q in ("auto_awq",) if version.startswith("0.3") else ("awq_marlin",):
        assert "quantization_mismatch" not in run(awq, q, version=version).problems()
    assert run(gptq, "awq", version=version).problem == "quantization_mismatch"


def test_marlin_names_need_capability_8_up_to_0_11(tmp_path):
    """0.10.2/0.11 awq_marlin.py is_awq_marlin_compatible → check_marlin_supported, which needs
    capability 80 (marlin_utils.py query_marlin_supported_quant_types: `< 80: return []`):
    on a T4 the override does not fire and "awq_marlin" mismatches "awq". 0.32's auto_awq.py
    accepts the name on any CUDA card (its Marlin runs from 7.5)."""
    m = checkpoint(tmp_path, AWQ)
    for version in ("0.10.2", "0.11.0"):
        p = run(m, "awq_marlin", gpu="T4", version=version)
        f = finding(p, "quantization_mismatch")
        assert p.problem == "quantization_mismatch" and "compute capability 8.0" in f.message
        assert f.fix == {"quantization": None}
        assert "quantization_mismatch" not in run(m, "awq_marlin", gpu="RTX 3090", version=version).problems()
    assert "quantization_mismatch" not in run(m, "awq_marlin", gpu="T4", version="0.32.0").problems()


def test_cpu_build_rules(tmp_path):
    """0.10.2/0.11 ipex_quant.py: on the CPU build IPEXConfig takes every awq/gptq checkpoint
    whatever --quantization says; 0.32 auto_awq.py "Don't override on CPU", so only "awq" itself
    passes there."""
    m = checkpoint(tmp_path, AWQ)
    assert "quantization_mismatch" not in run(m, "awq_marlin", gpu="cpu", version="0.11.0").problems()
    assert run(m, "awq_marlin", gpu="cpu", version="0.32.0").problem == "quantization_mismatch"
    assert "quantization_mismatch" not in run(m, "awq", gpu="cpu", version="0.32.0").problems()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("given", ["awq", "gptq", "compressed-tensors"])
def test_quantized_method_on_a_16_bit_checkpoint_is_refused(tmp_path, version, given):
    """No quantization_config: _verify_quantization passes, then
    vllm/model_executor/model_loader/weight_utils.py get_quant_config looks for the method's
    files (awq: quant_config.json/quantize_config.json; gptq: quantize_config.json) and raises
    "Cannot find the config file for awq"; compressed-tensors has no file and no default config."""
    m = checkpoint(tmp_path)
    p = run(m, given, version=version)
    f = finding(p, "quantization_mismatch")
    assert p.verdict == "error" and f is not None and f.fix == {"quantization": None}
    if given != "compressed-tensors":
        assert f"Cannot find the config file for {given}" in f.message
    assert run(m, None, version=version).verdict == "ok"


@pytest.mark.parametrize("version,online", [("0.10.2", "fp8"), ("0.11.0", "experts_int8"),
                                            ("0.32.0", "fp8_per_tensor"), ("0.33.0", "fp8")])
def test_online_quantization_of_a_16_bit_checkpoint_passes(tmp_path, version, online):
    """fp8.py/experts_int8.py get_config_filenames() is [] and the config builds without
    arguments (0.10.2, 0.11); 0.32/0.33 weight_utils.get_quant_config turns fp8 and the
    shorthands of config/quantization.py (_ONLINE_SHORTHANDS) into OnlineQuantizationConfig."""
    p = run(checkpoint(tmp_path), online, gpu="H100 SXM", version=version)
    assert "quantization_mismatch" not in p.problems() and p.verdict == "ok", p.findings


def test_a_separate_quantize_config_json_is_read(tmp_path):
    """Old GPTQ checkpoints keep their config in quantize_config.json (get_config_filenames of
    gptq.py / auto_gptq.py): with it beside config.json, --quantization gptq loads."""
    m = checkpoint(tmp_path, files=("quantize_config.json",))
    assert m.checkpoint_files == ("config.json", "quantize_config.json")
    for version in VERSIONS:
        assert "quantization_mismatch" not in run(m, "gptq", version=version).problems()
    assert run(m, "compressed-tensors", version="0.11.0").problem == "quantization_mismatch"  # no file of its own


def test_modelopt_checkpoint_takes_any_value(tmp_path):
    """A ModelOpt FP8 checkpoint (producer modelopt) is named "modelopt"
    (model_arch_config_convertor.py _normalize_quantization_config, 0.32/0.33) and
    ModelOptFp8Config.override_quantization_method returns "modelopt" whatever the user gave."""
    qc = {"producer": {"name": "modelopt", "version": "0.29"}, "quantization": {"quant_algo": "FP8"},
          "quant_method": "modelopt"}
    assert checkpoint_quant_method(qc) == "modelopt"
    assert checkpoint_quant_method({**qc, "quantization": {"quant_algo": "NVFP4"}}) == "modelopt_fp4"
    assert checkpoint_quant_method({"quant_method": "compressed_tensors"}) == "compressed-tensors"
    m = checkpoint(tmp_path, qc)
    for version in VERSIONS:
        assert "quantization_mismatch" not in run(m, "fp8", gpu="H100 SXM", version=version).problems()


def test_catalog_names_warn_and_repacks_are_assumed():
    """The catalog holds base configs: a method guessed from the id ("-AWQ") warns when the
    option differs; an unsuffixed catalog model with --quantization is planned as a repack."""
    p = run(from_catalog("Qwen2.5-7B-Instruct-AWQ"), "gptq")
    f = finding(p, "quantization_mismatch")
    assert f.verdict == "warn" and "guessed" in f.message and p.fix == {"quantization": None}
    assert "quantization_mismatch" not in run(from_catalog("Qwen2.5-7B-Instruct"), "awq").problems()


def test_mismatch_comes_before_capability(tmp_path):
    """vLLM stops in ModelConfig (the mismatch) before VllmConfig checks the capability."""
    p = run(checkpoint(tmp_path, AWQ), "fp8", gpu="T4", version="0.10.2")
    assert p.problems() == ["quantization_mismatch"]
    assert "quantization_unsupported_by_gpu" not in run(checkpoint(tmp_path, AWQ, name="b"), "fp8", gpu="T4",
                                                        version="0.32.0").problems()


# ------------------------------------------------------------------ item 4: capability per method and scheme
def test_capability_table_per_version():
    """get_min_capability() of each config: 0.10.2/0.11 fp8.py 80, awq_marlin.py 80, gptq_marlin.py
    80, modelopt.py ModelOptFp8Config 89 / ModelOptNvFp4Config 80, gptq_bitblas.py 80, mxfp4.py 80;
    0.32/0.33 fp8.py 75 (Marlin FP8 from 7.5), auto_awq.py 75, auto_gptq.py 60, modelopt.py 80 / 75,
    fp_quant.py 100."""
    old, new = rules_for("0.11.0"), rules_for("0.33.0")
    assert [old.min_capability(q) for q in ("fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "modelopt",
                                            "modelopt_fp4", "gptq_bitblas")] == [80, 75, 80, 60, 80, 89, 80, 80]
    assert [new.min_capability(q) for q in ("fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "modelopt",
                                            "modelopt_fp4", "fp_quant")] == [75, 75, 75, 60, 60, 80, 75, 100]
    assert old.marlin_min_capability == 80 and new.marlin_min_capability == 75
    # every CUDA method of each version has a minimum; the others are not CUDA methods
    # (tpu_int8.py raises "should not be called with TPU Backend", ipex_quant.py -1, inc.py AssertionError)
    for v in VERSIONS:
        r = rules_for(v)
        assert {q for q in r.quantization_methods if r.min_capability(q) is None} <= {
            "tpu_int8", "neuron_quant", "ipex", "inc"}, v


def ct(weights, inputs=None, fmt="pack-quantized", **extra):
    """A compressed-tensors quantization_config as llm-compressor writes it."""
    grp = {"targets": ["Linear"], "weights": weights, "input_activations": inputs, **extra}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": grp},
            "ignore": ["lm_head"]}


FP8_W = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
FP8_TOKEN = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
INT8_W = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False}
INT8_TOKEN = {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True}
INT4_G128 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True,
             "dynamic": False}
NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
         "dynamic": False}
MXFP4 = {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32, "symmetric": True,
         "dynamic": False}

SCHEMES = {  # config → scheme, by compressed_tensors.py _get_scheme_from_parts (0.11 and 0.33)
    "W8A8-FP8": ct(FP8_W, FP8_TOKEN, "float-quantized"),
    "W8A16-FP8": ct(FP8_W, None, "float-quantized"),
    "W8A8-INT8": ct(INT8_W, INT8_TOKEN, "int-quantized"),
    "W4A16": ct(INT4_G128),
    "W8A16": ct({**INT4_G128, "num_bits": 8}),
    "W4A16-2:4": ct(INT4_G128, None, "marlin-24"),
    "W4A8-FP8": ct(INT4_G128, FP8_TOKEN, "int-quantized"),
    "W4A8-INT": ct(INT4_G128, INT8_TOKEN, "int-quantized"),
    "W4A4-NVFP4": ct(NVFP4, {**NVFP4, "dynamic": "local"}, "nvfp4-pack-quantized"),
    "W4A16-NVFP4": ct(NVFP4, None, "nvfp4-pack-quantized"),
    "W4A4-MXFP4": ct(MXFP4, None, "mxfp4-pack-quantized"),
    "W4A8-MXFP4": ct(MXFP4, FP8_TOKEN, "mxfp4-pack-quantized"),
    "WNA8O8-INT": ct(INT4_G128, {"num_bits": 8, "type": "int", "strategy": "tensor", "dynamic": False},
                     "pack-quantized",
                     output_activations={"num_bits": 8, "type": "int", "strategy": "tensor", "dynamic": False}),
}


def test_compressed_tensors_schemes_are_read(tmp_path):
    for name, qc in SCHEMES.items():
        assert compressed_tensors_scheme(qc["config_groups"]["group_0"], qc["format"]) == name
    m = checkpoint(tmp_path, SCHEMES["W8A8-FP8"])
    assert m.quant_method == "compressed-tensors" and m.quant_schemes == ("W8A8-FP8",)
    assert m.quant_bits == 8
    # a 2:4 sparse checkpoint (CompressedTensors24, 0.10/0.11)
    sparse = {**SCHEMES["W8A8-FP8"], "sparsity_config": {"format": "sparse-24-bitmask", "sparsity_structure": "2:4"}}
    assert checkpoint(tmp_path, sparse, name="sparse").quant_schemes == ("Sparse-2:4",)
    # every scheme the classifier names has a minimum in some version
    assert all(any(rules_for(v).scheme_rule(s) for v in VERSIONS) for s in [*SCHEMES, "Sparse-2:4"])


@pytest.mark.parametrize("scheme,gpu,version,expect", [
    # compressed_tensors_w8a8_fp8.py 89; below it _get_scheme_from_parts takes W8A16Fp8 (80 in 0.11, 75 in 0.32)
    ("W8A8-FP8", "H100 SXM", "0.11.0", "ok"),
    ("W8A8-FP8", "A100 80GB SXM", "0.11.0", "fallback"),
    ("W8A8-FP8", "T4", "0.11.0", "error 80"),
    ("W8A8-FP8", "T4", "0.32.0", "fallback"),
    # compressed_tensors_wNa16.py: 80 in 0.10.2/0.11, 75 in 0.32/0.33
    ("W4A16", "T4", "0.10.2", "error 80"),
    ("W4A16", "T4", "0.33.0", "ok"),
    # compressed_tensors_w8a8_int8.py 75
    ("W8A8-INT8", "Tesla V100 SXM2 32GB", "0.33.0", "error 75"),
    ("W8A8-INT8", "T4", "0.11.0", "ok"),
    # compressed_tensors_w4a8_fp8.py 90, chosen only when the capability is exactly 90 (_is_fp8_w4a8_sm90)
    ("W4A8-FP8", "H100 SXM", "0.32.0", "ok"),
    ("W4A8-FP8", "RTX 4090", "0.32.0", "exact 90"),
    ("W4A8-FP8", "B200", "0.11.0", "exact 90"),
    # compressed_tensors_w4a4_nvfp4.py: 100 in 0.11 with the W4A16Fp4 fallback (80); 75 in 0.32
    ("W4A4-NVFP4", "H100 SXM", "0.11.0", "fallback"),
    ("W4A4-NVFP4", "B200", "0.11.0", "ok"),
    ("W4A4-NVFP4", "T4", "0.32.0", "ok"),
    # compressed_tensors_w4a4_mxfp4.py 80 (0.32)
    ("W4A4-MXFP4", "T4", "0.32.0", "error 80"),
])
def test_scheme_capability(tmp_path, scheme, gpu, version, expect):
    p = run(checkpoint(tmp_path, SCHEMES[scheme]), None, gpu=gpu, version=version)
    f = finding(p, "quantization_unsupported_by_gpu")
    fb = finding(p, "quantization_weight_only_fallback")
    if expect == "ok":
        assert f is None and fb is None, p.findings
    elif expect == "fallback":
        assert f is None and fb is not None and fb.verdict == "info" and scheme in fb.message, p.findings
        assert p.verdict != "error"
    elif expect.startswith("exact"):
        assert f is not None and "runs only on compute capability 9.0" in f.message
    else:
        need = expect.split()[1]
        assert f is not None and p.problem == "quantization_unsupported_by_gpu"
        assert f"Min capability: {need}." in f.message and f.fix is None, f.message


def test_fp8_weight_only_path_is_information():
    """fp8.py (0.10.2, 0.11: use_marlin = not has_device_capability(89)) and marlin_utils_fp8.py's
    warning: on 8.0–8.8 FP8 runs weight-only, not an error; below the minimum (80 in 0.11, 75 in
    0.32) it is refused and, for a 16-bit checkpoint, dropping the option fixes it."""
    m = ModelArch.from_config(QWEN1_5B, name="Qwen2.5-1.5B-Instruct")  # 16-bit, fits a T4 unquantized
    a100 = run(m, "fp8", gpu="A100 80GB SXM", version="0.11.0")
    f = finding(a100, "quantization_weight_only_fallback")
    assert a100.verdict == "ok" and f.verdict == "info" and "Marlin" in f.message
    assert finding(run(m, "fp8", gpu="L4", version="0.11.0"), "quantization_weight_only_fallback") is None
    t4 = run(m, "fp8", gpu="T4", version="0.11.0")
    assert t4.problem == "quantization_unsupported_by_gpu" and t4.fix == {"quantization": None}
    assert "Minimum capability: 80. Current capability: 75." in finding(t4, "quantization_unsupported_by_gpu").message
    t4_new = run(m, "fp8", gpu="T4", version="0.32.0")
    assert t4_new.verdict == "ok" and finding(t4_new, "quantization_weight_only_fallback") is not None


def test_awq_on_volta_has_no_option_fix(tmp_path):
    """awq.py / auto_awq.py get_min_capability() 75 in every version: a V100 (7.0) cannot run an
    AWQ checkpoint; no option change fixes it (another checkpoint or card)."""
    m = checkpoint(tmp_path, AWQ)
    for version in VERSIONS:
        p = run(m, None, gpu="Tesla V100 SXM2 32GB", version=version)
        f = finding(p, "quantization_unsupported_by_gpu")
        assert p.problem == "quantization_unsupported_by_gpu" and f.fix is None
        assert "Minimum capability: 75. Current capability: 70." in f.message
    fixed = apply_fix(ServerConfig(model="m", quantization="awq"), {"quantization": None})
    assert fixed.quantization is None


def test_the_sim_refuses_as_vllm_and_the_diagnosis_reads_it(tmp_path):
    """The sim (vLLM 0.32's rules) refuses what the plan calls an error, with vLLM's sentence,
    and the diagnosis names the same problem from that sentence."""
    from app.planner.diagnose import diagnose
    from app.sim import model_adapter as ma

    awq = checkpoint(tmp_path, AWQ, name="awq")
    with pytest.raises(ma.Refusal) as r:
        ma.plan_rig(ServerConfig(model=str(tmp_path / "awq"), quantization="gptq"), "RTX 4090", 1)
    assert "model config (awq) does not match" in r.value.text and awq.quant_method == "awq"
    assert diagnose([r.value.text]).problem == "quantization_mismatch"
    checkpoint(tmp_path, SCHEMES["W4A4-MXFP4"], name="mxfp4")  # compressed_tensors_w4a4_mxfp4.py: 80
    with pytest.raises(ma.Refusal) as r:
        ma.plan_rig(ServerConfig(model=str(tmp_path / "mxfp4")), "T4", 1)
    assert r.value.text == ("RuntimeError: Quantization scheme is not supported for the current GPU. Min capability: "
                            "80. Current capability: 75.")
    assert diagnose([r.value.text]).problem == "quantization_unsupported_by_gpu"
