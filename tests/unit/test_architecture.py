"""The architecture in .importlinter holds: pure cores, independent components, NVML confined."""

from __future__ import annotations

import subprocess


def test_import_contracts_are_kept(venv_bin, repo_root):
    result = subprocess.run(
        [str(venv_bin / "lint-imports"), "--no-cache"], cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
