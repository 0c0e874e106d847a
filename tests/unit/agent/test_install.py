"""`rasd-agent install`: the packaged unit and agent.toml written under --root, nothing with --dry-run,
an operator's agent.toml kept, and the written unit accepted by `systemd-analyze verify`.

These run the real console script of this venv; tests/integration/test_agent_install_wheel.py does
the same from a freshly built wheel in a fresh venv.
"""

from __future__ import annotations

import pathlib
import shutil
import stat
import subprocess

import pytest

from rasd.agent import install


def _install(venv_bin, *args):
    return subprocess.run(
        [str(venv_bin / "rasd-agent"), "install", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_install_root_writes_the_unit_config_and_state_folders(tmp_path, venv_bin):
    done = _install(venv_bin, "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "etc/systemd/system/rasd-agent.service"
    config = tmp_path / "etc/rasd/agent.toml"
    executable = (venv_bin / "rasd-agent").resolve()
    lines = unit.read_text().splitlines()
    assert f"ExecStart={executable} --config /etc/rasd/agent.toml $RASD_AGENT_ARGS" in lines
    assert f"Environment=PATH={executable.parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in lines
    assert config.read_text() == install.packaged_text("agent.toml")
    assert (_mode(unit), _mode(config)) == (0o644, 0o644)
    assert _mode(tmp_path / "etc/rasd/tls") == 0o700 and _mode(tmp_path / "var/lib/rasd-agent") == 0o700
    said = done.stdout.splitlines()
    assert f"wrote {unit} (ExecStart={executable})" in said
    assert f"skipped systemctl daemon-reload (--root: run it on the node that boots {tmp_path})" in said
    assert f"skipped systemctl enable rasd-agent.service (--root: run it on the node that boots {tmp_path})" in said


def test_the_written_unit_passes_systemd_analyze_verify(tmp_path, venv_bin):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd; .ci/run installs it)")
    assert _install(venv_bin, "--root", str(tmp_path)).returncode == 0
    unit = tmp_path / "etc/systemd/system/rasd-agent.service"
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in result.stderr.splitlines() if "rasd-agent.service" in line]
    assert (result.returncode, problems) == (0, []), result.stderr


def test_dry_run_says_every_step_and_writes_nothing(tmp_path, venv_bin):
    done = _install(venv_bin, "--root", str(tmp_path), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []
    said = done.stdout.splitlines()
    assert f"would write {tmp_path}/etc/rasd/agent.toml" in said
    assert f"would create {tmp_path}/var/lib/rasd-agent (mode 0700)" in said
    assert any(line.startswith(f"would write {tmp_path}/etc/systemd/system/rasd-agent.service") for line in said)


def test_dry_run_without_root_would_run_systemctl():
    said: list[str] = []
    steps = install.plan(pathlib.Path("/opt/rasd/bin/rasd-agent"))
    install.apply([s for s in steps if isinstance(s, install.RunCommand)], root=None, dry_run=True, say=said.append)
    assert said == ["would run systemctl daemon-reload", "would run systemctl enable rasd-agent.service"]


def test_an_existing_agent_toml_is_kept_unless_overwrite_is_asked(tmp_path, venv_bin):
    config = tmp_path / "etc/rasd/agent.toml"
    config.parent.mkdir(parents=True)
    config.write_text('node_id = "edited-by-the-operator"\n')
    done = _install(venv_bin, "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert config.read_text() == 'node_id = "edited-by-the-operator"\n'
    assert f"kept {config}: it exists (--overwrite-config replaces it)" in done.stdout.splitlines()
    assert _install(venv_bin, "--root", str(tmp_path), "--overwrite-config").returncode == 0
    assert config.read_text() == install.packaged_text("agent.toml")


def test_an_unwritable_target_fails_with_one_line_naming_it(tmp_path, venv_bin):
    (tmp_path / "etc").write_text("a file where a folder must go")
    done = _install(venv_bin, "--root", str(tmp_path))
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"rasd-agent install: {tmp_path}/etc/systemd/system/rasd-agent.service: ")


@pytest.mark.parametrize(
    ("executable", "hidden"),
    [
        ("/home/alice/venv/bin/rasd-agent", "/home"),
        ("/tmp/venv/bin/rasd-agent", "/tmp"),
        ("/opt/rasd/bin/rasd-agent", None),
    ],
)
def test_an_agent_the_unit_sandbox_hides_is_warned_about(executable, hidden):
    warning = install.hidden_from_the_unit(pathlib.Path(executable))
    if hidden is None:
        assert warning is None
    else:
        assert warning == (
            f"warning: {executable} is under {hidden}, which the unit hides from the service "
            "(ProtectHome=, PrivateTmp=); install rasd into /opt/rasd (python3 -m venv /opt/rasd)"
        )


def test_a_unit_template_without_the_expected_execstart_is_refused():
    template = install.packaged_text(install.UNIT_NAME).replace(install.PACKAGED_EXEC_START, "ExecStart=/bin/true ")
    with pytest.raises(install.InstallError, match="no single line starting 'ExecStart=/usr/local/bin/rasd-agent '"):
        install.render_unit(template, pathlib.Path("/opt/rasd/bin/rasd-agent"))
