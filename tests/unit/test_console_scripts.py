"""Every console script answers --help without a GPU, a controller or optional extras."""

from __future__ import annotations

import subprocess

import pytest


@pytest.mark.parametrize("script", ["rasd-agent", "rasd-controller", "rasctl", "rasd-validate", "rasd-sim"])
def test_help_works(script, venv_bin):
    result = subprocess.run([str(venv_bin / script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["rasd-controller"], "--insecure"),
        (["rasd-controller", "--insecure", "--listen", "10.1.2.3:7443"], "non-loopback"),
        (["rasd-controller", "--insecure", "--listen", "nonsense"], "--listen"),
        (["rasd-agent", "--insecure", "--backend", "simulated", "--controller", "10.0.0.1:7443"], "non-loopback"),
        (["rasd-agent", "--insecure", "--backend", "simulated", "--gpus", "99"], "gpus"),
        (["rasd-agent", "--insecure", "--label", "oops"], "KEY=VALUE"),
        (["rasd-sim", "--nodes", "0"], "--nodes"),
        (["rasd-sim", "--scenario", "no-such-scenario"], "no-such-scenario"),
    ],
)
def test_bad_arguments_are_named(argv, complaint, venv_bin):
    result = subprocess.run(
        [str(venv_bin / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 2
    assert complaint in result.stderr
