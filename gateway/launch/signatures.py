"""The failure signatures of ``gateway backends diagnose``: one table, one row per known failure.

Every row is a regular expression over one log line, the layer it points at, the likely cause and
the one change to make; ``{1}``, ``{2}``... in the texts are the pattern's groups. The wording of
each pattern is taken from vLLM 0.32's source, PyTorch/NCCL, or a real failing run (each has a
test on a real log excerpt in ``tests/fixtures/vllm_logs/``). To add a failure: add a row here and
a log excerpt plus a test case in ``tests/unit/test_diagnose.py``.

Layers, outermost first (seed 004's order of checking):

``visibility``     the GPUs this process sees (CUDA_VISIBLE_DEVICES, container devices, MIG)
``communication``  NCCL between the GPUs (P2P, IB, sockets, collective timeouts)
``split``          the parallel split of the model and its length (TP vs heads, dtype vs
                   quantization, max_model_len vs the model and the KV cache)
``resources``      memory, shared memory, ports, file descriptors, leftover processes
``versions``       driver / CUDA / torch / vLLM builds that do not fit together
``model``          the model directory itself, or a model shape this vLLM cannot run

``kind``: ``cause`` is a root cause; ``consequence`` is what other processes report after
something else failed (NCCL watchdog timeouts on the ranks that waited, "Engine core
initialization failed"): it is the diagnosis only when no cause is in the log. ``note`` is a
warning worth showing next to the diagnosis but never the diagnosis itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Layer = Literal["visibility", "communication", "split", "resources", "versions", "model"]
Kind = Literal["cause", "consequence", "note"]

LAYERS: dict[Layer, str] = {
    "visibility": "the GPUs the process sees",
    "communication": "NCCL between the GPUs",
    "split": "the parallel split / length of the model",
    "resources": "memory, shared memory, ports, processes",
    "versions": "driver, CUDA, torch and vLLM versions",
    "model": "the model files, or a model this vLLM cannot run",
}


@dataclass(frozen=True)
class Signature:
    id: str
    layer: Layer
    pattern: re.Pattern[str]
    cause: str
    change: str
    kind: Kind = "cause"
    source: str | None = None  # "vllm/<file>.py": the installed vLLM file that holds this text

    def explain(self, m: re.Match[str]) -> tuple[str, str]:
        """(cause, change) with the match's groups filled in (missing groups become '?')."""
        groups = ["" if g is None else g for g in (m.group(0), *m.groups())]
        return self.cause.format(*groups), self.change.format(*groups)


def _sig(id: str, layer: Layer, pattern: str, cause: str, change: str, kind: Kind = "cause",
         source: str | None = None) -> Signature:
    return Signature(id, layer, re.compile(pattern), cause, change, kind, source)


