"""`rasd-agent install`: put the packaged systemd unit and agent.toml on this node and enable the service.

The wheel carries both files as package data (`rasd.agent` / `packaging/`), so an install needs no
git checkout::

    sudo python3 -m venv /opt/rasd && sudo /opt/rasd/bin/pip install 'rasd[nvml]'
    sudo /opt/rasd/bin/rasd-agent install

writes `/etc/systemd/system/rasd-agent.service` with `ExecStart` (and the front of `PATH`, where
`rasd-validate` is found) pointing at the rasd-agent it was run from, writes `/etc/rasd/agent.toml`
unless one is there (`--overwrite-config` replaces it), creates `/etc/rasd/tls` and
`/var/lib/rasd-agent`, and runs `systemctl daemon-reload` and `systemctl enable rasd-agent.service`.
`--root DIR` writes everything under DIR (an image being built, a test) and `--dry-run` writes
nothing; both skip systemctl and say so. Every step prints one line saying what it did.

`plan()` decides the steps from the packaged files and the executable's folder; `apply()` carries
them out, so a dry run prints exactly what a real run would do.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence

UNIT_NAME = "rasd-agent.service"
UNIT_PATH = pathlib.PurePosixPath("/etc/systemd/system") / UNIT_NAME
CONFIG_PATH = pathlib.PurePosixPath("/etc/rasd/agent.toml")
TLS_DIR = pathlib.PurePosixPath("/etc/rasd/tls")
STATE_DIR = pathlib.PurePosixPath("/var/lib/rasd-agent")
PACKAGED_EXEC_START = "ExecStart=/usr/local/bin/rasd-agent "
"""The start of the packaged unit's ExecStart line, which `render_unit` points at the real executable."""
PACKAGED_PATH = "Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The packaged unit's PATH, to which `render_unit` prepends the executable's folder."""
HIDDEN_FROM_THE_UNIT = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")
"""Folders the unit's ProtectHome= and PrivateTmp= hide from the service: an agent there cannot start."""


class InstallError(Exception):
    """The install cannot go on; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class WriteFile:
    """Write text to a file (mode), or keep an existing file when keep_existing."""

    path: pathlib.PurePosixPath
    text: str
    mode: int
    keep_existing: bool = False
    note: str = ""
    """Said after the path when written (e.g. where ExecStart points)."""


@dataclasses.dataclass(frozen=True)
class MakeDir:
    """Create a folder (and its parents) with mode, if it is not there."""

    path: pathlib.PurePosixPath
    mode: int


@dataclasses.dataclass(frozen=True)
class RunCommand:
    """Run a command on the node (skipped with --root and --dry-run)."""

    argv: tuple[str, ...]


Step = WriteFile | MakeDir | RunCommand


def packaged_text(name: str) -> str:
    """A file of the packaged `agent/packaging/` folder (in the wheel: rasd/agent/packaging/NAME)."""
    return importlib.resources.files("rasd.agent").joinpath("packaging", name).read_text(encoding="utf-8")


def render_unit(template: str, executable: pathlib.Path) -> str:
    """The packaged unit with ExecStart at executable and its folder first on PATH.

    Raises:
        InstallError: the template lacks the lines to adapt (a packaging bug, named).
    """
    for expected in (PACKAGED_EXEC_START, PACKAGED_PATH):
        if template.count(expected) != 1:
            raise InstallError(f"the packaged {UNIT_NAME} has no single line starting {expected!r}")
    bin_dir = str(executable.parent)
    path = PACKAGED_PATH.replace("PATH=", f"PATH={bin_dir}:", 1) if bin_dir != "/usr/local/bin" else PACKAGED_PATH
    return template.replace(PACKAGED_EXEC_START, f"ExecStart={executable} ", 1).replace(PACKAGED_PATH, path, 1)


def plan(executable: pathlib.Path, *, overwrite_config: bool = False) -> list[Step]:
    """The steps of an install of the agent at executable."""
    unit = render_unit(packaged_text(UNIT_NAME), executable)
    return [
        WriteFile(UNIT_PATH, unit, 0o644, note=f"ExecStart={executable}"),
        WriteFile(CONFIG_PATH, packaged_text("agent.toml"), 0o644, keep_existing=not overwrite_config),
        MakeDir(TLS_DIR, 0o700),
        MakeDir(STATE_DIR, 0o700),
        RunCommand(("systemctl", "daemon-reload")),
        RunCommand(("systemctl", "enable", UNIT_NAME)),
    ]


def agent_executable(argv0: str = "") -> pathlib.Path:
    """The rasd-agent being run: argv[0] when it is one, else the interpreter's scripts folder, else PATH.

    Raises:
        InstallError: none of them holds an executable rasd-agent.
    """
    candidates = []
    if pathlib.Path(argv0).name == "rasd-agent":
        candidates.append(pathlib.Path(argv0))
    candidates.append(pathlib.Path(sysconfig.get_path("scripts")) / "rasd-agent")
    found = shutil.which("rasd-agent")
    if found:
        candidates.append(pathlib.Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            # Resolved: the venv's own bin folder, where rasd-validate lives too, not a symlink's.
            return candidate.resolve()
    raise InstallError(
        "cannot find the rasd-agent executable; run `rasd-agent install` from the environment rasd is installed in"
    )


def hidden_from_the_unit(executable: pathlib.Path) -> str | None:
    """A warning when the unit's sandbox hides executable from the service (it could not start), else None."""
    hidden = next((folder for folder in HIDDEN_FROM_THE_UNIT if executable.is_relative_to(folder)), None)
    if hidden is None:
        return None
    return (
        f"warning: {executable} is under {hidden}, which the unit hides from the service "
        "(ProtectHome=, PrivateTmp=); install rasd into /opt/rasd (python3 -m venv /opt/rasd)"
    )


