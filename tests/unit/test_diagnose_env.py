"""Environment and I/O failures, and out-of-memory errors by launch phase (issue 36, items 3
and 5): each kind is fed every wording its rule knows, each wording cited (file, version).

:data:`SITE_WORDINGS` is read by tests/unit/test_raise_sites.py: every row of
docs/vllm-raise-sites.md marked covered has its wording here (keyed by the row's site),
checked for its kind and fix: :data:`HAND_SITE_WORDINGS` written here, the rest generated
into tests/unit/raise_site_wordings.py.
"""
from __future__ import annotations

import pytest

from app.planner.diagnose import REMOTE_CODE_WORD, diagnose, diagnose_text
from tests.unit.raise_site_wordings import GENERATED_SITE_WORDINGS

P = "(EngineCore_DP0 pid=91) ERROR 02-10 14:03:10 [core.py:1098] "
A = "(APIServer pid=77) ERROR 02-10 14:03:10 [api_server.py:80] "

#: (wording as a log shows it, where it comes from, expected kind, expected fix)
ENV_WORDINGS = [
    # --- trust_remote_code_needed
    ("RuntimeError: Failed to load the model config. If the model is a custom model not yet available in the "
     "HuggingFace transformers library, consider setting `trust_remote_code=True` in LLM or using the "
     "`--trust-remote-code` flag in the CLI.",
     "vllm/transformers_utils/config.py HFConfigParser.parse, 0.32.0", "trust_remote_code_needed",
     {"trust_remote_code": True}),
    ("RuntimeError: Failed to load the tokenizer. If the tokenizer is a custom tokenizer not yet available in the "
     "HuggingFace transformers library, consider setting `trust_remote_code=True` in LLM or using the "
     "`--trust-remote-code` flag in the CLI. If the model was created with a newer version of transformers, "
     "consider upgrading: `uv pip install --upgrade transformers`",
     "vllm/tokenizers/hf.py get_tokenizer, 0.32.0", "trust_remote_code_needed", {"trust_remote_code": True}),
    ("ValueError: The repository /models/phi-custom contains custom code which must be executed to correctly load "
     "the model. You can inspect the repository content at /models/phi-custom .",
     "transformers/dynamic_module_utils.py resolve_trust_remote_code (a directory), 5.19.0",
     "trust_remote_code_needed", {"trust_remote_code": True}),
    ("ValueError: The repository org/custom-7b contains custom code which must be executed to correctly load the "
     "model. You can inspect the repository content at https://hf.co/org/custom-7b .",
     "transformers/dynamic_module_utils.py resolve_trust_remote_code (a Hub id), 5.19.0",
     "trust_remote_code_needed", {"trust_remote_code": True}),
    ("ValueError: The repository org/ft-7b references custom code contained in org/base-7b which must be executed "
     "to correctly load the model. You can inspect the repository content at https://hf.co/org/base-7b .",
     "transformers/dynamic_module_utils.py resolve_trust_remote_code (upstream repo), 5.19.0",
     "trust_remote_code_needed", {"trust_remote_code": True}),
    ("ValueError: Loading org/custom-7b requires you to execute the configuration file in that repo on your local "
     "machine. Make sure you have read the code there to avoid malicious use, then set the option "
     "`trust_remote_code=True` to remove this error.",
     "transformers 4.x dynamic_module_utils.py, the phrase vllm/transformers_utils/config.py 0.32.0 tests for",
     "trust_remote_code_needed", {"trust_remote_code": True}),
    # --- tokenizer_load_failed
    ("OSError: Can't load tokenizer for '/models/ft-7b'. If you were trying to load it from "
     "'https://huggingface.co/models', make sure you don't have a local directory with the same name. Otherwise, "
     "make sure '/models/ft-7b' is the correct path to a directory containing all relevant files for a "
     "TokenizersBackend tokenizer.",
     "transformers/tokenization_utils_base.py from_pretrained, 5.19.0", "tokenizer_load_failed", {}),
    ("ValueError: Couldn't instantiate the backend tokenizer from one of: ",
     "transformers/tokenization_utils_tokenizers.py, 5.19.0", "tokenizer_load_failed", {}),
    ("ImportError: LlamaTokenizer requires the SentencePiece library but it was not found in your environment. "
     "Check out the instructions on the",
     "transformers/utils/import_utils.py SENTENCEPIECE_IMPORT_ERROR, 5.19.0", "tokenizer_load_failed", {}),
    # --- disk_full
    ("OSError: [Errno 28] No space left on device", "Python's OSError for ENOSPC (errno 28, Linux)", "disk_full", {}),
    ("OSError: [Errno 28] No space left on device: '/root/.cache/huggingface/hub/models--org--m/blobs/"
     "0a1b.incomplete'", "Python's OSError for ENOSPC with the file (shutil/open)", "disk_full", {}),
    ("UserWarning: Not enough free disk space to download the file. The expected file size is: 4976.70 MB. The "
     "target location /root/.cache/huggingface/hub/models--org--m/blobs only has 1203.55 MB free disk space.",
     "huggingface_hub/file_download.py _check_disk_space, 2.4.0", "disk_full", {}),
    # --- permission_denied
    ("PermissionError: [Errno 13] Permission denied: '/root/.cache/huggingface/hub/models--org--m'",
     "Python's PermissionError for EACCES (errno 13)", "permission_denied", {}),
    # --- no_c_compiler
    ("torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler found in "
     "torch._inductor.config.cpp.cxx: (None, 'g++')",
     "torch/_inductor/exc.py InvalidCxxCompiler, torch 2.13.0", "no_c_compiler", {"enforce_eager": True}),
    ("RuntimeError: Failed to find C compiler. Please specify via CC environment variable or set "
     "triton.knobs.build.impl.", "triton/runtime/build.py, triton 3.9.0", "no_c_compiler", {}),
    # --- gguf_model
    ("ValueError: Invalid repository ID or local directory specified: '/models/qwen2.5-7b-q4_k_m.gguf'.",
     "vllm/transformers_utils/config.py get_config, 0.32.0 (printed by this build for a .gguf path)",
     "gguf_model", {}),
    ("OSError: It looks like the config file at '/models/qwen2.5-7b-q4_k_m.gguf' is not a valid JSON file.",
     "transformers/configuration_utils.py, 5.19.0 (AutoConfig on a .gguf path)", "gguf_model", {}),
    # --- concurrent_launch: vLLM issue #56830
    ("AssertionError: Error in memory profiling. Initial free memory 61.32 GiB, current free memory 74.01 GiB. This "
     "happens when other processes sharing the same container release GPU memory while vLLM is profiling during "
     "initialization. To fix this, ensure consistent GPU memory allocation or isolate vLLM in its own container.",
     "vllm/v1/worker/gpu_worker.py determine_available_memory, 0.32.0", "concurrent_launch", {}),
]


