"""Diagnosis of quantization refusals (issue 16, items 2 and 4): every wording vLLM has
for a --quantization that does not match the checkpoint and for a card below a method's,
a scheme's or a kernel's minimum compute capability. Each line is written from the raise
site named beside it (vLLM's wheel of that version), with the log prefix vLLM prints and
the wrapper that follows, so the root cause must win over the wrapper."""
from __future__ import annotations

import pytest

from app.planner.diagnose import diagnose

WRAPPER = ("(APIServer pid=50) ERROR 01-01 10:00:10 [api_server.py:10] RuntimeError: Engine core initialization "
           "failed. See root cause above. Failed core proc(s): {}")


def diag(*lines: str):
    d = diagnose([*lines, WRAPPER])
    assert d is not None
    return d


# ------------------------------------------------------------------ item 2: method vs checkpoint
@pytest.mark.parametrize("line,ckpt,given", [
    # vllm/config/model.py ModelConfig._verify_quantization @ 0.32.0 / 0.33.0 (and 0.11.0; vllm/config.py
    # @ 0.10.0, vllm/config/__init__.py @ 0.10.2) — raised inside ModelConfig's validator, so it arrives
    # as pydantic's "Value error, …" line
    ("(APIServer pid=50)   Value error, Quantization method specified in the model config (awq) does not match "
     "the quantization method specified in the `quantization` argument (gptq). [type=value_error, input_value="
     "ArgsKwargs((), {'model': '/models/Qwen2.5-7B-Instruct-AWQ'}), input_type=ArgsKwargs]", "awq", "gptq"),
    # the inner ValueError of the same raise, as a traceback prints it
    ("ValueError: Quantization method specified in the model config (compressed-tensors) does not match the "
     "quantization method specified in the `quantization` argument (fp8).", "compressed-tensors", "fp8"),
    # a quantization_config without quant_method: "()" up to 0.11 (quant_cfg.get("quant_method", "")),
    # "(None)" from 0.32 (`quant_method if quant_method != "" else None`)
    ("  Value error, Quantization method specified in the model config (None) does not match the quantization "
     "method specified in the `quantization` argument (awq_marlin).", "", "awq_marlin"),
    ("ValueError: Quantization method specified in the model config () does not match the quantization "
     "method specified in the `quantization` argument (gptq).", "", "gptq"),
])
def test_method_mismatch(line, ckpt, given):
    d = diag(line)
    assert d.problem == "quantization_mismatch" and d.fix == {"quantization": None}
    assert f"--quantization {given}" in d.explanation and "does not match" in d.evidence[0]
    if ckpt:
        assert f"quantized with {ckpt}" in d.explanation and f"give --quantization {ckpt}" in d.explanation
    else:
        assert "names no quant_method" in d.explanation


@pytest.mark.parametrize("line,q", [
    # vllm/model_executor/model_loader/weight_utils.py get_quant_config @ 0.10.0, 0.11.0 (f-string split on
    # two lines) and @ 0.32.0 / 0.33.0 (one line): the method wants its own file beside config.json
    ("(EngineCore_DP0 pid=51) ValueError: Cannot find the config file for awq", "awq"),
    ("  Value error, Cannot find the config file for gptq [type=value_error, input_value=ArgsKwargs((), "
     "{'model': 'Qwen/Qwen2.5-7B-Instruct'}), input_type=ArgsKwargs]", "gptq"),
])
def test_method_on_a_16_bit_checkpoint(line, q):
    d = diag(line)
    assert d.problem == "quantization_mismatch" and d.fix == {"quantization": None}
    assert f"--quantization {q}" in d.explanation and "no quantization_config" in d.explanation


