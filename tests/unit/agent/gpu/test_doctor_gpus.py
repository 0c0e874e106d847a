"""`rasd-agent check`'s GPU line and the agent's one-line start failure, against the NVML double: the
real pynvml over a fake libnvidia-ml (two H100s, a driver not loaded), and pynvml not installed."""

from __future__ import annotations

import sys

import fake_nvml
import pytest

from rasd.agent import doctor
from rasd.agent import main as agent_main
from rasd.agent import settings as agent_settings

NVML = agent_settings.AgentSettings(node_id="n", gpu=agent_settings.GpuSettings(backend="nvml"))


def test_nvml_reachable_names_the_gpus(fake):
    assert doctor.check_gpus(NVML) == doctor.Finding("gpus", "ok", "NVML: 2 GPUs: NVIDIA H100 80GB HBM3 x2")
    assert fake.refcount == 0  # the doctor shut NVML down again


def test_a_driver_not_loaded_fails_saying_what_to_do(install_fake):
    fake = fake_nvml.FakeNvml([fake_nvml.h100_sxm5(0)])
    fake.driver_loaded = False
    install_fake(fake)
    finding = doctor.check_gpus(NVML)
    assert (finding.status, finding.detail) == ("fail", "NVML unavailable: Driver Not Loaded (code 9)")
    assert finding.fix.startswith("load the NVIDIA driver")
    with pytest.raises(SystemExit) as stopped:
        agent_main.open_backend(NVML)
    assert str(stopped.value) == (
        "rasd-agent: NVML unavailable: Driver Not Loaded (code 9) (is the NVIDIA driver loaded? "
        "`rasd-agent check` says more)"
    )


def test_without_the_nvml_extra_both_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what an environment without nvidia-ml-py gives
    finding = doctor.check_gpus(NVML)
    assert (finding.status, finding.detail) == ("fail", doctor.NVML_EXTRA_MISSING)
    assert finding.fix == f"{sys.executable} -m pip install 'rasd[nvml]'"
    with pytest.raises(SystemExit) as stopped:
        agent_main.open_backend(NVML)
    assert str(stopped.value) == f"rasd-agent: {doctor.NVML_EXTRA_MISSING} (or --backend simulated)"


def test_the_simulated_backend_needs_no_nvml():
    simulated = agent_settings.AgentSettings(node_id="n", gpu=agent_settings.GpuSettings(backend="simulated", gpus=4))
    assert doctor.check_gpus(simulated) == doctor.Finding("gpus", "ok", "simulated backend: 4 GPUs (NVML not used)")
