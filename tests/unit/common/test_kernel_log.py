"""Kernel-log facts: their event kinds, their text form, and reading an older agent's attributes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.common import kernel_log
from rasd.common.kernel_log import KernelEvent, KernelEventKind
from rasd.common.vocabulary import EventKind
from rasd.common.xid_catalog import RecoveryAction


@pytest.mark.parametrize(
    ("kind", "xid", "event_kind"),
    [
        (KernelEventKind.XID, 79, EventKind.XID),
        (KernelEventKind.XID, 154, EventKind.RECOVERY_ACTION),
        (KernelEventKind.FALLEN_OFF_BUS, None, EventKind.FALLEN_OFF_BUS),
        (KernelEventKind.SXID, None, EventKind.SXID),
        (KernelEventKind.IB_LINK, None, EventKind.IB_LINK_STATE),
    ],
)
def test_event_kinds_both_ways(kind, xid, event_kind):
    assert kernel_log.event_kind(KernelEvent(kind=kind, message="", raw="", xid=xid)) is event_kind
    assert kernel_log.kernel_kind(event_kind) is kind


def test_kinds_the_kernel_log_never_reports_have_none():
    assert kernel_log.kernel_kind(EventKind.ECC_SBE_RATE) is None


def test_what_an_agent_before_the_typed_facts_sent_reads_as_facts():
    # The attributes such an agent put on an Xid 145 (its classification keys are ignored).
    attributes = {
        "kernel_event": "xid",
        "recommended_action": "none",
        "reason": "NVLink5 decode RLW_RXPIPE (V1): IGNORE",
        "raw": "4,1204,2201000300,-;NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal ...",
        "pci": "0018:01:00.0",
        "mnemonic": "NVLINK_RLW_ERROR",
        "kernel_time_us": "2201000300",
        "nvlink": "13",
        "nvlink_subcode": "RLW_RXPIPE",
        "nvlink_fatal": "false",
        "registers": "0x0409a0c2 0x00000008 0x00000001",
    }
    facts = kernel_log.from_attributes(attributes, message="RLW_RXPIPE Nonfatal", xid=145)
    assert facts == KernelEvent(
        kind=KernelEventKind.XID,
        message="RLW_RXPIPE Nonfatal",
        raw=attributes["raw"],
        xid=145,
        pci="0018:01:00.0",
        kernel_time_us=2201000300,
        nvlink=13,
        registers=(0x0409A0C2, 0x8, 0x1),
        nvlink_subcode="RLW_RXPIPE",
        nvlink_fatal=False,
    )


@pytest.mark.parametrize(
    ("text", "action"),
    [("GPU_RESET", RecoveryAction.GPU_RESET), ("2", RecoveryAction.NODE_REBOOT), ("99", None), ("Nonsense", None)],
)
def test_recovery_actions_read_by_name_or_number(text, action):
    facts = kernel_log.from_attributes({"kernel_event": "xid", "recovery_action": text})
    assert facts is not None and facts.recovery_action is action


def test_a_map_without_the_kernel_event_mark_has_no_facts():
    assert kernel_log.from_attributes({"pci": "0000:18:00.0"}) is None
    assert kernel_log.from_attributes({"kernel_event": "not-a-kind"}) is None


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["kernel_event", "pid", "registers", "nvlink", "recovery_action", "sxid_fatal", "ib_port", "raw", "x"]
        ),
        st.one_of(st.text(max_size=40), st.sampled_from(["xid", "sxid", "ib_link", "9" * 300, "0x1 0xzz", "١٢"])),
    )
)
def test_reading_never_raises_on_any_text(attributes):
    facts = kernel_log.from_attributes(attributes)
    if facts is not None:
        assert kernel_log.from_attributes(kernel_log.to_attributes(facts)) == facts