# ------------------------------------------------------------------ item 4: capability refusals
@pytest.mark.parametrize("line,method,need,have", [
    # VllmConfig._get_quantization_config: vllm/config.py @ 0.10.0, vllm/config/__init__.py @ 0.11.0,
    # vllm/config/vllm.py @ 0.32.0 / 0.33.0
    ("(EngineCore_DP0 pid=51) ValueError: The quantization method awq is not supported for the current GPU. "
     "Minimum capability: 75. Current capability: 70.", "awq", "7.5", "7.0"),
    ("ValueError: The quantization method fp8 is not supported for the current GPU. Minimum capability: 80. "
     "Current capability: 75.", "fp8", "8.0", "7.5"),
    # 0.32 names an AWQ checkpoint by its config class
    ("ValueError: The quantization method auto_awq is not supported for the current GPU. Minimum capability: 75. "
     "Current capability: 70.", "auto_awq", "7.5", "7.0"),
    # vllm/model_executor/layers/quantization/moe_wna16.py MoeWNA16Config.__init__ @ 0.10.0 … 0.33.0
    ("ValueError: The quantization method moe_wna16 + awq is not supported for the current GPU. Minimum "
     "capability: 75. Current capability: 70.", "moe_wna16 + awq", "7.5", "7.0"),
])
def test_method_capability(line, method, need, have):
    d = diag(line)
    assert d.problem == "quantization_unsupported_by_gpu" and d.fix == {}
    assert f"the {method} kernels need compute capability {need}; this GPU has {have}" in d.explanation
    # the advice fits the method: AWQ → GPTQ (from 6.0); FP8 → AWQ/GPTQ, or drop an online --quantization
    assert ("GPTQ" in d.explanation) and (("drop it" in d.explanation) == (method == "fp8"))


@pytest.mark.parametrize("line,need,have,exact", [
    # compressed_tensors.py CompressedTensorsConfig._check_scheme_supported @ 0.10.0 / 0.11.0: the
    # RuntimeError is given three strings, so Python prints a tuple
    ("(EngineCore_DP0 pid=51) RuntimeError: ('Quantization scheme is not supported for ', 'the current GPU. "
     "Min capability: 80. ', 'Current capability: 75.')", "8.0", "7.5", False),
    ("RuntimeError: ('Quantization scheme is not supported for ', 'the current GPU. Required capability: ', "
     "'90. Current capability: 89.')", "9.0", "8.9", True),
    # the same check @ 0.32.0 / 0.33.0 (one string), and quark.py QuarkConfig._check_scheme_supported @ 0.32.0
    ("RuntimeError: Quantization scheme is not supported for the current GPU. Min capability: 89. "
     "Current capability: 86.", "8.9", "8.6", False),
    ("RuntimeError: Quantization scheme is not supported for the current GPU. Required capability: 100. "
     "Current capability: 90.", "10.0", "9.0", True),
])
def test_scheme_capability(line, need, have, exact):
    d = diag(line)
    assert d.problem == "quantization_unsupported_by_gpu" and d.fix == {}
    assert f"{'exactly' if exact else 'at least'} {need}; this GPU has {have}" in d.explanation


def test_no_scheme_for_the_layout():
    # compressed_tensors.py _get_scheme_from_parts @ 0.11.0 (and 0.33.0 with the layer's arguments
    # appended): W4A8 with FP8 activations is picked only on capability 9.0 (_is_fp8_w4a8_sm90)
    for line in ("NotImplementedError: No compressed-tensors compatible scheme was found.",
                 "NotImplementedError: No compressed-tensors compatible scheme was found for "
                 "layer_name='model.layers.0.self_attn.qkv_proj', weight_quant=QuantizationArgs(num_bits=4, "
                 "type='int'), input_quant=QuantizationArgs(num_bits=8, type='float'), output_quant=None, "
                 "format='int-quantized'"):
        d = diag(line)
        assert d.problem == "quantization_unsupported_by_gpu" and "9.0" in d.explanation


def test_kernel_choice_lists_capabilities():
    """kernels/mixed_precision/__init__.py choose_mp_linear_kernel @ 0.10.0 / 0.11.0 (and
    kernels/linear/__init__.py @ 0.32.0 / 0.33.0) print "current compute " + " capability" — two
    spaces; scaled_mm/__init__.py @ 0.11.0 one. The reason lines with both figures win over the
    header; the header alone is still a capability-or-shape diagnosis."""
    log = ["(EngineCore_DP0 pid=51) ValueError: Failed to find a kernel that can implement the WNA16 linear "
           "layer. Reasons: ",
           "(EngineCore_DP0 pid=51) MacheteLinearKernel requires capability 90, current compute  capability is 75",
           "(EngineCore_DP0 pid=51) AllSparkLinearKernel requires capability 80, current compute  capability is 75",
           "(EngineCore_DP0 pid=51) MarlinLinearKernel requires capability 80, current compute  capability is 75"]
    d = diag(*log)
    assert d.problem == "quantization_unsupported_by_gpu"
    assert "MarlinLinearKernel needs compute capability 8.0, this GPU has 7.5" in d.explanation
    d = diag("CutlassScaledMMLinearKernel requires capability 75, current compute capability is 70")
    assert "needs compute capability 7.5, this GPU has 7.0" in d.explanation
    # 0.32/0.33 reasons name no current capability ("requires compute capability 90 and above."): the header
    d = diag("ValueError: Failed to find a kernel that can implement the ScaledMM linear layer. Reasons: ",
             "FlashInferFP8ScaledMMLinearKernel requires compute capability 100 and above.")
    assert d.problem == "quantization_unsupported_by_gpu" and "ScaledMM" in d.explanation
    assert "tensor_parallel_size" in d.explanation  # or a shape the kernel cannot split


