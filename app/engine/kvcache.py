"""KV cache groups as vLLM 0.32.0's hybrid KV cache manager builds them, and the
capacity that follows: blocks in the pool, blocks one request holds, the "KV cache
size" and "Maximum concurrency" vLLM logs, the longest context that fits.

Every decoder layer has one KV cache kind (:class:`LayerKv`):

- ``full``: full attention, every token of the context (``FullAttentionSpec``,
  vllm/v1/kv_cache_interface.py:551 @ 0.32.0);
- ``sliding``: a sliding window of ``window`` tokens (``SlidingWindowSpec``,
  kv_cache_interface.py:859): a request holds at most ``cdiv(min(window − 1 +
  max_in_flight_tokens, max_model_len), block) + 1`` blocks of it
  (``max_admission_blocks_per_request``, kv_cache_interface.py:870–899); at run time
  the blocks left of the window are freed (``SlidingWindowManager.get_num_skipped_tokens``
  = computed − window + 1, vllm/v1/core/single_type_kv_cache_manager.py:1135–1170);
- ``chunked``: chunked local attention of ``window`` (= ``attention_chunk_size``) tokens
  (``ChunkedLocalAttentionSpec``, kv_cache_interface.py:818): at most
  ``cdiv(min(chunk + max_in_flight_tokens, max_model_len), block)`` blocks
  (kv_cache_interface.py:822–840); at run time the chunks before the current one are
  freed (single_type_kv_cache_manager.py:1368–1412);
- ``mamba``: a recurrent state (Mamba, gated delta net / linear attention) of
  ``state_bytes`` per request (``MambaSpec``, kv_cache_interface.py:1034): one block
  per request, two with prefix caching (``mamba_cache_mode`` "align",
  kv_cache_interface.py:1071–1077; vllm/model_executor/models/config.py:685 sets
  "align" when prefix caching is on).

Grouping (:func:`kv_cache_groups`, vllm/v1/core/kv_cache_utils.py ``get_kv_cache_groups``
:2159): all layers of one kind and window → one group (``_get_kv_cache_groups_uniform_spec``
:1260 / ``_uniform_type`` :1276). Several kinds → ``_get_kv_cache_groups_uniform_page_size``
(:1362–1502): the layers are bucketed by kind and window; the group size is the smallest
bucket's layer count (the largest's when it is under 1.5× the smallest, :1457–1468); each
bucket is split into ``cdiv(n, group size)`` groups, layer i of the bucket into group
i mod that count (:1469–1501), so every group has ``group size`` layer slots (the last
padded). Every layer's page (one block of its KV) has the same bytes: a mamba state is
padded to the attention page, the attention block grown until its page holds the state
(``Platform._align_hybrid_block_size``, vllm/platforms/interface.py:939–1121: block =
16 · cdiv(state, 16 · attention bytes per token)).

Capacity: ``num_blocks = available // bytes_per_block`` where a block is one block of
every layer of the widest group (``_get_kv_cache_bytes_per_block``, kv_cache_utils.py:1520,
``get_kv_cache_config_from_groups`` :1588, ``num_blocks = available_memory //
bytes_per_block`` :1630); all groups draw from that one pool, so one request of
``max_model_len`` tokens holds the sum over groups of each group's blocks
(``get_max_concurrency_for_kv_cache_config`` :1195); "KV cache size" is
``int(num_blocks / that sum × max_model_len)`` tokens (``get_kv_cache_capacity`` :2300).
A context fits when that sum × bytes_per_block ≤ available − one block (the null block,
``get_kv_cache_configs`` :2618–2640 and ``_check_enough_kv_cache_memory`` :1003);
otherwise vLLM's "estimated maximum model length" is the largest that does (binary
search, ``_estimate_max_model_len_from_groups`` :2369).

With the hybrid manager off (``--disable-hybrid-kv-cache-manager``, or by default for a
model with ``attention_chunk_size``: vllm/config/vllm.py:2148–2169 unless
``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1``) sliding and chunked layers are
allocated as full attention when the model also has full-attention layers
(``unify_hybrid_kv_cache_specs`` kv_cache_utils.py:1799, ``_promote_local_kv_cache_specs``
:1690); an all-sliding model (Mistral-7B-v0.1) keeps its window either way.

Sizes in bytes, lengths in tokens. This module imports nothing else of the app.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Collection, Sequence

FULL, SLIDING, CHUNKED, MAMBA = "full", "sliding", "chunked", "mamba"
KINDS = (FULL, SLIDING, CHUNKED, MAMBA)
#: the attention backends' smallest kernel block (tokens) the mamba alignment rounds to
#: (FlashAttention's 16: ``kernel_block_alignment_size``, vllm/platforms/interface.py:1060–1067)
KERNEL_BLOCK = 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LayerKv:
    """One decoder layer's KV cache on one card: ``kind`` (module docstring);
    ``bytes_per_token`` an attention layer's K and V (or MLA latent) bytes per token
    on this card; ``window`` the sliding window or attention chunk (tokens, 0 for
    full/mamba); ``state_bytes`` a mamba layer's state per request on this card."""

    kind: str
    bytes_per_token: int = 0
    window: int = 0
    state_bytes: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"KV cache kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind in (SLIDING, CHUNKED) and self.window < 1:
            raise ValueError(f"a {self.kind} layer needs a window of at least 1 token, not {self.window}")


