"""Fuzzed kernel-log input: the parser never raises, its state stays bounded, and every event it finds
turns into a health event the controller's edge accepts (a refused one would block the agent's spool)
and its classifier classifies.

Inputs are arbitrary bytes and real lines from tests/fixtures/kmsg mutated at the byte level, decoded
the way the kmsg and journal followers decode them, and fed line by line to one parser per example
(the parser is stateful: multi-line messages, the PCI → UUID map).
"""

from __future__ import annotations

import math
import pathlib

import pytest
import rasd_fuzz_strategies as fuzz
from conftest import FUZZ_INPUTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rasd.agent import sources
from rasd.agent import wire as agent_wire
from rasd.agent.core import kmsg, model
from rasd.common import xid_catalog
from rasd.controller.core.remediation import classify, policy
from rasd.controller.core.remediation import events as health
from rasd.controller.rpc import validate_input
from rasd.controller.wire import agent as wire

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "kmsg"
REAL_LINES = sorted(
    {line for path in FIXTURES.glob("*.txt") for line in path.read_text(errors="replace").splitlines() if line.strip()}
)
PER_EXAMPLE = 50
DRAWN_PER_EXAMPLE = 10
NODE_GPU = "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"  # one UUID the fixtures print, as this node's GPU
PCI_MAP = {"0000:91:00.0": NODE_GPU}
KNOWN = frozenset({NODE_GPU})
CATALOG = xid_catalog.load_catalog()
POLICY = policy.ClassificationPolicy()


class Tally:
    lines = 0
    events = 0


@settings(
    # 20 % more examples than the promised count: hypothesis discards examples that overrun its buffer.
    max_examples=max(1, math.ceil(1.2 * FUZZ_INPUTS / PER_EXAMPLE)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(
    drawn=st.lists(fuzz.kernel_line(REAL_LINES), min_size=DRAWN_PER_EXAMPLE, max_size=DRAWN_PER_EXAMPLE),
    rng=st.randoms(use_true_random=False),
)
def test_fuzzed_kernel_log_lines(drawn, rng):
    # A few lines drawn by hypothesis, the rest byte-mutated from real and drawn lines (cheap to make).
    lines = drawn + [fuzz.mutate_line(rng.choice(REAL_LINES + drawn), rng) for _ in range(PER_EXAMPLE - len(drawn))]
    rng.shuffle(lines)
    parser = kmsg.KmsgParser()
    identity = validate_input.StreamIdentity(node_id="node-k", gpu_owners={NODE_GPU: "node-k"})
    limits = validate_input.InputLimits()
    for seq, line in enumerate(lines, start=1):
        Tally.lines += 1
        events = parser.feed(line)
        assert isinstance(events, list)
        for event in events:
            Tally.events += 1
            observation = sources.observation_for(event, 1_800_000_000_000_000_000, pci_map=PCI_MAP, known_gpus=KNOWN)
            spooled = model.SpooledEvent(seq=seq, observation=observation)
            batch = agent_wire.events([spooled]).events
            # What the agent would send passes the controller's edge and its conversion.
            validate_input.check_events(batch, identity, limits)
            (stored,) = wire.events_from_wire(batch, KNOWN, 1, "node-k")
            # ... and the controller's classifier decides about it from the facts the store keeps.
            core_event = health.HealthEvent(
                node_id="node-k", kind=health.EventKind(stored.kind), observed_at=0.0, gpu_uuid=stored.gpu_uuid,
                xid=stored.xid, message=stored.message, attributes=stored.attributes,
            )  # fmt: skip
            assert health.kernel_log_of(core_event) is not None
            classify.classify(core_event, catalog=CATALOG, policy=POLICY, ib_state_changes_in_window=1)
        # The parser's memory stays bounded whatever it is fed.
        assert len(parser._uuid_by_pci) <= kmsg.KmsgParser._MAX_UUIDS
        assert len(parser._pending_lines) <= kmsg._FALLEN_MAX_LINES


def test_kernel_log_counts(record_property):
    """Runs after the fuzz test above (file order): reports and checks the count."""
    record_property("fuzz:kernel log lines", Tally.lines)
    record_property("fuzz:kernel log events found in fuzzed lines", Tally.events)
    assert Tally.lines >= FUZZ_INPUTS
    assert Tally.events > 0


@pytest.mark.parametrize("line", REAL_LINES[:5])
def test_real_lines_still_parse(line):
    """A sanity anchor for the fuzz: the fixtures themselves parse without error."""
    assert isinstance(kmsg.KmsgParser().feed(line), list)
