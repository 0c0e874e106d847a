"""The agent's systemd unit is hardened (`systemd-analyze security --offline` <= 3.0) and still keeps what
NVML, the kernel log, GPU resets, process restarts and reboots need; the operator guide names each.

The score is read from the unit `rasd-agent install` writes, the one operators run.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from rasd.agent import install

MAX_EXPOSURE = 3.0
KEPT_CAPABILITIES = {"CAP_SYS_ADMIN", "CAP_SYSLOG", "CAP_KILL"}
KEPT_DEVICES = {
    "char-nvidia-frontend rw",  # /dev/nvidiactl, /dev/nvidia0.., /dev/nvidia-modeset
    "char-nvidia-uvm rw",  # CUDA (rasd-validate)
    "char-nvidia-caps rw",  # MIG
    "char-nvidia-nvlink rw",
    "char-nvidia-nvswitch rw",
    "/dev/kmsg r",
}


def _unit_lines() -> list[str]:
    text = install.render_unit(install.packaged_text(install.UNIT_NAME), pathlib.Path("/opt/rasd/bin/rasd-agent"))
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _values(key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in _unit_lines() if line.startswith(f"{key}=")]


def test_the_installed_unit_scores_at_most_3_in_systemd_analyze_security(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd; .ci/run installs it)")
    unit = tmp_path / install.UNIT_NAME
    unit.write_text("\n".join(_unit_lines()) + "\n")
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(unit)], capture_output=True, text=True, timeout=60
    )
    match = re.search(r"Overall exposure level for rasd-agent\.service: (\d+\.\d)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match[1]) <= MAX_EXPOSURE, result.stdout


def test_the_unit_keeps_only_the_capabilities_and_devices_the_agent_needs():
    assert set(_values("CapabilityBoundingSet")[0].split()) == KEPT_CAPABILITIES
    assert _values("AmbientCapabilities") == [""]  # root already holds them; nothing is added
    assert _values("DevicePolicy") == ["closed"]
    assert set(_values("DeviceAllow")) == KEPT_DEVICES
    # What would break NVML or the kernel log is not there.
    keys = {line.split("=", 1)[0] for line in _unit_lines() if "=" in line}
    assert not keys & {"ProtectKernelLogs", "PrivateDevices", "ProcSubset", "PrivateNetwork", "IPAddressDeny"}
    assert set(_values("RestrictAddressFamilies")[0].split()) == {"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}


def test_the_operator_guide_says_which_capabilities_and_devices_it_keeps(repo_root):
    guide = (repo_root / "docs/operator-guide.md").read_text()
    section = guide.split("### Hardening", 1)[1].split("\n## ", 1)[0]
    for name in [*KEPT_CAPABILITIES, *(device.split()[0] for device in KEPT_DEVICES)]:
        assert f"`{name}`" in section, name