@dataclass(frozen=True)
class KvGroup:
    """One KV cache group: its ``kind`` and ``window``, the model's layer indices in it
    (``layers``; fewer than ``slots`` in a padded group), ``block_size`` tokens per block."""

    kind: str
    window: int
    layers: tuple[int, ...]
    slots: int
    block_size: int

    def blocks_for_request(self, max_model_len: int, max_in_flight_tokens: int, mamba_blocks: int) -> int:
        """Blocks one request of ``max_model_len`` tokens may hold in this group
        (``max_memory_usage_bytes`` / page, kv_cache_interface.py: FullAttentionSpec :574,
        ChunkedLocalAttentionSpec :822, SlidingWindowSpec :870, MambaSpec :1071)."""
        bs = self.block_size
        if self.kind == FULL:
            return cdiv(max_model_len, bs)
        if self.kind == SLIDING:
            return cdiv(min(self.window - 1 + max_in_flight_tokens, max_model_len), bs) + 1
        if self.kind == CHUNKED:
            return cdiv(min(self.window + max_in_flight_tokens, max_model_len), bs)
        return mamba_blocks

    def held(self, computed: int, new: int) -> int:
        """Blocks a request holds in this group while ``new`` tokens are scheduled after
        ``computed`` ones: those up to ``computed + new`` minus the whole blocks left of the
        window (``remove_skipped_blocks``, single_type_kv_cache_manager.py:672–710)."""
        bs = self.block_size
        total = cdiv(computed + new, bs)
        if self.kind == FULL:
            return total
        if self.kind == SLIDING:
            skipped = max(0, computed - self.window + 1)
        elif self.kind == CHUNKED:
            skipped = computed // self.window * self.window
        else:
            return 1 if computed + new > 0 else 0
        return total - min(skipped // bs, total)


@dataclass(frozen=True)
class KvCacheLayout:
    """The KV cache groups of a model (:func:`kv_cache_groups`) and what one layer's page
    costs (``page_bytes``, the same for every layer: module docstring); ``mamba_blocks``
    blocks a request holds per mamba group. Methods take the layers on one worker
    (``layers``: model layer indices, None: all) for pipeline parallelism, where each
    stage's pool is sized by its own layers (``_project_kv_cache_groups_to_worker``,
    kv_cache_utils.py:2486) and vLLM then uses the smallest block count of all workers."""

    groups: tuple[KvGroup, ...]
    page_bytes: int
    mamba_blocks: int = 1

    @property
    def uniform(self) -> bool:
        """One group of full attention: the classic pool, a block = block_size tokens of every layer."""
        return len(self.groups) == 1 and self.groups[0].kind == FULL

    @property
    def block_size(self) -> int:
        """Tokens per block of the first attention group (the pool's block size; every
        group has it unless a mamba alignment grew it for all)."""
        return next((g.block_size for g in self.groups if g.kind != MAMBA), self.groups[0].block_size)

    def bytes_per_block(self, layers: Collection[int] | None = None) -> int:
        """Bytes of one pool block: the widest group's layers on this worker, one page each
        (``_get_kv_cache_bytes_per_block``, kv_cache_utils.py:1520–1551)."""
        on = None if layers is None else set(layers)
        return max((sum(1 for i in g.layers if on is None or i in on) for g in self.groups), default=0) * self.page_bytes

    def num_blocks(self, available_bytes: float, layers: Collection[int] | None = None) -> int:
        """Blocks in the pool of a worker with ``available_bytes`` for KV (kv_cache_utils.py:1630)."""
        b = self.bytes_per_block(layers)
        return max(0, int(available_bytes // b)) if b else 0

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens holds over all groups
        (``get_max_concurrency_for_kv_cache_config``, kv_cache_utils.py:1195–1227)."""
        return sum(g.blocks_for_request(max_model_len, max_in_flight_tokens, self.mamba_blocks) for g in self.groups)

    def max_concurrency(self, num_blocks: int, max_model_len: int, max_in_flight_tokens: int) -> float:
        """vLLM's "Maximum concurrency for max_model_len tokens per request"."""
        return num_blocks / max(1, self.blocks_per_request(max_model_len, max_in_flight_tokens))

    def kv_cache_tokens(self, num_blocks: int, max_model_len: int, max_in_flight_tokens: int) -> int:
        """vLLM's "KV cache size: N tokens" (``get_kv_cache_capacity``, kv_cache_utils.py:2300):
        int(concurrency × max_model_len); for one full-attention group the pool's tokens,
        num_blocks × block_size (the same when max_model_len is a multiple of the block)."""
        if self.uniform:
            return num_blocks * self.groups[0].block_size
        return int(self.max_concurrency(num_blocks, max_model_len, max_in_flight_tokens) * max_model_len)

    def fits(self, available_bytes: float, max_model_len: int, max_in_flight_tokens: int,
             layers: Collection[int] | None = None) -> bool:
        """Whether one request of ``max_model_len`` fits in ``available_bytes`` less the
        null block (kv_cache_utils.py:2618–2640, :1003–1040)."""
        b = self.bytes_per_block(layers)
        return b > 0 and b * self.blocks_per_request(max_model_len, max_in_flight_tokens) <= available_bytes - b

    def max_model_len(self, available_bytes: float, max_in_flight_tokens: int, upper: int,
                      layers: Collection[int] | None = None) -> int:
        """The longest max_model_len (≤ ``upper``) that :meth:`fits`: vLLM's "estimated
        maximum model length" (``_estimate_max_model_len_from_groups``, kv_cache_utils.py:2369
        — the same binary search); 0 when not even one token fits."""
        if not self.fits(available_bytes, 1, max_in_flight_tokens, layers):
            return 0
        lo, hi, best = 1, upper, 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.fits(available_bytes, mid, max_in_flight_tokens, layers):
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best

    def held_blocks(self, computed: int, new: int) -> int:
        """Pool blocks one request holds with ``computed`` tokens done and ``new`` scheduled
        (every group's :meth:`KvGroup.held`) — the engine's per-request KV at run time."""
        return sum(g.held(computed, new) for g in self.groups)

    def describe(self) -> str:
        """One line: the groups by kind, e.g. "7 KV cache groups: 1 full (10 layers), 6
        sliding 1024 (52 layers in 60 slots)"."""
        parts = []
        for (kind, window), gs in _by_kind(self.groups).items():
            n = sum(len(g.layers) for g in gs)
            slots = sum(g.slots for g in gs)
            w = f" {window}" if window else ""
            pad = f" in {slots} slots" if slots != n else ""
            parts.append(f"{len(gs)} {kind}{w} ({n} layers{pad})")
        return f"{len(self.groups)} KV cache group{'s' if len(self.groups) != 1 else ''}: " + ", ".join(parts)


def _by_kind(groups: Sequence[KvGroup]) -> dict[tuple[str, int], list[KvGroup]]:
    out: dict[tuple[str, int], list[KvGroup]] = {}
    for g in groups:
        out.setdefault((g.kind, g.window), []).append(g)
    return out


def kv_cache_groups(layers: Sequence[LayerKv], block_size: int = 16, hybrid: bool = True,
                    prefix_caching: bool = True, spec_tokens: int = 0) -> KvCacheLayout:
    """The KV cache groups vLLM 0.32.0 builds for a model whose decoder layers are
    ``layers`` (in model order), ``block_size`` tokens per block (``--block-size``);
    ``hybrid``: the hybrid KV cache manager is on (module docstring); ``prefix_caching``:
    mamba states keep 2 blocks per request ("align"), else 1; ``spec_tokens``: draft
    tokens, one more mamba block each (``num_speculative_blocks``). Raises ValueError for
    a model without layers."""
    if not layers:
        raise ValueError("a model needs at least one decoder layer for its KV cache")
    specs = list(layers)
    kinds = {s.kind for s in specs}
    if not hybrid and FULL in kinds and kinds & {SLIDING, CHUNKED}:
        specs = [replace(s, kind=FULL, window=0) if s.kind in (SLIDING, CHUNKED) else s for s in specs]
    attn = [s for s in specs if s.kind != MAMBA]
    bs = block_size
    page = max((s.bytes_per_token for s in attn), default=0) * bs
    states = [s.state_bytes for s in specs if s.kind == MAMBA]
    if states:
        state = max(states)
        if attn:
            per_tok = max(s.bytes_per_token for s in attn)
            align = max(KERNEL_BLOCK, bs)
            bs = max(bs, align * cdiv(state, align * per_tok))
            page = bs * per_tok
        else:
            page = state
    mamba_blocks = (2 if prefix_caching else 1) + spec_tokens
    # buckets by kind and window, in the order their first layer appears (kv_cache_utils.py:1427–1455)
    buckets: dict[tuple[str, int], list[int]] = {}
    for i, s in enumerate(specs):
        buckets.setdefault((s.kind, s.window if s.kind in (SLIDING, CHUNKED) else 0), []).append(i)
    if len(buckets) == 1:
        (kind, window), idx = next(iter(buckets.items()))
        return KvCacheLayout((KvGroup(kind, window, tuple(idx), len(idx), bs),), page, mamba_blocks)
    counts = [len(v) for v in buckets.values()]
    size = min(counts)
    if max(counts) < size * 1.5:
        size = max(counts)
    groups = []
    for (kind, window), idx in buckets.items():
        n = cdiv(len(idx), size)
        for j in range(n):
            groups.append(KvGroup(kind, window, tuple(idx[j::n]), size, bs))
    return KvCacheLayout(tuple(groups), page, mamba_blocks)