@pytest.mark.parametrize("line,source,kind,fix", ENV_WORDINGS, ids=[f"{w[2]}-{i}" for i, w in enumerate(ENV_WORDINGS)])
def test_each_environment_wording_has_its_kind_and_fix(line, source, kind, fix):
    d = diagnose([P + line])
    assert d is not None, source
    assert (d.problem, d.fix) == (kind, fix), source
    assert d.evidence[0].endswith(line)


def test_trust_remote_code_says_what_it_allows():
    d = diagnose([P + ENV_WORDINGS[0][0]])
    assert REMOTE_CODE_WORD in d.explanation and "--revision" in d.explanation
    assert "tokenizer" in diagnose([P + ENV_WORDINGS[1][0]]).explanation


def test_disk_full_names_the_path_and_the_free_space():
    log = [A + ENV_WORDINGS[11][0], P + "OSError: [Errno 28] No space left on device"]
    d = diagnose(log)
    assert d.problem == "disk_full"
    assert "/root/.cache/huggingface/hub/models--org--m/blobs" in d.explanation
    assert "4.98 GB" in d.explanation and "1.20 GB free" in d.explanation and "--download-dir" in d.explanation
    assert "at /root/.cache/huggingface/hub/models--org--m/blobs/0a1b.incomplete:" in diagnose(
        [P + ENV_WORDINGS[10][0]]).explanation


