"""Remediation policy: defaults are valid, TOML-shaped dicts load, bad input names its key."""

from __future__ import annotations

import tomllib

import pytest

from rasd.controller.core.remediation import policy


def test_defaults_are_valid():
    pol = policy.RemediationPolicy()
    for group in (pol.classification, pol.correlation, pol.escalation, pol.disruption):
        group.validate()


def test_an_empty_mapping_gives_the_defaults():
    assert policy.RemediationPolicy.from_mapping({}) == policy.RemediationPolicy()


def test_a_toml_document_loads_with_int_to_float_and_string_xid_keys():
    doc = tomllib.loads(
        """
        [classification]
        ib_flap_isolation = "port"
        nvlink_crc_rate_per_s = 50
        [classification.xid_action_overrides]
        "13" = "reset_gpu"
        [correlation]
        sticky_xids = [79, 95]
        [escalation]
        max_attempts_reset_gpu = 1
        bmc_power_cycle_enabled = true
        [disruption]
        max_disrupted_nodes = 4
        [disruption.domain_max_nodes]
        rack = 1
        """
    )
    pol = policy.RemediationPolicy.from_mapping(doc)
    assert pol.classification.ib_flap_isolation == "port"
    assert pol.classification.nvlink_crc_rate_per_s == 50.0
    assert dict(pol.classification.xid_action_overrides) == {13: "reset_gpu"}
    assert pol.correlation.sticky_xids == (79, 95)
    assert pol.escalation.max_attempts("reset_gpu") == 1
    assert pol.escalation.bmc_power_cycle_enabled is True
    assert pol.disruption.max_disrupted_nodes == 4
    assert dict(pol.disruption.domain_max_nodes) == {"rack": 1}


@pytest.mark.parametrize(
    ("mapping", "key"),
    [
        ({"escalaton": {}}, "escalaton:"),
        ({"escalation": {"max_attempt_reset_gpu": 1}}, "escalation.max_attempt_reset_gpu:"),
        ({"escalation": {"max_attempts_reset_gpu": -1}}, "escalation.max_attempts_reset_gpu:"),
        ({"escalation": {"max_attempts_reset_gpu": 1.5}}, "escalation.max_attempts_reset_gpu:"),
        ({"escalation": {"bmc_power_cycle_enabled": "yes"}}, "escalation.bmc_power_cycle_enabled:"),
        ({"escalation": {"reboot_node_timeout_s": 0}}, "escalation.reboot_node_timeout_s:"),
        ({"escalation": {"post_repair_suite": ""}}, "escalation.post_repair_suite:"),
        ({"classification": {"retired_pages_rma": 0}}, "classification.retired_pages_rma:"),
        ({"classification": {"ib_flap_isolation": "rack"}}, "classification.ib_flap_isolation:"),
        ({"classification": {"ib_flap_state_changes": 1}}, "classification.ib_flap_state_changes:"),
        ({"classification": {"xid_action_overrides": {"x13": "none"}}}, "classification.xid_action_overrides.x13:"),
        ({"classification": {"xid_action_overrides": {"13": "explode"}}}, "classification.xid_action_overrides.13:"),
        ({"correlation": {"sticky_xids": [79, "95"]}}, "correlation.sticky_xids[1]:"),
        ({"correlation": {"sticky_window_s": 60}}, "correlation.sticky_window_s:"),
        ({"disruption": {"max_disrupted_nodes_pct": 0}}, "disruption.max_disrupted_nodes_pct:"),
        ({"disruption": {"breaker_quarantine_pct": 101}}, "disruption.breaker_quarantine_pct:"),
        ({"disruption": {"domain_max_nodes": {"rack": -1}}}, "disruption.domain_max_nodes.rack:"),
        ({"disruption": {"domain_max_pct": {"rack": 0}}}, "disruption.domain_max_pct.rack:"),
        ({"disruption": []}, "disruption:"),
    ],
)
def test_bad_input_names_the_offending_key(mapping, key):
    with pytest.raises(policy.PolicyError) as err:
        policy.RemediationPolicy.from_mapping(mapping)
    assert str(err.value).startswith(key)


def test_timeouts_and_budgets_are_looked_up_by_action_word():
    esc = policy.EscalationPolicy()
    assert esc.timeout_s("reboot_node") == esc.reboot_node_timeout_s
    assert esc.timeout_s("run_validation") == esc.validation_timeout_s
    assert esc.max_attempts("power_cycle_bmc") == esc.max_attempts_power_cycle_bmc
