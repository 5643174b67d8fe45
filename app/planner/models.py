"""Model architecture (:class:`ModelArch`) from a ``config.json`` mapping, a local model
directory, the local Hugging Face cache (offline, no network) or the built-in catalog
(``data/models.yaml``).

Parameter counts and byte sizes follow docs/perf-model.md ("Weights", "KV cache"):
every linear layer of the decoder is quantized, embeddings and lm_head stay 16-bit;
AWQ/GPTQ b-bit with group g cost b/8 + 2/g + (b/8)/g bytes per parameter (fp16 scale
and a b-bit zero point per group); KV per token = 2·L·kv_heads·head_dim·bytes, MLA =
L·(kv_lora_rank + qk_rope_head_dim)·bytes (one latent, not split by TP).
"""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from app.engine.kvcache import CHUNKED, FULL, MAMBA, SLIDING, LayerKv
from app.fileio import load_yaml
from app.paths import hf_cache_dirs

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1,
               "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1, "int8": 1}


class ModelNotFoundError(LookupError):
    """No config.json for the model locally and no catalog entry; the message says where it looked."""

    def __str__(self) -> str:
        return str(self.args[0])


def quant_bytes_per_param(method: str | None, bits: int | None = None, group_size: int | None = None,
                          dtype_bytes: int = 2) -> float:
    """Bytes per parameter of a quantized linear weight (source: docs/perf-model.md "Weights").

    ``None`` → ``dtype_bytes``; fp8/int8 families → 1 (scales are negligible); AWQ/GPTQ/
    Marlin → bits/8 + 2/g + (bits/8)/g (0.5195 at 4 bits, g=128; g = -1 means per
    channel); bitsandbytes nf4 ≈ 0.53; mxfp4 = 0.5 + 1/32; nvfp4 = 0.5 + 1/16; gguf ≈ 0.6
    (Q4_K_M, assumed).
    """
    if not method:
        return float(dtype_bytes)
    m = method.lower()
    if m in ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "gptq_marlin_24", "bitblas", "gptq_bitblas",
             "compressed-tensors-w4a16", "moe_wna16", "auto-round", "inc"):
        b = bits or 4
        g = group_size if group_size and group_size > 0 else 0
        return b / 8 + ((2 + b / 8) / g if g else 0.0)
    if m in ("fp8", "fbgemm_fp8", "modelopt", "ptpc_fp8", "fp8_per_tensor", "experts_int8", "int8", "w8a8",
             "compressed-tensors", "quark", "torchao"):
        if bits and bits == 4:
            return 0.5 + 2 / (group_size or 128)
        return 1.0
    if m in ("bitsandbytes",):
        return 0.53
    if m in ("mxfp4",):
        return 0.5 + 1 / 32
    if m in ("modelopt_fp4", "nvfp4"):
        return 0.5 + 1 / 16
    if m in ("gguf",):
        return 0.6
    return float(dtype_bytes)


def checkpoint_quant_method(qc: dict[str, Any]) -> str | None:
    """The quantization method vLLM reads from a checkpoint's ``quantization_config``
    (or ``compression_config``): ``quant_method`` lower-cased, ``compressed_tensors`` →
    ``compressed-tensors``; a ModelOpt config (producer ``modelopt``) by its
    ``quant_algo``: FP8 → ``modelopt``, NVFP4 → ``modelopt_fp4``, MIXED_PRECISION →
    ``modelopt_mixed``. None when it names none. Source: vllm/config/model.py
    ``_parse_quant_hf_config`` (0.10, 0.11) and
    vllm/transformers_utils/model_arch_config_convertor.py
    ``_normalize_quantization_config`` (0.32, 0.33)."""
    mo = qc.get("quantization") if isinstance(qc.get("quantization"), dict) else {}
    producer = (qc.get("producer") or {}).get("name") if isinstance(qc.get("producer"), dict) else None
    if producer == "modelopt" or "modelopt_quant_config" in mo:
        algo = str(mo.get("quant_algo") or "").upper()
        if algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"):
            return "modelopt"
        if algo == "NVFP4":
            return "modelopt_fp4"
        if algo == "MIXED_PRECISION":
            return "modelopt_mixed"
    qm = str(qc.get("quant_method") or "").lower().replace("compressed_tensors", "compressed-tensors")
    return qm or None


