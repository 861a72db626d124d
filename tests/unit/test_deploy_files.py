"""The deployment files under deploy/ agree with deploy/config.yaml and with each other.

Pure checks: the files are parsed (YAML, env files, systemd units, the Dockerfile), nothing is
built or started. What is checked, per upstream of deploy/config.yaml that has a ``launch:``:

- docker-compose.yml and k8s/: a service / Service named like the upstream URL's host, on its port;
  vLLM flags equal to the ``launch:`` section (served name = upstream.model, tensor parallel size,
  max-model-len, ...); GPUs reserved = tensor_parallel_size x pipeline_parallel_size; NCCL variables
  as ``launch.nccl`` renders them; /dev/shm and ulimits for NCCL; health checks on /health;
- systemd: the vllm@.service ExecStart expanded with each vllm-<name>.env.example gives the same flags;
- secrets: keys only by reference (``${VAR}``, secretKeyRef, VLLM_API_KEY env), placeholders only in
  the example files, no key-looking string anywhere, never ``--api-key`` in an argv;
- the gateway: /health/ready readiness, non-root, the ConfigMap holds deploy/config.yaml verbatim,
  and the config loads with deploy/.env.example (and with the systemd gateway.env.example).
"""

from __future__ import annotations

import configparser
import fnmatch
import json
import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.config import GatewayConfig, LaunchSpec, UpstreamSpec, load_config
from gateway.launch import commands

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
CONFIG = DEPLOY / "config.yaml"
ENV_EXAMPLE = DEPLOY / ".env.example"

API_SERVER = "vllm.entrypoints.openai.api_server"
SECRET_NAME_RE = re.compile(r"(API_KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)
PLACEHOLDER_RE = re.compile(r"^(CHANGE_ME|REPLACE_ME)[A-Za-z0-9_.-]*$")
ZERO_HASH = "0" * 64
ENV_REF_RE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")  # a whole value that is one ${VAR}
ANY_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?][^}]*)?\}")


# ---------------------------------------------------------------------------------------------
# Readers


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (docker env_file / systemd EnvironmentFile subset); comments and blanks skipped."""
    env: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert "=" in line, f"{path.name}:{n}: not KEY=VALUE: {line!r}"
        key, value = line.split("=", 1)
        key, value = key.strip(), value.strip()
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"{path.name}:{n}: bad name {key!r}"
        assert key not in env, f"{path.name}:{n}: {key} set twice"
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


def yaml_docs(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def compose_interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?err}`` (error: unset)."""

    def repl(m: re.Match[str]) -> str:
        name, tail = m.group(1), m.group(2) or ""
        if tail.startswith((":-", "-")):
            default = tail.split("-", 1)[1]
            value = env.get(name)
            return default if value is None or (tail.startswith(":") and not value) else value
        assert env.get(name), f"compose needs ${{{name}}}, which is not set"
        return env[name]

    return ANY_REF_RE.sub(repl, text)


def parse_flags(argv: list[str]) -> dict[str, str | bool]:
    """``--a=1 --b 2 --c`` -> ``{"--a": "1", "--b": "2", "--c": True}``; a flag given twice fails."""
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        value: str | bool
        assert tok.startswith("--"), f"positional argument {tok!r} in a vLLM command line: {argv}"
        if "=" in tok:
            name, value = tok.split("=", 1)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            name, value = tok, argv[i + 1]
            i += 2
        else:
            name, value = tok, True
            i += 1
        assert name not in flags, f"{name} given twice in {argv}"
        flags[name] = value
    return flags


def normalized(flags: Mapping[str, str | bool]) -> dict[str, str | bool | float]:
    out: dict[str, str | bool | float] = {}
    for k, v in flags.items():
        if isinstance(v, bool):
            out[k] = v
            continue
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def expected_flags(u: UpstreamSpec) -> dict[str, str | bool]:
    """The vLLM flags (except --host) that `gateway backends command` derives from the launch section."""
    assert u.launch is not None
    flags = parse_flags(commands.vllm_args(u, u.launch))
    flags.pop("--host")
    return flags


def gpu_count(launch: LaunchSpec) -> int:
    return launch.tensor_parallel_size * launch.pipeline_parallel_size