def test_a_gguf_path_is_not_a_missing_model():
    d = diagnose([P + ENV_WORDINGS[15][0]])
    assert "GGUF" in d.explanation and "config.json" in d.explanation
    assert diagnose([P + "ValueError: Invalid repository ID or local directory specified: '/models/x'."]).problem \
        == "model_not_found"


def test_the_profiling_race_gives_the_freed_memory_and_the_order():
    d = diagnose([P + ENV_WORDINGS[-1][0]])
    assert "12.69 GiB" in d.explanation and "one after the other" in d.explanation


# ---------------------------------------------------------------------- OOM by phase (item 3)
# the phase lines: vLLM 0.32.0 (app/server/logparse.py LAUNCH_PHASES cites each); torch's message:
# c10/cuda/CUDACachingAllocator.cpp (torch 2.4–2.13, "Process P has M memory in use" per other process)
W = "(Worker_TP0 pid=120) INFO 02-10 14:00:{:02d} [gpu_model_runner.py:5040] "
HEAD = ["(APIServer pid=77) INFO 02-10 14:00:00 [api_utils.py:286] non-default args: {'model': 'm', "
        "'gpu_memory_utilization': 0.9, 'max_num_batched_tokens': 8192}",
        W.format(1) + "Starting to load model /models/m..."]
LOADED = [W.format(2) + "Model loading took 14.99 GiB memory and 12.500000 seconds"]
KV = [W.format(3) + "Available KV cache memory: 52.10 GiB",
      "(EngineCore_DP0 pid=91) INFO 02-10 14:00:04 [kv_cache_utils.py:2328] GPU KV cache size: 426,800 tokens"]
GRAPHS = [W.format(5) + "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 40%|####      | 20/51"]


def _oom(tried: str, free: str, total: str = "79.19 GiB", others: str = "") -> str:
    return (P + f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity "
            f"of {total} of which {free} is free. {others}Including non-PyTorch memory, this process has 76.00 GiB "
            f"memory in use. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by "
            f"PyTorch but unallocated.")


def test_oom_while_loading_weights_is_the_weights():
    d = diagnose(HEAD + [_oom("1.00 GiB", "200.00 MiB")])
    assert d.problem == "weights_do_not_fit" and d.fix == {}
    assert "quantized" in d.explanation and "tensor_parallel_size" in d.explanation


def test_oom_while_profiling_lowers_the_batched_tokens_by_the_figures():
    d = diagnose(HEAD + LOADED + [_oom("8.00 GiB", "3.00 GiB")])
    # 8192 × 3/8 = 3072 → the power of two below, 2048 (at most half of 8192)
    assert d.problem == "cuda_oom" and d.fix == {"max_num_batched_tokens": 2048}
    assert "profiling" in d.explanation


def test_oom_while_allocating_the_kv_cache_lowers_the_utilization_by_the_shortfall():
    d = diagnose(HEAD + LOADED + KV[:1] + [_oom("4.00 GiB", "1.50 GiB")])
    # (4.00 − 1.50) / 79.19 = 0.0316 → 0.04, + 0.01: 0.9 − 0.05
    assert d.problem == "cuda_oom" and d.fix == {"gpu_memory_utilization": 0.85}
    assert "allocating the KV cache" in d.explanation and "52.1 GiB" in d.explanation