SIGNATURES: tuple[Signature, ...] = (
    # ---------------------------------------------------------------- visibility
    _sig("no-cuda-gpus", "visibility", r"No CUDA GPUs are available",
         "the process sees no GPU at all: CUDA_VISIBLE_DEVICES is empty or names GPUs that do not "
         "exist, or the container was started without GPU devices",
         "set launch.cuda_visible_devices to physical indices nvidia-smi lists (comma-separated, no "
         "spaces); in a container request the GPUs (--gpus, deploy.resources.reservations.devices or "
         "nvidia.com/gpu)", source="vllm/utils/torch_utils.py"),
    _sig("world-size-gpus", "visibility",
         r"World size \((\d+)\) is larger than the number of available GPUs \((\d+)\)",
         "tensor_parallel_size x pipeline_parallel_size = {1} GPUs, but this process sees {2}",
         "list {1} GPUs in launch.cuda_visible_devices (or give the container {1}), or lower "
         "tensor_parallel_size to fit {2}", source="vllm/config/parallel.py"),
    _sig("local-world-size", "visibility",
         r"local_world_size \((\d+)\) must be less than or equal to the number of visible devices \((\d+)\)",
         "this node must run {1} ranks but sees {2} GPUs",
         "list {1} GPUs in launch.cuda_visible_devices, or lower tensor_parallel_size to {2} (or spread "
         "the ranks over more nodes)"),
    _sig("cpu-numa-nodes", "visibility",
         r"Not enough allowed NUMA nodes to bind threads of (\d+) local CPUWorkers\. Allowed NUMA nodes are "
         r"\[([^\]]*)\]",
         "vLLM's automatic CPU binding wants one NUMA node per rank: {1} ranks, NUMA nodes [{2}] here",
         "name each rank's cores in launch.env VLLM_CPU_OMP_THREADS_BIND (e.g. '0-3|4-7' for 2 ranks), or "
         "lower tensor_parallel_size"),
    _sig("invalid-device-ordinal", "visibility", r"invalid device ordinal",
         "a worker asked for a CUDA device number the process does not have: CUDA_VISIBLE_DEVICES "
         "lists fewer GPUs than the ranks need, or indices that do not exist",
         "make launch.cuda_visible_devices list exactly tensor_parallel_size x pipeline_parallel_size "
         "existing GPUs (nvidia-smi -L)"),
    # ---------------------------------------------------------------- communication
    _sig("nccl-watchdog-timeout", "communication",
         r"Watchdog caught collective operation timeout: WorkNCCL\(.*?OpType=(\w+).*?Timeout\(ms\)=(\d+)\) "
         r"ran for (\d+) milliseconds",
         "a {1} waited {3} ms (limit {2} ms) and NCCL's watchdog killed it: another rank stopped "
         "taking part (its own error is the root cause) or the GPUs cannot reach each other",
         "look for the first rank that failed; if no rank failed, restart with launch.nccl.debug: INFO "
         "and try launch.nccl.p2p_disable: true (P2P between these GPUs is broken)",
         kind="consequence"),
    _sig("nccl-system-error", "communication",
         r"unhandled system error \(run with NCCL_DEBUG=INFO for details\)",
         "NCCL failed in a system call while connecting the GPUs (in containers usually a too small "
         "/dev/shm; else an IB device or network interface NCCL cannot use)",
         "restart with launch.nccl.debug: INFO and read the 'NCCL WARN' line it prints; in a container "
         "give it shm_size: 8gb (or ipc: host)"),
    _sig("nccl-shm", "resources", r"NCCL WARN .*(?:/dev/shm|shared memory)",
         "NCCL could not create its shared-memory segment in /dev/shm: the container's /dev/shm is "
         "too small (Docker's default is 64 MB)",
         "give the container more shared memory: shm_size: 8gb or ipc: host (compose), an emptyDir "
         "with medium: Memory at /dev/shm (Kubernetes)"),
    _sig("nccl-warn", "communication", r"NCCL WARN (.+)",
         "NCCL reported: {1}",
         "fix what the NCCL WARN line names (interface: launch.nccl.socket_ifname; InfiniBand: "
         "launch.nccl.ib_disable: true; P2P: launch.nccl.p2p_disable: true)"),
    # NCCL_DEBUG=INFO lines: what NCCL chose, shown next to a diagnosis (never one themselves)
    _sig("nccl-socket-interface", "communication", r"NCCL INFO NET/Socket : Using (.+)",
         "NCCL talks over the network interface(s) {1}",
         "if that is not the interface between the nodes/GPUs, set launch.nccl.socket_ifname", kind="note"),
    _sig("nccl-no-ib", "communication", r"NCCL INFO NET/IB : No device found",
         "NCCL found no InfiniBand device and uses sockets",
         "expected on one machine; across nodes check the IB drivers, or set launch.nccl.ib_disable: true to "
         "make it explicit", kind="note"),
    _sig("nccl-init-rank", "communication", r"NCCL INFO ncclCommInitRank .*rank (\d+) nranks (\d+)",
         "rank {1} of {2} started its NCCL communicator",
         "if a rank never logs this, it did not get this far: look at that rank's first error", kind="note"),
    # ---------------------------------------------------------------- split
    _sig("tp-heads", "split",
         r"Total number of attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)",
         "tensor_parallel_size {2} does not divide the model's {1} attention heads",
         "set tensor_parallel_size to a divisor of {1}"),
    _sig("quant-dtype", "split",
         r"(torch\.\w+) is not supported for quantization method (\w+)\. Supported dtypes: \[([^\]]*)\]",
         "the {2} kernels do not run in {1} (they support {3})",
         "set launch.dtype to one they support (for AWQ: dtype: half)"),
    _sig("max-model-len-limit", "split",
         r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len \((\w+)=([\d.]+)",
         "max_model_len {1} is above the model's limit ({2}={3} in config.json)",
         "lower launch.max_model_len to at most {3} (or extend the context with rope scaling where the "
         "model supports it)"),
    _sig("kv-cache-too-small", "split",
         r"To serve at least one request with the model's max seq len \((\d+)\), \(([\d.]+) GiB KV cache is "
         r"needed, which is larger than the available KV cache memory \(([\d.]+) GiB\)\.(?: Based on the "
         r"available memory, the estimated maximum model length is (\d+)\.)?",
         "one sequence of max_model_len {1} needs {2} GiB of KV cache, more than the {3} GiB left "
         "(the KV cache holds about {4} tokens)",
         "lower launch.max_model_len (to {4} or less), or give the KV cache more memory "
         "(gpu_memory_utilization, tensor_parallel_size; on CPU VLLM_CPU_KVCACHE_SPACE)"),
    _sig("kv-cache-too-small-old", "split",
         r"The model's max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored "
         r"in KV cache \((\d+)\)",
         "one sequence of max_model_len {1} does not fit the KV cache, which holds {2} tokens",
         "lower launch.max_model_len to {2} or less, or raise gpu_memory_utilization"),
    # ---------------------------------------------------------------- resources
    _sig("cuda-oom", "resources", r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMG]iB)",
         "a GPU ran out of memory while allocating {1}: the weights (plus activations) do not fit what "
         "is free on one GPU, or another process holds part of it",
         "check nvidia-smi for other processes on these GPUs first; then raise tensor_parallel_size "
         "(or use a quantized checkpoint), or lower gpu_memory_utilization / max_num_seqs"),
    _sig("free-memory", "resources",
         r"[Ff]ree memory on device (?:(\S+) )?\(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory "
         r"utilization \(([\d.]+), ([\d.]+) GiB\)",
         "only {2} of {3} GiB are free on the GPU {1}, less than the {5} GiB gpu_memory_utilization {4} asks "
         "for: another process (a leftover vLLM, another backend) holds GPU memory",
         "stop the process holding the GPU (nvidia-smi --query-compute-apps=pid,used_memory "
         "--format=csv), or lower gpu_memory_utilization below {2}/{3}"),
    _sig("no-kv-memory", "resources", r"No available memory for the cache blocks",
         "after loading the weights nothing is left for the KV cache",
         "raise gpu_memory_utilization or tensor_parallel_size, or use a smaller/quantized model",
         source="vllm/v1/core/kv_cache_utils.py"),
    _sig("port-in-use", "resources", r"\[Errno 98\] .*[Aa]ddress already in use",
         "the backend's port is taken by another process (a leftover vLLM, or another server)",
         "stop that process (`gateway backends down`, or find it with `ss -ltnp`) or give the upstream "
         "another port in its url"),
    _sig("bus-error", "resources", r"Fatal Python error: Bus error|\bBus error \(core dumped\)",
         "a process died with SIGBUS, in containers typically when /dev/shm fills up",
         "give the container more shared memory: shm_size: 8gb or ipc: host (compose), an emptyDir "
         "with medium: Memory at /dev/shm (Kubernetes)"),
    _sig("worker-died", "resources",
         r"Worker (?:proc |VllmWorkerProcess pid )?(\S+) died(?: unexpectedly)?,? \(?exit code:? (-?\d+)",
         "worker {1} died without a Python error (exit code {2}; -9: killed, usually by the kernel's OOM "
         "killer; -7: bus error, usually /dev/shm; -6: aborted, often by NCCL)",
         "-9: give the host/container more RAM or lower max_num_seqs (dmesg shows the OOM killer); -7: give "
         "the container shm_size/ipc: host; -6: restart with launch.nccl.debug: INFO",
         source="vllm/v1/executor/multiproc_executor.py"),
    _sig("nofile-ulimit", "resources",
         r"Found ulimit of (\d+) and failed to automatically increase",
         "the open-files limit is {1} and vLLM could not raise it (many connections then fail with "
         "'Too many open files')",
         "raise nofile to 65536 (ulimit -n, LimitNOFILE= in systemd, ulimits.nofile in compose)",
         kind="note"),
    # ---------------------------------------------------------------- versions
    _sig("driver-too-old", "versions", r"The NVIDIA driver on your system is too old \(found version (\d+)\)",
         "torch was built for a newer CUDA than the NVIDIA driver supports (driver's CUDA {1})",
         "install a torch/vLLM build for the driver's CUDA version, or upgrade the NVIDIA driver"),
    _sig("undefined-symbol", "versions", r"(\S*_C\S*\.so): undefined symbol",
         "vLLM's compiled extension ({1}) was built against another torch than the one installed",
         "reinstall vLLM with the torch version it pins (pip install vllm==<version> in a clean venv)"),
    # ---------------------------------------------------------------- model
    _sig("cpu-head-dim", "model", r"Unsupported CPU attention configuration: head_dim=(\d+)",
         "vLLM's CPU attention has no kernel for head size {1}: the server passed /health and the first "
         "generation killed the engine",
         "serve a model whose head size the CPU backend supports (32, 64, 80, 96, 112, 128, 160, 192, "
         "224, 256, 512)"),
    _sig("model-path-missing", "model",
         r"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '([^']+)'",
         "model_path {1} is not a directory here, so vLLM took it for a Hugging Face repo id",
         "point launch.model_path at the directory that holds config.json (absolute path; mounted "
         "in a container)"),
    _sig("model-config-invalid", "model", r"the config file at '([^']+)' is not a valid JSON file",
         "{1} is not valid JSON (an interrupted download or copy)",
         "copy or download the model again and check that config.json is complete"),
    # ---------------------------------------------------------------- consequences
    _sig("engine-init-failed", "model", r"Engine core initialization failed\. See root cause above",
         "the engine process died while starting; the reason is earlier in the log",
         "read the first error above it (run with the whole log: --log FILE)", kind="consequence"),
    _sig("engine-dead", "model", r"EngineCore encountered an issue|EngineDeadError",
         "the engine process died while serving; the reason is earlier in the log",
         "read the first error above it", kind="consequence"),
)


def by_id(signature_id: str) -> Signature:
    for s in SIGNATURES:
        if s.id == signature_id:
            return s
    raise KeyError(signature_id)