def assert_backend_flags(where: str, argv: list[str], u: UpstreamSpec) -> dict[str, str | bool]:
    """``argv`` (the flags after the api_server module) stands for exactly the upstream's launch."""
    assert "--api-key" not in {a.split("=", 1)[0] for a in argv}, f"{where}: a key in argv (use VLLM_API_KEY)"
    flags = parse_flags(argv)
    assert "--host" in flags, f"{where}: no --host"
    got = {k: v for k, v in flags.items() if k != "--host"}
    assert normalized(got) == normalized(expected_flags(u)), (
        f"{where}: vLLM flags differ from upstream {u.name!r}'s launch section in deploy/config.yaml"
    )
    return flags


def assert_backend_env(where: str, env: Mapping[str, str], u: UpstreamSpec) -> None:
    launch = u.launch
    assert launch is not None
    got_nccl = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    assert got_nccl == commands.nccl_env(launch.nccl), (
        f"{where}: NCCL_* variables differ from launch.nccl of {u.name!r}")
    for k, v in launch.env.items():
        assert env.get(k) == v, f"{where}: {k}={v!r} from launch.env of {u.name!r} is missing"


def after_module(cmd: list[str], where: str) -> list[str]:
    assert API_SERVER in cmd, f"{where}: does not start {API_SERVER}: {cmd}"
    return cmd[cmd.index(API_SERVER) + 1 :]


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    return read_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def config(env_example: dict[str, str]) -> GatewayConfig:
    return load_config(CONFIG, env_example)


@pytest.fixture(scope="module")
def raw_config() -> dict[str, Any]:
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def launched(config: GatewayConfig) -> list[UpstreamSpec]:
    ups = [u for _, u in config.upstreams() if u.launch is not None]
    assert ups, "deploy/config.yaml has no upstream with a launch section"
    return ups