def test_oom_while_capturing_graphs_is_the_graphs_sized():
    d = diagnose(HEAD + LOADED + KV + GRAPHS + [_oom("512.00 MiB", "100.00 MiB")])
    assert d.problem == "cuda_graph_oom_risk" and d.fix == {"gpu_memory_utilization": 0.88}
    assert "--enforce-eager" in d.explanation


def test_a_graph_phrase_before_the_graphs_is_not_a_graph_oom():
    # torch's text may name CUDA graphs anywhere; the phase decides (here: loading weights)
    line = _oom("1.00 GiB", "10.00 MiB") + " (e.g., CUDA Graphs)"
    assert diagnose(HEAD + [line]).problem == "weights_do_not_fit"


def test_oom_while_serving_is_sized_from_the_figures():
    log = HEAD + LOADED + KV + GRAPHS + ["INFO:     Application startup complete.",
                                         P.replace("ERROR", "ERROR") + "EngineCore encountered a fatal error.",
                                         _oom("2.00 GiB", "0.50 GiB")]
    d = diagnose(log)
    # (2.00 − 0.50) / 79.19 = 0.019 → 0.02, + 0.01
    assert d.problem == "cuda_oom" and d.after_ready and d.fix == {"gpu_memory_utilization": 0.87}
    assert "while serving" in d.explanation


def test_oom_with_other_processes_is_a_concurrent_launch():
    d = diagnose(HEAD + LOADED + KV[:1] + [_oom("4.00 GiB", "1.00 GiB", others="Process 4242 has 20.00 GiB memory "
                                                                                 "in use. ")])
    assert d.problem == "concurrent_launch" and d.fix == {}
    assert "4242" in d.explanation and "20.00 GiB" in d.explanation and "one after the other" in d.explanation


def test_oom_without_phase_or_figures_keeps_the_old_fix():
    d = diagnose([P + "torch.OutOfMemoryError: CUDA out of memory."])
    assert d.problem == "cuda_oom" and d.fix == {"gpu_memory_utilization": 0.87}  # 0.92 (0.32's default) − 0.05


# "No available memory for the cache blocks" (vllm/v1/core/kv_cache_utils.py, 0.32.0) after the workers'
# "Available KV cache memory: %s GiB" (vllm/v1/worker/gpu_worker.py, 0.32.0)
NO_KV = ("(EngineCore_DP0 pid=91) ERROR 02-10 14:00:09 [core.py:1098] ValueError: No available memory for the cache "
         "blocks. Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
         "memory reservation on the CPU backend, despite its name). See "
         "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")


def test_workers_that_disagree_are_a_concurrent_launch():
    log = ["(Worker_TP1 pid=104299) INFO 12-10 03:24:48 [gpu_worker.py:298] Available KV cache memory: -3.86 GiB",
           "(Worker_TP0 pid=104298) INFO 12-10 03:24:48 [gpu_worker.py:298] Available KV cache memory: 9.90 GiB",
           NO_KV]
    d = diagnose(log)
    assert d.problem == "concurrent_launch" and d.fix == {}
    assert "13.76 GiB" in d.explanation and "Worker_TP1" in d.explanation and "one after the other" in d.explanation


def test_a_negative_budget_is_raised_by_its_size_where_the_card_is_known():
    args = "(APIServer pid=77) INFO 02-10 14:00:00 [api_utils.py:286] non-default args: {'model': 'm', " \
           "'gpu_memory_utilization': 0.7}"
    kv = "(Worker pid=9) INFO 02-10 14:00:05 [gpu_worker.py:753] Available KV cache memory: -3.21 GiB"
    d = diagnose([args, kv, NO_KV])
    assert d.problem == "no_kv_cache_memory" and d.fix == {} and "3.71 GiB" in d.explanation
    # the card's size from vLLM's DEBUG line (vllm/v1/worker/gpu_worker.py, 0.32.0): 16.47 / 0.7 = 23.53 GiB
    req = ("(Worker pid=9) DEBUG 02-10 14:00:05 [gpu_worker.py:747] Initial free memory: 23.10 GiB; Requested "
           "memory: 0.700000 (util), 16.47 GiB")
    d = diagnose([args, req, kv, NO_KV])
    # (3.21 + 0.5) / 23.53 = 0.158 → +0.16, not "+0.03"
    assert d.problem == "no_kv_cache_memory" and d.fix == {"gpu_memory_utilization": 0.86}


