"""The agent's TLS settings: the shipped agent.toml, the [tls] table and flags, and bad files named."""

from __future__ import annotations

import pathlib
import tomllib

import pytest

from rasd.agent import main as agent_main
from rasd.agent import settings as agent_settings
from rasd.common import devcerts, tls

HOST = agent_settings.HostDefaults(hostname="node-h", ib_sysfs_present=False)


def _settings(argv, table):
    return agent_settings.load(table, vars(agent_main.build_parser().parse_args(argv)), HOST)


def test_the_shipped_agent_toml_uses_mutual_tls_from_etc_rasd(repo_root):
    settings = _settings([], tomllib.loads((repo_root / "agent/packaging/agent.toml").read_text()))
    assert settings.tls.files == tls.TlsFiles(
        ca=pathlib.Path("/etc/rasd/tls/ca.crt"),
        cert=pathlib.Path("/etc/rasd/tls/agent.crt"),
        key=pathlib.Path("/etc/rasd/tls/agent.key"),
    )


def test_flags_override_the_table_and_unknown_keys_are_named(tmp_path):
    pki = devcerts.init(tmp_path, ["n1"])
    settings = _settings(
        ["--tls-cert", str(pki.nodes["n1"].cert), "--tls-key", str(pki.nodes["n1"].key)],
        {"tls": {"ca": str(pki.ca.cert), "server_name": "rasd.example"}},
    )
    files = settings.tls.files
    assert files is not None
    assert files.cert == pki.nodes["n1"].cert and settings.tls.server_name == "rasd.example"
    files.read()
    with pytest.raises(
        ValueError, match=r"tls\.certificate \(agent\.toml\): unknown setting \(known: ca, cert, key, server_name\)"
    ):
        _settings([], {"tls": {"certificate": "x"}})


def test_insecure_means_plaintext_and_only_to_a_loopback_controller():
    assert _settings(["--insecure"], {}).tls.files is None
    with pytest.raises(
        ValueError, match=r"insecure \(--insecure\): refusing plaintext gRPC to non-loopback controller .10\.0\.0\.1."
    ):
        _settings(["--insecure", "--controller", "10.0.0.1:7443"], {})


def test_the_agent_refuses_to_start_without_its_certificate(tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        agent_main.main(["--backend", "simulated", "--tls-ca", str(tmp_path / "missing.crt")])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "missing.crt" in err and "--insecure" in err