@pytest.fixture(scope="module")
def api_key_vars(raw_config: dict[str, Any]) -> dict[str, str]:
    """Upstream name -> the environment variable its api_key comes from."""
    out: dict[str, str] = {}
    for m in raw_config["models"]:
        for i, u in enumerate(m["upstreams"]):
            name = u.get("name") or f"{m['id']}-{i}"
            m_ref = ENV_REF_RE.match(str(u.get("api_key", "")))
            assert m_ref, f"upstream {name}: api_key must be exactly ${{VAR}} (no literal, no default)"
            out[name] = m_ref.group(1)
    return out


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object, over every manifest under deploy/k8s (kustomization excluded)."""
    objs: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml_docs(path):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in objs, f"{path.name}: {key} defined twice"
            objs[key] = doc
    return objs


@pytest.fixture(scope="module")
def k8s_secret(k8s: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    secrets = [o for (kind, _), o in k8s.items() if kind == "Secret"]
    assert len(secrets) == 1, "expected one Secret template in deploy/k8s"
    return secrets[0]


def only_container(dep: dict[str, Any]) -> dict[str, Any]:
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{dep['metadata']['name']}: expected one container"
    c: dict[str, Any] = containers[0]
    return c


def container_env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def service_for(k8s: Mapping[tuple[str, str], dict[str, Any]], dep: dict[str, Any]) -> list[dict[str, Any]]:
    labels = dep["spec"]["template"]["metadata"]["labels"]
    return [
        o for (kind, _), o in k8s.items()
        if kind == "Service" and all(labels.get(k) == v for k, v in o["spec"]["selector"].items())
    ]


def resolve_target_port(c: dict[str, Any], target: int | str) -> int:
    if isinstance(target, int):
        return target
    for p in c.get("ports", []):
        if p.get("name") == target:
            port: int = p["containerPort"]
            return port
    raise AssertionError(f"no container port named {target!r}")


# ---------------------------------------------------------------------------------------------
# Every file parses; the config loads


def _deploy_yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


@pytest.mark.parametrize("path", _deploy_yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    docs = yaml_docs(path)
    assert docs, f"{path} is empty"
    assert all(isinstance(d, dict) for d in docs)


def test_config_loads_with_env_example(config: GatewayConfig, env_example: dict[str, str]) -> None:
    assert config.models
    needed = {m.group(1) for m in ANY_REF_RE.finditer(CONFIG.read_text()) if not m.group(2)}
    missing = needed - env_example.keys()
    assert not missing, f"deploy/.env.example lacks {sorted(missing)}"


def test_config_references_no_secret_in_clear(raw_config: dict[str, Any], api_key_vars: dict[str, str]) -> None:
    for var in api_key_vars.values():
        assert SECRET_NAME_RE.search(var), var
    for k in raw_config.get("keys", []):
        assert "key" not in k, f"key {k['name']}: a clear key in the config; use key_sha256"
        value = str(k["key_sha256"])
        assert ENV_REF_RE.match(value) or re.fullmatch(r"[0-9a-f]{64}", value), k["name"]


def test_launch_sections_are_self_consistent(launched: list[UpstreamSpec]) -> None:
    used: dict[str, str] = {}
    for u in launched:
        assert u.launch is not None and u.launch.cuda_visible_devices
        devices = u.launch.cuda_visible_devices.split(",")
        assert len(devices) == gpu_count(u.launch), f"{u.name}: cuda_visible_devices vs parallel size"
        for d in devices:
            assert d not in used, f"GPU {d} given to both {used[d]} and {u.name}"
            used[d] = str(u.name)
        assert u.host == f"vllm-{u.name}", f"{u.name}: url host should be the service name vllm-{u.name}"


# ---------------------------------------------------------------------------------------------
# docker compose


def test_compose_interpolation_is_covered_by_env_example(env_example: dict[str, str]) -> None:
    text = (DEPLOY / "docker-compose.yml").read_text(encoding="utf-8")
    required = {m.group(1) for m in ANY_REF_RE.finditer(text) if not (m.group(2) or "").lstrip(":").startswith("-")}
    missing = required - env_example.keys()
    assert not missing, f"docker-compose.yml needs {sorted(missing)}, absent from .env.example"


def test_compose_vllm_services_match_launch(
    compose: dict[str, Any], launched: list[UpstreamSpec], api_key_vars: dict[str, str],
    env_example: dict[str, str],
) -> None:
    services = compose["services"]
    vllm_services = {n for n, s in services.items() if "vllm/vllm-openai" in str(s.get("image", ""))}
    assert vllm_services == {u.host for u in launched}, "compose vLLM services vs upstream URL hosts"
    for u in launched:
        assert u.launch is not None
        where = f"docker-compose.yml:{u.host}"
        svc = services[u.host]
        entry = [str(a) for a in svc["entrypoint"]]
        cmd = [str(a) for a in svc["command"]]
        assert entry[-1] == API_SERVER, f"{where}: entrypoint {entry}"
        flags = assert_backend_flags(where, cmd, u)
        assert flags["--host"] == "0.0.0.0", f"{where}: vLLM must listen on all container interfaces"
        assert str(u.port) in [str(p) for p in svc.get("expose", [])], f"{where}: port {u.port} not exposed"

        env = {k: str(v) for k, v in svc["environment"].items()}
        assert_backend_env(where, env, u)
        assert "CUDA_VISIBLE_DEVICES" not in env, f"{where}: the container renumbers its GPUs from 0"
        key_ref = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:\?[^}]*)?\}", env.get("VLLM_API_KEY", ""))
        assert key_ref and key_ref.group(1) == api_key_vars[str(u.name)], (
            f"{where}: VLLM_API_KEY must be ${{{api_key_vars[str(u.name)]}}}, the var the gateway sends"
        )

        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1 and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        ids = [str(i) for i in devices[0]["device_ids"]]
        assert len(ids) == gpu_count(u.launch), f"{where}: {len(ids)} GPUs reserved for TP x PP"
        assert ids == (u.launch.cuda_visible_devices or "").split(","), f"{where}: device_ids vs launch"

        assert svc.get("ipc") == "host" or svc.get("shm_size"), f"{where}: needs ipc: host or shm_size"
        ulimits = svc["ulimits"]
        assert ulimits["nofile"] == {"soft": 65536, "hard": 65536}, where
        assert ulimits["memlock"] == {"soft": -1, "hard": -1}, where

        mounts = [compose_interpolate(str(v), env_example).split(":") for v in svc["volumes"]]
        assert any(
            u.launch.model_path.startswith(m[1].rstrip("/") + "/") and m[-1] == "ro" for m in mounts
        ), f"{where}: no read-only volume holds {u.launch.model_path}"

        check = " ".join(str(t) for t in svc["healthcheck"]["test"])
        assert f":{u.port}/health'" in check or f":{u.port}/health\"" in check, f"{where}: healthcheck {check}"

        image = compose_interpolate(str(svc["image"]), env_example)
        assert image.startswith("vllm/vllm-openai:"), image


def test_compose_gateway(compose: dict[str, Any], launched: list[UpstreamSpec]) -> None:
    services = compose["services"]
    gw = services["gateway"]
    build = gw["build"]
    assert (DEPLOY / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    assert ".env" in gw["env_file"]

    check = " ".join(str(t) for t in gw["healthcheck"]["test"])
    assert "/health/ready" in check, "the gateway's compose healthcheck must use /health/ready"

    deps = gw["depends_on"]
    assert deps["redis"]["condition"] == "service_healthy", "gateway must wait for its own Redis"
    assert "healthcheck" in services["redis"]
    for name in (u.host for u in launched):
        # Readiness is the gateway's own: one vLLM that never turns healthy must not keep the
        # gateway (and every other model) down.
        assert deps[name]["condition"] == "service_started", f"gateway must not wait for {name} to be healthy"
        assert "healthcheck" in services[name], f"{name} has no healthcheck"

    env = {k: str(v) for k, v in gw["environment"].items()}
    redis_url = urlsplit(env["GATEWAY_REDIS_URL"])
    assert redis_url.scheme == "redis" and redis_url.hostname in services
    assert env["GATEWAY_HOST"] == "0.0.0.0"
    assert not any(SECRET_NAME_RE.search(k) for k in env), "secrets belong in .env, not in compose"
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in gw["volumes"]}
    assert mounts.get(env["GATEWAY_CONFIG"]) == "./config.yaml", "compose must mount deploy/config.yaml"


# ---------------------------------------------------------------------------------------------
# Kubernetes


def test_k8s_kustomization_lists_every_manifest_but_the_secret_template() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = set(kust["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    secrets = {p.name for p in K8S.glob("*.yaml") if any(d.get("kind") == "Secret" for d in yaml_docs(p))}
    assert listed == on_disk - secrets, "kustomization.yaml resources vs the files in deploy/k8s"
    assert all(d["metadata"].get("namespace") == kust["namespace"]
               for p in on_disk if p != "namespace.yaml" for d in yaml_docs(K8S / p))


def test_k8s_configmap_is_deploy_config(k8s: dict[tuple[str, str], dict[str, Any]]) -> None:
    cm = k8s[("ConfigMap", "vllm-gateway-config")]
    assert cm["data"]["config.yaml"] == CONFIG.read_text(encoding="utf-8"), (
        "deploy/k8s/configmap.yaml differs from deploy/config.yaml (regenerate it, see its header)"
    )


def test_k8s_secret_has_placeholders_only(k8s_secret: dict[str, Any], env_example: dict[str, str]) -> None:
    assert "data" not in k8s_secret, "the template must use stringData placeholders, not base64 data"
    values = k8s_secret["stringData"]
    assert values
    for k, v in values.items():
        assert_placeholder(f"k8s Secret {k}", k, str(v))
    assert set(values) <= env_example.keys(), "--from-env-file=deploy/.env must give the same keys"


def test_k8s_vllm_deployments_match_launch(
    k8s: dict[tuple[str, str], dict[str, Any]], launched: list[UpstreamSpec], api_key_vars: dict[str, str],
    k8s_secret: dict[str, Any],
) -> None:
    vllm_deps = {
        name for (kind, name), o in k8s.items()
        if kind == "Deployment" and "vllm/vllm-openai" in str(only_container(o)["image"])
    }
    assert len(vllm_deps) == len(launched)
    for u in launched:
        assert u.launch is not None
        svc = k8s.get(("Service", u.host))
        assert svc is not None, f"no k8s Service named {u.host} (the host of {u.url})"
        ports = [p for p in svc["spec"]["ports"] if p["port"] == u.port]
        assert ports, f"Service {u.host} does not listen on {u.port}"
        deps = [
            o for (kind, _), o in k8s.items()
            if kind == "Deployment" and svc in service_for(k8s, o)
        ]
        assert len(deps) == 1, f"Service {u.host} must select exactly one Deployment"
        dep = deps[0]
        where = f"k8s Deployment {dep['metadata']['name']}"
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate", where
        c = only_container(dep)
        cmd = [str(a) for a in (*c.get("command", []), *c.get("args", []))]
        flags = assert_backend_flags(where, after_module(cmd, where), u)
        assert flags["--host"] == "0.0.0.0", where
        assert resolve_target_port(c, ports[0]["targetPort"]) == u.port == int(str(flags["--port"])), where

        limits = c["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == gpu_count(u.launch), f"{where}: GPU limit vs TP x PP"
        requests = c["resources"].get("requests", {})
        assert int(requests.get("nvidia.com/gpu", limits["nvidia.com/gpu"])) == gpu_count(u.launch), where

        env = container_env(c)
        key = env["VLLM_API_KEY"]
        assert "value" not in key, f"{where}: VLLM_API_KEY in clear"
        ref = key["valueFrom"]["secretKeyRef"]
        assert ref["name"] == k8s_secret["metadata"]["name"], where
        assert ref["key"] == api_key_vars[str(u.name)], f"{where}: key of another upstream"
        assert ref["key"] in k8s_secret["stringData"], f"{where}: Secret template lacks {ref['key']}"
        assert_backend_env(where, {k: str(e["value"]) for k, e in env.items() if "value" in e}, u)
        assert "CUDA_VISIBLE_DEVICES" not in env, f"{where}: the device plugin picks the GPUs"

        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        shm = volumes[mounts["/dev/shm"]]
        assert shm["emptyDir"]["medium"] == "Memory", f"{where}: /dev/shm must be a Memory emptyDir"
        model_mounts = [p for p in mounts if u.launch.model_path.startswith(p.rstrip("/") + "/")]
        assert model_mounts, f"{where}: nothing mounted where {u.launch.model_path} lives"

        ready = c["readinessProbe"]["httpGet"]
        assert ready["path"] == "/health"
        assert resolve_target_port(c, ready["port"]) == u.port
        startup = c.get("startupProbe")
        if startup is not None:
            budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
            assert startup["httpGet"]["path"] == "/health"
        else:
            budget = c["readinessProbe"].get("initialDelaySeconds", 0)
        assert budget >= 300, f"{where}: model loading needs a long startupProbe / initialDelay ({budget}s)"


def test_k8s_gateway(
    k8s: dict[tuple[str, str], dict[str, Any]], k8s_secret: dict[str, Any], env_example: dict[str, str],
) -> None:
    dep = k8s[("Deployment", "vllm-gateway")]
    spec = dep["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    c = only_container(dep)
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["resources"]["requests"] and c["resources"]["limits"]

    pod_sc, c_sc = pod.get("securityContext", {}), c.get("securityContext", {})
    assert pod_sc.get("runAsNonRoot") is True or c_sc.get("runAsNonRoot") is True
    assert c_sc.get("runAsUser", pod_sc.get("runAsUser")) not in (None, 0)
    assert c_sc.get("allowPrivilegeEscalation") is False

    env = container_env(c)
    redis_url = urlsplit(env["GATEWAY_REDIS_URL"]["value"])
    redis_svc = k8s.get(("Service", redis_url.hostname or ""))
    assert redis_svc is not None, "GATEWAY_REDIS_URL must name a Service"
    assert redis_url.port in [p["port"] for p in redis_svc["spec"]["ports"]]

    # Every ${VAR} the config needs is given, and every secret-looking one only from the Secret.
    needed = {m.group(1) for m in ANY_REF_RE.finditer(CONFIG.read_text()) if not m.group(2)}
    assert needed <= env.keys(), f"gateway Deployment lacks {sorted(needed - env.keys())}"
    for name, e in env.items():
        if SECRET_NAME_RE.search(name) or "SHA256" in name:
            assert "value" not in e, f"gateway env {name} in clear"
            ref = e["valueFrom"]["secretKeyRef"]
            assert ref["name"] == k8s_secret["metadata"]["name"] and ref["key"] in k8s_secret["stringData"]

    config_dir = str(Path(env["GATEWAY_CONFIG"]["value"]).parent)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[config_dir]]["configMap"]["name"] == "vllm-gateway-config"

    svc = service_for(k8s, dep)
    assert len(svc) == 1
    assert resolve_target_port(c, svc[0]["spec"]["ports"][0]["targetPort"]) == 8080
    assert "--host" in c["args"] and c["args"][c["args"].index("--host") + 1] == "0.0.0.0"


def test_vllm_image_is_the_same_everywhere(
    compose: dict[str, Any], k8s: dict[tuple[str, str], dict[str, Any]], launched: list[UpstreamSpec],
    env_example: dict[str, str],
) -> None:
    images = {compose_interpolate(str(compose["services"][u.host]["image"]), env_example) for u in launched}
    images |= {
        str(only_container(o)["image"]) for (kind, _), o in k8s.items()
        if kind == "Deployment" and "vllm/vllm-openai" in str(only_container(o)["image"])
    }
    assert len(images) == 1, f"one vLLM version for every deployment (flags depend on it): {images}"


# ---------------------------------------------------------------------------------------------
# systemd


def read_unit(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(path.read_text(encoding="utf-8"), source=str(path))
    return cp


def systemd_seconds(value: str) -> float:
    total = 0.0
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600}
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(num) * units[unit]
    return total


def systemd_argv(exec_start: str, env: Mapping[str, str]) -> list[str]:
    """systemd's expansion: ``${VAR}`` -> one argument, a lone ``$VAR`` word -> split at whitespace."""
    words = shlex.split(exec_start.replace("\\\n", " "))
    argv: list[str] = []
    for w in words:
        lone = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if lone:
            argv.extend(env.get(lone.group(1), "").split())
            continue

        def sub(m: re.Match[str]) -> str:
            assert m.group(1) in env, f"ExecStart uses ${{{m.group(1)}}}, which the env file lacks"
            return env[m.group(1)]

        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, w))
    return argv


