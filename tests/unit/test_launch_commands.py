"""gateway.launch.commands: the exact vLLM command line and environment (pure)."""

from __future__ import annotations

import shlex

import pytest

from gateway.config import UpstreamSpec, parse_config
from gateway.launch.commands import (
    API_KEY_ENV,
    API_SERVER_MODULE,
    CPU_ENV,
    MASK,
    LaunchError,
    build_command,
    nccl_env,
)

FULL = """
models:
  - id: qwen
    upstreams:
      - name: qwen-a
        url: http://10.0.0.5:8001/v1/
        model: qwen2.5-7b
        api_key: sk-backend-secret
        launch:
          model_path: /models/Qwen2.5-7B-Instruct
          python: /opt/vllm/bin/python
          tensor_parallel_size: 2
          pipeline_parallel_size: 1
          dtype: bfloat16
          quantization: awq
          max_model_len: 8192
          gpu_memory_utilization: 0.9
          max_num_seqs: 64
          enable_chunked_prefill: true
          enforce_eager: true
          cuda_visible_devices: "0, 1"
          nccl: {p2p_disable: true, timeout: 1200, ib_disable: false, socket_ifname: eth0,
                 debug: INFO, p2p_level: PIX}
          env: {VLLM_LOGGING_LEVEL: DEBUG}
          extra_args: ["--swap-space", "8", "--disable-log-stats"]
          startup_timeout_s: 1200
"""


def _upstream(yaml_text: str, env: dict[str, str] | None = None) -> UpstreamSpec:
    cfg = parse_config(yaml_text, env or {})
    return cfg.upstreams()[0][1]


def _one(launch: str, *, key: str | None = "sk-b", url: str = "http://127.0.0.1:8011") -> UpstreamSpec:
    key_line = f"        api_key: {key}\n" if key is not None else ""
    text = (
        "models:\n  - id: m\n    upstreams:\n"
        f"      - url: {url}\n        model: tiny\n{key_line}"
        "        launch:\n" + "".join(f"          {line}\n" for line in launch.strip().splitlines())
    )
    return _upstream(text)


def test_full_argv_is_exact_and_carries_no_secret() -> None:
    cmd = build_command(_upstream(FULL))
    assert cmd.argv == (
        "/opt/vllm/bin/python", "-m", API_SERVER_MODULE,
        "--model", "/models/Qwen2.5-7B-Instruct",
        "--served-model-name", "qwen2.5-7b",
        "--host", "10.0.0.5",
        "--port", "8001",
        "--tensor-parallel-size", "2",
        "--dtype", "bfloat16",
        "--quantization", "awq",
        "--max-model-len", "8192",
        "--gpu-memory-utilization", "0.9",
        "--max-num-seqs", "64",
        "--enable-chunked-prefill",
        "--enforce-eager",
        "--swap-space", "8", "--disable-log-stats",
    )
    assert not any("sk-backend-secret" in a for a in cmd.argv)
    assert "--api-key" not in cmd.argv
    assert cmd.env[API_KEY_ENV] == "sk-backend-secret"
    assert cmd.secret_env == frozenset({API_KEY_ENV})
    assert cmd.name == "qwen-a"
    assert (cmd.host, cmd.port, cmd.url) == ("10.0.0.5", 8001, "http://10.0.0.5:8001")
    assert cmd.startup_timeout_s == 1200
    assert cmd.log_file == "var/log/qwen-a.log"


def test_cuda_environment_has_devices_and_nccl_but_no_offline_defaults() -> None:
    cmd = build_command(_upstream(FULL))
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert cmd.env["NCCL_P2P_DISABLE"] == "1"
    assert cmd.env["NCCL_IB_DISABLE"] == "0"
    assert cmd.env["NCCL_TIMEOUT"] == "1200"
    assert cmd.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert cmd.env["NCCL_DEBUG"] == "INFO"
    assert cmd.env["NCCL_P2P_LEVEL"] == "PIX"
    assert cmd.env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert "HF_HUB_OFFLINE" not in cmd.env


