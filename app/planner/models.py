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

import yaml

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


@dataclass
class ModelArch:
    """A decoder-only transformer's shape. Counts are plain integers; ``torch_dtype`` is
    the checkpoint's dtype; ``quant_method``/``quant_bits``/``quant_group_size`` come from
    ``quantization_config`` (None when unquantized). MoE: ``experts`` routed experts per
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
    architectures: tuple[str, ...] = ()
    source: str = ""  # "config.json at …", "HF cache …", "catalog …"

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
        same = q is not None and q.replace("_marlin", "") == (self.quant_method or "").replace("_marlin", "")
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

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str = "model", source: str = "") -> "ModelArch":
        """From a ``config.json`` mapping (HF field names; ``text_config`` of multimodal
        models merged in). Raises ValueError naming the missing field."""
        c = dict(cfg)
        if isinstance(c.get("text_config"), dict):
            c = {**c, **c["text_config"]}

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
        qc = c.get("quantization_config") or {}
        qm, bits, group = None, None, None
        if qc:
            qm = str(qc.get("quant_method") or "").lower() or None
            bits = qc.get("bits") or qc.get("w_bit")
            group = qc.get("group_size") or qc.get("q_group_size")
            if qm == "compressed-tensors":
                for grp in (qc.get("config_groups") or {}).values():
                    w = (grp or {}).get("weights") or {}
                    bits = bits or w.get("num_bits")
                    group = group or w.get("group_size")
            bits = int(bits) if bits else None
            group = int(group) if group else None
        dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
        return cls(
            name=name, layers=int(req("num_hidden_layers", "n_layer")), hidden=H, heads=heads,
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
            quant_method=qm, quant_bits=bits, quant_group_size=group,
            architectures=tuple(c.get("architectures") or ()), source=source,
        )

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> "ModelArch":
        """From a local model directory holding config.json. Raises ModelNotFoundError."""
        p = Path(path).expanduser()
        f = p / "config.json"
        if not f.is_file():
            raise ModelNotFoundError(f"{p} has no config.json: point --model at the model directory")
        return cls.from_config(json.loads(f.read_text()), name=p.name, source=f"config.json at {p}")


def hf_cache_dirs() -> list[Path]:
    """Where the Hugging Face hub cache may be (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)."""
    out = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        out.append(Path(os.environ["HF_HOME"]) / "hub")
    out.append(Path.home() / ".cache" / "huggingface" / "hub")
    return out


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
    return yaml.safe_load(text)["models"]


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
        return ModelArch.from_config(json.loads(f.read_text()), name=model, source=f"HF cache {f.parent}")
    return from_catalog(model)
