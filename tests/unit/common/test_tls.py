"""Dev certificates and the TLS file checks: what `rasctl certs init` writes, and bad files named."""

from __future__ import annotations

import datetime
import stat

import pytest

from rasd.common import devcerts, tls


def test_init_writes_a_ca_a_controller_nodes_and_one_operator_per_role(tmp_path):
    pki = devcerts.init(tmp_path / "d", ["gpu-1", "gpu-2"], controller_names=["rasd.example", "10.0.0.5"])
    for pair in [pki.ca, pki.controller, *pki.nodes.values(), *pki.operators.values()]:
        assert pair.cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
        assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600
    controller = tls.parse_certificate(pki.controller.cert.read_bytes())
    assert controller.dns_names == ("localhost", "rasd.example")
    node = tls.parse_certificate(pki.nodes["gpu-2"].cert.read_bytes())
    assert (node.node_id, node.units) == ("gpu-2", ("node",))
    assert tls.parse_certificate(pki.operators["operator"].cert.read_bytes()).units == ("operator",)
    for pair in [pki.controller, pki.nodes["gpu-1"], pki.operators["admin"]]:
        tls.TlsFiles(pki.ca.cert, pair.cert, pair.key).read()


def test_init_again_keeps_the_ca_and_adds_nodes(tmp_path):
    first = devcerts.init(tmp_path, ["a"])
    ca = first.ca.cert.read_bytes()
    second = devcerts.init(tmp_path, ["b"])
    assert second.ca.cert.read_bytes() == ca
    assert sorted(devcerts.existing(tmp_path).nodes) == ["a", "b"]
    with pytest.raises(FileNotFoundError, match="certs init"):
        devcerts.existing(tmp_path / "none")


@pytest.mark.parametrize("bad", ["", "../x", "a b", ".hidden"])
def test_a_node_id_that_cannot_be_a_certificate_name_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="node id"):
        devcerts.init(tmp_path, [bad])


def test_bad_files_are_named(tmp_path):
    pki = devcerts.init(tmp_path, ["a", "b"])
    mismatched = tls.TlsFiles(pki.ca.cert, pki.nodes["a"].cert, pki.nodes["b"].key)
    with pytest.raises(ValueError, match=r"b\.key: does not belong to the certificate .*a\.crt"):
        mismatched.read()
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not pem")
    with pytest.raises(ValueError, match=r"garbage\.pem: not a PEM CA bundle"):
        tls.TlsFiles(garbage, pki.nodes["a"].cert, pki.nodes["a"].key).read()
    with pytest.raises(ValueError, match=r"garbage\.pem: not an unencrypted PEM private key"):
        tls.TlsFiles(pki.ca.cert, pki.nodes["a"].cert, garbage).read()
    with pytest.raises(ValueError, match=r"tls\.key: required"):
        tls.TlsFiles.from_mapping({"ca": "x", "cert": "y"})


def test_the_reloading_credentials_keep_the_last_good_pair(tmp_path):
    pki = devcerts.init(tmp_path, [])
    reloading = tls.ReloadingServerCredentials(tls.TlsFiles(pki.ca.cert, pki.controller.cert, pki.controller.key))
    assert reloading._fetch() is None  # nothing changed: gRPC keeps its configuration
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    devcerts.issue_controller(pki, now=later)
    assert reloading._fetch() is not None and reloading.reloads == 1
    pki.controller.key.write_text("half-written")
    assert reloading._fetch() is None and reloading.reloads == 1


def test_client_keepalive_respects_the_controllers_ping_floor():
    # Pings more often than the server allows without data earn a GOAWAY ("too_many_pings").
    from rasd.agent import settings as agent_settings

    options = dict(tls.channel_options())
    assert options["grpc.keepalive_time_ms"] >= tls.SERVER_MIN_PING_INTERVAL_MS
    assert agent_settings.LinkSettings().keepalive_time_s * 1000 == options["grpc.keepalive_time_ms"]
