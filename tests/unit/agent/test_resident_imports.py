"""What the running agent's process imports: nothing it uses only at start-up or in a subcommand (issue #36).

Every module an agent imports stays in its resident set for its whole life (bench/RESULTS.md "Agent
overhead": ≤ 60 MiB). Checked in a fresh interpreter, as rasd-agent starts.
"""

from __future__ import annotations

import json
import subprocess
import sys

NOT_RESIDENT = ("numpy", "pydantic", "cryptography", "rasd.agent.doctor", "rasd.agent.install")
"""numpy (the fleet-wide edge search only), pydantic (agent.toml's checking, `settings.load`),
cryptography (the certificate checks of `rasd-agent check`), and the two subcommands."""


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_daemon_and_its_nvml_backend_import_none_of_the_start_up_only_modules():
    loaded = _modules_after("import rasd.agent.main, rasd.agent.runtime, rasd.agent.gpu.nvml")
    assert not [name for name in NOT_RESIDENT if name in loaded]


def test_loading_settings_imports_pydantic_only_then():
    loaded = _modules_after(
        "from rasd.agent import settings as s\n"
        "s.load({}, {'insecure': True, 'controller': '127.0.0.1:1'}, s.HostDefaults('n', False))"
    )
    assert "pydantic" in loaded and "rasd.agent.settings_file" in loaded
