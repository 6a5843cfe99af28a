"""What CPU this process runs on: its model, the ISA flags that decide which kernels are fast,
the cores it may use and the vector ISA torch dispatches to. Its ``key`` names a profile's
cache file (``paradec.cpu``)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# the CPU flags that decide which kernels are fast (x86 and ARM spellings)
ISA_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimddp",
    "sve",
    "bf16",
    "i8mm",
)


@dataclass(frozen=True)
class CpuInfo:
    model: str  # the CPU's model name
    machine: str  # x86_64, aarch64, ...
    isa: tuple[str, ...]  # the flags of ISA_FLAGS it has
    cores: int  # logical CPUs this process may run on
    threads: int  # torch's intra-op threads
    torch: str
    capability: str  # the vector ISA torch's own kernels dispatch to (ATEN_CPU_CAPABILITY caps it)

    @property
    def native_bf16(self) -> bool:
        return bool({"avx512_bf16", "amx_bf16", "bf16"} & set(self.isa))

    @property
    def kind(self) -> str:
        """One line: "AMD EPYC (AVX2, no native bf16), 2 threads"."""
        top = next(
            (f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2", "sve", "asimd") if f in self.isa), self.machine
        )
        bf16 = "native bf16" if self.native_bf16 else "no native bf16"
        return f"{self.model} ({top.upper()}, {bf16}; torch dispatches {self.capability}), {self.threads} threads"

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def cpu_info() -> CpuInfo:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model") and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key in ("flags", "Features"):
                flags |= set(value.split())
    except OSError:  # not Linux: the flags stay unknown, the timings still decide
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return CpuInfo(
        model,
        platform.machine(),
        tuple(f for f in ISA_FLAGS if f in flags),
        cores,
        torch.get_num_threads(),
        torch.__version__,
        torch.backends.cpu.get_cpu_capability(),
    )