def _is_fmt(q: dict[str, Any] | None, kind: str, bits: int) -> bool:
    return bool(q) and str(q.get("type") or "int") == kind and int(q.get("num_bits") or 0) == bits  # type: ignore[union-attr]


def compressed_tensors_scheme(group: dict[str, Any], fmt: str | None = None,
                              sparsity: dict[str, Any] | None = None) -> str | None:
    """The vLLM scheme a compressed-tensors config group selects, by the order of
    ``CompressedTensorsConfig._get_scheme_from_parts``
    (vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py,
    0.10–0.33): ``W4A4-NVFP4``/``W4A16-NVFP4`` (fp4 weights, group 16), ``W4A8-MXFP4``/
    ``W4A4-MXFP4`` (fp4 weights, group 32), ``W8A8-MXFP8``, ``W4A8-FP8`` (int4 weights,
    fp8 dynamic per-token activations), ``WNA8O8-INT`` (int weights, static int8 input
    and output), ``WNA4-INT`` (int weights, int4 dynamic activations), ``W4A8-INT``,
    ``W4A16-2:4`` (marlin-24 format), ``W4A16``/``W8A16`` (int weight-only),
    ``W8A8-FP8``, ``W8A16-FP8``, ``W8A8-INT8``; ``Sparse-2:4`` for a 2:4 sparsity
    config (``CompressedTensors24``, 0.10/0.11). ``fmt`` is the config's ``format``
    (a group's own ``format`` wins). None when no scheme matches (vLLM: "No
    compressed-tensors compatible scheme was found")."""
    w = group.get("weights")
    a = group.get("input_activations")
    o = group.get("output_activations")
    fmt = group.get("format") or fmt
    if sparsity and sparsity.get("sparsity_structure") == "2:4" and sparsity.get("format") not in (None, "dense"):
        return "Sparse-2:4"
    if not isinstance(w, dict):
        return None
    bits, strategy, gsize = int(w.get("num_bits") or 0), w.get("strategy"), w.get("group_size")
    if _is_fmt(w, "float", 4) and strategy == "tensor_group" and gsize == 16:
        return "W4A16-NVFP4" if not a else "W4A4-NVFP4"
    if _is_fmt(w, "float", 4) and strategy == "group" and gsize == 32:
        return "W4A8-MXFP4" if _is_fmt(a, "float", 8) else "W4A4-MXFP4"
    if _is_fmt(w, "float", 8) and strategy == "group" and gsize == 32:
        return "W8A8-MXFP8"
    if _is_fmt(w, "int", 4) and strategy == "group" and _is_fmt(a, "float", 8) and a.get("dynamic"):
        return "W4A8-FP8"
    if str(w.get("type") or "int") == "int" and strategy in ("channel", "group"):
        if _is_fmt(a, "int", 8) and _is_fmt(o, "int", 8) and not a.get("dynamic"):
            return "WNA8O8-INT"
        if _is_fmt(a, "int", 4) and a.get("dynamic"):
            return "WNA4-INT"
        if bits == 4 and _is_fmt(a, "int", 8) and a.get("dynamic"):
            return "W4A8-INT"
        if not a:
            if fmt == "marlin-24":
                return "W4A16-2:4"
            return f"W{bits}A16" if bits in (4, 8) else None
    if str(w.get("type")) == "float" and bits == 8 and strategy in ("tensor", "channel", "block"):
        return "W8A8-FP8" if _is_fmt(a, "float", 8) else "W8A16-FP8"
    if _is_fmt(w, "int", 8) and strategy in ("tensor", "channel") and _is_fmt(a, "int", 8):
        return "W8A8-INT8"
    return None


def json_files_beside(config_json: Path) -> tuple[str, ...]:
    """The ``*.json`` file names in the folder of ``config_json`` (vLLM looks there for
    a separate quantization config: quantize_config.json, quant_config.json,
    hf_quant_config.json, quantization_config.json — weight_utils.get_quant_config)."""
    return tuple(sorted(f.name for f in config_json.parent.glob("*.json")))


