"""Build the exact vLLM server command for an upstream from its ``launch`` section.

Pure functions: nothing here reads the process environment, the file system or starts anything
(``gateway.launch.process`` does that). The same :class:`LaunchCommand` is printed by
``gateway backends command`` and executed by ``gateway backends up``, so what an operator reads
is what runs.

The served name (``--served-model-name``), API key, host and port come from the upstream's own
fields (``model``, ``api_key``, ``url``), the ones the gateway uses to reach it, so the gateway and
the backend cannot disagree about them.

The API key never appears in argv (and so never in ``ps``/``/proc/<pid>/cmdline``): vLLM reads
the ``VLLM_API_KEY`` environment variable when ``--api-key`` is absent
(``vllm/entrypoints/openai/api_server.py``: ``args.api_key or envs.VLLM_API_KEY``), so the launcher
passes it there. The printed form shows ``--api-key "$VLLM_API_KEY"`` and masks the value.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.config.schema import LaunchSpec, NcclSpec, UpstreamSpec

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
API_KEY_ENV = "VLLM_API_KEY"
MASK = "********"

# For device "cpu": the local development / CI tier, where nothing may be downloaded and nothing
# should phone home. launch.env can override any of them.
CPU_ENV: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


class LaunchError(ValueError):
    """An upstream cannot be turned into a launch command; the message says why."""


@dataclass(frozen=True)
class LaunchCommand:
    """One backend's command line and the environment changes it runs with.

    ``argv`` never contains a secret. ``env`` holds the variables to set on top of the
    launcher's own environment (the API key among them, see ``secret_env``); ``unset`` names
    variables to remove from the inherited environment (a stray ``VLLM_API_KEY`` when the
    upstream has no key).
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    secret_env: frozenset[str] = frozenset()
    host: str = "127.0.0.1"  # bind address (--host)
    port: int = 8000
    url: str = "http://127.0.0.1:8000"  # how the gateway reaches it (the upstream's url)
    local_url: str = "http://127.0.0.1:8000"  # how the launcher on this machine polls /health
    startup_timeout_s: float = 900.0
    log_file: str | None = None

    def child_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The complete environment for the child: ``base`` (normally ``os.environ``) changed."""
        out = {k: v for k, v in base.items() if k not in self.unset}
        out.update(self.env)
        return out

    def masked_env(self) -> dict[str, str]:
        return {k: (MASK if k in self.secret_env else v) for k, v in self.env.items()}

    def render(self, show_secrets: bool = False) -> str:
        """A shell snippet (bash) that runs the same server by hand."""
        return render_shell(self, show_secrets=show_secrets)


def _bool_env(v: bool) -> str:
    return "1" if v else "0"


def nccl_env(nccl: NcclSpec) -> dict[str, str]:
    """``launch.nccl`` as ``NCCL_*`` variables (only the ones that are set)."""
    env: dict[str, str] = {}
    if nccl.p2p_level is not None:
        env["NCCL_P2P_LEVEL"] = nccl.p2p_level
    if nccl.p2p_disable is not None:
        env["NCCL_P2P_DISABLE"] = _bool_env(nccl.p2p_disable)
    if nccl.timeout is not None:
        env["NCCL_TIMEOUT"] = str(nccl.timeout)
    if nccl.ib_disable is not None:
        env["NCCL_IB_DISABLE"] = _bool_env(nccl.ib_disable)
    if nccl.socket_ifname is not None:
        env["NCCL_SOCKET_IFNAME"] = nccl.socket_ifname
    if nccl.debug is not None:
        env["NCCL_DEBUG"] = nccl.debug
    return env


def _fmt_float(v: float) -> str:
    return repr(float(v)).removesuffix(".0") if float(v).is_integer() else repr(float(v))


def bind_host(upstream: UpstreamSpec, launch: LaunchSpec) -> str:
    """``launch.host`` (e.g. 0.0.0.0 in a container), else the host of the upstream's url."""
    return launch.host or upstream.host


def local_url(upstream: UpstreamSpec, launch: LaunchSpec) -> str:
    """Where the launcher polls ``/health``: a wildcard bind is reached over loopback; otherwise
    the bind address, or the upstream's url when the server binds the url's own host."""
    host = bind_host(upstream, launch)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if host == upstream.host:
        return upstream.url
    netloc = f"[{host}]" if ":" in host else host
    return f"http://{netloc}:{upstream.port}"


