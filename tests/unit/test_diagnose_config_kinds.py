"""vLLM's configuration refusals by kind (issue 36 item 1; app/planner/diagnose.py
CONFIG_KINDS): a ValueError from a config class, or pydantic's "Value error, …" of one, is
named by its phrasing — with the class, the options and vLLM's own words — and the fix is
the value where the message gives it. Each wording is vLLM 0.32.0's, from the installed
CPU build's source (`.venv-vllm`), its placeholders filled as a launch would fill them."""
from __future__ import annotations

import pytest

from app.planner.diagnose import diagnose, diagnose_text

P = "(EngineCore_DP0 pid=91) ERROR 02-10 14:03:10 [core.py:1098] "

#: (line, vLLM 0.32.0 site, kind, fix, words the explanation must hold)
KINDS = [
    ("ValueError: max_cpu_loras (2) must be >= max_loras (4).", "vllm/config/lora.py:123",
     "config_out_of_range", {"max_cpu_loras": 4}, ["--max-cpu-loras", "--max-loras", "must be >= max_loras (4)"]),
    ("ValueError: data_parallel_size_local (4) must be <= data_parallel_size (2)", "vllm/config/parallel.py:542",
     "config_out_of_range", {"data_parallel_size_local": 2}, ["--data-parallel-size-local"]),
    ("ValueError: max_num_seqs (512) exceeds available Mamba cache blocks (300). Each decode sequence requires one "
     "Mamba cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to at most 300 or increase "
     "gpu_memory_utilization.", "vllm/config/compilation.py:1518", "config_out_of_range", {"max_num_seqs": 300},
     ["--max-num-seqs", "Mamba cache blocks (300)"]),
    ("ValueError: FlashInfer ReplaySSM requires --replayssm-buffer-len <= 16", "vllm/config/vllm.py:3348",
     "config_out_of_range", {"replayssm_buffer_len": 16}, ["--replayssm-buffer-len"]),
    ("ValueError: --grpc-port must be between 0 and 65535", "vllm/entrypoints/launchers/cli_args.py:497",
     "config_out_of_range", {}, ["--grpc-port", "between 0 and 65535"]),
    ("ValueError: tp_size=4 must be divisible by dcp_size=3.", "vllm/config/parallel.py:596",
     "config_not_divisible", {}, ["tp_size", "dcp_size", "vLLM's own"]),
    ("ValueError: MXFP8 requires input_size_per_partition (1376) to be divisible by 32.",
     "vllm/model_executor/layers/quantization/online/mxfp8.py:59", "config_not_divisible", {},
     ["--tensor-parallel-size", "input_size_per_partition (1376)"]),
    ("ValueError: --enable-return-routed-experts is incompatible with pipeline parallelism (PP > 1).",
     "vllm/config/vllm.py:1166", "config_conflict", {}, ["--enable-return-routed-experts", "pipeline parallelism"]),
    ("ValueError: Cannot set both `pooling_type` and `seq_pooling_type`", "vllm/config/pooler.py:145",
     "config_conflict", {}, ["pooling_type", "seq_pooling_type"]),
    ("ValueError: collect_detailed_traces requires `--otlp-traces-endpoint` to be set.",
     "vllm/config/observability.py:219", "config_requires", {},
     ["--collect-detailed-traces", "--otlp-traces-endpoint"]),
    ("ValueError: This model does not support `--runner pooling`. You can pass `--convert embed` to adapt it into a "
     "pooling model.", "vllm/config/model.py:722", "config_not_supported", {}, ["--runner", "--convert embed"]),
    ("NotImplementedError: Sparse Attention is not supported on CPU.", "vllm/platforms/cpu.py:150",
     "config_not_supported", {}, ["Sparse Attention is not supported on CPU"]),
    ("ValueError: Unknown dtype: 'float8'", "vllm/config/model.py:2480", "config_invalid_value", {},
     ["Unknown dtype: 'float8'"]),
    ("ValueError: compile_cache_save_format must be 'binary' or 'unpacked', got: zip",
     "vllm/config/compilation.py:893", "config_invalid_value", {}, ["compile_cache_save_format"]),
]


@pytest.mark.parametrize("line, site, kind, fix, words", KINDS, ids=[k[1] for k in KINDS])
def test_a_config_refusal_is_named_by_its_phrasing(line, site, kind, fix, words):
    d = diagnose([P + line])
    assert d is not None and (d.problem, d.fix) == (kind, fix), site
    assert d.explanation.startswith("vLLM refused ")
    for w in words:
        assert w in d.explanation, (site, w, d.explanation)
    assert d.evidence == [P + line]


