"""IB sysfs reading on a fixture tree, and the observations two readings imply."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.agent.core.model import EventKind, Severity
from rasd.agent.ib_sysfs import IbPortReading, ib_observations, parse_state, read_ib_ports

FIXTURE_ROOT = Path(__file__).parents[2] / "fixtures" / "sysfs" / "class" / "infiniband"
NOW_NS = 1_764_480_000_000_000_000


@pytest.fixture
def root(tmp_path: Path) -> Path:
    copy = tmp_path / "infiniband"
    shutil.copytree(FIXTURE_ROOT, copy)
    return copy


def write(root: Path, device: str, rel: str, text: str) -> None:
    (root / device / "ports" / "1" / rel).write_text(text + "\n")


def test_read_fixture_tree():
    readings = read_ib_ports(FIXTURE_ROOT)
    assert sorted(readings) == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1)]  # mlx5_3 has no ports
    assert readings[("mlx5_0", 1)] == IbPortReading(
        device="mlx5_0",
        port=1,
        state="ACTIVE",
        state_code=4,
        phys_state="LinkUp",
        link_layer="InfiniBand",
        rate="400 Gb/sec (4X NDR)",
        link_downed=3,
        link_error_recovery=1,
        symbol_error=12,
    )
    down = readings[("mlx5_1", 1)]
    assert (down.state, down.state_code, down.phys_state) == ("DOWN", 1, "Polling")
    roce = readings[("mlx5_2", 1)]
    assert (roce.link_layer, roce.link_downed, roce.link_error_recovery, roce.symbol_error) == (
        "Ethernet",
        0,
        None,
        None,
    )


def test_missing_root_means_no_hca(tmp_path):
    assert read_ib_ports(tmp_path / "nope") == {}


def test_unreadable_or_odd_files_become_none(root):
    write(root, "mlx5_0", "counters/link_downed", "not a number")
    (root / "mlx5_0" / "ports" / "1" / "state").unlink()
    reading = read_ib_ports(root)[("mlx5_0", 1)]
    assert (reading.link_downed, reading.state, reading.state_code) == (None, "", None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4: ACTIVE", (4, "ACTIVE")),
        ("1: DOWN\n", (1, "DOWN")),
        ("5: LinkUp", (5, "LinkUp")),
        ("7: Phy Test", (7, "Phy Test")),
        ("ACTIVE", (None, "ACTIVE")),
        ("", (None, "")),
        (None, (None, "")),
    ],
)
def test_parse_state(text, expected):
    assert parse_state(text) == expected


def test_first_reading_is_a_baseline():
    assert ib_observations(None, read_ib_ports(FIXTURE_ROOT), observed_unix_ns=NOW_NS) == ()


def test_no_change_no_observation(root):
    before = read_ib_ports(root)
    assert ib_observations(before, read_ib_ports(root), observed_unix_ns=NOW_NS) == ()


def test_link_flap_down(root):
    before = read_ib_ports(root)
    write(root, "mlx5_0", "state", "1: DOWN")
    write(root, "mlx5_0", "phys_state", "2: Polling")
    write(root, "mlx5_0", "counters/link_downed", "4")
    state, downed = ib_observations(before, read_ib_ports(root), observed_unix_ns=NOW_NS)
    assert all(o.kind is EventKind.IB_LINK_STATE and o.source == "ib_sysfs" for o in (state, downed))
    assert all(o.observed_unix_ns == NOW_NS for o in (state, downed))
    assert (state.attributes["signal"], state.severity, state.message) == (
        "state_change",
        Severity.WARNING,
        "mlx5_0 port 1: ACTIVE -> DOWN",
    )
    assert (state.attributes["previous_ib_state"], state.attributes["ib_state"]) == ("ACTIVE", "DOWN")
    assert (downed.attributes["signal"], downed.attributes["delta"], downed.attributes["link_downed"]) == (
        "link_downed",
        "1",
        "4",
    )
    assert downed.severity is Severity.WARNING


def test_flap_that_recovered_between_readings_still_shows_in_link_downed(root):
    before = read_ib_ports(root)
    write(root, "mlx5_0", "counters/link_downed", "5")
    write(root, "mlx5_0", "counters/link_error_recovery", "2")
    obs = ib_observations(before, read_ib_ports(root), observed_unix_ns=NOW_NS)
    assert [(o.attributes["signal"], o.attributes["delta"]) for o in obs] == [
        ("link_downed", "2"),
        ("link_error_recovery", "1"),
    ]


def test_port_coming_up_is_info(root):
    before = read_ib_ports(root)
    write(root, "mlx5_1", "state", "4: ACTIVE")
    (obs,) = ib_observations(before, read_ib_ports(root), observed_unix_ns=NOW_NS)
    assert (obs.severity, obs.message) == (Severity.INFO, "mlx5_1 port 1: DOWN -> ACTIVE")


def test_symbol_errors_need_a_minimum_increase(root):
    before = read_ib_ports(root)
    write(root, "mlx5_0", "counters/symbol_error", "111")  # +99
    assert ib_observations(before, read_ib_ports(root), observed_unix_ns=NOW_NS) == ()
    (obs,) = ib_observations(before, read_ib_ports(root), observed_unix_ns=NOW_NS, symbol_error_min_delta=50)
    assert (obs.attributes["signal"], obs.attributes["delta"]) == ("symbol_error", "99")


def test_counter_reset_is_not_a_negative_delta():
    before = {("mlx5_0", 1): IbPortReading("mlx5_0", 1, "ACTIVE", link_downed=200)}
    after_reset_quiet = {("mlx5_0", 1): IbPortReading("mlx5_0", 1, "ACTIVE", link_downed=0)}
    after_reset_flap = {("mlx5_0", 1): IbPortReading("mlx5_0", 1, "ACTIVE", link_downed=2)}
    assert ib_observations(before, after_reset_quiet, observed_unix_ns=NOW_NS) == ()
    (obs,) = ib_observations(before, after_reset_flap, observed_unix_ns=NOW_NS)
    assert obs.attributes["delta"] == "2"


def test_counter_that_becomes_unreadable_is_not_a_change():
    reading = IbPortReading("mlx5_0", 1, "ACTIVE", link_downed=3)
    unreadable = dataclasses.replace(reading, link_downed=None)
    assert ib_observations({("mlx5_0", 1): reading}, {("mlx5_0", 1): unreadable}, observed_unix_ns=NOW_NS) == ()


def test_ports_removed_and_added(root):
    before = read_ib_ports(root)
    shutil.rmtree(root / "mlx5_1")
    shutil.copytree(root / "mlx5_0", root / "mlx5_4")
    removed, added = ib_observations(before, read_ib_ports(root), observed_unix_ns=NOW_NS)
    assert (removed.attributes["signal"], removed.attributes["ib_device"], removed.severity) == (
        "port_removed",
        "mlx5_1",
        Severity.WARNING,
    )
    assert (added.attributes["signal"], added.attributes["ib_device"], added.severity) == (
        "port_added",
        "mlx5_4",
        Severity.INFO,
    )


def test_attributes_are_text():
    before = read_ib_ports(FIXTURE_ROOT)
    after = {k: dataclasses.replace(v, state="INIT") for k, v in before.items()}
    for obs in ib_observations(before, after, observed_unix_ns=NOW_NS):
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in obs.attributes.items())


_COUNTER = st.one_of(st.none(), st.integers(0, 0xFFFF))


@st.composite
def readings(draw):
    keys = draw(st.sets(st.tuples(st.sampled_from(["mlx5_0", "mlx5_1", "mlx5_2"]), st.integers(1, 2)), max_size=4))
    return {
        key: IbPortReading(
            key[0],
            key[1],
            draw(st.sampled_from(["ACTIVE", "DOWN", "INIT", "ARMED", ""])),
            link_downed=draw(_COUNTER),
            link_error_recovery=draw(_COUNTER),
            symbol_error=draw(_COUNTER),
        )
        for key in sorted(keys)
    }


@settings(max_examples=150, deadline=None)
@given(readings(), readings())
def test_diff_properties(before, after):
    assert ib_observations(before, before, observed_unix_ns=NOW_NS) == ()
    for obs in ib_observations(before, after, observed_unix_ns=NOW_NS):
        assert (obs.attributes["ib_device"], int(obs.attributes["ib_port"])) in set(before) | set(after)
        if "delta" in obs.attributes:
            assert int(obs.attributes["delta"]) > 0
