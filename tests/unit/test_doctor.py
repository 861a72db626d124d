"""`gateway doctor` checks against the published config.json of real model families."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.config import GatewayConfig, LaunchSpec
from gateway.launch.doctor import ACROSS, Finding, diagnose
from gateway.launch.gpu import parse_inventory, parse_topology
from gateway.launch.model_shape import (
    ModelConfigError,
    kv_bytes_per_token,
    model_shape,
    read_model_config,
    weight_bytes,
)
from tests.unit.test_gpu import A100_X4, TOPO_NVLINK, TOPO_PCIE

# The published hyperparameters (config.json on the model hubs), trimmed of tokenizer ids.
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
    "num_hidden_layers": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000,
}
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}
LLAMA3_70B = {**LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
              "num_hidden_layers": 80}
QWEN2_7B_INSTRUCT = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
    "num_hidden_layers": 28, "max_position_embeddings": 32768, "max_window_layers": 28,
    "rope_theta": 1000000.0, "sliding_window": 131072, "use_sliding_window": False,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 152064,
}
QWEN25_72B_INSTRUCT = {
    **QWEN2_7B_INSTRUCT, "hidden_size": 8192, "intermediate_size": 29568, "num_attention_heads": 64,
    "num_key_value_heads": 8, "num_hidden_layers": 80, "max_window_layers": 70,
}
# Qwen's AWQ release pads the MLP to 29696 so that it splits over 8 GPUs in groups of 128.
QWEN25_72B_INSTRUCT_AWQ = {
    **QWEN25_72B_INSTRUCT, "intermediate_size": 29696, "torch_dtype": "float16",
    "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm",
                            "zero_point": True},
}
DEEPSEEK_LLM_7B_CHAT = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
    "num_hidden_layers": 30, "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 102400,
}
DEEPSEEK_V2_LITE_CHAT = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 10944, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_hidden_layers": 27, "max_position_embeddings": 163840, "vocab_size": 102400,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
    "moe_intermediate_size": 1408, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "max_position_embeddings": 32768, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
}
# The random-weight model of vllm/RECIPE.md (scripts/make_tiny_model.py) for the vllm-cpu tier.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32,
    "num_hidden_layers": 2, "max_position_embeddings": 2048, "torch_dtype": "bfloat16", "vocab_size": 2048,
}
A100_80_X2 = "0, NVIDIA A100-SXM4-80GB, 81920\n1, NVIDIA A100-SXM4-80GB, 81920\n"
H100_X1 = "0, NVIDIA H100 80GB HBM3, 81559\n"


def write_model(root: Path, name: str, config: dict[str, Any]) -> str:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(d)


def gateway(*launches: dict[str, Any], urls: list[str] | None = None) -> GatewayConfig:
    ups = [{"name": f"b{i}", "url": (urls or [])[i] if urls else f"http://127.0.0.1:{8001 + i}",
            "model": "served", "launch": launch} for i, launch in enumerate(launches)]
    return GatewayConfig.model_validate({"models": [{"id": "m", "upstreams": ups}]})


def run(*launches: dict[str, Any], gpus: str | None = None, topo: str | None = None,
        gpu_memory_gib: float | None = None, urls: list[str] | None = None) -> list[Finding]:
    return diagnose(gateway(*launches, urls=urls), read_model_config,
                    gpus=parse_inventory(gpus) if gpus is not None else None,
                    topology=parse_topology(topo) if topo is not None else None,
                    gpu_memory_gib=gpu_memory_gib)


def ids(findings: list[Finding], severity: str | None = None) -> set[str]:
    return {f.check for f in findings if severity is None or f.severity == severity}


def one(findings: list[Finding], check: str, severity: str | None = None) -> Finding:
    found = [f for f in findings if f.check == check and (severity is None or f.severity == severity)]
    assert len(found) == 1, findings
    return found[0]


@pytest.fixture
def models(tmp_path: Path) -> dict[str, str]:
    return {name: write_model(tmp_path, name, cfg) for name, cfg in {
        "llama2-7b": LLAMA2_7B, "llama3-8b": LLAMA3_8B, "llama3-70b": LLAMA3_70B,
        "qwen2-7b": QWEN2_7B_INSTRUCT, "qwen2.5-72b": QWEN25_72B_INSTRUCT,
        "qwen2.5-72b-awq": QWEN25_72B_INSTRUCT_AWQ, "deepseek-7b": DEEPSEEK_LLM_7B_CHAT,
        "deepseek-v2-lite": DEEPSEEK_V2_LITE_CHAT, "mistral-7b": MISTRAL_7B, "tiny": TINY_LLAMA,
    }.items()}


# -- model arithmetic --------------------------------------------------------------------------------

@pytest.mark.parametrize(("config", "params"), [
    (LLAMA2_7B, 6_738_415_616), (LLAMA3_8B, 8_030_261_248), (LLAMA3_70B, 70_553_706_496),
    (MISTRAL_7B, 7_241_732_096), (DEEPSEEK_LLM_7B_CHAT, 6_910_365_696),
])
def test_parameter_count_matches_the_published_sizes(config: dict[str, Any], params: int) -> None:
    assert model_shape(config).params == params


@pytest.mark.parametrize(("config", "billions"), [
    (QWEN2_7B_INSTRUCT, 7.62), (QWEN25_72B_INSTRUCT, 72.7), (DEEPSEEK_V2_LITE_CHAT, 15.7),
])
def test_parameter_count_close_for_biased_and_moe_models(config: dict[str, Any], billions: float) -> None:
    assert model_shape(config).params / 1e9 == pytest.approx(billions, rel=0.01)


@pytest.mark.parametrize(("config", "tp", "kv_dtype", "per_token"), [
    (LLAMA2_7B, 1, None, 2 * 32 * 32 * 128 * 2),  # 512 KiB: no GQA
    (LLAMA3_8B, 1, None, 2 * 32 * 8 * 128 * 2),
    (LLAMA3_8B, 1, "fp8", 2 * 32 * 8 * 128),
    (LLAMA3_70B, 4, None, 2 * 80 * 2 * 128 * 2),  # 8 KV heads over 4 GPUs
    (LLAMA3_70B, 16, None, 2 * 80 * 1 * 128 * 2),  # replicated: one KV head per GPU
    (DEEPSEEK_LLM_7B_CHAT, 1, None, 491_520),  # the article's "about 0.5 MB per token"
    (QWEN2_7B_INSTRUCT, 1, None, 2 * 28 * 4 * 128 * 2),
    (DEEPSEEK_V2_LITE_CHAT, 2, None, 27 * (512 + 64) * 2),  # MLA latent, not split by TP
])
def test_kv_bytes_per_token(config: dict[str, Any], tp: int, kv_dtype: str | None, per_token: int) -> None:
    launch = LaunchSpec(model_path="x", tensor_parallel_size=tp)
    assert kv_bytes_per_token(model_shape(config), launch, kv_dtype) == per_token


def test_weights_of_a_4bit_checkpoint_are_about_a_quarter() -> None:
    full = weight_bytes(model_shape(QWEN25_72B_INSTRUCT), None, "auto")
    awq = weight_bytes(model_shape(QWEN25_72B_INSTRUCT_AWQ), None, "half")
    assert full / 2**30 == pytest.approx(135.4, rel=0.01)
    assert 0.25 < awq / full < 0.32  # 4-bit layers plus scales, 16-bit embeddings and lm_head


def test_context_limit_follows_vllm_including_yarn() -> None:
    assert model_shape(LLAMA3_8B).max_len_limit == 8192
    lite = model_shape(DEEPSEEK_V2_LITE_CHAT)
    assert (lite.max_len_limit, lite.rope_scaled) == (4096 * 40, True)
    yarn = {**QWEN2_7B_INSTRUCT, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 32768}}
    assert model_shape(yarn).max_len_limit == 131072
    llama31 = {**LLAMA3_8B, "max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}
    assert model_shape(llama31).max_len_limit == 131072  # llama3 scaling is already included


def test_model_config_errors(tmp_path: Path) -> None:
    assert read_model_config("meta-llama/Meta-Llama-3-8B-Instruct") is None  # a hub id
    with pytest.raises(ModelConfigError, match="does not exist"):
        read_model_config(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelConfigError, match=r"no config\.json"):
        read_model_config(str(tmp_path / "empty"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="cannot read"):
        read_model_config(str(bad))
    with pytest.raises(ModelConfigError, match="hidden_size"):
        model_shape({"num_attention_heads": 32})


# -- one backend -------------------------------------------------------------------------------------

def test_the_articles_deepseek_command_on_4x_a100_40gb(models: dict[str, str]) -> None:
    # CUDA_VISIBLE_DEVICES=0,1,2,3 ... --tensor-parallel-size 4 --dtype bfloat16 --max-model-len 8192
    launch = {"model_path": models["deepseek-7b"], "tensor_parallel_size": 4, "dtype": "bfloat16",
              "max_model_len": 8192, "gpu_memory_utilization": 0.9, "max_num_seqs": 256,
              "cuda_visible_devices": "0,1,2,3"}
    found = run(launch, gpus=A100_X4, topo=TOPO_NVLINK)
    err = one(found, "max-model-len", "error")
    assert "4096" in err.message and "rope scaling" in err.message
    fixed = run({**launch, "max_model_len": 4096}, gpus=A100_X4, topo=TOPO_NVLINK)
    assert ids(fixed, "error") == set()
    assert "NVLink" in one(fixed, "nccl", "info").message
    mem = one(fixed, "kv-memory", "warning")  # starts; 256 sequences of 4096 tokens do not all fit
    assert "66 full-length (4096-token) sequences, fewer than max_num_seqs 256" in mem.message


def test_unset_max_model_len_warns_and_uses_the_model_limit(models: dict[str, str]) -> None:
    found = run({"model_path": models["mistral-7b"]}, gpus="0, NVIDIA A10G, 23028\n")
    warn = one(found, "max-model-len", "warning")
    assert "32768" in warn.message and "max_position_embeddings" in warn.message
    assert "1 full-length (32768-token)" in one(found, "kv-memory", "warning").message


@pytest.mark.parametrize(("tp", "errors"), [
    (1, set()), (2, set()), (4, set()), (3, {"tp-heads", "tp-mlp"}), (8, {"tp-heads"}),
    (7, {"tp-kv-heads", "tp-mlp"}),  # 28 heads split, but 4 KV heads and 18944 do not
])
def test_tensor_parallel_must_divide_heads(models: dict[str, str], tp: int, errors: set[str]) -> None:
    found = run({"model_path": models["qwen2-7b"], "tensor_parallel_size": tp, "max_model_len": 8192})
    assert ids(found, "error") == errors
    if "tp-heads" in errors:
        assert "1, 2, 4, 7, 14" in one(found, "tp-heads").message


def test_more_gpus_than_kv_heads_replicates(models: dict[str, str]) -> None:
    found = run({"model_path": models["llama3-70b"], "tensor_parallel_size": 16, "max_model_len": 8192})
    assert "replicated on 2 GPUs" in one(found, "tp-kv-heads", "info").message


def test_awq_needs_float16(models: dict[str, str]) -> None:
    base = {"model_path": models["qwen2.5-72b-awq"], "tensor_parallel_size": 4, "max_model_len": 8192}
    bf16 = run({**base, "quantization": "awq", "dtype": "bfloat16"})
    assert "--dtype half" in one(bf16, "awq-dtype", "error").message
    assert "awq-dtype" not in ids(run({**base, "quantization": "awq", "dtype": "half"}))
    assert "awq-dtype" not in ids(run({**base, "dtype": "auto"}))  # the AWQ checkpoint says float16
    detected = one(run({**base, "dtype": "bfloat16"}), "awq-dtype", "warning")  # awq_marlin may take it
    assert "awq_marlin" in detected.message
    gptq = {**QWEN25_72B_INSTRUCT_AWQ, "quantization_config": {"bits": 4, "group_size": 128,
                                                                 "quant_method": "gptq", "desc_act": False}}
    assert ids(diagnose(gateway({**base, "dtype": "bfloat16"}), lambda _p: gptq), "error") == set()


def test_quantization_must_match_the_checkpoint(models: dict[str, str]) -> None:
    awq_as_gptq = run({"model_path": models["qwen2.5-72b-awq"], "quantization": "gptq", "dtype": "half",
                       "tensor_parallel_size": 4, "max_model_len": 4096})
    assert "'awq'" in one(awq_as_gptq, "quant-mismatch", "error").message
    plain_as_awq = run({"model_path": models["llama3-8b"], "quantization": "awq", "max_model_len": 4096})
    assert "no quantization_config" in one(plain_as_awq, "quant-mismatch", "error").message
    online_fp8 = run({"model_path": models["llama3-8b"], "quantization": "fp8", "max_model_len": 4096})
    assert "quant-mismatch" not in ids(online_fp8)


def test_quantized_mlp_must_split_in_whole_groups(models: dict[str, str]) -> None:
    unpadded = {**QWEN25_72B_INSTRUCT, "torch_dtype": "float16",
                "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "gptq"}}
    found = diagnose(gateway({"model_path": "/m", "tensor_parallel_size": 8, "max_model_len": 8192}),
                     lambda _p: unpadded)
    assert "3696 is not a multiple of 128" in one(found, "tp-quant-group", "error").message
    padded = run({"model_path": models["qwen2.5-72b-awq"], "tensor_parallel_size": 8, "dtype": "half",
                  "max_model_len": 8192})
    assert ids(padded, "error") == set()


def test_max_model_len_above_the_limit(models: dict[str, str]) -> None:
    over = {"model_path": models["llama3-8b"], "max_model_len": 16384}
    assert "8192" in one(run(over), "max-model-len", "error").message
    allowed = {**over, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}
    assert one(run(allowed), "max-model-len").severity == "warning"
    lite = run({"model_path": models["deepseek-v2-lite"], "max_model_len": 32768})
    assert "max-model-len" not in ids(lite)  # YaRN gives it 163840


def test_memory_weights_do_not_fit(models: dict[str, str]) -> None:
    found = run({"model_path": models["llama3-70b"], "tensor_parallel_size": 2, "max_model_len": 8192,
                 "gpu_memory_gib": 40})
    err = one(found, "kv-memory", "error")
    assert "weights alone do not fit" in err.message and "tensor_parallel_size" in err.message
    assert "65.7 GiB" in err.message  # 70.6B parameters x 2 bytes / 2 GPUs


def test_memory_counts_full_length_sequences(models: dict[str, str]) -> None:
    launch = {"model_path": models["llama3-8b"], "max_model_len": 8192, "max_num_seqs": 256}
    warn = one(run(launch, gpu_memory_gib=24), "kv-memory", "warning")
    assert "5 full-length (8192-token) sequences" in warn.message
    assert "fewer than max_num_seqs 256" in warn.message and "max_model_len" in warn.message
    fp8 = one(run({**launch, "extra_args": ["--kv-cache-dtype", "fp8"]}, gpu_memory_gib=24), "kv-memory")
    assert "10 full-length" in fp8.message and "64 KiB/token" in fp8.message
    small = one(run({**launch, "max_num_seqs": 4}, gpu_memory_gib=24), "kv-memory")
    assert small.severity == "info"


def test_memory_less_than_one_sequence_is_an_error(models: dict[str, str]) -> None:
    found = run({"model_path": models["llama2-7b"], "max_model_len": 4096, "gpu_memory_gib": 16})
    assert "less than one max_model_len (4096) sequence" in one(found, "kv-memory", "error").message


def test_memory_source_order(models: dict[str, str]) -> None:
    launch = {"model_path": models["llama3-8b"], "max_model_len": 8192, "max_num_seqs": 8}
    assert "from the GPU list" in one(run(launch, gpus=A100_X4, gpu_memory_gib=80), "kv-memory").message
    own = run({**launch, "gpu_memory_gib": 48}, gpus=A100_X4)
    assert "48.0 GiB from launch.gpu_memory_gib" in one(own, "kv-memory").message
    assert "from --gpu-memory-gib" in one(run(launch, gpu_memory_gib=80), "kv-memory").message
    skipped = one(run(launch), "kv-memory", "info")
    assert "memory check skipped" in skipped.message


def test_default_max_num_seqs_follows_the_gpu(models: dict[str, str]) -> None:
    launch = {"model_path": models["llama3-8b"], "max_model_len": 8192}
    assert "max_num_seqs 1024" in one(run(launch, gpus=H100_X1), "kv-memory").message
    assert "max_num_seqs 256" in one(run(launch, gpus=A100_80_X2), "kv-memory").message


def test_moe_mla_model_fits_one_80gb_gpu(models: dict[str, str]) -> None:
    found = run({"model_path": models["deepseek-v2-lite"], "max_model_len": 32768, "max_num_seqs": 32},
                gpus=H100_X1)
    mem = one(found, "kv-memory", "info")
    assert "15.7B parameters" in mem.message and "30 KiB/token" in mem.message
    assert ids(found, "error") == set()


def test_gpu_count_against_cuda_visible_devices(models: dict[str, str]) -> None:
    base = {"model_path": models["llama3-8b"], "max_model_len": 8192, "tensor_parallel_size": 2}
    assert "lists 1" in one(run({**base, "cuda_visible_devices": "0"}), "gpu-count", "error").message
    assert "sit idle" in one(run({**base, "cuda_visible_devices": "0,1,2"}), "gpu-count", "warning").message
    pp = run({**base, "pipeline_parallel_size": 2, "cuda_visible_devices": "0,1,2,3"}, gpus=A100_X4)
    assert "gpu-count" not in ids(pp)
    assert "the GPU list (nvidia-smi) has 2" in one(run({**base, "tensor_parallel_size": 4}, gpus=A100_80_X2),
                                       "gpu-count", "error").message
    assert "GPU 5" in one(run({**base, "cuda_visible_devices": "0,5"}, gpus=A100_X4), "gpu-count").message


def test_mixed_gpus_in_one_group(models: dict[str, str]) -> None:
    inventory = "0, NVIDIA A100-SXM4-80GB, 81920\n1, NVIDIA A100-PCIE-40GB, 40960\n"
    found = run({"model_path": models["llama3-8b"], "max_model_len": 8192, "tensor_parallel_size": 2,
                 "cuda_visible_devices": "0,1"}, gpus=inventory)
    assert "smallest memory" in one(found, "gpu-mixed", "warning").message
    assert "CUDA_DEVICE_ORDER" in one(found, "gpu-order", "warning").message
    assert "40.0 GiB from the GPU list" in one(found, "kv-memory").message


@pytest.mark.parametrize(("devices", "nccl", "expect"), [
    ("0,2", {}, ["NCCL_P2P_DISABLE=1", "NCCL_TIMEOUT", "--distributed-timeout-seconds"]),  # across sockets
    ("0,1", {}, ["PHB", "NCCL_P2P_DISABLE=1"]),
    ("0,1", {"p2p_disable": True}, ["NCCL_TIMEOUT"]),
])
def test_nccl_advice_on_pcie(models: dict[str, str], devices: str, nccl: dict[str, Any],
                             expect: list[str]) -> None:
    found = run({"model_path": models["llama3-8b"], "max_model_len": 8192, "tensor_parallel_size": 2,
                 "cuda_visible_devices": devices, "nccl": nccl}, topo=TOPO_PCIE)
    warn = one(found, "nccl", "warning")
    assert all(e in warn.message for e in expect), warn.message
    if nccl:
        assert "NCCL_P2P_DISABLE" not in warn.message


def test_nccl_looks_inside_tensor_parallel_groups_only(models: dict[str, str]) -> None:
    base = {"model_path": models["llama3-8b"], "max_model_len": 8192, "cuda_visible_devices": "0,1,2,3"}
    found = run({**base, "tensor_parallel_size": 2, "pipeline_parallel_size": 2}, topo=TOPO_PCIE)
    assert "GPUs 0 and 1 are linked by PHB" in one(found, "nccl", "warning").message  # not 1-2 (SYS)
    assert "nccl" not in ids(run({**base, "pipeline_parallel_size": 4}, topo=TOPO_PCIE))


def test_nccl_timeout_flag_counts(models: dict[str, str]) -> None:
    found = run({"model_path": models["llama3-8b"], "max_model_len": 8192, "tensor_parallel_size": 2,
                 "cuda_visible_devices": "0,1", "nccl": {"p2p_disable": True},
                 "extra_args": ["--distributed-timeout-seconds", "1800"]}, topo=TOPO_PCIE)
    assert one(found, "nccl").severity == "info"


def test_nccl_settings_present_is_info(models: dict[str, str]) -> None:
    found = run({"model_path": models["llama3-8b"], "max_model_len": 8192, "tensor_parallel_size": 2,
                 "cuda_visible_devices": "1,2", "nccl": {"p2p_level": "SYS", "timeout": 1800}}, topo=TOPO_PCIE)
    assert one(found, "nccl").severity == "info"


def test_cpu_backend(models: dict[str, str], tmp_path: Path) -> None:
    tiny = {"model_path": models["tiny"], "device": "cpu", "dtype": "bfloat16", "max_model_len": 512,
            "extra_args": ["--kv-cache-memory-bytes", "67108864"]}
    found = run(tiny, gpus=A100_X4, topo=TOPO_PCIE)
    assert ids(found) == {"cpu-backend", "kv-memory", "tool-calling"}
    assert "65,536 tokens at 1024 bytes/token: 128 sequences" in one(found, "kv-memory", "info").message
    assert "GPU checks" in one(found, "cpu-backend").message
    head16 = write_model(tmp_path, "tiny16", {**TINY_LLAMA, "head_dim": 16, "num_attention_heads": 8,
                                              "num_key_value_heads": 8})
    err = one(run({**tiny, "model_path": head16}), "cpu-head-dim", "error")
    assert "head_dim 16" in err.message and "32, 64, 80" in err.message
    short = run({**tiny, "max_model_len": 2048, "extra_args": ["--kv-cache-memory-bytes", "1048576"]})
    assert "1024 tokens" in one(short, "kv-memory", "error").message


def test_tool_calling_note(models: dict[str, str]) -> None:
    tiny = {"model_path": models["tiny"], "device": "cpu", "max_model_len": 512}
    note = one(run(tiny), "tool-calling", "info")
    assert "--enable-auto-tool-choice" in note.message and "Claude Code" in note.message
    for extra in (["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"],
                  ["--tool-call-parser=hermes", "--enable-auto-tool-choice"]):
        assert "tool-calling" not in ids(run({**tiny, "extra_args": extra}))
    assert "tool-calling" in ids(run({**tiny, "extra_args": ["--enable-auto-tool-choice"]}), "info")


def test_hub_id_and_missing_paths(tmp_path: Path) -> None:
    hub = run({"model_path": "meta-llama/Meta-Llama-3-8B-Instruct", "max_model_len": 8192})
    assert ids(hub) == {"model-config", "tool-calling"}
    assert "not a local directory" in one(hub, "model-config", "info").message
    missing = run({"model_path": str(tmp_path / "gone")})
    assert "does not exist" in one(missing, "model-config", "error").message


def test_extra_args_that_duplicate_launch_fields(models: dict[str, str]) -> None:
    found = run({"model_path": models["llama3-8b"], "extra_args": ["--max-model-len=4096", "--enforce-eager"]},
                gpu_memory_gib=80)
    assert "launch.max_model_len" in one(found, "extra-args", "warning").message
    assert "max-model-len" not in ids(found)  # the flag's value is what vLLM gets
    assert "(4096-token)" in one(found, "kv-memory").message
    bad = run({"model_path": models["llama3-8b"], "max_model_len": 8192, "extra_args": ["-tp", "two"]})
    assert one(bad, "extra-args").severity == "error"


# -- across backends ---------------------------------------------------------------------------------

def test_duplicate_ports(models: dict[str, str]) -> None:
    a = {"model_path": models["llama3-8b"], "max_model_len": 8192, "cuda_visible_devices": "0"}
    b = {**a, "cuda_visible_devices": "1"}
    clash = run(a, b, urls=["http://127.0.0.1:8001", "http://localhost:8001/v1"])
    err = one(clash, "port-conflict", "error")
    assert err.upstream == ACROSS and "b0 and b1" in err.message
    wildcard = run(a, b, urls=["http://0.0.0.0:8001", "http://127.0.0.1:8001"])
    assert "port-conflict" in ids(wildcard, "error")
    assert "port-conflict" not in ids(run(a, b))


def test_gpus_shared_between_backends(models: dict[str, str]) -> None:
    a = {"model_path": models["llama3-8b"], "max_model_len": 8192, "tensor_parallel_size": 2,
         "cuda_visible_devices": "0,1"}
    b = {"model_path": models["llama3-8b"], "max_model_len": 8192, "cuda_visible_devices": "1"}
    err = one(run(a, b), "gpu-shared", "error")
    assert err.message.startswith("GPU 1 is used by b0 and b1") and "1.8" in err.message
    halves = run({**a, "gpu_memory_utilization": 0.45}, {**b, "gpu_memory_utilization": 0.45})
    assert one(halves, "gpu-shared").severity == "warning"
    implicit = one(run({"model_path": models["llama3-8b"], "max_model_len": 8192},
                       {"model_path": models["mistral-7b"], "max_model_len": 8192}), "gpu-shared", "error")
    assert "set no cuda_visible_devices" in implicit.message
    cpu = {**b, "device": "cpu", "model_path": models["tiny"], "max_model_len": 512}
    assert "gpu-shared" not in ids(run(a, cpu))


def test_no_launch_sections() -> None:
    cfg = GatewayConfig.model_validate({"models": [{"id": "m", "upstreams": [
        {"url": "http://127.0.0.1:8001", "model": "x"}]}]})
    assert [f.check for f in diagnose(cfg)] == ["no-launch"]


# -- the command -------------------------------------------------------------------------------------

def write_config(tmp_path: Path, launch: dict[str, Any]) -> str:
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps({"models": [{"id": "llama-3-8b", "upstreams": [
        {"name": "gpu01", "url": "http://127.0.0.1:8001/v1", "model": "llama", "launch": launch}]}]}))
    return str(path)


@pytest.fixture
def machine(tmp_path: Path) -> list[str]:
    (tmp_path / "gpus.txt").write_text(A100_X4)
    (tmp_path / "topo.txt").write_text(TOPO_PCIE)
    return ["--gpus-file", str(tmp_path / "gpus.txt"), "--topo-file", str(tmp_path / "topo.txt")]


def test_cli_errors_exit_1_grouped_by_upstream(models: dict[str, str], tmp_path: Path, machine: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    config = write_config(tmp_path, {"model_path": models["qwen2-7b"], "tensor_parallel_size": 8})
    assert main(["doctor", "--config", config, *machine]) == 1
    out = capsys.readouterr().out
    assert "gpu01 (model llama-3-8b, http://127.0.0.1:8001, TP 8)" in out
    assert "  ERROR tp-heads: tensor_parallel_size 8 does not divide num_attention_heads 28" in out
    assert "  warn  max-model-len:" in out
    assert out.rstrip().endswith("FAIL: fix the errors before starting the backends")


def test_cli_warnings_only_exit_0(models: dict[str, str], tmp_path: Path, machine: list[str],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    config = write_config(tmp_path, {"model_path": models["llama3-8b"], "tensor_parallel_size": 2,
                                     "cuda_visible_devices": "0,1", "max_model_len": 8192})
    assert main(["doctor", "--config", config, *machine]) == 0
    out = capsys.readouterr().out
    assert "warn  nccl: GPUs 0 and 1 are linked by PHB" in out
    assert out.rstrip().endswith(": OK")


def test_cli_json_and_env_config(models: dict[str, str], tmp_path: Path, machine: list[str],
                                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    config = write_config(tmp_path, {"model_path": models["llama3-70b"], "tensor_parallel_size": 2,
                                     "max_model_len": 8192})
    monkeypatch.setenv("GATEWAY_CONFIG", config)
    assert main(["doctor", "--json", *machine]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["config"] == config and report["errors"] == 1
    assert report["gpus"][0] == {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [(f["upstream"], f["check"]) for f in errors] == [("gpu01", "kv-memory")]
    assert "weights alone do not fit" in errors[0]["message"]


def test_cli_gpu_memory_flag_without_inventory(models: dict[str, str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    (tmp_path / "topo.txt").write_text(TOPO_NVLINK)  # a file given: nvidia-smi is not run at all
    config = write_config(tmp_path, {"model_path": models["llama3-8b"], "max_model_len": 8192,
                                     "max_num_seqs": 16})
    rc = main(["doctor", "--config", config, "--topo-file", str(tmp_path / "topo.txt"), "--gpu-memory-gib", "80"])
    out = capsys.readouterr().out
    assert rc == 0 and "GPUs: none (no --gpus-file)" in out and "80.0 GiB from --gpu-memory-gib" in out


def test_cli_unreadable_inputs_exit_2(tmp_path: Path, machine: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - id: m\n    upstreams:\n      - url: http://h:1\n        model: m\n"
                   "        launch: {model_path: /m, tensor_parallel_size: 0}\n")
    assert main(["doctor", "--config", str(bad), *machine]) == 2
    assert "tensor_parallel_size" in capsys.readouterr().err
    good = write_config(tmp_path, {"model_path": "org/model"})
    (tmp_path / "gpus.txt").write_text("GPU 0: NVIDIA A100 (UUID: GPU-x)\n")
    assert main(["doctor", "--config", good, *machine]) == 2
    assert "gpus.txt: line 1" in capsys.readouterr().err