def test_minimal_cpu_launch() -> None:
    cmd = build_command(_one("model_path: var/tiny-model\npython: .venv-vllm/bin/python\ndevice: cpu"))
    assert cmd.argv == (
        ".venv-vllm/bin/python", "-m", API_SERVER_MODULE,
        "--model", "var/tiny-model", "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", "8011",
        "--tensor-parallel-size", "1",  # dtype "auto" is vLLM's default: not repeated
    )
    for k, v in CPU_ENV.items():
        assert cmd.env[k] == v
    assert cmd.env["HF_HUB_OFFLINE"] == "1"
    assert cmd.env["VLLM_NO_USAGE_STATS"] == "1"
    assert cmd.name == "m-0"  # the default upstream name


@pytest.mark.parametrize(
    ("value", "flag"),
    [("true", "--enable-chunked-prefill"), ("false", "--no-enable-chunked-prefill")],
)
def test_chunked_prefill_flag_spelling(value: str, flag: str) -> None:
    cmd = build_command(_one(f"model_path: m\nenable_chunked_prefill: {value}"))
    assert flag in cmd.argv
    assert sum("chunked-prefill" in a for a in cmd.argv) == 1


def test_optional_flags_absent_when_unset() -> None:
    cmd = build_command(_one("model_path: m"))
    for flag in ("--quantization", "--max-model-len", "--gpu-memory-utilization", "--max-num-seqs",
                 "--enforce-eager", "--pipeline-parallel-size", "--enable-chunked-prefill",
                 "--no-enable-chunked-prefill"):
        assert flag not in cmd.argv


def test_pipeline_parallel_and_float_formatting() -> None:
    cmd = build_command(_one("model_path: m\npipeline_parallel_size: 2\ngpu_memory_utilization: 1"))
    i = cmd.argv.index("--pipeline-parallel-size")
    assert cmd.argv[i + 1] == "2"
    assert cmd.argv[cmd.argv.index("--gpu-memory-utilization") + 1] == "1"


def test_extra_args_come_last() -> None:
    cmd = build_command(_one('model_path: m\nenforce_eager: true\nextra_args: ["--kv-cache-memory-bytes", "1"]'))
    assert cmd.argv[-3:] == ("--enforce-eager", "--kv-cache-memory-bytes", "1")


def test_no_key_unsets_an_inherited_vllm_api_key() -> None:
    cmd = build_command(_one("model_path: m", key=None))
    assert API_KEY_ENV not in cmd.env
    assert cmd.unset == (API_KEY_ENV,)
    assert cmd.secret_env == frozenset()
    child = cmd.child_env({"PATH": "/bin", API_KEY_ENV: "stray", "HOME": "/root"})
    assert API_KEY_ENV not in child
    assert child["PATH"] == "/bin"
    assert "--api-key" not in cmd.render()


def test_child_env_overrides_the_base() -> None:
    cmd = build_command(_one("model_path: m\ndevice: cpu"))
    child = cmd.child_env({"HF_HUB_OFFLINE": "0", "PATH": "/usr/bin", API_KEY_ENV: "old"})
    assert child["HF_HUB_OFFLINE"] == "1"
    assert child[API_KEY_ENV] == "sk-b"
    assert child["PATH"] == "/usr/bin"


def test_launch_env_overrides_cpu_defaults() -> None:
    cmd = build_command(_one("model_path: m\ndevice: cpu\nenv: {HF_HUB_OFFLINE: '0', OMP_NUM_THREADS: '2'}"))
    assert cmd.env["HF_HUB_OFFLINE"] == "0"
    assert cmd.env["OMP_NUM_THREADS"] == "2"


def test_key_in_launch_env_is_refused() -> None:
    with pytest.raises(LaunchError, match="api_key"):
        build_command(_one("model_path: m\nenv: {VLLM_API_KEY: x}"))


def test_conflicting_cuda_devices_are_refused() -> None:
    with pytest.raises(LaunchError, match="CUDA_VISIBLE_DEVICES"):
        build_command(_one("model_path: m\ncuda_visible_devices: '0'\nenv: {CUDA_VISIBLE_DEVICES: '1'}"))
    same = build_command(_one("model_path: m\ncuda_visible_devices: '0,1'\nenv: {CUDA_VISIBLE_DEVICES: '0, 1'}"))
    assert same.env["CUDA_VISIBLE_DEVICES"] == "0, 1"