def test_systemd_gateway_unit() -> None:
    unit = read_unit(SYSTEMD / "vllm-gateway.service")
    svc = unit["Service"]
    assert unit["Unit"]["Description"]
    assert "gateway serve" in svc["ExecStart"]
    assert svc["EnvironmentFile"].lstrip("-").startswith("/etc/vllm-gateway/")
    assert svc["User"] not in ("root", "0")
    assert svc["Restart"] == "on-failure"
    assert svc["LimitNOFILE"] == "65536"
    for key, value in {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
        "PrivateDevices": "yes",
    }.items():
        assert svc.get(key) == value, f"vllm-gateway.service: {key}={value}"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_vllm_template_unit(launched: list[UpstreamSpec]) -> None:
    unit = read_unit(SYSTEMD / "vllm@.service")
    svc = unit["Service"]
    assert svc["EnvironmentFile"] == "/etc/vllm-gateway/vllm-%i.env"
    assert svc["LimitMEMLOCK"] == "infinity"
    assert svc["LimitNOFILE"] == "65536"
    assert svc["KillMode"] == "control-group"
    assert svc["Restart"] == "on-failure"
    assert svc["NoNewPrivileges"] == "yes"
    assert svc["User"] not in ("root", "0")
    assert svc.get("PrivateDevices", "no") == "no", "PrivateDevices hides the GPUs"
    longest = max(u.launch.startup_timeout_s for u in launched if u.launch is not None)
    assert systemd_seconds(svc["TimeoutStartSec"]) >= longest, "TimeoutStartSec < launch.startup_timeout_s"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_env_files_match_launch(launched: list[UpstreamSpec]) -> None:
    exec_start = read_unit(SYSTEMD / "vllm@.service")["Service"]["ExecStart"]
    ports: set[int] = set()
    for u in launched:
        assert u.launch is not None
        path = SYSTEMD / f"vllm-{u.name}.env.example"
        where = f"systemd/{path.name}"
        env = read_env_file(path)
        argv = systemd_argv(exec_start, env)
        flags = assert_backend_flags(where, after_module(argv, where), u)
        assert flags["--host"] == env["VLLM_HOST"]
        assert env["CUDA_VISIBLE_DEVICES"] == u.launch.cuda_visible_devices, where
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == gpu_count(u.launch), where
        assert_backend_env(where, env, u)
        assert_placeholder(f"{where} VLLM_API_KEY", "VLLM_API_KEY", env["VLLM_API_KEY"])
        assert u.port not in ports, f"{where}: two backends on port {u.port} of one host"
        ports.add(u.port)
    unknown = {p.name for p in SYSTEMD.glob("vllm-*.env.example")} - {f"vllm-{u.name}.env.example" for u in launched}
    assert not unknown, f"env files for upstreams not in deploy/config.yaml: {sorted(unknown)}"


