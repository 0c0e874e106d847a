"""The distribution: namespaced import names, complete package list, committed generated code."""

from __future__ import annotations

import filecmp
import hashlib
import pathlib
import subprocess
import sys
import tomllib
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_source_package_is_listed_in_pyproject():
    setuptools_cfg = _pyproject()["tool"]["setuptools"]
    listed = set(setuptools_cfg["packages"])
    found = set()
    for dotted, folder in setuptools_cfg["package-dir"].items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            relative = init.parent.relative_to(root)
            found.add(".".join([dotted, *relative.parts]) if relative.parts else dotted)
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "listed packages with no __init__.py"


def test_committed_generated_code_matches_a_fresh_generation(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "proto" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    committed = REPO / "proto" / "gen" / "python"
    fresh_files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed_files = sorted(
        p.relative_to(committed) for p in committed.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    assert fresh_files == committed_files, "run `make proto` and commit proto/gen"
    differing = [str(p) for p in fresh_files if not filecmp.cmp(tmp_path / p, committed / p, shallow=False)]
    assert differing == [], "run `make proto` and commit proto/gen"


def test_runtime_floors_match_the_generator():
    project = _pyproject()["project"]
    grpc_gen = (REPO / "proto/gen/python/rasd/api/v1/agent_service_pb2_grpc.py").read_text()
    generated_grpc = grpc_gen.split("GRPC_GENERATED_VERSION = '")[1].split("'")[0]
    assert f"grpcio>={generated_grpc}" in project["dependencies"]
    assert f"grpcio-tools=={generated_grpc}" in project["optional-dependencies"]["dev"]
    pb2 = (REPO / "proto/gen/python/rasd/api/v1/health_pb2.py").read_text()
    gencode = pb2.split("# Protobuf Python Version: ")[1].split("\n")[0].strip()
    assert any(dep.startswith(f"protobuf>={gencode},") for dep in project["dependencies"])


def test_wheel_installs_only_the_rasd_namespace(tmp_path, build_wheel):
    wheel = build_wheel(tmp_path / "wheel")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        site = tmp_path / "site"
        archive.extractall(site)
    top_levels = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_levels == {"rasd"}
    assert "rasd/api/v1/agent_service_pb2.pyi" in names
    assert "rasd/common/data/nvidia-xid-catalog.csv" in names
    assert "rasd/sim/scenarios/demo.toml" in names
    # What `rasd-agent install` writes on a node, and the license pyproject names.
    assert {"rasd/agent/packaging/rasd-agent.service", "rasd/agent/packaging/agent.toml"} <= set(names)
    (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(license_name) == (REPO / "LICENSE").read_bytes()
    for script in ("rasd-agent", "rasd-controller", "rasctl", "rasd-validate", "rasd-sim"):
        assert f"{script} = rasd." in entry_points

    # A fresh interpreter that sees only the unpacked wheel plus third-party packages (not the
    # editable install, not the repo): rasd.* imports, the bare folder names do not.
    deps = [p for p in sys.path if p.endswith("site-packages")]
    probe = (
        "import importlib, sys\n"
        "import rasd.agent, rasd.controller, rasd.api.v1, rasd.validation, rasd.cli, rasd.sim\n"
        "from rasd.api.v1 import agent_service_pb2_grpc\n"
        f"assert rasd.agent.__file__.startswith({str(site)!r}), rasd.agent.__file__\n"
        "for bare in ('agent', 'controller', 'validation', 'proto', 'common', 'sim', 'cli'):\n"
        "    try:\n"
        "        importlib.import_module(bare)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    sys.exit(f'bare module {bare!r} is importable')\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": ":".join([str(site), *deps]), "PATH": "/usr/bin:/bin"}
    # -S: no site processing, so the venv's editable-install .pth hook never loads.
    result = subprocess.run(
        [sys.executable, "-S", "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_license_is_the_apache_2_0_text_unmodified():
    """pyproject says Apache-2.0; LICENSE is apache.org's LICENSE-2.0.txt byte for byte (its well-known md5)."""
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.md5(text, usedforsecurity=False).hexdigest() == "3b83ef96387f14655fc854ddc3c6bd57"
    assert _pyproject()["project"]["license"] == {"text": "Apache-2.0"}