def quant_format(method: str | None) -> str | None:
    """The checkpoint format a quantization method reads: a Marlin kernel variant named as
    its format (``awq_marlin`` → ``awq``, ``gptq_marlin`` → ``gptq``, ``gptq_marlin_24`` →
    ``gptq_24``; vLLM picks the Marlin kernel for such a checkpoint by itself,
    ``override_quantization_method`` of vllm/model_executor/layers/quantization/auto_awq.py and auto_gptq.py, 0.32.0).
    The one place the project strips the variant: the tuner's checkpoint label
    (app.tuner.space), the model's own-method check and the error table's families
    (app.planner.model_error.quant_family) read it. None stays None."""
    return None if method is None else method.replace("_marlin", "")


#: transformers' config defaults (5.19) for the fields the planner reads, by ``model_type``, where a
#: published config.json leaves them out (google/gemma-3-27b-it's text_config has no vocab_size,
#: max_position_embeddings or sliding_window_pattern): transformers/models/gemma3/configuration_gemma3.py
CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072, "sliding_window": 4096,
                    "tie_word_embeddings": True, "head_dim": 256},
}
#: ``layer_types`` names (transformers) → KV cache kinds (app.engine.kvcache)
LAYER_TYPE_KINDS = {"full_attention": FULL, "attention": FULL, "sliding_attention": SLIDING,
                    "chunked_attention": CHUNKED, "linear_attention": MAMBA, "mamba": MAMBA}