def test_systemd_gateway_env_loads_config_for_one_host(launched: list[UpstreamSpec]) -> None:
    env = read_env_file(SYSTEMD / "gateway.env.example")
    cfg = load_config(CONFIG, env)
    for _, u in cfg.upstreams():
        if u.launch is None:
            continue
        backend = read_env_file(SYSTEMD / f"vllm-{u.name}.env.example")
        assert u.host == "127.0.0.1" and u.port == int(backend["VLLM_PORT"]), u.name
    assert int(env["GATEWAY_PORT"]) not in {u.port for u in launched}


# ---------------------------------------------------------------------------------------------
# Secrets


def assert_placeholder(where: str, name: str, value: str) -> None:
    if "SHA256" in name:
        assert value == ZERO_HASH, f"{where}: example hashes are all zeros"
    elif SECRET_NAME_RE.search(name):
        assert PLACEHOLDER_RE.match(value), f"{where}: {value!r} is not a CHANGE_ME placeholder"


@pytest.mark.parametrize(
    "path",
    [ENV_EXAMPLE, *sorted(SYSTEMD.glob("*.env.example"))],
    ids=lambda p: str(p.relative_to(DEPLOY)),
)
def test_env_examples_hold_placeholders_only(path: Path) -> None:
    for name, value in read_env_file(path).items():
        assert_placeholder(str(path.relative_to(DEPLOY)), name, value)


