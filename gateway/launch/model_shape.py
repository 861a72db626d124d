"""A model's shape from its config.json: what the doctor's arithmetic needs.

Reads config.json (local paths only), derives layers, heads, KV heads, head_dim, the context limit
vLLM derives, parameter count, and the byte sizes of weights and of one token's KV cache.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config.schema import LaunchSpec

GIB = 1024**3
_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
             "max_sequence_length", "max_seq_length", "seq_len")  # vLLM takes the smallest present
_UNGATED = ("gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "gpt_bigcode", "starcoder2")
_FP8 = ("fp8", "fbgemm_fp8", "modelopt", "ptpc_fp8")


class ModelConfigError(ValueError):
    """A model's config.json is missing, unreadable or lacks a field the checks need."""


def read_model_config(model_path: str) -> dict[str, Any] | None:
    """``<model_path>/config.json``; None when model_path is not a local directory (a hub id)."""
    p = Path(model_path).expanduser()
    if not p.is_dir():
        if model_path.startswith(("/", "./", "../", "~")) and not p.exists():
            raise ModelConfigError("model_path does not exist")
        return None
    try:
        data = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelConfigError("no config.json in the model directory") from None
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"cannot read config.json: {exc}") from None
    if not isinstance(data, dict):
        raise ModelConfigError("config.json is not a JSON object")
    return data


@dataclass(frozen=True)
class ModelShape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int  # attention head size (config head_dim, else hidden_size / heads)
    mla_kv_dim: int  # MLA (DeepSeek-V2/V3): kv_lora_rank + qk_rope_head_dim per layer and token; else 0
    intermediate: int  # dense MLP width (0 when every layer is MoE)
    moe_intermediate: int  # one expert's MLP width (0 for dense models)
    params: int
    embed_params: int  # embeddings + untied lm_head: kept in 16 bits by AWQ/GPTQ checkpoints
    max_len_limit: int
    max_len_source: str
    rope_scaled: bool
    torch_dtype: str
    quant_method: str | None  # from config.json quantization_config
    quant_bits: float
    group_size: int


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    v = cfg.get(key)
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if default is None:
        raise ModelConfigError(f"config.json has no integer {key!r}")
    return default


def model_shape(data: Mapping[str, Any]) -> ModelShape:
    text = data.get("text_config")
    cfg: Mapping[str, Any] = {**data, **text} if isinstance(text, dict) and "hidden_size" not in data else data
    hidden, heads, layers = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads"), _int(cfg, "num_hidden_layers")
    vocab, kv_heads = _int(cfg, "vocab_size"), _int(cfg, "num_key_value_heads", heads)
    if min(hidden, heads, layers, vocab, kv_heads) <= 0:
        raise ModelConfigError("config.json has a zero or negative size")
    head_dim = _int(cfg, "head_dim", hidden // heads)
    kv_lora = _int(cfg, "kv_lora_rank", 0)
    if kv_lora:  # multi-head latent attention
        nope, rope, v_dim = (_int(cfg, k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        q_lora = _int(cfg, "q_lora_rank", 0)
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        attn = q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_dim) + heads * v_dim * hidden
        head_dim, mla_kv_dim = nope + rope, kv_lora + rope
    else:
        attn, mla_kv_dim = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim, 0
    inter = _int(cfg, "intermediate_size", 4 * hidden)
    mult = 2 if str(cfg.get("model_type", "")) in _UNGATED else 3
    experts = next((_int(cfg, k) for k in ("n_routed_experts", "num_experts", "num_local_experts")
                    if isinstance(cfg.get(k), int) and cfg[k] > 0), 0)
    moe_inter, dense_layers = 0, layers
    mlp = layers * mult * hidden * inter
    if experts:
        moe_inter = _int(cfg, "moe_intermediate_size", inter)
        shared = _int(cfg, "n_shared_experts", 0) * moe_inter or _int(cfg, "shared_expert_intermediate_size", 0)
        dense_layers = _int(cfg, "first_k_dense_replace", 0)
        per_moe = mult * hidden * (experts * moe_inter + shared) + experts * hidden
        mlp = dense_layers * mult * hidden * inter + (layers - dense_layers) * per_moe
    tied = cfg.get("tie_word_embeddings") is True
    embed = vocab * hidden * (1 if tied else 2)
    params = embed + layers * (attn + 2 * hidden) + mlp + hidden
    found = sorted((cfg[k], k) for k in _LEN_KEYS if isinstance(cfg.get(k), int))
    limit, source = found[0] if found else (2048, "vLLM's default")
    rope_scaled = False
    rs = cfg.get("rope_scaling")
    if isinstance(rs, dict) and "gemma3" not in str(cfg.get("model_type", "")):
        kind = rs.get("rope_type") or rs.get("type")
        factor = rs.get("factor", 1.0)
        if kind not in ("su", "longrope", "llama3") and isinstance(factor, int | float) and factor != 1:
            base = rs.get("original_max_position_embeddings") if kind == "yarn" else None
            limit, rope_scaled = int((base if isinstance(base, int) else limit) * factor), True
    qc = data.get("quantization_config")
    qc = qc if isinstance(qc, dict) else {}
    method = str(qc["quant_method"]).lower() if qc.get("quant_method") else None
    bits = qc.get("bits") or qc.get("w_bit") or (8 if method in _FP8 else 4)
    group = qc.get("group_size") or qc.get("q_group_size") or 0
    return ModelShape(
        layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim, mla_kv_dim=mla_kv_dim,
        intermediate=inter if dense_layers else 0, moe_intermediate=moe_inter, params=params,
        embed_params=embed, max_len_limit=limit, max_len_source=f"{source} {found[0][0]}" if found else source,
        rope_scaled=rope_scaled, torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
        quant_method=method, quant_bits=float(bits) if isinstance(bits, int | float) else 4.0,
        group_size=group if isinstance(group, int) and group > 0 else 0)


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype in ("float", "float32") else 2  # "auto" casts float32 checkpoints to 16 bits


def weight_bytes(s: ModelShape, quantization: str | None, dtype: str) -> float:
    """Estimated weight memory of the whole model (all GPUs together)."""
    method = s.quant_method or quantization
    if method is None:
        return float(s.params * _dtype_bytes(dtype))
    bits = s.quant_bits if s.quant_method else (8.0 if method in _FP8 else 4.0)
    per = bits / 8 + ((16 + bits) / 8 / s.group_size if s.group_size else 0.0)  # + scales and zeros
    return s.embed_params * _dtype_bytes(dtype) + (s.params - s.embed_params) * per


def kv_bytes_per_token(s: ModelShape, launch: LaunchSpec, kv_cache_dtype: str | None) -> int:
    """KV-cache bytes per token on one GPU: 2 (K, V) x layers x KV heads x head_dim x dtype bytes."""
    elem = 1 if kv_cache_dtype and kv_cache_dtype.startswith("fp8") else _dtype_bytes(launch.dtype)
    layers = math.ceil(s.layers / launch.pipeline_parallel_size)
    if s.mla_kv_dim:  # one latent vector per layer, the same on every tensor-parallel rank
        return layers * s.mla_kv_dim * elem
    return 2 * layers * math.ceil(s.kv_heads / launch.tensor_parallel_size) * s.head_dim * elem