def layer_kinds(c: dict[str, Any], n_layers: int) -> tuple[tuple[str, ...], int, int]:
    """(each layer's KV cache kind, the sliding window, the attention chunk) of a text
    config mapping, as vLLM 0.32.0 builds the layers with transformers 5.19's defaults:

    - ``sliding_window`` 0 means none (vllm/config/model.py:802–808); a config with
      ``use_sliding_window: false`` has none (transformers' Qwen2/Qwen3 configs);
    - gpt-oss: even layers slide, whatever ``layer_types`` says
      (vllm/model_executor/models/gpt_oss.py:176);
    - Llama 4: a layer with RoPE (``no_rope_layers[i]`` 1; default every layer but each
      ``no_rope_layer_interval``-th, 4) is chunked when ``attention_chunk_size`` is set
      (vllm/model_executor/models/llama4.py:185, :251; transformers configuration_llama4.py:180);
    - else ``layer_types`` (sliding_attention, full_attention, chunked_attention,
      linear_attention) as given or as transformers derives it: Gemma 3 every
      ``sliding_window_pattern``-th (6) layer full, the rest sliding (configuration_gemma3.py:111);
      Gemma 2 odd layers full (configuration_gemma2.py:95); Qwen3-Next every
      ``full_attention_interval``-th (4) full, the rest linear attention
      (configuration_qwen3_next.py:130); Qwen2/Qwen3 with a window: layers from
      ``max_window_layers`` on slide; a sliding layer takes ``sliding_window``
      (gemma3.py:153, gemma2.py:155, llama.py:185);
    - no ``layer_types`` and a window: every layer slides (vLLM sets the cache's
      sliding_window only for an all-sliding model: vllm/engine/arg_utils.py:2249–2254 —
      Mistral-7B-v0.1).

    A sliding layer without a window is full attention (vLLM gives it none). Returns ()
    for an all-full-attention model."""
    mt = str(c.get("model_type") or "")
    sw = c.get("sliding_window")
    sw = int(sw) if isinstance(sw, (int, float)) and not isinstance(sw, bool) and sw > 0 else 0
    if c.get("use_sliding_window") is False:
        sw = 0
    chunk = int(c.get("attention_chunk_size") or 0)
    n = n_layers
    kinds: list[str]
    if mt == "gpt_oss":
        kinds = [SLIDING if i % 2 == 0 else FULL for i in range(n)]
    elif mt.startswith("llama4"):
        nope = c.get("no_rope_layers") or [int((i + 1) % int(c.get("no_rope_layer_interval") or 4) != 0)
                                           for i in range(n)]
        kinds = [CHUNKED if chunk and i < len(nope) and nope[i] else FULL for i in range(n)]
    elif isinstance(c.get("layer_types"), list):
        kinds = [LAYER_TYPE_KINDS.get(str(t), FULL) for t in c["layer_types"][:n]]
        kinds += [FULL] * (n - len(kinds))
    elif mt.startswith("gemma3"):
        pattern = int(c.get("sliding_window_pattern") or c.get("_sliding_window_pattern") or 6)
        kinds = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    elif mt == "gemma2":
        kinds = [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
    elif mt.startswith("qwen3_next"):
        every = int(c.get("full_attention_interval") or 4)
        kinds = [MAMBA if (i + 1) % every else FULL for i in range(n)]
    elif sw and c.get("max_window_layers") is not None and mt.startswith(("qwen2", "qwen3")):
        kinds = [SLIDING if i >= int(c["max_window_layers"]) else FULL for i in range(n)]
    else:
        kinds = [SLIDING if sw else FULL] * n
    kinds = [FULL if (k == SLIDING and not sw) or (k == CHUNKED and not chunk) else k for k in kinds]
    if all(k == FULL for k in kinds):
        return (), 0, 0
    return tuple(kinds), sw if SLIDING in kinds else 0, chunk if CHUNKED in kinds else 0


@dataclass
class ModelArch:
    """A decoder-only transformer's shape. Counts are plain integers; ``torch_dtype`` is
    the checkpoint's dtype; ``quant_method``/``quant_bits``/``quant_group_size`` come from
    ``quantization_config`` (None when unquantized), ``quant_method`` normalised as vLLM
    does (:func:`checkpoint_quant_method`); ``quant_schemes`` the compressed-tensors
    schemes of its config groups (:func:`compressed_tensors_scheme`); ``quant_source``
    "config" (read from ``quantization_config``), "name" (guessed from the repo id) or
    None; ``checkpoint_files`` the ``*.json`` names beside config.json when the
    checkpoint folder was read (None when it was not: catalog, a bare mapping). MoE: ``experts`` routed experts per
    MoE layer, ``experts_per_tok`` active, ``moe_intermediate`` each expert's size,
    ``shared_intermediate`` the always-active shared expert(s), ``first_dense_layers``
    leading dense layers. MLA when ``kv_lora_rank`` is set."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_position: int
    torch_dtype: str = "bfloat16"
    tie_embeddings: bool = False
    experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    first_dense_layers: int = 0
    moe_every: int = 1
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    quant_method: str | None = None
    quant_bits: int | None = None
    quant_group_size: int | None = None
    quant_schemes: tuple[str, ...] = ()
    quant_source: str | None = None
    checkpoint_files: tuple[str, ...] | None = None
    architectures: tuple[str, ...] = ()
    source: str = ""  # "config.json at …", "HF cache …", "catalog …"
    #: each decoder layer's KV cache kind (app.engine.kvcache: full, sliding, chunked, mamba), as vLLM
    #: 0.32 builds the layer (:func:`layer_kinds`); () means all full attention
    layer_kinds: tuple[str, ...] = ()
    #: the sliding window of the sliding layers and the chunk of the chunked ones (tokens; 0: none)
    sliding_window: int = 0
    attention_chunk_size: int = 0
    #: a gated delta net's (linear attention) shape: key and value heads, their head dims, the
    #: causal conv's kernel (Qwen3-Next ``linear_*``; 0: none)
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv_kernel: int = 0

    # ------------------------------------------------------------------ shape
    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and self.experts_per_tok > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe and i >= self.first_dense_layers and (i % max(1, self.moe_every) == 0)

    def attention_params(self) -> int:
        """Linear parameters of one attention block (q, k, v, o or the MLA projections)."""
        H = self.hidden
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = H * self.q_lora_rank + self.q_lora_rank * self.heads * qk if self.q_lora_rank else H * self.heads * qk
            kv = H * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * self.heads * (
                self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + self.heads * self.v_head_dim * H
        return H * self.heads * self.head_dim * 2 + H * self.kv_heads * self.head_dim * 2

    def mlp_params(self, i: int, active: bool = False) -> int:
        """Linear parameters of layer ``i``'s MLP (gated: 3·H·I); MoE: all experts, or the
        ``experts_per_tok`` active ones when ``active``; shared experts and router included."""
        H = self.hidden
        if not self.is_moe_layer(i):
            return 3 * H * self.intermediate
        n = self.experts_per_tok if active else self.experts
        return n * 3 * H * self.moe_intermediate + 3 * H * self.shared_intermediate + H * self.experts

    def layer_params(self, i: int, active: bool = False) -> int:
        return self.attention_params() + self.mlp_params(i, active)

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def total_params(self) -> int:
        """All parameters (embedding, lm_head unless tied, every expert)."""
        emb = self.embedding_params() * (1 if self.tie_embeddings else 2)
        return emb + sum(self.layer_params(i) for i in range(self.layers))

    def active_params(self) -> int:
        """Parameters used per token (MoE: active experts only; embedding lookup excluded,
        lm_head included) — the compute side of the step-time model."""
        return self.embedding_params() + sum(self.layer_params(i, True) for i in range(self.layers))

    # ------------------------------------------------------------------ bytes
    def weight_bytes(self, quantization: str | None = None, dtype_bytes: int = 2, layers: range | None = None,
                     embed: bool = True, lm_head: bool = True, active: bool = False) -> float:
        """Bytes of weights for ``layers`` (default all) plus embedding/lm_head, quantized
        with ``quantization`` (default: the checkpoint's). Not divided by TP."""
        q = quantization if quantization is not None else self.quant_method
        same = q is not None and quant_format(q) == quant_format(self.quant_method)
        bits, g = (self.quant_bits, self.quant_group_size) if same else (None, None)
        if q in ("awq", "awq_marlin", "gptq", "gptq_marlin") and g is None:
            g = 128
        bpp = quant_bytes_per_param(q, bits, g, dtype_bytes)
        rng = range(self.layers) if layers is None else layers
        lin = sum(self.layer_params(i, active) for i in rng)
        emb = self.embedding_params() * dtype_bytes
        total = lin * bpp
        if embed:
            total += emb
        if lm_head and not (self.tie_embeddings and embed):
            total += emb
        return total

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2, tp: int = 1, layers: int | None = None) -> int:
        """KV cache bytes per token on one GPU of a TP group, for ``layers`` layers
        (default all). GQA: kv_heads/TP heads per GPU, at least 1 (replicated when
        kv_heads < TP). MLA: one latent of kv_lora_rank + qk_rope_head_dim per layer, not
        split by TP. Llama-3-70B bf16: 327,680; DeepSeek-V3 bf16: 70,272."""
        L = self.layers if layers is None else layers
        if self.is_mla:
            return L * (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes
        heads = max(1, -(-self.kv_heads // tp))
        return 2 * L * heads * self.head_dim * kv_dtype_bytes

    @property
    def is_hybrid_kv(self) -> bool:
        """Whether any layer's KV cache is not full attention (sliding, chunked, mamba)."""
        return any(k != FULL for k in self.layer_kinds)

    def kv_layers(self, kv_dtype_bytes: int = 2, tp: int = 1, spec_tokens: int = 0,
                  state_dtype_bytes: int | None = None) -> list[LayerKv]:
        """Every decoder layer's KV cache on one card of a TP group (app.engine.kvcache
        :class:`LayerKv`): attention layers with their K+V (MLA: latent) bytes per token,
        :meth:`kv_bytes_per_token` of one layer; a sliding layer with ``sliding_window``, a
        chunked one with ``attention_chunk_size``; a gated-delta-net (mamba) layer with its
        state per request — conv state (k_dim·k_heads·2 + v_dim·v_heads)/TP × (kernel − 1 +
        ``spec_tokens``) and temporal state v_heads/TP × v_dim × k_dim, both in
        ``state_dtype_bytes`` (default: the KV dtype's; vLLM's mamba_cache_dtype "auto" is
        the model dtype) — vllm/model_executor/layers/mamba/mamba_utils.py
        ``gated_delta_net_state_shape`` :280 and ``_mamba_state_dtype`` :98 @ 0.32.0."""
        per_tok = self.kv_bytes_per_token(kv_dtype_bytes, tp, 1)
        sb = state_dtype_bytes or kv_dtype_bytes
        out = []
        for i in range(self.layers):
            k = self.layer_kinds[i] if i < len(self.layer_kinds) else FULL
            if k == SLIDING and self.sliding_window > 0:
                out.append(LayerKv(SLIDING, per_tok, self.sliding_window))
            elif k == CHUNKED and self.attention_chunk_size > 0:
                out.append(LayerKv(CHUNKED, per_tok, self.attention_chunk_size))
            elif k == MAMBA:
                conv_dim = self.linear_k_dim * self.linear_k_heads * 2 + self.linear_v_dim * self.linear_v_heads
                conv = conv_dim // tp * max(0, self.linear_conv_kernel - 1 + spec_tokens)
                temporal = max(1, self.linear_v_heads // tp) * self.linear_v_dim * self.linear_k_dim
                out.append(LayerKv(MAMBA, 0, 0, (conv + temporal) * sb))
            else:
                out.append(LayerKv(FULL, per_tok))
        return out

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str = "model", source: str = "") -> "ModelArch":
        """From a ``config.json`` mapping (HF field names; ``text_config`` of multimodal
        models merged in). Raises ValueError naming the missing field."""
        c = dict(cfg)
        if isinstance(c.get("text_config"), dict):
            c = {**c, **c["text_config"]}
        c = {**CONFIG_DEFAULTS.get(str(c.get("model_type") or ""), {}), **c}

        def req(*keys: str) -> Any:
            for k in keys:
                if c.get(k) is not None:
                    return c[k]
            raise ValueError(f"config.json of {name} has no {keys[0]}: it is not a decoder-only "
                             "transformer the planner knows; give a catalog model instead")

        H = int(req("hidden_size", "d_model", "n_embd"))
        heads = int(req("num_attention_heads", "n_head"))
        kv = int(c.get("num_key_value_heads") or heads)
        hd = int(c.get("head_dim") or H // heads)
        experts = int(c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts") or 0)
        inter = int(c.get("intermediate_size") or 4 * H)
        moe_inter = int(c.get("moe_intermediate_size") or (inter if experts else 0))
        shared = int(c.get("shared_expert_intermediate_size") or 0)
        if not shared and c.get("n_shared_experts"):
            shared = int(c["n_shared_experts"]) * moe_inter
        qc = c.get("quantization_config") or c.get("compression_config") or {}
        qm, bits, group, schemes = None, None, None, ()
        if isinstance(qc, dict) and qc:
            qm = checkpoint_quant_method(qc)
            bits = qc.get("bits") or qc.get("w_bit")
            group = qc.get("group_size") or qc.get("q_group_size")
            if qm == "compressed-tensors":
                groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
                for grp in groups:
                    w = grp.get("weights") or {}
                    bits = bits or w.get("num_bits")
                    group = group or w.get("group_size")
                schemes = tuple(dict.fromkeys(
                    s for s in (compressed_tensors_scheme(g, qc.get("format"), qc.get("sparsity_config"))
                                for g in groups) if s))
            bits = int(bits) if bits else None
            group = int(group) if group else None
        dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
        n_layers = int(req("num_hidden_layers", "n_layer"))
        kinds, window, chunk = layer_kinds(c, n_layers)
        return cls(
            name=name, layers=n_layers, hidden=H, heads=heads,
            kv_heads=kv, head_dim=hd, intermediate=inter, vocab=int(req("vocab_size")),
            max_position=int(c.get("max_position_embeddings") or c.get("n_positions") or 2048),
            torch_dtype=dtype, tie_embeddings=bool(c.get("tie_word_embeddings", False)),
            experts=experts, experts_per_tok=int(c.get("num_experts_per_tok") or c.get("moe_topk") or 0),
            moe_intermediate=moe_inter, shared_intermediate=shared,
            first_dense_layers=int(c.get("first_k_dense_replace") or 0),
            moe_every=int(c.get("moe_layer_freq") or c.get("decoder_sparse_step") or 1),
            kv_lora_rank=int(c.get("kv_lora_rank") or 0), q_lora_rank=int(c.get("q_lora_rank") or 0),
            qk_rope_head_dim=int(c.get("qk_rope_head_dim") or 0),
            qk_nope_head_dim=int(c.get("qk_nope_head_dim") or 0), v_head_dim=int(c.get("v_head_dim") or 0),
            quant_method=qm, quant_bits=bits, quant_group_size=group, quant_schemes=schemes,
            quant_source="config" if qm else None,
            architectures=tuple(c.get("architectures") or ()), source=source,
            layer_kinds=kinds, sliding_window=window, attention_chunk_size=chunk,
            linear_k_heads=int(c.get("linear_num_key_heads") or 0),
            linear_v_heads=int(c.get("linear_num_value_heads") or 0),
            linear_k_dim=int(c.get("linear_key_head_dim") or 0), linear_v_dim=int(c.get("linear_value_head_dim") or 0),
            linear_conv_kernel=int(c.get("linear_conv_kernel_dim") or 0),
        )

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> "ModelArch":
        """From a local model directory holding config.json. Raises ModelNotFoundError."""
        p = Path(path).expanduser()
        f = p / "config.json"
        if not f.is_file():
            raise ModelNotFoundError(f"{p} has no config.json: point --model at the model directory")
        arch = cls.from_config(json.loads(f.read_text()), name=p.name, source=f"config.json at {p}")
        arch.checkpoint_files = json_files_beside(f)
        return arch


def find_in_hf_cache(model_id: str) -> Path | None:
    """config.json of ``org/name`` in the local HF cache (the snapshot ``refs/main`` names,
    else the newest), or None. Never touches the network."""
    if "/" not in model_id:
        return None
    folder = "models--" + model_id.replace("/", "--")
    for base in hf_cache_dirs():
        d = base / folder
        if not d.is_dir():
            continue
        ref = d / "refs" / "main"
        if ref.is_file():
            f = d / "snapshots" / ref.read_text().strip() / "config.json"
            if f.is_file():
                return f
        snaps = sorted((d / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        if snaps:
            return snaps[0]
    return None


def _key(s: str) -> str:
    s = s.split("/")[-1].lower()
    s = re.sub(r"[-_.](awq|gptq|fp8|int4|int8|w4a16|w8a8|bnb|4bit|8bit|gguf|dynamic|marlin)(?=[-_.]|$).*$", "", s)
    return re.sub(r"[^a-z0-9.]", "", s)


@functools.lru_cache(maxsize=1)
def _catalog() -> list[dict[str, Any]]:
    text = resources.files("app.planner").joinpath("data/models.yaml").read_text(encoding="utf-8")
    return load_yaml(text)["models"]


def catalog_ids() -> list[str]:
    return [e["id"] for e in _catalog()]


def quantization_from_id(model_id: str) -> tuple[str | None, int | None, int | None]:
    """(method, bits, group) a repo id's suffix implies: ``…-AWQ`` → awq 4-bit g128,
    ``…-GPTQ-Int4``/``Int8`` → gptq, ``…-FP8`` → fp8; else (None, None, None)."""
    s = model_id.lower()
    if re.search(r"awq", s):
        return "awq", 4, 128
    m = re.search(r"gptq(?:[-_]int(\d))?", s)
    if m:
        return "gptq", int(m.group(1) or 4), 128
    if re.search(r"fp8", s):
        return "fp8", 8, None
    return None, None, None


def from_catalog(model_id: str) -> ModelArch:
    """Built-in catalog entry for an id (full id, short name or alias; quantized-repack
    suffixes such as ``-AWQ`` ignored for the match and applied as the quantization).
    Raises ModelNotFoundError listing the catalog."""
    k = _key(model_id)
    for e in _catalog():
        names = [e["id"], *e.get("aliases", [])]
        if any(_key(n) == k for n in names):
            arch = ModelArch.from_config(e["config"], name=model_id, source=f"catalog {e['id']}")
            q, b, g = quantization_from_id(model_id)
            if q and not arch.quant_method:
                arch.quant_method, arch.quant_bits, arch.quant_group_size = q, b, g
                arch.quant_source = "name"
            return arch
    raise ModelNotFoundError(
        f"model {model_id!r} has no config.json locally (not a directory, not in the Hugging Face "
        f"cache) and is not in the built-in catalog: download it, pass its directory, or use one of "
        f"{', '.join(catalog_ids())}"
    )


def resolve_model(model: str) -> ModelArch:
    """The architecture of ``model``: a local directory → its config.json; a Hub id in
    the local HF cache → the cached config.json; else the built-in catalog. Offline.
    Raises ModelNotFoundError with where it looked."""
    p = Path(model).expanduser()
    if p.is_dir():
        return ModelArch.from_dir(p)
    f = find_in_hf_cache(model)
    if f is not None:
        arch = ModelArch.from_config(json.loads(f.read_text()), name=model, source=f"HF cache {f.parent}")
        arch.checkpoint_files = json_files_beside(f)
        return arch
    return from_catalog(model)
