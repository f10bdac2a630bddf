"""Turn a Hugging Face ``config.json`` into the numbers the cost model needs: parameters, bytes, KV size.

Supported families: Llama-style dense GQA (``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2/3``),
Qwen-style MoE (``Qwen3MoeForCausalLM``, ``Qwen2MoeForCausalLM``, ``MixtralForCausalLM``) and
DeepSeek-V3-style MLA + MoE (``DeepseekV3ForCausalLM``, Kimi K2). Parameter counts ignore norms and
biases (well under 0.1 % of any model here).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from vocab.model import ModelConfigError, language_config, read_config_json
from vocab.model import context_length as config_context_length

BF16_BYTES = 2.0
# --kv-cache-dtype values the simulated engine models (of those SGLang 0.5.23 accepts, in
# mem_cache/kv_cache_dtype.py) and the bytes one KV element takes; "auto" keeps the model's dtype (BF16
# here). SGLang's FP4 pools (nvfp4, fp4_mx_block16) are not modelled.
KV_CACHE_DTYPES = {"auto": BF16_BYTES, "bf16": BF16_BYTES, "bfloat16": BF16_BYTES, "fp8_e4m3": 1.0,
                   "fp8_e5m2": 1.0, "mxfp8": 1.0}
DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}


def is_fp8(bytes_per_param: float) -> bool:
    """Weights stored as FP8 (one byte each, plus block scales)."""
    return 1.0 <= bytes_per_param < 1.01


ONLINE_FP8 = "fp8"  # SGLang's --quantization fp8
NVFP4_GROUP = 16


def quantized_online(spec: ModelSpec) -> ModelSpec:
    """``spec`` as SGLang serves it with ``--quantization fp8``: an unquantized checkpoint's linear layers
    (attention projections, MLPs, experts) quantized to FP8 at load time, one scale per tensor; the
    embedding, the LM head and the KV cache keep their dtypes. A checkpoint that is already quantized is
    served as it is."""
    if spec.quant_desc:
        return spec
    return dataclasses.replace(
        spec, attn_bytes_per_param=1.0, dense_mlp_bytes_per_param=1.0, expert_bytes_per_param=1.0,
        shared_expert_bytes_per_param=1.0, quant_desc="fp8 (online, per tensor) on linear layers")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str
    architecture: str
    model_type: str
    num_layers: int
    hidden: int
    vocab: int
    num_heads: int
    num_kv_heads: int  # for MLA: the number of query heads (the latent cache is shared by all of them)
    attention: str  # "mla" or "gqa"
    qk_head_dim: int
    v_head_dim: int
    kv_lora_rank: int  # MLA only, else 0
    qk_rope_head_dim: int  # MLA only, else 0
    context_length: int  # the serving context (``--context-length`` or the model maximum)
    max_context_length: int  # ``max_position_embeddings``
    eos_token_ids: tuple[int, ...]
    # parameters (counts, not bytes)
    attn_params: int  # one layer's attention projections
    dense_mlp_params: int  # one dense layer's MLP
    expert_params: int  # one routed expert
    shared_expert_params: int  # all shared experts of one MoE layer
    router_params: int  # one MoE layer's gate
    num_experts: int  # routed experts per MoE layer (0 for dense models)
    top_k: int
    moe_layer_mask: tuple[bool, ...]  # per layer: True if it is a MoE layer
    embed_params: int
    lm_head_params: int
    # bytes per parameter, by weight category (quantization may differ between them)
    attn_bytes_per_param: float
    dense_mlp_bytes_per_param: float
    expert_bytes_per_param: float
    shared_expert_bytes_per_param: float
    lm_head_bytes_per_param: float
    embed_bytes_per_param: float
    kv_bytes_per_elem: float
    quant_desc: str  # e.g. "compressed-tensors (int4, group 32) on routed experts"; "" when unquantized
    # GEMM widths the measured step costs need (the parameter counts above fold them in)
    q_lora_rank: int = 0  # MLA: width of the low-rank query projection (0: one q_proj)
    dense_inter: int = 0  # a dense layer's MLP intermediate size
    moe_inter: int = 0  # one routed expert's intermediate size
    shared_inter: int = 0  # all shared experts of a MoE layer together
    # the quantized weights are NVFP4 (4-bit floats, one FP8 scale per 16): the same bytes per weight as
    # 4-bit integers with BF16 scales per 32, but other kernels (the tables' nvfp4 rows)
    nvfp4: bool = False
    # q and k are RMS-normalised over all heads at once, not head by head (MiniMax-M2's per-layer QK norm):
    # with the heads split over a TP group each GPU holds a slice, and the per-token sums of squares are
    # all-reduced between the norm's two kernels
    qk_norm_over_heads: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_mask)

    @property
    def expert_bytes(self) -> float:
        return self.expert_params * self.expert_bytes_per_param

    def kv_elems_per_token_layer(self) -> int:
        """Elements cached per token per layer (before any TP sharding)."""
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim  # one latent vector, shared by all heads
        return 2 * self.num_kv_heads * self.qk_head_dim  # K and V

    def layer_nonexpert_params(self, layer: int) -> int:
        """Parameters of one layer that every token reads: attention, dense MLP or shared experts, gate."""
        if self.moe_layer_mask[layer]:
            return self.attn_params + self.shared_expert_params + self.router_params
        return self.attn_params + self.dense_mlp_params

    def layer_nonexpert_fp8_params(self, layer: int) -> int:
        """Of ``layer_nonexpert_params``, those stored in FP8 (their GEMMs run at the FP8 peak)."""
        n = self.attn_params if is_fp8(self.attn_bytes_per_param) else 0
        if self.moe_layer_mask[layer]:
            n += self.shared_expert_params if is_fp8(self.shared_expert_bytes_per_param) else 0
        elif is_fp8(self.dense_mlp_bytes_per_param):
            n += self.dense_mlp_params
        return n

    def layer_nonexpert_bytes(self, layer: int) -> float:
        b = self.attn_params * self.attn_bytes_per_param
        if self.moe_layer_mask[layer]:
            b += self.shared_expert_params * self.shared_expert_bytes_per_param
            b += self.router_params * BF16_BYTES
        else:
            b += self.dense_mlp_params * self.dense_mlp_bytes_per_param
        return b

    def total_params(self) -> int:
        n = self.embed_params + self.lm_head_params
        for layer in range(self.num_layers):
            n += self.layer_nonexpert_params(layer)
            if self.moe_layer_mask[layer]:
                n += self.num_experts * self.expert_params
        return n

    def active_params_per_token(self) -> int:
        n = self.lm_head_params
        for layer in range(self.num_layers):
            n += self.layer_nonexpert_params(layer)
            if self.moe_layer_mask[layer]:
                n += self.top_k * self.expert_params
        return n


def _get(cfg: dict, *keys: str, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


# Representative module names per weight category, matched against a quantization ``ignore`` list.
_CATEGORY_MODULES = {
    "attn": "model.layers.1.self_attn.o_proj",
    "dense_mlp": "model.layers.0.mlp.down_proj",
    "expert": "model.layers.1.mlp.experts.0.down_proj",
    "shared_expert": "model.layers.1.mlp.shared_experts.down_proj",
    "lm_head": "lm_head",
}


ATTENTION_INPUT_MODULE = "model.layers.1.self_attn.q_b_proj"


def _ignored(module: str, ignore: list[str]) -> bool:
    for pat in ignore:
        if pat.startswith("re:"):
            if re.match(pat[3:], module):
                return True
        elif pat == module or module.endswith("." + pat):
            return True
    return False


def _quant_bytes(cfg: dict, base: float) -> tuple[dict[str, float], str]:
    """Bytes per parameter for each weight category, from ``quantization_config``."""
    per_cat = {c: base for c in _CATEGORY_MODULES}
    q = cfg.get("quantization_config")
    if not q:
        return per_cat, ""
    method = q.get("quant_method", "")
    ignore = list(q.get("ignore") or q.get("modules_to_not_convert") or [])
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        if not groups:
            raise ModelConfigError("compressed-tensors quantization_config without config_groups")
        w = next(iter(groups.values())).get("weights") or {}
        bits = int(w.get("num_bits", 8))
        group = w.get("group_size")
        # packed integers plus one BF16 scale per group (symmetric: no zero point)
        qbytes = bits / 8 + (BF16_BYTES / group if group else 0.0)
        desc = f"compressed-tensors ({w.get('type', 'int')}{bits}, group {group})"
    elif method == "modelopt" and str(q.get("quant_algo", "")).upper() == "NVFP4":
        group = int(q.get("group_size", NVFP4_GROUP))
        qbytes = 0.5 + 1.0 / group  # 4-bit floats + one FP8 scale per group
        desc = f"NVFP4 (group {group})"
        ignore = [p.replace(".", r"\.").replace("*", ".*") for p in q.get("exclude_modules") or []]
        ignore = [f"re:{p}$" for p in ignore]
    elif method == "fp8":
        block = q.get("weight_block_size") or [128, 128]
        qbytes = 1.0 + 4.0 / (block[0] * block[1])  # FP8 weights + one FP32 scale per block
        desc = f"fp8 (block {block[0]}x{block[1]})"
    else:
        raise ModelConfigError(f"unsupported quant_method {method!r} (supported: compressed-tensors, fp8, "
                               "modelopt NVFP4)")
    quantized = []
    for cat, module in _CATEGORY_MODULES.items():
        if not _ignored(module, ignore):
            per_cat[cat] = qbytes
            quantized.append(cat)
    if "attn" in quantized and _ignored(ATTENTION_INPUT_MODULE, ignore):
        # NVIDIA's NVFP4 recipes keep the attention's input projections (most of its weights) in BF16 and
        # quantize only its output projection: the attention is priced as BF16
        per_cat["attn"] = base
        quantized.remove("attn")
    return per_cat, f"{desc} on {', '.join(quantized) or 'nothing'}"


def load_model_spec(model_path: str, context_length: int | None = None) -> ModelSpec:
    path = Path(model_path).expanduser()
    cfg = read_config_json(path)
    return spec_from_config(cfg, name=path.name, path=str(path), context_length=context_length)


def spec_from_config(
    cfg: dict, name: str = "model", path: str = "", context_length: int | None = None
) -> ModelSpec:
    cfg = language_config(cfg)
    archs = cfg.get("architectures") or ["?"]
    arch = archs[0]
    try:
        layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        vocab = int(cfg["vocab_size"])
        heads = int(cfg["num_attention_heads"])
    except KeyError as e:
        raise ModelConfigError(f"config.json lacks {e.args[0]!r}") from e
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    base = DTYPE_BYTES.get(str(cfg.get("torch_dtype", "bfloat16")), BF16_BYTES)
    inter = int(_get(cfg, "intermediate_size", default=4 * hidden))

    mla = cfg.get("kv_lora_rank") is not None
    if mla:
        q_lora = cfg.get("q_lora_rank")
        q_lora_rank = int(q_lora or 0)
        kv_lora = int(cfg["kv_lora_rank"])
        rope = int(cfg["qk_rope_head_dim"])
        nope = int(cfg["qk_nope_head_dim"])
        v_dim = int(cfg["v_head_dim"])
        qk_dim = nope + rope
        # q_a/q_b low-rank pair when q_lora_rank is set, else one q_proj
        q_params = hidden * int(q_lora) + int(q_lora) * heads * qk_dim if q_lora else hidden * heads * qk_dim
        attn = (
            q_params
            + hidden * (kv_lora + rope)  # kv_a_proj_with_mqa
            + kv_lora * heads * (nope + v_dim)  # kv_b_proj
            + heads * v_dim * hidden  # o_proj
        )
        attention = "mla"
        kv_heads = heads
    else:
        kv_lora = rope = q_lora_rank = 0
        qk_dim = int(_get(cfg, "head_dim", default=hidden // heads))
        v_dim = qk_dim
        attn = hidden * heads * qk_dim + 2 * hidden * kv_heads * qk_dim + heads * qk_dim * hidden
        attention = "gqa"

    num_experts = int(_get(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0))
    top_k = int(_get(cfg, "num_experts_per_tok", default=0)) if num_experts else 0
    if num_experts:
        moe_inter = int(_get(cfg, "moe_intermediate_size", default=inter))
        expert = 3 * hidden * moe_inter  # gate, up, down
        n_shared = int(_get(cfg, "n_shared_experts", default=0))
        shared_inter = int(_get(cfg, "shared_expert_intermediate_size", default=n_shared * moe_inter))
        shared = 3 * hidden * shared_inter
        router = hidden * num_experts
        first_dense = int(_get(cfg, "first_k_dense_replace", default=0))
        freq = int(_get(cfg, "moe_layer_freq", "decoder_sparse_step", default=1)) or 1
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        if "first_k_dense_replace" in cfg:  # DeepSeek convention: layer i >= k with i % freq == 0
            mask = tuple(i >= first_dense and i % freq == 0 for i in range(layers))
        else:  # Qwen convention: (i + 1) % decoder_sparse_step == 0, minus mlp_only_layers
            mask = tuple(i not in mlp_only and (i + 1) % freq == 0 for i in range(layers))
        if not 0 < top_k <= num_experts:
            raise ModelConfigError(f"num_experts_per_tok must be in [1, {num_experts}], got {top_k}")
    else:
        expert = shared = router = moe_inter = shared_inter = 0
        mask = (False,) * layers
    dense_mlp = 3 * hidden * inter

    embed = vocab * hidden
    # A tied head shares storage with the embedding only when both sit on one GPU; under PP they are on
    # different stages, so the simulator always counts both (a small overestimate for tied models).
    lm_head = vocab * hidden
    bytes_per, quant_desc = _quant_bytes(cfg, base)

    max_ctx = config_context_length(cfg)
    ctx = max_ctx if context_length is None else int(context_length)

    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((int(eos),) if eos is not None else ())
    return ModelSpec(
        name=name,
        path=path,
        architecture=arch,
        model_type=str(cfg.get("model_type", "")),
        num_layers=layers,
        hidden=hidden,
        vocab=vocab,
        num_heads=heads,
        num_kv_heads=kv_heads,
        attention=attention,
        qk_head_dim=qk_dim,
        v_head_dim=v_dim,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope,
        context_length=ctx,
        max_context_length=max_ctx,
        eos_token_ids=eos_ids,
        attn_params=attn,
        dense_mlp_params=dense_mlp,
        expert_params=expert,
        shared_expert_params=shared,
        router_params=router,
        num_experts=num_experts,
        top_k=top_k,
        moe_layer_mask=mask,
        embed_params=embed,
        lm_head_params=lm_head,
        attn_bytes_per_param=bytes_per["attn"],
        dense_mlp_bytes_per_param=bytes_per["dense_mlp"],
        expert_bytes_per_param=bytes_per["expert"],
        shared_expert_bytes_per_param=bytes_per["shared_expert"],
        lm_head_bytes_per_param=bytes_per["lm_head"],
        embed_bytes_per_param=base,
        kv_bytes_per_elem=BF16_BYTES,
        quant_desc=quant_desc,
        q_lora_rank=q_lora_rank,
        dense_inter=inter,
        moe_inter=moe_inter,
        shared_inter=shared_inter,
        nvfp4=quant_desc.startswith("NVFP4"),
        qk_norm_over_heads=bool(cfg.get("use_qk_norm")) and cfg.get("qk_norm_type") == "per_layer",
    )

