"""Issue #39's install path as a newcomer walks it: build the wheel, install it into a fresh venv,
`rasd-agent install --root DIR`, `systemd-analyze verify` the unit it wrote, and `rasd-agent check`
against a controller started with dev certificates. That venv has no nvml extra, so the agent's
one-line message for it is checked there too.

Offline and quick: the fresh venv gets the wheel alone (`--no-deps`), and the runtime dependencies
come from this project's venv through a folder of links on a .pth line, without rasd itself (its
editable install) and without nvidia-ml-py (the nvml extra), as `pip install rasd` would leave them.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
NOT_A_RUNTIME_DEPENDENCY = ("rasd-", "__editable__", "pynvml", "nvidia_ml_py", "__pycache__")
"""Entries of this venv's site-packages the fresh venv must not see: rasd itself and the nvml extra."""

pytestmark = pytest.mark.slow


def _run(argv, **kwargs):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=180, check=False, **kwargs)


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory, build_wheel) -> pathlib.Path:
    """A new venv holding the freshly built wheel; returns its bin folder."""
    root = tmp_path_factory.mktemp("fresh")
    wheel = build_wheel(root / "wheel")
    venv = root / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert made.returncode == 0, made.stderr
    deps = root / "deps"
    deps.mkdir()
    for entry in pathlib.Path(sysconfig.get_path("purelib")).iterdir():
        if not entry.name.startswith(NOT_A_RUNTIME_DEPENDENCY) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    fresh_site = _run([venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    pathlib.Path(fresh_site.stdout.strip(), "runtime-dependencies.pth").write_text(f"{deps}\n")
    installed = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            venv / "bin/python",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            wheel,
        ]
    )
    assert installed.returncode == 0, installed.stderr
    return venv / "bin"


def test_wheel_install_root_verify_and_check_against_a_dev_controller(fresh_venv, tmp_path, free_port):
    no_nvml = _run([fresh_venv / "python", "-c", "import pynvml"])
    assert no_nvml.returncode == 1 and "No module named 'pynvml'" in no_nvml.stderr
    root = tmp_path / "root"
    done = _run([fresh_venv / "rasd-agent", "install", "--root", root])
    assert done.returncode == 0, done.stderr
    agent = fresh_venv / "rasd-agent"
    assert done.stdout.splitlines()[0].startswith(f"warning: {agent.resolve()} is under /tmp")  # pytest's tmp
    unit = root / "etc/systemd/system/rasd-agent.service"
    assert f"ExecStart={agent.resolve()} --config /etc/rasd/agent.toml $RASD_AGENT_ARGS" in unit.read_text()
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:  # Debian's systemd; .ci/run installs it
        verified = _run([analyze, "verify", unit])
        assert (verified.returncode, verified.stderr) == (0, "")

    certs = tmp_path / "certs"
    assert _run([fresh_venv / "rasctl", "certs", "init", "--dir", certs, "--nodes", "node-w"]).returncode == 0
    address = f"127.0.0.1:{free_port}"
    log = open(tmp_path / "controller.log", "w")  # noqa: SIM115  (closed below)
    controller = subprocess.Popen(
        [str(fresh_venv / "rasd-controller"), "--dev-certs", str(certs), "--listen", address, "--metrics-port", "-1",
         "--db", f"sqlite:///{tmp_path / 'rasd.db'}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    check = [
        fresh_venv / "rasd-agent", "check", "--config", root / "etc/rasd/agent.toml", "--node-id", "node-w",
        "--controller", address, "--state-dir", root / "var/lib/rasd-agent", "--kmsg-path", kmsg,
        "--label", "rack=r1", "--tls-ca", certs / "ca.crt", "--tls-cert", certs / "nodes/node-w.crt",
        "--tls-key", certs / "nodes/node-w.key",
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            with_nvml = _run(check)  # the installed agent.toml says backend = "nvml"
            if "ok    controller" in with_nvml.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        simulated = _run([*check, "--backend", "simulated"])
    finally:
        controller.terminate()
        controller.wait(timeout=30)
        log.close()
    lines = {line.split(None, 2)[1]: line.split(None, 2)[2] for line in with_nvml.stdout.splitlines()}
    assert with_nvml.returncode == 1, with_nvml.stdout + (tmp_path / "controller.log").read_text()[-2000:]
    assert lines["gpus"].startswith("the nvml backend needs the nvml extra, which is not installed")
    assert lines["controller"].startswith(f"{address} answered SERVING over mutual TLS")
    assert lines["certificate"].startswith(f"{certs / 'nodes/node-w.crt'}: node node-w")
    statuses = {line.split()[1]: line.split()[0] for line in simulated.stdout.splitlines()}
    assert simulated.returncode == 0, simulated.stdout
    assert {name: status for name, status in statuses.items() if name != "clock"} == {
        name: "ok" for name in ("config", "gpus", "kernel-log", "certificate", "controller", "spool", "labels")
    }


def test_the_agent_without_the_nvml_extra_prints_one_line(fresh_venv, tmp_path):
    done = _run(
        [fresh_venv / "rasd-agent", "--insecure", "--backend", "nvml", "--state-dir", tmp_path, "--metrics-port", "-1"],
        env={**os.environ, "PATH": f"{fresh_venv}:/usr/bin:/bin"},
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "rasd-agent: the nvml backend needs the nvml extra, which is not installed: pip install 'rasd[nvml]' "
        "(or --backend simulated)"
    ]