def vllm_args(upstream: UpstreamSpec, launch: LaunchSpec) -> list[str]:
    """The server's argv after ``python -m vllm.entrypoints.openai.api_server`` (no secrets)."""
    args = [
        "--model", launch.model_path,
        "--served-model-name", upstream.model,
        "--host", bind_host(upstream, launch),
        "--port", str(upstream.port),
        "--tensor-parallel-size", str(launch.tensor_parallel_size),
    ]
    if launch.pipeline_parallel_size != 1:
        args += ["--pipeline-parallel-size", str(launch.pipeline_parallel_size)]
    if launch.dtype != "auto":  # vLLM's own default
        args += ["--dtype", launch.dtype]
    if launch.quantization is not None:
        args += ["--quantization", launch.quantization]
    if launch.max_model_len is not None:
        args += ["--max-model-len", str(launch.max_model_len)]
    if launch.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", _fmt_float(launch.gpu_memory_utilization)]
    if launch.max_num_seqs is not None:
        args += ["--max-num-seqs", str(launch.max_num_seqs)]
    if launch.enable_chunked_prefill is not None:
        # vLLM 0.32 declares it with argparse.BooleanOptionalAction.
        args.append("--enable-chunked-prefill" if launch.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if launch.enforce_eager:
        args.append("--enforce-eager")
    args += list(launch.extra_args)
    return args


def launch_env(upstream: UpstreamSpec, launch: LaunchSpec) -> tuple[dict[str, str], tuple[str, ...]]:
    """Variables to set and to unset for the child. Raises :class:`LaunchError` on conflicts."""
    env: dict[str, str] = {}
    if launch.device == "cpu":
        env.update(CPU_ENV)
    if launch.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = launch.cuda_visible_devices
    env.update(nccl_env(launch.nccl))
    for key, value in launch.env.items():
        if key == API_KEY_ENV:
            raise LaunchError(
                f"upstream {upstream.name!r}: launch.env sets {API_KEY_ENV}; set the upstream's "
                "`api_key` instead (the gateway sends the same key)"
            )
        if key == "CUDA_VISIBLE_DEVICES" and launch.cuda_visible_devices is not None \
                and value.replace(" ", "") != launch.cuda_visible_devices:
            raise LaunchError(
                f"upstream {upstream.name!r}: CUDA_VISIBLE_DEVICES is set both in launch.env ({value!r}) "
                f"and launch.cuda_visible_devices ({launch.cuda_visible_devices!r}); keep one"
            )
        typed_nccl = nccl_env(launch.nccl)
        if key in typed_nccl and typed_nccl[key] != value:
            raise LaunchError(
                f"upstream {upstream.name!r}: {key} is set both in launch.env ({value!r}) and "
                f"launch.nccl ({typed_nccl[key]!r}); keep one"
            )
        env[key] = value
    unset: tuple[str, ...] = ()
    api_key = upstream.api_key_value()
    if api_key:
        env[API_KEY_ENV] = api_key
    else:
        unset = (API_KEY_ENV,)  # an inherited one would lock the gateway out
    return env, unset


def build_command(upstream: UpstreamSpec, log_dir: str = "var/log") -> LaunchCommand:
    """The :class:`LaunchCommand` for one upstream that has a ``launch`` section."""
    launch = upstream.launch
    name = upstream.name or upstream.model
    if launch is None:
        raise LaunchError(f"upstream {name!r} has no `launch:` section; the gateway cannot start it")
    if not launch.python.strip():
        raise LaunchError(f"upstream {name!r}: launch.python is empty")
    env, unset = launch_env(upstream, launch)
    argv = (launch.python, "-m", API_SERVER_MODULE, *vllm_args(upstream, launch))
    log_file = launch.log_file or f"{log_dir.rstrip('/') or '.'}/{name}.log"
    return LaunchCommand(
        name=name,
        argv=argv,
        env=env,
        unset=unset,
        secret_env=frozenset({API_KEY_ENV}) if API_KEY_ENV in env else frozenset(),
        host=bind_host(upstream, launch),
        port=upstream.port,
        url=upstream.url,
        local_url=local_url(upstream, launch),
        startup_timeout_s=launch.startup_timeout_s,
        log_file=log_file,
    )


def _flag_lines(argv: tuple[str, ...]) -> list[str]:
    """Group argv as ``--flag value`` pairs, one per line (a value never starts with ``--``)."""
    lines: list[str] = []
    i = 0
    while i < len(argv):
        cur = argv[i]
        if cur.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            lines.append(f"{shlex.quote(cur)} {shlex.quote(argv[i + 1])}")
            i += 2
        else:
            lines.append(shlex.quote(cur))
            i += 1
    return lines


def render_shell(cmd: LaunchCommand, show_secrets: bool = False) -> str:
    """Bash that starts the same server: ``export`` of the key, ``env`` settings, the command.

    The key is shown as ``--api-key "$VLLM_API_KEY"`` and its value masked unless ``show_secrets``.
    (The launcher itself passes only the variable, so its processes never show the key.)
    """
    out = [f"# upstream {cmd.name}: {cmd.url} (log: {cmd.log_file})"]
    for k in cmd.unset:
        out.append(f"unset {k}")
    plain: list[str] = []
    for k, v in cmd.env.items():
        if k in cmd.secret_env:
            value = v if show_secrets else MASK
            note = "" if show_secrets else "  # masked; --show-secrets prints it"
            out.append(f"export {k}={shlex.quote(value)}{note}")
        else:
            plain.append(f"{k}={shlex.quote(v)}")
    head = [*plain, *(shlex.quote(a) for a in cmd.argv[:3])]
    rest = _flag_lines(cmd.argv[3:])
    if API_KEY_ENV in cmd.secret_env:
        rest.append(f'--api-key "${API_KEY_ENV}"')
    body = " \\\n  ".join([*head[:-3], " ".join(head[-3:]), *rest])
    out.append(body)
    return "\n".join(out)
