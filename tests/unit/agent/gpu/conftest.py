"""Fixtures for the NVML backend tests: the fake libnvidia-ml in tests/nvml_double.

tests/ has no __init__.py and pytest runs with --import-mode=importlib, so the double is loaded as a
plain module by putting its folder on sys.path here. No marker or environment variable is needed:
the real pynvml.py (nvidia-ml-py, installed in the dev extra) runs against the fake C library.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable, Iterator

import pytest

_DOUBLE_DIR = str(pathlib.Path(__file__).resolve().parents[3] / "nvml_double")
if _DOUBLE_DIR not in sys.path:
    sys.path.insert(0, _DOUBLE_DIR)

import fake_nvml  # noqa: E402  (needs the sys.path entry above)

from rasd.agent.gpu import nvml  # noqa: E402


@pytest.fixture
def install_fake() -> Iterator[Callable[[fake_nvml.FakeNvml], fake_nvml.FakeNvml]]:
    """Install a FakeNvml as pynvml's C library; uninstalled after the test."""

    def install(fake: fake_nvml.FakeNvml) -> fake_nvml.FakeNvml:
        fake_nvml.install(fake)
        return fake

    yield install
    fake_nvml.uninstall()


@pytest.fixture
def fake(install_fake) -> fake_nvml.FakeNvml:
    """Two H100s, installed."""
    return install_fake(fake_nvml.FakeNvml([fake_nvml.h100_sxm5(0), fake_nvml.h100_sxm5(1)]))


@pytest.fixture
def open_backend(install_fake) -> Iterator[Callable[..., nvml.NvmlBackend]]:
    """Open NVML backends through the real open function; closed before the fake is uninstalled."""
    opened: list[nvml.NvmlBackend] = []

    def open_(**settings) -> nvml.NvmlBackend:
        backend = nvml.open_nvml_backend(**settings)
        opened.append(backend)
        return backend

    yield open_
    for backend in opened:
        backend.close()
