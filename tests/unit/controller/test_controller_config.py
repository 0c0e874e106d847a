"""controller.toml: the shipped example loads; a bad key is named. And where the metrics port binds."""

from __future__ import annotations

import pytest

from rasd.controller import main


def test_shipped_example_loads(repo_root):
    config = main.load_config(repo_root / "controller/packaging/controller.toml")
    assert config["remediation_policy"].disruption.max_disrupted_nodes == 8
    assert config["quarantine"]["adapter"] == "record"
    assert "bmc" not in config


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[remediaton]\n", "remediaton"),
        ("[remediation.escalation]\nmax_attempts_reset_gpu = -1\n", "remediation.escalation.max_attempts_reset_gpu"),
        ("[quarantine]\nadapter = 'carrier-pigeon'\n", "adapter"),
    ],
)
def test_bad_config_is_named(tmp_path, text, complaint):
    path = tmp_path / "controller.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=complaint.replace(".", r"\.")):
        main.load_config(path)


@pytest.mark.parametrize(
    ("argv", "bound"),
    [
        (["--insecure"], "127.0.0.1"),  # was 0.0.0.0 (issue #37 item 18)
        (["--insecure", "--metrics-addr", "0.0.0.0"], "0.0.0.0"),
        (["--tls-ca", "ca.pem"], "0.0.0.0"),  # mutual TLS, in the cluster: its scraper reaches the pod
        (["--metrics-addr", "10.0.0.7"], "10.0.0.7"),
    ],
)
def test_a_plaintext_controller_binds_its_metrics_to_loopback_unless_told(argv, bound):
    assert main.metrics_bind_address(main.build_parser().parse_args(argv)) == bound
