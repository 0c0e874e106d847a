"""The suite's execution environment: lazy torch, determinism, devices, software key, time budget.

torch is an optional extra (``rasd[validate]``), so nothing here imports it at module import time;
``require_torch()`` imports it on first use and turns its absence into ``TorchMissing``, which the CLI
reports as a usage error naming the extra.

``setup_determinism()`` is the one place the determinism recipe of sdc-anchors §3.1 is applied. It must
run before CUDA initialises because cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` at handle creation.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

# cuBLAS guarantees bitwise-reproducible results for a fixed workspace configuration (cuBLAS docs,
# "Results reproducibility"); golden answers are only comparable under the same value, so it is fixed,
# not defaulted.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"

# Bit width and the integer dtype of the same width, per floating dtype name, for bit-pattern views.
FLOAT_BITS = {"float64": 64, "float32": 32, "bfloat16": 16, "float16": 16}
INT_VIEW = {64: "int64", 32: "int32", 16: "int16", 8: "int8"}


class TorchMissing(RuntimeError):
    """torch is not installed; the message names the extra that provides it."""


def require_torch() -> ModuleType:
    """Import and return torch, or raise ``TorchMissing`` naming the ``rasd[validate]`` extra.

    Raises:
        TorchMissing: when torch cannot be imported.
    """
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise TorchMissing(
            "this check needs torch, which is not installed: install the validation extra with "
            "`pip install 'rasd[validate]'` (CI and the Makefile install torch==2.13.0)"
        ) from exc


def set_determinism_env() -> None:
    """Set the environment half of the recipe; call it before anything imports torch or touches CUDA.

    cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when it creates a handle and the TF32 override when the
    library loads, so the CLI calls this first thing on its run path.
    """
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG
    # Belt and braces: the driver-level switch also keeps cuBLAS/cuDNN from using TF32.
    os.environ["NVIDIA_TF32_OVERRIDE"] = "0"


def setup_determinism(seed: int) -> ModuleType:
    """Apply the determinism recipe once per process and seed every generator; return torch.

    Sets ``CUBLAS_WORKSPACE_CONFIG`` and ``NVIDIA_TF32_OVERRIDE=0`` in the environment (before CUDA
    initialises), turns on ``torch.use_deterministic_algorithms``, turns off TF32 and reduced-precision
    reductions and cuDNN autotuning, and seeds torch's CPU and CUDA generators.

    Args:
        seed: the suite seed.
    """
    set_determinism_env()
    torch = require_torch()
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.manual_seed(seed)
    return torch


@dataclasses.dataclass(frozen=True)
class Device:
    """One GPU under test, or one logical slot on the host CPU when ``--device cpu``.

    On CPU every slot is the same processor; slots exist so that peer voting and collectives have
    peers. They prove the code path, not the hardware.
    """

    gpu: int
    kind: str  # "cuda" or "cpu"

    @property
    def torch_device(self) -> str:
        """The torch device string for this slot."""
        return f"cuda:{self.gpu}" if self.kind == "cuda" else "cpu"


def visible_gpus(kind: str) -> list[int]:
    """GPU indices to test when ``--gpus`` is not given: every visible CUDA GPU, or 3 CPU slots.

    Three CPU slots are the smallest number for which a majority vote can single out one deviant.
    """
    if kind == "cpu":
        return [0, 1, 2]
    torch = require_torch()
    return list(range(torch.cuda.device_count()))


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def software_key(device: Device) -> dict[str, str]:
    """What a bitwise golden answer is keyed by for this device (sdc-anchors §3.1).

    cuBLAS is bitwise reproducible only for the same architecture, SM count and library versions, so
    the key names the GPU model, SM count, compute capability, torch, CUDA runtime and cuBLAS versions
    and the workspace configuration. On CPU it names the machine, torch's CPU kernel ISA and torch.
    """
    torch = require_torch()
    key = {
        "torch": torch.__version__,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""),
    }
    if device.kind == "cuda":
        props = torch.cuda.get_device_properties(device.gpu)
        key |= {
            "model": props.name,
            "sm_count": str(props.multi_processor_count),
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": str(torch.version.cuda),
            "cublas": _dist_version("nvidia-cublas-cu12", "nvidia-cublas-cu13", "nvidia-cublas"),
        }
    else:
        key |= {
            "model": f"cpu {platform.machine()}",
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
    return key


def key_string(key: Mapping[str, str]) -> str:
    """Canonical one-line form of a software key, used as the golden store's key."""
    return ";".join(f"{k}={key[k]}" for k in sorted(key))


class Budget:
    """A deadline on the monotonic clock that run() adapters poll between units of work.

    Args:
        seconds: time allowed from now.
        clock: monotonic clock in seconds; injectable for tests.
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._deadline = clock() + seconds

    def remaining_s(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._deadline - self._clock())

    def exhausted(self) -> bool:
        """True once the deadline has passed."""
        return self._clock() >= self._deadline


def int_view(torch: ModuleType, tensor: Any) -> Any:
    """The same memory as ``tensor`` viewed as the signed integer type of the same width."""
    bits = tensor.element_size() * 8
    return tensor.view(getattr(torch, INT_VIEW[bits]))


def bits_hex(value: int, width: int) -> str:
    """``value``'s two's-complement bit pattern as zero-padded hex of ``width`` bits."""
    return f"0x{value & ((1 << width) - 1):0{width // 4}x}"


def differing_bits(a: int, b: int, width: int) -> list[int]:
    """Bit positions (0 = least significant) where ``a`` and ``b`` differ within ``width`` bits."""
    x = (a ^ b) & ((1 << width) - 1)
    return [i for i in range(width) if x >> i & 1]


def sync(torch: ModuleType, device: Device) -> None:
    """Wait for queued GPU work on ``device`` so timings and budget checks mean wall time."""
    if device.kind == "cuda":
        torch.cuda.synchronize(device.gpu)


def devices_from(indices: Sequence[int], kind: str) -> list[Device]:
    """``Device`` objects for the given indices."""
    return [Device(gpu=i, kind=kind) for i in indices]
