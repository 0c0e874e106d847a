"""rasd-validate's command line without torch: --help, the missing-extra error, usage errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Runs main() in a fresh interpreter where `import torch` fails, as on a machine without the extra.
NO_TORCH = "import sys; sys.modules['torch'] = None; from rasd.validation.main import main; sys.exit(main({argv!r}))"


def run_without_torch(argv: list[str]) -> subprocess.CompletedProcess[str]:
    code = NO_TORCH.format(argv=argv)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


def test_help_works_without_torch() -> None:
    done = run_without_torch(["--help"])
    assert done.returncode == 0, done.stderr
    for words in ("--suite", "--inject-fault", "exit codes: 0 pass, 1 fail or suspect, 2 software drift"):
        assert words in done.stdout


def test_running_without_torch_is_a_usage_error_naming_the_extra() -> None:
    done = run_without_torch(["--device", "cpu", "--json"])
    assert done.returncode == 2
    assert "rasd[validate]" in done.stderr
    assert done.stdout == ""


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from rasd.validation.main import main

    with pytest.raises(SystemExit) as exc:
        main(["--record-golden", "--device", "cpu"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", "--checks", "V9"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", "--inject-fault", "drift", "--inject-check", "V4"])
    assert exc.value.code == 2
    assert "drift is caught by ['V2']" in capsys.readouterr().err
