"""Shared fixtures for the validation suite's tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

_ENV = ("CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE")


@pytest.fixture(autouse=True)
def restore_process_state() -> Iterator[None]:
    """Undo setup_determinism() after each test.

    The suite sets process-global torch flags and environment variables on purpose (once per
    rasd-validate process); in a shared pytest process they must not leak into other components' tests.
    """
    env = {k: os.environ.get(k) for k in _ENV}
    torch = sys.modules.get("torch")
    flags = None
    if torch is not None:
        flags = (
            torch.are_deterministic_algorithms_enabled(),
            torch.get_float32_matmul_precision(),
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
        )
    yield
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    torch = sys.modules.get("torch")
    if torch is not None:
        if flags is None:
            flags = (False, "highest", False, False)
        torch.use_deterministic_algorithms(flags[0])
        torch.set_float32_matmul_precision(flags[1])
        torch.backends.cudnn.benchmark = flags[2]
        torch.backends.cudnn.deterministic = flags[3]
