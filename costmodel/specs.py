"""Frozen hardware and model descriptions, and their struct-of-arrays form for broadcasting.

A `GPU` is one accelerator type (datasheet figures); a `Model` is one MoE transformer (its
published config). Both validate their own values and nothing else: loading YAML, naming the
file a bad value came from, and composing inventories happen in `pipeline.catalog`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

SOFTWARE = ("cuda", "rocm")  # kernel stacks: NVIDIA's CUDA libraries, AMD's ROCm (aiter, hipBLASLt)
GEMM_TABLES = ("default", "h20")
ATTENTIONS = ("mla", "gqa")  # MLA with DeepSeek Sparse Attention's indexer is MLA with `Model.index_topk` set
# attention kinds public MoE models have that the cost model does not price: a model with one is refused when loaded,
# saying what it lacks, rather than priced as MLA or GQA over every cached token
UNPRICED_ATTENTIONS = {
    "linear": "linear attention (Qwen3-Next's Gated DeltaNet, MiniMax-M1's lightning attention): a fixed-size state "
              "per sequence in place of a KV cache",
}
FP8_SCALE_BLOCK = 128  # FP8 KV caches with a scale per block (DSA's latent and indexer keys): elements per FP32 scale


class SpecError(ValueError):
    """A GPU or model figure that cannot be right (negative, zero where it must not be...)."""


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise SpecError(msg)


@dataclass(frozen=True)
class Device:
    """What a GPU of the type reports about itself, as the engines' own settings checks need it (their device probes,
    `deployment.engines`): its name as torch and NVML give it, its memory as nvidia-smi reports it, its SMs and its
    compute capability."""

    name: str  # torch.cuda.get_device_name, NVML's nvmlDeviceGetName
    memory_mib: int  # nvidia-smi --query-gpu=memory.total (MiB): torch's total_memory and NVML's, >> 20
    sms: int  # streaming multiprocessors (torch.cuda.get_device_properties().multi_processor_count)
    capability: tuple[int, int]  # compute capability (major, minor)

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and bool(self.name), f"device `name` must be text, got {self.name!r}")
        for f in ("memory_mib", "sms"):
            v = getattr(self, f)
            _require(isinstance(v, int) and not isinstance(v, bool) and v > 0,
                     f"`device.{f} > 0` (integer) must hold, got {v!r}")  # fmt: skip
        cc = self.capability
        _require(
            isinstance(cc, (list, tuple)) and len(cc) == 2 and all(isinstance(c, int) and c >= 0 for c in cc),
            f"`device.capability` must be [major, minor], e.g. [9, 0], got {cc!r}",
        )
        object.__setattr__(self, "capability", tuple(cc))


@dataclass(frozen=True)
class GPU:
    """One GPU type. Bandwidths are per GPU and per direction; TFLOPS are dense peaks."""

    name: str
    sm: int
    comm_sm: int
    tflops_bf16: float
    tflops_fp8: float
    tflops_fp4: float
    mem_gb: float
    mem_bw_gb_s: float
    nvlink_bw_gb_s: float
    scaleout_bw_gb_s: float
    gpus_per_node: int  # the scale-up (NVLink) domain: GPUs an all-to-all reaches without the NIC
    grouped_gemm_table: str
    price_per_hour: float
    node_gpus: int = 8  # GPUs per host (server, or rack compute tray): the unit a deployment places
    software: str = "cuda"  # the kernel stack its engines run (cuda | rocm): end-to-end factors are the stack's
    device: Device | None = None  # what the device reports (None: not recorded; the engines' checks need it)
    host_memory_gb: float | None = None  # DRAM of one host (node_gpus GPUs), GB (None: not known)
    host_link_gb_s: float = 0.0  # GPU <-> host bandwidth per GPU, one direction (PCIe), GB/s (0: not known)

    def __post_init__(self) -> None:
        _require(self.software in SOFTWARE, f"`software` of GPU {self.name} must be one of {SOFTWARE}, "
                 f"got {self.software!r}")  # fmt: skip
        for f in ("sm", "gpus_per_node", "node_gpus"):
            v = getattr(self, f)
            _require(isinstance(v, int) and v > 0, f"`{f} > 0` (integer) must hold for GPU {self.name}, got {v!r}")
        _require(
            self.gpus_per_node % self.node_gpus == 0 or self.node_gpus % self.gpus_per_node == 0,
            f"GPU {self.name}: node_gpus ({self.node_gpus}) and gpus_per_node, the scale-up domain "
            f"({self.gpus_per_node}), must divide one another",
        )
        _require(
            0 <= self.comm_sm < self.sm,
            f"`0 <= comm_sm < sm` must hold for GPU {self.name}, got comm_sm={self.comm_sm}, sm={self.sm}",
        )
        for f in ("tflops_bf16", "mem_gb", "mem_bw_gb_s", "nvlink_bw_gb_s", "scaleout_bw_gb_s"):
            v = getattr(self, f)
            _require(_finite(v) and v > 0, f"`{f} > 0` must hold for GPU {self.name}, got {v!r}")
        _require(self.host_memory_gb is None or (_finite(self.host_memory_gb) and self.host_memory_gb > 0),
                 f"`host_memory_gb > 0` (GB of DRAM a host has) must hold for GPU {self.name}, or leave it out "
                 f"(not known), got {self.host_memory_gb!r}")  # fmt: skip
        for f in ("tflops_fp8", "tflops_fp4", "price_per_hour", "host_link_gb_s"):
            v = getattr(self, f)
            _require(_finite(v) and v >= 0, f"`{f} >= 0` must hold for GPU {self.name} (0: none), got {v!r}")
        _require(
            self.grouped_gemm_table in GEMM_TABLES,
            f"`grouped_gemm_table` of GPU {self.name} must be one of {list(GEMM_TABLES)}, "
            f"got {self.grouped_gemm_table!r}",
        )

    @property
    def has_fp8(self) -> bool:
        return self.tflops_fp8 > 0

    @property
    def has_fp4(self) -> bool:
        return self.tflops_fp4 > 0


@dataclass(frozen=True)
class Model:
    """A transformer: MoE (routed experts), or dense (`n_routed_experts` 0: every layer a dense MLP). MLA fields apply
    when attention == 'mla', GQA fields when 'gqa'."""

    name: str
    attention: Literal["mla", "gqa"]
    hidden: int
    n_layers: int
    n_dense_layers: int
    dense_inter: int
    moe_inter: int
    n_routed_experts: int
    n_shared_experts: int
    top_k: int
    n_heads: int
    vocab_size: int
    max_context: int = 0  # longest prompt + output the model serves (config.json); 0: not given
    mtp_layers: int = 0  # multi-token-prediction modules (config.json num_nextn_predict_layers); 0: no MTP head
    # MLA (DeepSeek-V2/V3)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # GQA (Qwen3-MoE, Mixtral...)
    n_kv_heads: int = 0
    head_dim: int = 0
    # a sliding window (GPT-OSS): `sliding_layers` of the layers attend to the last `sliding_window` tokens only and
    # keep only those in their KV cache; the others attend to every token (0: every layer attends to every token)
    sliding_window: int = 0
    sliding_layers: int = 0
    expert_bits: float = 0.0  # bits per routed-expert weight as the checkpoint ships them (MXFP4: 4.25); 0: the GPU's
    # DeepSeek Sparse Attention (DeepSeek-V3.2, MLA only; config.json's names): a lightning indexer of `index_n_heads`
    # heads of `index_head_dim` scores every cached token in FP8 (its own key cache, one FP8 key and an FP32 scale per
    # token and layer), and MLA attends to the `index_topk` best of them (0: MLA over every cached token)
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0

    def __post_init__(self) -> None:
        _require(
            self.attention not in UNPRICED_ATTENTIONS,
            f"model {self.name}'s attention is `{self.attention}` ({UNPRICED_ATTENTIONS.get(self.attention)}), which "
            "the cost model does not price (it prices MLA, with or without DeepSeek's sparse indexer, and GQA): "
            "refused rather than priced as either",
        )
        _require(
            self.attention in ATTENTIONS,
            f"`attention` of model {self.name} must be one of {list(ATTENTIONS)}, got {self.attention!r}",
        )
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("int",):
                _require(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                    f"`{f.name} >= 0` (integer) must hold for model {self.name}, got {v!r}",
                )
        for f in ("hidden", "n_layers", "n_heads", "vocab_size"):
            _require(getattr(self, f) > 0, f"`{f} > 0` must hold for model {self.name}, got {getattr(self, f)!r}")
        if self.dense:  # every layer a dense MLP: no experts of any kind
            for f in ("moe_inter", "top_k", "n_shared_experts"):
                _require(getattr(self, f) == 0, f"model {self.name} is dense (n_routed_experts 0), so `{f}` must be "
                         f"0, got {getattr(self, f)!r}")  # fmt: skip
            _require(
                self.n_dense_layers == self.n_layers,
                f"model {self.name} is dense (n_routed_experts 0), so every layer is: `n_dense_layers` must be "
                f"{self.n_layers}, got {self.n_dense_layers}",
            )
        else:
            for f in ("moe_inter", "top_k"):
                _require(getattr(self, f) > 0, f"`{f} > 0` must hold for MoE model {self.name}, got "
                         f"{getattr(self, f)!r}")  # fmt: skip
            _require(
                self.n_dense_layers < self.n_layers,
                f"`n_dense_layers < n_layers` must hold for MoE model {self.name}, "
                f"got {self.n_dense_layers} >= {self.n_layers}",
            )
        _require(
            self.top_k <= self.n_routed_experts,
            f"`top_k <= n_routed_experts` must hold for model {self.name}, got {self.top_k} > {self.n_routed_experts}",
        )
        _require(
            self.n_dense_layers == 0 or self.dense_inter > 0,
            f"model {self.name} has dense layers, so `dense_inter > 0` must hold, got {self.dense_inter}",
        )
        needed = (
            ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            if self.attention == "mla"
            else ("n_kv_heads", "head_dim")
        )
        for f in needed:
            _require(
                getattr(self, f) > 0,
                f"`{f} > 0` must hold for {self.attention.upper()} model {self.name}, got {getattr(self, f)!r}",
            )
        _require(
            (self.sliding_window == 0) == (self.sliding_layers == 0) and self.sliding_layers <= self.n_layers,
            f"model {self.name}: a sliding window needs both `sliding_window` (tokens) and `sliding_layers` (how many "
            f"of its {self.n_layers} layers use it), got {self.sliding_window} and {self.sliding_layers}",
        )
        _require(
            _finite(self.expert_bits) and 0 <= self.expert_bits <= 16,
            f"`expert_bits` of model {self.name} must be 0 (the GPU's format) or bits per weight up to 16, got "
            f"{self.expert_bits!r}",
        )
        indexer = (self.index_topk, self.index_n_heads, self.index_head_dim)
        _require(
            all(v == 0 for v in indexer) or (all(v > 0 for v in indexer) and self.attention == "mla"),
            f"model {self.name}: DeepSeek Sparse Attention needs MLA and all of `index_topk`, `index_n_heads` and "
            f"`index_head_dim` (0 for all three: none), got {self.attention} and {indexer}",
        )
        if self.attention == "gqa":
            _require(
                self.n_heads % self.n_kv_heads == 0,
                f"`n_heads % n_kv_heads == 0` must hold for model {self.name}, got {self.n_heads} % {self.n_kv_heads}",
            )

    @property
    def dense(self) -> bool:
        """No routed experts: every layer a dense MLP, every weight on every token (Llama)."""
        return self.n_routed_experts == 0

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers

    @property
    def attn_params_per_layer(self) -> int:
        """Attention weights of one layer (norms left out; DSA's indexer in), as an element count."""
        d, h = self.hidden, self.n_heads
        if self.attention == "mla":
            return (
                self.indexer_params_per_layer
                + d * self.q_lora_rank
                + self.q_lora_rank * h * (self.qk_nope_head_dim + self.qk_rope_head_dim)
                + d * (self.kv_lora_rank + self.qk_rope_head_dim)
                + self.kv_lora_rank * h * self.qk_nope_head_dim
                + self.kv_lora_rank * h * self.v_head_dim
                + h * self.v_head_dim * d
            )
        hd = self.head_dim
        return d * hd * (2 * h + 2 * self.n_kv_heads)

    @property
    def params(self) -> int:
        """Weights of the whole model (untied embedding and LM head, attention, dense MLPs, every expert and the
        routers; norms and the MTP modules left out), as an element count: what its published total counts."""
        moe = self.n_moe_layers * ((self.n_routed_experts + self.n_shared_experts) * self.expert_params
                                   + self.hidden * self.n_routed_experts)  # fmt: skip
        return 2 * self.vocab_size * self.hidden + self.n_layers * self.attn_params_per_layer + self.dense_params + moe

    @property
    def active_params(self) -> int:
        """Weights one token runs through (the LM head, attention, dense MLPs, its top_k routed and the shared
        experts): what a published "activated" count counts."""
        experts = self.n_moe_layers * (self.top_k + self.n_shared_experts) * self.expert_params
        return self.vocab_size * self.hidden + self.n_layers * self.attn_params_per_layer + self.dense_params + experts

    @property
    def dense_params(self) -> int:
        """The dense layers' MLPs."""
        return self.n_dense_layers * 3 * self.hidden * self.dense_inter

    @property
    def expert_params(self) -> int:
        """One routed (or shared) expert: gate, up and down projections."""
        return 3 * self.hidden * self.moe_inter

    @property
    def indexer_params_per_layer(self) -> int:
        """DSA's lightning indexer in one layer (its query up-projection from the query latent, its key projection and
        its per-head weights), as an element count; 0 without one."""
        if not self.index_topk:
            return 0
        return self.index_n_heads * self.index_head_dim * self.q_lora_rank + self.hidden * (
            self.index_head_dim + self.index_n_heads
        )

    @property
    def index_bytes_per_token_layer(self) -> float:
        """Bytes of DSA's indexer key cache one token adds to one layer: its key in FP8 and an FP32 scale per block
        (SGLang's DSA pool: index_head_dim + index_head_dim / 128 x 4); 0 without an indexer."""
        return self.index_head_dim * (1.0 + 4.0 / FP8_SCALE_BLOCK) if self.index_topk else 0.0

    def attended(self, context: Any) -> Any:
        """Tokens a query at `context` attends to, per layer on average over the layers: every token on
        full-attention layers, the last `sliding_window` on the others; under DSA the `index_topk` the indexer picks."""
        if self.index_topk:
            return np.minimum(context, self.index_topk)
        if not self.sliding_window:
            return context
        full = self.n_layers - self.sliding_layers
        return (full * context + self.sliding_layers * np.minimum(context, self.sliding_window)) / self.n_layers

    @property
    def attention_bend(self) -> int:
        """The context past which a query attends to no more tokens (the sliding window, DSA's top-k; 0: none): a
        decode step is affine in its context on either side of it."""
        return self.index_topk or self.sliding_window

    def held(self, context: Any) -> Any:
        """Tokens a sequence of `context` tokens keeps in the KV cache, per layer on average: what its queries attend
        to (a sliding layer keeps its window), but every token under DSA (the indexer picks among them all)."""
        return context if self.index_topk else self.attended(context)

    def attended_pairs(self, new: Any, context: Any, causal: bool) -> Any:
        """(query, key) pairs of `new` tokens at the end of `context` tokens, per layer on average: a causal
        triangle over every token on full-attention layers, over the last `sliding_window` on the others (each
        query at position x sees min(x + 1, window) tokens); under DSA over the `index_topk` each query picks."""
        q, c = new, context
        if self.index_topk:
            return _window_pairs(q, c, float(self.index_topk), causal)
        pairs = q * (c - q) + q * (q + 1) / 2.0 if causal else q * c
        if not self.sliding_window:
            return pairs
        window = _window_pairs(q, c, float(self.sliding_window), causal)
        full = self.n_layers - self.sliding_layers
        return (full * pairs + self.sliding_layers * window) / self.n_layers

    @property
    def kv_elems_per_token_layer(self) -> int:
        """KV-cache elements one token adds to one layer (MLA: latent + rope key; GQA: K and V)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim


def _window_pairs(q: Any, c: Any, w: float, causal: bool) -> Any:
    """(query, key) pairs of `q` tokens at the end of `c` when each query at position x sees min(x + 1, w) tokens
    (causal), or min(c, w) (not)."""

    def seen(n: Any) -> Any:  # Σ_{y=1..n} min(y, w)
        return np.where(n <= w, n * (n + 1) / 2.0, w * (w + 1) / 2.0 + (n - w) * w)

    return seen(c) - seen(c - q) if causal else q * np.minimum(c, w)


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# --- struct-of-arrays view for broadcasting over GPUs --------------------------------------


@dataclass(frozen=True)
class GPUArray:
    """The numeric fields of several GPUs as arrays, shaped to broadcast along one axis.

    `GPUArray.of([h200, h800], ndim=3, axis=0)` gives every field shape (2, 1, 1), so a call
    with `seq_len` of shape (1, L, 1) and `batch` of shape (1, 1, B) evaluates a G×L×B grid.
    A single `GPU` is accepted everywhere a `GPUArray` is, through `GPUArray.of(gpu)`.
    """

    names: tuple[str, ...]
    software: tuple[str, ...]  # each GPU's kernel stack (GPU.software)
    sm: np.ndarray
    comm_sm: np.ndarray
    tflops_bf16: np.ndarray
    tflops_fp8: np.ndarray
    tflops_fp4: np.ndarray
    mem_gb: np.ndarray
    mem_bw_gb_s: np.ndarray
    nvlink_bw_gb_s: np.ndarray
    scaleout_bw_gb_s: np.ndarray
    gpus_per_node: np.ndarray
    gemm_table_h20: np.ndarray  # bool: the GPU's own field says the H20 table
    gemm_table_h20_by_name: np.ndarray  # bool: shallowsim's substring rule ("H20" in name)

    @staticmethod
    def of(gpus: GPU | GPUArray | list[GPU] | tuple[GPU, ...], ndim: int = 1, axis: int = 0) -> GPUArray:
        if isinstance(gpus, GPUArray):
            return gpus
        single = isinstance(gpus, GPU)
        seq = [gpus] if single else list(gpus)
        shape = [1] * ndim
        shape[axis] = len(seq)

        def col(vals: list[float], dtype: type = float) -> np.ndarray:
            a = np.asarray(vals, dtype=dtype)
            return a.reshape(()) if single else a.reshape(shape)

        num = {
            f: col([getattr(g, f) for g in seq])
            for f in (
                "sm",
                "comm_sm",
                "tflops_bf16",
                "tflops_fp8",
                "tflops_fp4",
                "mem_gb",
                "mem_bw_gb_s",
                "nvlink_bw_gb_s",
                "scaleout_bw_gb_s",
                "gpus_per_node",
            )
        }
        return GPUArray(
            names=tuple(g.name for g in seq),
            software=tuple(g.software for g in seq),
            **num,
            gemm_table_h20=col([g.grouped_gemm_table == "h20" for g in seq], bool),
            gemm_table_h20_by_name=col(["H20" in g.name for g in seq], bool),
        )
