"""controller.toml: the shipped example loads; a bad key is named."""

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
