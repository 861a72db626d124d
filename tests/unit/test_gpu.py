from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.launch.gpu import (
    INVENTORY_ARGS,
    TOPOLOGY_ARGS,
    GpuInfo,
    GpuParseError,
    parse_inventory,
    parse_topology,
    read_inventory,
    read_topology,
    run_nvidia_smi,
)

# `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`
A100_X4 = """\
0, NVIDIA A100-SXM4-40GB, 40960
1, NVIDIA A100-SXM4-40GB, 40960
2, NVIDIA A100-SXM4-40GB, 40960
3, NVIDIA A100-SXM4-40GB, 40960
"""
MIXED = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA GeForce RTX 4090, 24564\n2, NVIDIA A10, [N/A]\n"

# `nvidia-smi topo -m` on a DGX-style NVLink box (with the underline escapes newer drivers print)
TOPO_NVLINK = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV12\tNV12\tNV12\tPXB\t0-63\t0\t\tN/A\n"
    "GPU1\tNV12\t X \tNV12\tNV12\tPXB\t0-63\t0\t\tN/A\n"
    "GPU2\tNV12\tNV12\t X \tNV12\tSYS\t64-127\t1\t\tN/A\n"
    "GPU3\tNV12\tNV12\tNV12\t X \tSYS\t64-127\t1\t\tN/A\n"
    "NIC0\tPXB\tPXB\tSYS\tSYS\t X \t\t\t\t\n"
    "\n"
    "Legend:\n\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
    "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)
# A two-socket PCIe server: pairs behind one host bridge, sockets joined by UPI
TOPO_PCIE = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPHB\tSYS\tSYS\t0-15,32-47\t0
GPU1\tPHB\t X \tSYS\tSYS\t0-15,32-47\t0
GPU2\tSYS\tSYS\t X \tPHB\t16-31,48-63\t1
GPU3\tSYS\tSYS\tPHB\t X \t16-31,48-63\t1

Legend:

  X    = Self
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
"""


def test_parse_inventory() -> None:
    gpus = parse_inventory(A100_X4)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[0] == GpuInfo(index=0, name="NVIDIA A100-SXM4-40GB", memory_mib=40960)
    assert gpus[0].memory_gib == 40.0


def test_parse_inventory_mixed_and_not_available() -> None:
    gpus = parse_inventory(MIXED)
    assert [g.name for g in gpus] == ["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090", "NVIDIA A10"]
    assert gpus[1].memory_mib == 24564
    assert gpus[2].memory_mib is None and gpus[2].memory_gib is None


@pytest.mark.parametrize(
    "text",
    ["index, name, memory.total [MiB]\n0, A100, 40960 MiB x", "GPU 0: NVIDIA A100 (UUID: GPU-1)", "x, A100, 1"],
)
def test_parse_inventory_rejects_other_formats(text: str) -> None:
    with pytest.raises(GpuParseError):
        parse_inventory(text)


def test_parse_topology_nvlink_ignores_nics_and_escapes() -> None:
    topo = parse_topology(TOPO_NVLINK)
    assert topo.gpus == (0, 1, 2, 3)
    assert topo.link(0, 3) == "NV12"
    assert topo.link(3, 0) == "NV12"
    assert topo.link(0, 0) is None
    assert all(k[0] != k[1] for k in topo.links)
    assert len(topo.links) == 12


def test_parse_topology_pcie() -> None:
    topo = parse_topology(TOPO_PCIE)
    assert topo.link(0, 1) == "PHB"
    assert topo.link(1, 2) == "SYS"
    assert topo.link(2, 3) == "PHB"


def test_parse_topology_single_gpu() -> None:
    topo = parse_topology("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-31\t0\n\nLegend:\n")
    assert topo.gpus == (0,)
    assert topo.links == {}


def test_parse_topology_rejects_other_text() -> None:
    with pytest.raises(GpuParseError):
        parse_topology("No devices were found\n")


class FakeSmi:
    def __init__(self, outputs: dict[tuple[str, ...], str | None]) -> None:
        self.outputs = outputs
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, args: Sequence[str], timeout: float) -> str | None:
        assert timeout > 0
        self.calls.append(tuple(args))
        return self.outputs.get(tuple(args))


def test_readers_use_the_documented_commands() -> None:
    smi = FakeSmi({INVENTORY_ARGS: A100_X4, TOPOLOGY_ARGS: TOPO_PCIE})
    inventory = read_inventory(smi)
    assert inventory is not None and len(inventory) == 4
    topo = read_topology(smi)
    assert topo is not None and topo.link(0, 2) == "SYS"
    assert smi.calls == [INVENTORY_ARGS, TOPOLOGY_ARGS]
    assert INVENTORY_ARGS == ("--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits")


def test_readers_return_none_without_nvidia_smi_or_on_garbage() -> None:
    absent = FakeSmi({})
    assert read_inventory(absent) is None
    assert read_topology(absent) is None
    garbage = FakeSmi({INVENTORY_ARGS: "Failed to initialize NVML", TOPOLOGY_ARGS: "oops"})
    assert read_inventory(garbage) is None
    assert read_topology(garbage) is None


def test_run_nvidia_smi_absent_and_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert run_nvidia_smi(INVENTORY_ARGS) is None
    exe = tmp_path / "nvidia-smi"
    lines = "".join(f"echo '{line}'\n" for line in A100_X4.splitlines())  # builtins only: PATH is empty
    exe.write_text(f"#!/bin/sh\n[ \"$1\" = topo ] && exit 9\n{lines}")
    exe.chmod(0o755)
    assert run_nvidia_smi(INVENTORY_ARGS) == A100_X4
    assert run_nvidia_smi(TOPOLOGY_ARGS) is None  # a failing nvidia-smi counts as none