def test_conflicting_nccl_is_refused() -> None:
    with pytest.raises(LaunchError, match="NCCL_TIMEOUT"):
        build_command(_one("model_path: m\nnccl: {timeout: 60}\nenv: {NCCL_TIMEOUT: '120'}"))


def test_upstream_without_launch_is_an_error() -> None:
    up = UpstreamSpec(url="http://127.0.0.1:1", model="x", name="plain")
    with pytest.raises(LaunchError, match="no `launch:` section"):
        build_command(up)


def test_port_defaults_from_scheme() -> None:
    assert build_command(_one("model_path: m", url="http://gpu-box")).port == 80
    assert build_command(_one("model_path: m", url="https://gpu-box")).port == 443


def test_log_file_default_and_override() -> None:
    assert build_command(_one("model_path: m"), log_dir="/tmp/logs/").log_file == "/tmp/logs/m-0.log"
    cmd = build_command(_one("model_path: m\nlog_file: /srv/vllm.log"), log_dir="/tmp/logs")
    assert cmd.log_file == "/srv/vllm.log"


def test_nccl_env_only_set_fields() -> None:
    from gateway.config import NcclSpec

    assert nccl_env(NcclSpec()) == {}
    assert nccl_env(NcclSpec(p2p_disable=False)) == {"NCCL_P2P_DISABLE": "0"}


def _parse_render(text: str) -> tuple[list[str], list[str]]:
    """(comment/export/unset lines, the command's words with env assignments first)."""
    head = [ln for ln in text.splitlines() if ln.startswith(("#", "export ", "unset "))]
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith(("#", "export ", "unset ")))
    return head, shlex.split(body.replace("\\\n", " "))


def test_render_masks_the_key_and_matches_argv() -> None:
    cmd = build_command(_upstream(FULL))
    text = cmd.render()
    assert "sk-backend-secret" not in text
    head, words = _parse_render(text)
    assert f"export {API_KEY_ENV}='{MASK}'  # masked; --show-secrets prints it" in head
    assignments = [w for w in words if "=" in w and not w.startswith("-")]
    rest = words[len(assignments):]
    assert dict(a.split("=", 1) for a in assignments) == {k: v for k, v in cmd.env.items() if k != API_KEY_ENV}
    assert tuple(rest[:-2]) == cmd.argv
    assert rest[-2:] == ["--api-key", "$VLLM_API_KEY"]
    assert '--api-key "$VLLM_API_KEY"' in text


def test_render_show_secrets() -> None:
    text = build_command(_upstream(FULL)).render(show_secrets=True)
    assert f"export {API_KEY_ENV}=sk-backend-secret" in text
    assert MASK not in text


def test_render_quotes_awkward_values() -> None:
    up = _one("model_path: \"/models/my model\"\nenv: {NOTE: \"a b'c\"}")
    _head, words = _parse_render(build_command(up).render())
    assert "NOTE=a b'c" in words
    assert words[words.index("--model") + 1] == "/models/my model"


def test_unset_is_rendered() -> None:
    text = build_command(_one("model_path: m", key=None)).render()
    assert f"unset {API_KEY_ENV}" in text


def test_bind_host_defaults_to_the_url_host() -> None:
    cmd = build_command(_one("model_path: m", url="http://10.0.0.7:9000/v1"))
    assert cmd.argv[cmd.argv.index("--host") + 1] == "10.0.0.7"
    assert cmd.local_url == cmd.url == "http://10.0.0.7:9000"


def test_wildcard_bind_is_polled_over_loopback() -> None:
    cmd = build_command(_one("model_path: m\nhost: 0.0.0.0", url="http://vllm-a:8001"))
    assert cmd.argv[cmd.argv.index("--host") + 1] == "0.0.0.0"
    assert cmd.host == "0.0.0.0"
    assert cmd.url == "http://vllm-a:8001"  # the gateway's view is unchanged
    assert cmd.local_url == "http://127.0.0.1:8001"
    v6 = build_command(_one("model_path: m\nhost: '::'", url="http://vllm-a:8001"))
    assert v6.local_url == "http://[::1]:8001"


def test_specific_bind_address_is_polled_there() -> None:
    cmd = build_command(_one("model_path: m\nhost: 10.1.2.3", url="http://gpu-box.internal:8001"))
    assert cmd.local_url == "http://10.1.2.3:8001"