def test_marlin_refuses_the_card():
    # layers/quantization/utils/marlin_utils.py verify_marlin_supported @ 0.11.0 (no types below 80) and
    # @ 0.33.0 (below 75): "Only types = [] are supported"
    for line, have in (
            ("ValueError: Marlin does not support weight_bits = uint4b8. Only types = [] are supported (for "
             "group_size = 128, device_capability = 75, zp = False).", "7.5"),
            ("ValueError: Marlin does not support weight_bits = uint4. Only types = [] are supported (for "
             "group_size = 128, device_capability = 70, zp = True).", "7.0")):
        d = diag(line)
        assert d.problem == "quantization_unsupported_by_gpu" and f"compute capability {have}" in d.explanation
    # a type Marlin never runs (3-bit) is not a capability refusal
    other = diagnose(["ValueError: Marlin does not support weight_bits = uint3b4. Only types = [ScalarType."
                      "uint4b8, ScalarType.uint8b128] are supported (for group_size = 128, device_capability = 89, "
                      "zp = False)."])
    assert other is None or other.problem != "quantization_unsupported_by_gpu"


def test_fp8_only_refusals_of_032():
    # torchao.py @ 0.32.0 / 0.33.0
    d = diag("ValueError: torchao FP8 activation quantization config 'Float8DynamicActivationFloat8WeightConfig' "
             "requires GPU compute capability >= 8.9 (e.g., NVIDIA Ada Lovelace / Hopper or AMD MI300+) (current "
             "GPU compute capability: 8.0). For older GPUs, consider using a non-FP8 config such as "
             "Int8WeightOnlyConfig or Int4WeightOnlyConfig.")
    assert d.problem == "quantization_unsupported_by_gpu" and "8.9" in d.explanation
    # layers/quantization/online/fp8.py @ 0.33.0 (PTPC needs per-token FP8 compute)
    d = diag("ValueError: FP8 PTPC online quant requires a kernel that honors per-token activation quantization; "
             "MarlinFP8 is W8A16 weight-only. Requires SM89+ for Cutlass FP8 or ROCm MI3xx for rowwise scaled_mm.")
    assert d.problem == "quantization_unsupported_by_gpu" and d.fix == {"quantization": "fp8_per_tensor"}
    # layers/quantization/online/nvfp4.py @ 0.32.0 / 0.33.0
    d = diag("ValueError: nvfp4_per_token online quantization requires a Blackwell (SM100) GPU.")
    assert d.problem == "quantization_unsupported_by_gpu" and d.fix == {"quantization": "fp8_per_tensor"}
    # layers/quantization/ptpc_fp8.py @ 0.10.0 / 0.11.0
    d = diag("ValueError: ptpc_fp8 quantization is supported only on ROCm.")
    assert d.fix == {"quantization": "fp8"}
    # platforms/interface.py Platform.verify_quantization @ 0.32.0 / 0.33.0
    d = diag("ValueError: bitsandbytes quantization is currently not supported in ROCm.")
    assert d.problem == "quantization_unsupported_by_gpu" and "ROCm" in d.explanation


def test_the_fp8_marlin_warning_is_not_a_cause():
    """marlin_utils_fp8.py prepare_fp8_layer_for_marlin logs a warning on 8.0–8.8 and runs: a log that
    only has it has no quantization problem."""
    warn = ("(EngineCore_DP0 pid=51) WARNING 01-01 10:00:03 [marlin_utils_fp8.py:109] Your GPU does not have "
            "native support for FP8 computation but FP8 quantization is being used. Weight-only FP8 compression "
            "will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy workloads.")
    d = diagnose([warn, WRAPPER])
    assert d is not None and d.problem == "engine_init_failed"
