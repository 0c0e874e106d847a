"""The `[power]` table of controller.toml: it loads, and every bad key is named with its path."""

from __future__ import annotations

import pytest

from rasd.controller import main
from rasd.controller.power import loop as power_loop

TREE = """
[power.tree]
budget_w = 12000
[[power.tree.rows]]
name = "row-a"
[[power.tree.rows.racks]]
name = "rack-a1"
budget_w = 6000
[[power.tree.rows.racks.nodes]]
name = "gpu-1"
"""


def _load(tmp_path, text):
    path = tmp_path / "controller.toml"
    path.write_text(text)
    return main.load_config(path)


def test_a_power_table_loads(tmp_path):
    config = _load(tmp_path, "[power]\ndetect_window_s = 8.0\n[power.policy]\ncontrol_period_s = 1.5\n" + TREE)
    settings = power_loop.PowerSettings.from_mapping(config["power"])
    assert settings.detect_window_s == 8.0 and settings.policy.control_period_s == 1.5
    assert settings.tree.domain("rack-a1").budget_w == 6000


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[power]\ndetect_windw_s = 8.0\n" + TREE, "power.detect_windw_s"),
        ("[power]\ndraw_window_s = 0\n" + TREE, "power.draw_window_s"),
        ("[power.policy]\ncontrol_period_s = -1\n" + TREE, "power.policy.control_period_s"),
        ("[power]\nseed = 1\n", "power.tree"),
        (TREE.replace("budget_w = 6000", "budget_w = -5"), "power.tree.rows[0].racks[0].budget_w"),
    ],
)
def test_bad_power_settings_name_the_key(tmp_path, text, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        _load(tmp_path, text)


def test_policy_toml_round_trips():
    policy = power_loop.PowerSettings.from_mapping(
        {"tree": {"budget_w": 1000, "rows": [{"name": "r", "racks": [{"name": "k", "nodes": [{"name": "n"}]}]}]},
         "policy": {"peak_cap_enabled": True, "swing_target_w": 5000}}
    ).policy  # fmt: skip
    text = power_loop.policy_to_toml(policy)
    assert power_loop.policy_from_toml(text) == policy.to_mapping()
    assert power_loop.policy_from_toml("[power.policy]\ncontrol_period_s = 2.0\n") == {"control_period_s": 2.0}
