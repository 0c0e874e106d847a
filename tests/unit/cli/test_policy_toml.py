"""`rasctl power policy set` sends its changes as TOML: written by a TOML writer, it reads back the same."""

from __future__ import annotations

import tomllib

from rasd.cli import power_views
from rasd.controller.core.power import policy as power_policy
from rasd.controller.power import loop as power_loop


def test_policy_changes_round_trip_through_toml_whatever_their_quotes():
    # repr() wrote 'it\'s "x"' here: not TOML, so the controller refused the text instead of naming the key.
    changes = {"control_period_s": 2.5, "peak_cap_enabled": True, "job_start_cap_w": 300, "odd": 'it\'s "x"\n'}
    assert tomllib.loads(power_views._toml(changes)) == changes


def test_the_controllers_policy_toml_reads_back_as_the_same_policy():
    policy = power_policy.PowerPolicy.from_mapping({"control_period_s": 1e-3 * 2500, "job_start_cap_w": 275.5})
    text = power_loop.policy_to_toml(policy)
    assert power_policy.PowerPolicy.from_mapping(power_loop.policy_from_toml(text)) == policy