def test_cli_diagnose_text():
    d = diagnose_text("\n".join(HEAD + [_oom("1.00 GiB", "200.00 MiB")]))
    assert d.summary().startswith("Diagnosis: weights_do_not_fit")


#: site (file:line in vLLM 0.32.0, or "library N: source", as docs/vllm-raise-sites.md names it) → its
#: wording (the site's template, its placeholders filled in) and kind: the rows marked covered in that table.
#: tests/unit/test_raise_sites.py checks that each covered row is here, that the wording is the row's
#: template, and that the diagnosis gives the row's kind and fix.
HAND_SITE_WORDINGS: dict[str, tuple[str, str]] = {
    'vllm/config/model.py:1444':
        ('Quantization method specified in the model config (8) does not match the quantization method specified in the `quantization` argument (8).', 'quantization_mismatch'),
    'vllm/config/model.py:1453':
        ('Unknown quantization method: 8. Must be one of 8.', 'quantization_unknown'),
    'vllm/config/model.py:1547':
        ('Total number of attention heads (8) must be divisible by tensor parallel size (8).', 'tp_not_divisor_of_heads'),
    'vllm/config/parallel.py:1052':
        ("World size (8) is larger than the number of available GPUs (8) in this node. If this is intentional and you are using: - ray, set '--distributed-executor-backend ray'. - multiprocessing, set '--nnodes' appropriately.", 'not_enough_gpus'),
    'vllm/config/scheduler.py:319':
        ('max_num_batched_tokens (8) is smaller than max_model_len (8). This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.', 'batched_tokens_below_max_model_len'),
    'vllm/config/scheduler.py:329':
        ('max_num_batched_tokens (8) must be greater than or equal to max_num_seqs (8).', 'batched_tokens_below_num_seqs'),
    'vllm/config/speculative.py:1188':
        ('num_speculative_tokens was provided but without speculative model.', 'speculative_draft_missing'),
    'vllm/config/speculative.py:1203':
        ('Either prompt_lookup_max or prompt_lookup_min must be provided when using the ngram method.', 'speculative_ngram_lookup'),
    'vllm/config/speculative.py:1210':
        ('Either prompt_lookup_max or prompt_lookup_min must be provided when using the ngram method.', 'speculative_ngram_lookup'),
    'vllm/config/speculative.py:1218':
        ('prompt_lookup_min=8 must be <= prompt_lookup_max=8', 'speculative_ngram_lookup'),
    'vllm/config/speculative.py:1504':
        ('A speculative model was provided, but `num_speculative_tokens` was not provided', 'speculative_tokens_missing'),
    'vllm/config/vllm.py:901':
        ('The quantization method 8 is not supported for the current GPU. Minimum capability: 8. Current capability: 8.', 'quantization_unsupported_by_gpu'),
    'vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:402':
        ('Quantization scheme is not supported for the current GPU. Required capability: 8. Current capability: 8.', 'quantization_unsupported_by_gpu'),
    'vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:410':
        ('Quantization scheme is not supported for the current GPU. Min capability: 8. Current capability: 8.', 'quantization_unsupported_by_gpu'),
    'vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:946':
        ('No compressed-tensors compatible scheme was found for layer_name=8, weight_quant=8, input_quant=8, output_quant=8, format=8', 'quantization_unsupported_by_gpu'),
    'vllm/model_executor/layers/quantization/moe_wna16.py:87':
        ('The quantization method moe_wna16 + awq is not supported for the current GPU. Minimum capability: 8. Current capability: 8.', 'quantization_unsupported_by_gpu'),
    'vllm/model_executor/layers/quantization/online/fp8.py:433':
        ('FP8 PTPC online quant requires a kernel that honors per-token activation quantization; MarlinFP8 is W8A16 weight-only. Requires SM89+ for Cutlass FP8 or ROCm MI3xx for rowwise scaled_mm.', 'quantization_unsupported_by_gpu'),
    'vllm/model_executor/layers/quantization/online/nvfp4.py:101':
        ('nvfp4_per_token online quantization requires a Blackwell (SM100) GPU.', 'quantization_unsupported_by_gpu'),
    'vllm/model_executor/layers/quantization/quark/quark.py:357':
        ('Quantization scheme is not supported for the current GPU. Min capability: 8. Current capability: 8.', 'quantization_unsupported_by_gpu'),
    'vllm/model_executor/layers/quantization/torchao.py:124':
        ("torchao FP8 activation quantization config '8' requires GPU compute capability >= 8.9 (e.g., NVIDIA Ada Lovelace / Hopper or AMD MI300+)8. For older GPUs, consider using a non-FP8 config such as Int8WeightOnlyConfig or Int4WeightOnlyConfig.", 'quantization_unsupported_by_gpu'),
    'vllm/model_executor/model_loader/weight_utils.py:375':
        ('Cannot find the config file for 8', 'quantization_mismatch'),
    'vllm/platforms/cuda.py:648':
        ('Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your 8 GPU 8. You can use float16 instead by explicitly setting the `dtype` flag in CLI, for example: --dtype=half.', 'dtype_unsupported_by_gpu'),
    'vllm/platforms/interface.py:1147':
        ('8 quantization is currently not supported in 8.', 'quantization_unsupported_by_gpu'),
    'vllm/platforms/rocm.py:1285':
        ('Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your 8 GPU 8. You can use float16 instead by explicitly setting the `dtype` flag in CLI, for example: --dtype=half.', 'dtype_unsupported_by_gpu'),
    'vllm/v1/core/kv_cache_utils.py:1010':
        ('No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.', 'no_kv_cache_memory'),
    'vllm/v1/worker/cpu_worker.py:83':
        ('Available memory on node 8 (8/8 GiB) on startup is less than desired CPU memory utilization (8, 8 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the fraction of CPU memory reserved (despite its name). To resolve: decrease `--gpu-memory-utilization` (e.g. `--gpu-memory-utilization 0.5`) or reduce CPU memory used by other processes.', 'not_enough_node_memory'),
    'vllm/v1/worker/cpu_worker.py:219':
        ('Available memory on node 8 (8/8 GiB) on kv cache allocation is less than requested memory for kv (8 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.', 'not_enough_node_memory'),
    'vllm/v1/worker/cpu_worker.py:241':
        ('Available memory on node 8 (8/8 GiB) on kv cache allocation is less than requested memory for kv (8/8 GiB). Reduce CPU memory used by other processes.', 'not_enough_node_memory'),
    'vllm/v1/worker/gpu_worker.py:492':
        ('DP adjusted local rank 8 is out of bounds for 8 devices.', 'not_enough_gpus'),
    'vllm/v1/worker/gpu_worker.py:719':
        ('Error in memory profiling. Initial free memory 8 GiB, current free memory 8 GiB. This happens when other processes sharing the same container release GPU memory while vLLM is profiling during initialization. To fix this, ensure consistent GPU memory allocation or isolate vLLM in its own container.', 'concurrent_launch'),
    'vllm/v1/worker/xpu_worker.py:154':
        ('DP adjusted local rank 8 is out of bounds for 8 devices.', 'not_enough_gpus'),
    'library 1: transformers/dynamic_module_utils.py resolve_trust_remote_code, 5.19.0':
        ('The repository 8 contains custom code which must be executed to correctly load the model.', 'trust_remote_code_needed'),
    'library 2: transformers/dynamic_module_utils.py resolve_trust_remote_code, 5.19.0':
        ('The repository 8 references custom code contained in 8 which must be executed to correctly load the model.', 'trust_remote_code_needed'),
    'library 3: transformers/tokenization_utils_base.py from_pretrained, 5.19.0':
        ("Can't load tokenizer for '8'. If you were trying to load it from 'https://huggingface.co/models', make sure you don't have a local directory with the same name.", 'tokenizer_load_failed'),
    'library 4: transformers/tokenization_utils_tokenizers.py, 5.19.0':
        ("Couldn't instantiate the backend tokenizer from one of: ", 'tokenizer_load_failed'),
    'library 5: transformers/utils/import_utils.py SENTENCEPIECE_IMPORT_ERROR, 5.19.0':
        ('8 requires the SentencePiece library but it was not found in your environment.', 'tokenizer_load_failed'),
    'library 6: transformers/configuration_utils.py, 5.19.0':
        ("It looks like the config file at '8.gguf' is not a valid JSON file.", 'gguf_model'),
    'library 7: vllm/tokenizers/hf.py get_tokenizer, 0.32.0':
        ('Failed to load the tokenizer. If the tokenizer is a custom tokenizer not yet available in the HuggingFace transformers library, consider setting `trust_remote_code=True` in LLM or using the `--trust-remote-code` flag in the CLI.', 'trust_remote_code_needed'),
    'library 8: vllm/transformers_utils/config.py HFConfigParser.parse, 0.32.0':
        ('Failed to load the model config. If the model is a custom model not yet available in the HuggingFace transformers library, consider setting `trust_remote_code=True` in LLM or using the `--trust-remote-code` flag in the CLI.', 'trust_remote_code_needed'),
    'library 9: vllm/transformers_utils/config.py get_config, 0.32.0':
        ("Invalid repository ID or local directory specified: '8'.", 'model_not_found'),
    'library 10: OS error ENOSPC (errno 28)':
        ("[Errno 28] No space left on device: '8'", 'disk_full'),
    'library 11: OS error EACCES (errno 13)':
        ("[Errno 13] Permission denied: '8'", 'permission_denied'),
    'library 12: OS error EADDRINUSE (errno 98)':
        ('[Errno 98] Address already in use', 'port_in_use'),
    'library 13: huggingface_hub/file_download.py _check_disk_space, 2.4.0':
        ('Not enough free disk space to download the file. The expected file size is: 8 MB. The target location 8 only has 8 MB free disk space.', 'disk_full'),
    'library 14: torch c10/cuda/CUDACachingAllocator.cpp, 2.13.0':
        ('CUDA out of memory. Tried to allocate 8 GiB. GPU 8 has a total capacity of 8 GiB of which 8 GiB is free.', 'cuda_oom'),
    'library 15: torch/_inductor/exc.py InvalidCxxCompiler, 2.13.0':
        ('No working C++ compiler found in torch._inductor.config.cpp.cxx: 8', 'no_c_compiler'),
    'library 16: triton/runtime/build.py, 3.9.0':
        ('Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl.', 'no_c_compiler'),
    'library 17: vllm/v1/worker/gpu_worker.py determine_available_memory (assert), 0.32.0':
        ('Error in memory profiling. Initial free memory 8 GiB, current free memory 8 GiB.', 'concurrent_launch'),
}

#: every covered row: the hand-written wordings above, and the reachable sites the generic config rules
#: (app/planner/diagnose.py CONFIG_KINDS) and the other rules name, generated from vLLM 0.32.0's templates
SITE_WORDINGS: dict[str, tuple[str, str]] = {**GENERATED_SITE_WORDINGS, **HAND_SITE_WORDINGS}