def _text_files() -> Iterator[Path]:
    for p in sorted(DEPLOY.rglob("*")):
        # deploy/.env (git-ignored) is the operator's filled-in copy: real keys belong there.
        if p.is_file() and not (p.name == ".env" or p.suffix == ".env"):
            yield p


@pytest.mark.parametrize("path", list(_text_files()), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_no_key_looking_string(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for pattern in (r"\bsk-[A-Za-z0-9_-]{8,}", r"\bhf_[A-Za-z0-9]{20,}", r"-----BEGIN [A-Z ]*PRIVATE KEY"):
        found = re.search(pattern, text)
        assert not found, f"{path.name}: a {found.group(0)[:3]}... string looks like a secret"
    for m in re.finditer(r"\b[0-9a-f]{64}\b", text):
        assert m.group(0) == ZERO_HASH, f"{path.name}: a real-looking SHA-256; keep example hashes zero"


# ---------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    buf = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        instr, _, rest = buf.partition(" ")
        out.append((instr.upper(), rest.strip()))
        buf = ""
    return out


def dockerignore_includes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern that matches the path (or a parent of it) decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(c, pat) for c in candidates):
            included = negate
    return included


def test_dockerfile_runs_the_gateway_as_non_root() -> None:
    instrs = dockerfile_instructions(DEPLOY / "Dockerfile")
    args = {}
    for instr, rest in instrs:
        if instr == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            args[k] = v
    froms = [i for i, (instr, _) in enumerate(instrs) if instr == "FROM"]
    for i in froms:
        image = instrs[i][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert image == "python:3.11-slim", image
    final = instrs[froms[-1] :]
    users = [rest for instr, rest in final if instr == "USER"]
    assert users, "the final stage must set USER"
    assert users[-1].split(":")[0] not in ("root", "0"), "the gateway must not run as root"
    assert any(instr == "EXPOSE" and "8080" in rest.split() for instr, rest in final)
    healthchecks = [rest for instr, rest in final if instr == "HEALTHCHECK"]
    assert healthchecks and "/health" in healthchecks[0]
    cmd = json.loads(next(rest for instr, rest in final if instr == "CMD"))
    assert cmd[:2] == ["gateway", "serve"] and cmd[cmd.index("--host") + 1] == "0.0.0.0"


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    patterns = [
        line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for instr, rest in dockerfile_instructions(DEPLOY / "Dockerfile"):
        if instr == "COPY" and "--from=" not in rest:
            sources.extend(rest.split()[:-1])
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: no such path in the repository"
        assert dockerignore_includes(patterns, src), f"COPY {src} is excluded by Dockerfile.dockerignore"
    assert dockerignore_includes(patterns, "gateway/cli.py")
    for secret_or_junk in (".venv/bin/python", ".git/config", "deploy/.env", "tests/unit/x.py",
                           "gateway/__pycache__/cli.cpython-311.pyc"):
        assert not dockerignore_includes(patterns, secret_or_junk), secret_or_junk