def apply(steps: Sequence[Step], *, root: pathlib.Path | None, dry_run: bool, say: Callable[[str], None]) -> None:
    """Carry out the steps under root (None: /), or only say what they would do.

    Raises:
        InstallError: a step failed (the message names the path or command and why).
    """
    for step in steps:
        if isinstance(step, RunCommand):
            _run(step, root=root, dry_run=dry_run, say=say)
            continue
        target = (root or pathlib.Path("/")) / step.path.relative_to("/")
        try:
            if isinstance(step, MakeDir):
                _make_dir(step, target, dry_run=dry_run, say=say)
            else:
                _write_file(step, target, dry_run=dry_run, say=say)
        except OSError as exc:
            hint = " (run as root, or pass --root DIR)" if isinstance(exc, PermissionError) else ""
            raise InstallError(f"{target}: {exc.strerror or exc}{hint}") from None


def _write_file(step: WriteFile, target: pathlib.Path, *, dry_run: bool, say: Callable[[str], None]) -> None:
    note = f" ({step.note})" if step.note else ""
    if step.keep_existing and target.exists():
        say(f"kept {target}: it exists (--overwrite-config replaces it)")
        return
    if dry_run:
        say(f"would write {target}{note}")
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed over it: a crash leaves the old file or the new one.
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(step.text, encoding="utf-8")
    partial.chmod(step.mode)
    partial.replace(target)
    say(f"wrote {target}{note}")


def _make_dir(step: MakeDir, target: pathlib.Path, *, dry_run: bool, say: Callable[[str], None]) -> None:
    if target.is_dir():
        say(f"exists {target}")
    elif dry_run:
        say(f"would create {target} (mode {step.mode:04o})")
    else:
        target.mkdir(parents=True, mode=step.mode)
        target.chmod(step.mode)  # mkdir's mode is masked by the umask
        say(f"created {target} (mode {step.mode:04o})")


def _run(step: RunCommand, *, root: pathlib.Path | None, dry_run: bool, say: Callable[[str], None]) -> None:
    command = " ".join(step.argv)
    if root is not None:
        say(f"skipped {command} (--root: run it on the node that boots {root})")
        return
    if dry_run:
        say(f"would run {command}")
        return
    try:
        done = subprocess.run(step.argv, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise InstallError(
            f"{step.argv[0]}: not found (is this a systemd host? --root DIR writes the files only)"
        ) from None
    except subprocess.TimeoutExpired:
        raise InstallError(f"{command}: no answer within 60 s") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise InstallError(f"{command}: exit {done.returncode}: {detail[0]}")
    say(f"ran {command}")


def build_parser() -> argparse.ArgumentParser:
    """The command line of `rasd-agent install`."""
    parser = argparse.ArgumentParser(
        prog="rasd-agent install",
        description="Install rasd-agent as a systemd service on this node: the unit, /etc/rasd/agent.toml, "
        "the state folders, then systemctl daemon-reload and enable.",
    )
    parser.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    parser.add_argument(
        "--root", type=pathlib.Path, help="write everything under this folder instead of / (skips systemctl)"
    )
    parser.add_argument("--overwrite-config", action="store_true", help="replace an existing /etc/rasd/agent.toml")
    return parser


def main(argv: Sequence[str]) -> int:
    """Run `rasd-agent install`; returns the exit code (0 done, 1 failed)."""
    args = build_parser().parse_args(argv)
    say = print
    try:
        executable = agent_executable(sys.argv[0])
        warning = hidden_from_the_unit(executable)
        if warning:
            say(warning)
        apply(plan(executable, overwrite_config=args.overwrite_config), root=args.root, dry_run=args.dry_run, say=say)
    except InstallError as exc:
        print(f"rasd-agent install: {exc}", file=sys.stderr)
        return 1
    say(
        f"next: set this node's labels and controller in {CONFIG_PATH}, put its certificate in {TLS_DIR} "
        "(ca.crt, agent.crt, agent.key), run `rasd-agent check`, then `systemctl enable --now rasd-agent`"
    )
    return 0
