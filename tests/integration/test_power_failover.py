"""The power loop on two replicas sharing PostgreSQL, and its leader SIGKILLed mid-period.

The real programs through bench/replicas.py's harness (the "Replicas" benchmark, smaller): two
`rasd-controller` processes with lease election and a `[power]` table, real agents on simulated GPUs
half on each replica. The leader caps every node of both replicas (the follower's through the
relay, from the aggregates it ships); a load change makes it move watts, decreases first, and it is
SIGKILLed the moment it has persisted an apply state with commands in flight. The other replica
takes the lease, continues the same apply state (the same command lineage, from the next sequence
number) and holds every budget: the limits the GPUs enforce never exceed a domain's budget, and no
agent runs a command id twice.

PostgreSQL comes from RASD_TEST_POSTGRES_URL; without it the test is skipped with a message (it
fails instead when RASD_TEST_POSTGRES_REQUIRED=1).
"""

from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import replicas  # bench/ is scripts, not a package

pytestmark = pytest.mark.slow

SETUP = replicas.Setup(nodes=4, gpus_per_node=2, settle_s=6.0, after_s=10.0)


def test_a_leader_killed_mid_period_is_continued_with_no_budget_violation_and_no_command_run_twice(
    postgres_schema_url, tmp_path
):
    figures = asyncio.run(replicas.run_replicas(SETUP, postgres_schema_url, tmp_path))
    print("\n" + "\n".join(f"{k}: {v}" for k, v in figures.items()))
    assert figures["violations"] == 0, f"budget violations: {figures['violation_domains']}"
    assert figures["duplicates"] == {}, "a command ran twice on an agent"
    assert figures["old_leader_nodes"] == SETUP.node_ids(), "the leader capped the nodes of both replicas"
    assert figures["relayed_to_ctl_b_nodes_before_kill"] > 0, "caps reached the follower's nodes through the relay"
    assert figures["in_flight_at_kill"] > 0, "killed with commands in flight"
    assert figures["takeover_s"] <= SETUP.lease_s + 1.0
    # The new leader continued the stored two-phase state: the same lineage, from where it stopped.
    assert len(figures["cap_epochs"]) == 1
    assert figures["restored_next_seq"] >= figures["persisted_next_seq_at_kill"] > 0
    assert figures["new_leader_caps_before_kill"] == 0
    assert figures["new_leader_caps"] > 0 and figures["new_leader_nodes"] == SETUP.node_ids()
    ok, missed = replicas.goal_met(figures, SETUP)
    assert ok, missed
