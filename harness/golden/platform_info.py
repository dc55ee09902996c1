"""What decides float bits on this machine -- CPU, torch's kernel selection, BLAS, threads and
the environment variables that override them -- recorded with goldens so a failure can say
whether the golden came from another platform."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch

# What a testbed is (history series, run comparison): the platform fields that move a result's bits.
TESTBED_KEYS = ("cpu", "machine", "cpu_capability", "blas", "torch_threads", "env")


KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")


@functools.lru_cache(maxsize=1)
def _machine() -> tuple[str, str, str]:
    """(CPU model, architecture, BLAS): fixed for the process, read once (every golden item asks)."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = next(
        (
            line.strip(" -")
            for line in torch.__config__.show().splitlines()
            if "Math Kernel Library" in line or "OpenBLAS" in line
        ),
        "unknown",
    )
    return cpu, platform.machine(), blas


def platform_record() -> dict[str, Any]:
    """What decides float bits on this machine: CPU, torch's kernel selection, BLAS, threads
    and the environment variables that override them. Recorded in each manifest, so a golden
    failure can say whether the golden came from another platform."""
    cpu, machine, blas = _machine()
    return {
        "cpu": cpu,
        "machine": machine,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "blas": blas,
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
    }


def platform_differences(manifest: dict[str, Any]) -> list[str]:
    """How the platform that wrote the golden differs from this one (empty: the same)."""
    then, now = manifest.get("platform") or {}, platform_record()
    if not then:
        return ["golden written before platforms were recorded"]
    return [
        f"{k} {then.get(k)!r} -> {now.get(k)!r}"
        for k in ("cpu", "cpu_capability", "blas", "torch_threads", "env")
        if then.get(k) != now.get(k)
    ]