def test_the_class_comes_from_the_traceback_or_pydantics_header():
    tb = [P + "Traceback (most recent call last):",
          P + '  File "/opt/venv/lib/python3.12/site-packages/vllm/config/parallel.py", line 542, in __post_init__',
          P + "ValueError: data_parallel_size_local (4) must be <= data_parallel_size (2)"]
    assert "(vllm/config/parallel.py __post_init__)" in diagnose(tb).explanation
    log = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for LoRAConfig\n"
           "  Value error, max_cpu_loras (2) must be >= max_loras (4). [type=value_error, input_value=ArgsKwargs(()),"
           " input_type=ArgsKwargs]\n"
           "    For further information visit https://errors.pydantic.dev/2.12/v/value_error\n")
    d = diagnose_text(log)
    assert d.problem == "config_out_of_range" and d.fix == {"max_cpu_loras": 4}
    assert "(LoRAConfig)" in d.explanation and "[type=" not in d.explanation and "Value error," not in d.explanation
    assert "validation error for LoRAConfig" in d.evidence[1]


def test_a_warning_with_the_phrase_is_not_a_refusal():
    warn = ("(EngineCore_DP0 pid=91) WARNING 02-10 14:03:10 [cuda.py:410] Cascade attention is not supported with "
            "this backend, falling back")
    assert diagnose([warn]) is None


def test_after_ready_a_config_phrase_is_not_the_cause():
    log = ["INFO:     Application startup complete.",
           P + "EngineCore encountered a fatal error.",
           P + "Traceback (most recent call last):",
           P + "ValueError: Unknown dtype: 'float8'"]
    d = diagnose(log)
    assert d.after_ready and d.problem == "engine_runtime_error"


def test_the_specific_rules_still_win():
    # vllm/config/model.py:1547 (0.32.0): its own kind and sized fix, not the generic "divisible" kind
    d = diagnose([P + "ValueError: Total number of attention heads (32) must be divisible by tensor parallel size "
                      "(3)."])
    assert d.problem == "tp_not_divisor_of_heads" and d.fix == {"tensor_parallel_size": 2}


@pytest.mark.parametrize("line, site, package", [
    ("ImportError: The package `amd-quark` is required to use MX-FP4 models. Please install it with `pip install "
     "amd-quark`.", "vllm/model_executor/layers/quantization/utils/mxfp4_utils.py:152", "amd-quark"),
    ("ImportError: Please install torchao>=0.10.0 via `pip install torchao>=0.10.0` to use torchao quantization.",
     "vllm/model_executor/layers/quantization/torchao.py:176", "torchao>=0.10.0"),
    ("ImportError: Arctic Inference is required for suffix decoding. Install via `pip install "
     "arctic-inference==0.1.1`.", "vllm/config/speculative.py:1598", "arctic-inference==0.1.1"),
], ids=["quark", "torchao", "arctic"])
def test_a_missing_optional_package_is_its_own_kind(line, site, package):
    d = diagnose([P + line])
    assert d.problem == "package_missing" and d.fix == {}, site
    assert f"pip install {package}" in d.explanation
    # the generic "requires" kind does not take it
    assert not d.explanation.startswith("vLLM refused")


def test_the_latest_refusal_is_the_cause_whatever_its_phrase():
    # an earlier ValueError vLLM caught and logged ("not supported") does not outrank the refusal that ended the
    # launch ("Unknown dtype", vllm/config/model.py:2480, 0.32.0)
    log = [P + "ValueError: Cascade attention is not supported with this backend",
           P + "ValueError: Unknown dtype: 'float8'"]
    d = diagnose(log)
    assert d.problem == "config_invalid_value" and "float8" in d.explanation


@pytest.mark.parametrize("line, site", [
    ("ValueError: mm_tensor_ipc='torch_shm' is not supported with data_parallel_size > 1 or tensor_parallel_size > 1 "
     "or pipeline_parallel_size > 1.", "vllm/config/model.py:1606"),
    ("ValueError: data_parallel_external_lb can only be set when data_parallel_size > 1",
     "vllm/config/parallel.py:548"),
    ("ValueError: FlashInfer ReplaySSM speculative decoding requires --replayssm-buffer-len >= 1 + "
     "num_speculative_tokens (4); got 3", "vllm/config/vllm.py:3379"),
])
def test_a_condition_or_a_sum_is_not_sized_into_a_fix(line, site):
    # the option after "with"/"when" is the condition of the refusal, not its subject; "1 + N" is not the bound 1
    d = diagnose([P + line])
    assert d.problem.startswith("config_") and d.fix == {}, site


def test_only_options_are_named_not_layers():
    # vllm/config/lora.py:146 (0.32.0): wo_ud and down_proj are layers, not options
    d = diagnose([P + "ValueError: Inkling LoRA requires INKLING_MULTIMEM_AR=0: the Lamport fused-collective path "
                      "bypasses the LoRA-wrapped wo_ud and dense down_proj layers on decode-sized batches"])
    assert d.problem == "config_requires" and "wo_ud" not in d.explanation.split(":")[0]


def test_no_device_is_an_invisible_gpu():
    # vllm/config/device.py:55 (0.32.0): no GPU (or its driver) in the container
    d = diagnose([P + "RuntimeError: Failed to infer device type, please set the environment variable "
                      "`VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue."])
    assert d.problem == "gpus_not_visible" and "nvidia-smi" in d.explanation
