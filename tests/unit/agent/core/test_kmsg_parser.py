"""The kernel-log parser on real driver lines (tests/fixtures/kmsg/README.md says where each came from)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.agent.core.kmsg import KmsgParser, normalize_pci, parse_lines, to_observation
from rasd.agent.core.model import EventKind, Severity
from rasd.common import kernel_log
from rasd.common.kernel_log import KernelEvent, KernelEventKind
from rasd.common.xid_catalog import RecoveryAction

FIXTURES = Path(__file__).parents[3] / "fixtures" / "kmsg"

XID_79 = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID_109 = (
    "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
    "errorString CTX SWITCH TIMEOUT, Info 0x58005"
)

XID_154_REBOOT = (
    "NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
)
XID_154_CLEARED = (
    "NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)"
)
XID_149 = (
    "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
    "(0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
XID_144 = (
    "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 "
    "(0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)"
)


def fixture_events(name: str) -> list[KernelEvent]:
    return parse_lines((FIXTURES / name).read_text().splitlines())


def one(line: str) -> KernelEvent:
    events = KmsgParser().feed(line)
    assert len(events) == 1, events
    return events[0]


# --- prefixes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "time_us"),
    [
        ("", None),
        ("[6781741.548779] ", 6781741548779),
        ("[   38.1] ", 38100000),
        ("[Fri Aug 30 11:43:09 2024] ", None),
        ("kern  :err   : 2025-01-25T10:34:54,859532+00:00 ", None),
        ("Nov 30 05:33:20 gpu-node-03 kernel: ", None),
        ("Nov 30 05:33:20 gpu-node-03 kernel: [449410.332316] ", 449410332316),
        ("2025-11-30T05:33:20+0000 gpu-node-03 kernel: ", None),
        ("<3>", None),
        ("3,1208,2201000700,-;", 2201000700),
        ("3,1208,2201000700,-,caller=T12;", 2201000700),
    ],
)
def test_xid_line_with_every_prefix(prefix, time_us):
    e = one(prefix + XID_79 + "\n")
    assert (e.kind, e.xid, e.pci, e.pid, e.process) == (KernelEventKind.XID, 79, "0000:91:00.0", None, None)
    assert e.message == "GPU has fallen off the bus."
    assert e.kernel_time_us == time_us
    assert e.raw == prefix + XID_79


def test_pid_and_name_are_split_off():
    e = one("[Fri Aug 30 11:43:14 2024] " + XID_109)
    assert (e.xid, e.pid, e.process) == (109, 1797828, "pt_main_thread")
    assert e.message == "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"


@pytest.mark.parametrize(
    ("rest", "pid", "process", "message"),
    [
        ("pid=1234, name=python3, Contained ECC error", 1234, "python3", "Contained ECC error"),
        ("pid='<unknown>', name=<unknown>, Graphics Exception", None, None, "Graphics Exception"),
        (
            "pid=<n/a>, name=<unknown>, NVLink: fatal error detected on link 2",
            None,
            None,
            "NVLink: fatal error detected on link 2",
        ),
        ("pid=0, NVLink: fatal error on link 3", 0, None, "NVLink: fatal error on link 3"),
        ("pid=1", 1, None, ""),
        ("An uncorrectable double bit error", None, None, "An uncorrectable double bit error"),
        ("GPU has fallen off the bus.", None, None, "GPU has fallen off the bus."),
    ],
)
def test_with_and_without_pid_and_name(rest, pid, process, message):
    e = one(f"NVRM: Xid (PCI:0000:04:00): 48, {rest}")
    assert (e.pid, e.process, e.message) == (pid, process, message)


def test_xid_with_nothing_after_the_number():
    e = one("NVRM: Xid (PCI:0000:01:00): 79, ")
    assert (e.xid, e.message) == (79, "")


@pytest.mark.parametrize(
    ("loc", "pci", "gi", "ci"),
    [
        ("PCI:0000:3b:00", "0000:3b:00.0", None, None),
        ("PCI:0000:3B:00", "0000:3b:00.0", None, None),
        ("0000:3b:00.0", "0000:3b:00.0", None, None),
        ("PCI:0009:01:00", "0009:01:00.0", None, None),
        ("PCI:0000:3b:00 GPU-I:01 GPU-CI:02", "0000:3b:00.0", 1, 2),
        ("PCI:0000:3b:00 GPU-I:01", "0000:3b:00.0", 1, None),
        ("PCI:0000:3b:00 GPU-I 1 CI 0", "0000:3b:00.0", 1, 0),
        ("PCI:...", None, None, None),  # redacted in a bug report
    ],
)
def test_pci_forms_and_mig_suffixes(loc, pci, gi, ci):
    e = one(f"NVRM: Xid ({loc}): 31, pid=9, name=a, Ch 00000008, intr 10000000. MMU Fault")
    assert (e.pci, e.gpu_instance, e.compute_instance, e.pid, e.process) == (pci, gi, ci, 9, "a")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PCI:0000:3b:00", "0000:3b:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML pciBusId
        ("0000:b3:00.1", "0000:b3:00.1"),
        ("3b:00.0", "0000:3b:00.0"),
        ("no address here", None),
    ],
)
def test_normalize_pci(text, expected):
    assert normalize_pci(text) == expected


def test_gpu_uuid_comes_from_the_gpu_at_line():
    events = fixture_events("dmesg_fallen_off_bus.txt")
    assert [e.gpu_uuid for e in events[:2]] == ["GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"] * 2
    other = KmsgParser().feed(XID_79)[0]
    assert other.gpu_uuid == ""


# --- whole fixtures ----------------------------------------------------------------------------------


def test_dmesg_fallen_off_bus_burst():
    events = fixture_events("dmesg_fallen_off_bus.txt")
    assert [(e.kind.value, e.xid or e.sxid, e.pci) for e in events] == [
        ("xid", 79, "0000:91:00.0"),
        ("fallen_off_bus", None, "0000:91:00.0"),
        ("sxid", 20034, "0000:06:00.0"),
        ("sxid", 20034, "0000:05:00.0"),
    ]
    assert events[1].message == "GPU has fallen off the bus."
    assert (events[2].nvswitch, events[2].sxid_fatal, events[2].message) == (
        "nvidia-nvswitch1",
        True,
        "Fatal, Link 48 LTSSM Fault Up",
    )


def test_three_line_probe_message_without_xid():
    (e,) = fixture_events("dmesg_probe_fallen_off.txt")
    assert (e.kind, e.xid, e.pci, e.kernel_time_us) == (
        KernelEventKind.FALLEN_OFF_BUS,
        None,
        "0000:b3:00.0",
        1843308145,
    )
    assert e.message == (
        "The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has "
        "fallen off the bus and is not responding to commands."
    )
    assert e.raw.count("\n") == 2


def test_probe_message_interrupted_by_another_line_is_dropped_but_the_other_line_is_kept():
    lines = [
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        XID_109,
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    events = parse_lines(lines)
    assert [e.kind for e in events] == [KernelEventKind.XID]


def test_probe_message_for_an_unsupported_gpu_is_not_an_event():
    lines = [
        "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5)",
        "NVRM: installed in this system is not supported by the",
        "NVRM: NVIDIA 535.54.03 driver release.",
        "NVRM: Please see 'Appendix A - Supported NVIDIA GPU Products'",
        "NVRM: fallen off the bus",  # too late: the parser gave up after four lines
    ]
    assert parse_lines(lines) == []


def test_dmesg_ctime_xids():
    events = fixture_events("dmesg_ctime_xids.txt")
    assert [(e.xid, e.pid, e.process) for e in events] == [
        (13, None, None),
        (109, 1797828, "pt_main_thread"),
        (43, 1045242, "pt_main_thread"),
        (31, 2512125, "python3.10"),
        (94, None, None),
    ]
    assert events[2].gpu_uuid == "GPU-efbdfde9-5798-a6e7-4c46-12518fa15375"
    assert events[0].message == "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"


def test_journal_xids_and_links():
    events = fixture_events("journal_xids.txt")
    assert [(e.kind.value, e.xid, e.ib_state) for e in events] == [
        ("xid", 45, ""),
        ("xid", 45, ""),
        ("ib_link", None, "INIT"),
        ("ib_link", None, "ACTIVE"),
        ("xid", 74, ""),
        ("xid", 74, ""),
    ]
    assert events[0].message == "Ch 00000001 caused by previous Xid 149"


def test_xid_74_nvlink_registers():
    events = [e for e in fixture_events("journal_xids.txt") if e.xid == 74]
    assert (events[0].nvlink, events[0].registers) == (6, (0x10000, 0, 0, 0, 0, 0, 0))
    assert (events[1].nvlink, events[1].registers, events[1].pci) == (14, (0, 0, 0x10000, 0, 0, 0, 0), "0003:00:00.0")
    assert events[1].kernel_time_us == 449410332316


def test_xid_74_without_registers_still_has_the_link():
    e = one("[  512.884] NVRM: Xid (PCI:0000:01:00): 74, pid=0, NVLink: fatal error on link 3")
    assert (e.nvlink, e.registers) == (3, ())


def test_kmsg_records_nvlink5_recovery_action_and_escaped_multiline():
    events = fixture_events("kmsg_records.txt")
    assert [(e.xid, e.kind.value) for e in events] == [
        (144, "xid"),
        (149, "xid"),
        (145, "xid"),
        (149, "xid"),
        (154, "xid"),
        (154, "xid"),
        (None, "fallen_off_bus"),
    ]
    saw, netir, rlw, netir_any, r1, r2, fallen = events
    assert (saw.nvlink_subcode, saw.nvlink_fatal, saw.nvlink, saw.registers[:2]) == ("SAW_MVB", False, 0, (1, 8))
    assert (netir.nvlink_subcode, netir.nvlink_fatal, netir.registers[0]) == ("NETIR_LINK_EVT", True, 0x025001C6)
    assert (rlw.nvlink, rlw.pci, len(rlw.registers)) == (13, "0018:01:00.0", 6)
    assert netir_any.nvlink == -1
    assert (r1.recovery_action, r1.previous_recovery_action, r1.pci) == (
        RecoveryAction.GPU_RESET,
        RecoveryAction.NONE,
        "0008:01:00.0",
    )
    assert r1.gpu_uuid == "GPU-4d3a8f1e-2c77-5b1a-9e0f-6b2c1d9a7e55"
    assert r1.kernel_time_us == 2201000500
    assert r2.recovery_action is RecoveryAction.NODE_REBOOT
    assert fallen.pci == "0000:b3:00.0"
    assert "fallen off the bus and is not responding" in fallen.message


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ("from 0x0 (None) to 0x2 (Node Reboot Required)", RecoveryAction.NODE_REBOOT),
        ("from 0x0 (None) to 0x2 (OS Reboot)", RecoveryAction.NODE_REBOOT),
        ("from 0x0 (None) to 0x1 (PF FLR)", RecoveryAction.GPU_RESET),
        ("from 0x0 (None) to 0x3 (Drain P2P)", RecoveryAction.DRAIN_P2P),
        ("from 0x3 (Drain P2P) to 0x4 (Drain and Reset)", RecoveryAction.DRAIN_AND_RESET),
        ("from 0x0 (None) to 0x63 (Node Reboot Required)", RecoveryAction.NODE_REBOOT),  # text fallback
        ("from 0x0 (None) to 0x63 (Who Knows)", None),
    ],
)
def test_xid_154_recovery_action_strings(tail, expected):
    e = one(f"NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed {tail}")
    assert e.recovery_action is expected


def test_nvswitch_sxid_triplet_is_one_event():
    events = fixture_events("nvswitch_sxid.txt")
    assert [(e.sxid, e.sxid_fatal, e.pci) for e in events] == [(22013, False, "0000:04:00.0")]
    assert events[0].message == "Non-fatal, Link 44 Minion Link DLREQ interrupt"
    assert events[0].kernel_time_us == 38178720


def test_sxid_of_unknown_shape_is_still_reported():
    e = one("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, egress non-posted PRIV error")
    assert (e.sxid, e.sxid_fatal) == (12028, None)


def test_mlx5_link_states():
    events = fixture_events("mlx5_links.txt")
    assert [(e.ib_device, e.ib_port, e.ib_state, e.pci) for e in events] == [
        ("mlx5_3", 1, "ACTIVE", "0000:53:00.0"),
        ("enp83s0f0np0", None, "DOWN", "0000:53:00.0"),
        ("mlx5_3", 1, "DOWN", "0000:53:00.0"),
        ("enp83s0f0np0", None, "UP", "0000:53:00.0"),
        ("mlx5_0", 1, "DOWN", "0000:0a:00.0"),
        ("", None, "MODULE_ERROR", None),
        ("", None, "MODULE_UNPLUGGED", "0000:08:00.0"),
    ]
    assert events[5].message == "module 0, Cable error, High Temperature"


@pytest.mark.parametrize(
    ("line", "device", "port", "state"),
    [
        ("mlx5_core 0000:08:00.0 rdmap8s0f0: Port: 2 Link ACTIVE", "rdmap8s0f0", 2, "ACTIVE"),
        ("mlx5_ib0: Port 1 Link ARMED", "mlx5_ib0", 1, "ARMED"),
        ("ib0: Link DOWN", "ib0", None, "DOWN"),
        ("Nov 30 05:33:20 host kernel: ib0: Link UP", "ib0", None, "UP"),
    ],
)
def test_ib_port_variants(line, device, port, state):
    e = one(line)
    assert (e.kind, e.ib_device, e.ib_port, e.ib_state) == (KernelEventKind.IB_LINK, device, port, state)


def test_noise_is_not_an_event():
    assert fixture_events("noise.txt") == []


def test_kmsg_dictionary_lines_and_blank_lines_are_ignored():
    assert parse_lines([" SUBSYSTEM=pci", " DEVICE=+pci:0000:3b:00.0", "", "\n"]) == []


# --- Observation (the classification of these lines: tests/unit/cli/test_kmsg_classify.py) ----------


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (XID_79, EventKind.XID),
        ("NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.", EventKind.FALLEN_OFF_BUS),
        ("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up", EventKind.SXID),
        ("mlx5_core 0000:0a:00.0 mlx5_0: Port: 1 Link DOWN", EventKind.IB_LINK_STATE),
        (
            "NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            EventKind.RECOVERY_ACTION,
        ),
    ],
)
def test_observation_kinds(line, kind):
    e = one(line)
    obs = to_observation(e, 1_700_000_000_000_000_000)
    assert obs.kind is kind
    assert obs.observed_unix_ns == 1_700_000_000_000_000_000
    assert obs.source == "kmsg"
    assert obs.kernel_log == e
    text = kernel_log.to_attributes(e)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in text.items())


def test_observation_carries_the_parsed_facts_and_no_opinion():
    e = fixture_events("dmesg_fallen_off_bus.txt")[0]
    obs = to_observation(e, 5)
    assert (obs.xid, obs.gpu_uuid, obs.severity, obs.message) == (
        79,
        "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
        Severity.UNSPECIFIED,  # the controller classifies
        "GPU has fallen off the bus.",
    )
    assert obs.attributes == {}
    text = kernel_log.to_attributes(obs.kernel_log)
    assert text["pci"] == "0000:91:00.0"
    assert text["kernel_time_us"] == "6781741548779"
    assert "pid" not in text  # '<unknown>' is absent, not "None"
    assert not {"recommended_action", "mnemonic", "reason"} & text.keys()


def test_observation_of_nvlink_and_recovery_fields():
    events = fixture_events("kmsg_records.txt")
    netir = kernel_log.to_attributes(to_observation(events[1], 1).kernel_log)
    assert netir["registers"].startswith("0x025001c6 0x00000000")
    assert (netir["nvlink_fatal"], netir["nvlink_subcode"]) == ("true", "NETIR_LINK_EVT")
    recovery = kernel_log.to_attributes(to_observation(events[4], 1).kernel_log)
    assert (recovery["recovery_action"], recovery["previous_recovery_action"]) == ("GPU_RESET", "NONE")


def test_the_text_form_of_the_facts_reads_back_as_the_same_facts():
    """The spool and the controller's store keep the facts as text: nothing is lost on the way back."""
    for e in parse_lines((FIXTURES / "kmsg_records.txt").read_text().splitlines()) + fixture_events(
        "dmesg_fallen_off_bus.txt"
    ):
        back = kernel_log.from_attributes(
            kernel_log.to_attributes(e), message=e.message, xid=e.xid, gpu_uuid=e.gpu_uuid
        )
        assert back == e


# --- robustness --------------------------------------------------------------------------------------

_FRAGMENTS = [
    "NVRM: Xid (",
    "PCI:0000:3b:00",
    " GPU-I:01 GPU-CI:02",
    "): ",
    "79",
    "154",
    "149",
    ", pid=",
    "'<unknown>'",
    ", name=",
    "GPU recovery action changed from 0x0 (None) to ",
    "0x2 (Node Reboot Required)",
    "NETIR_LINK_EVT Fatal XC0 i0 Link ",
    "(0x025001c6 0x00000000)",
    "link 6(0x10000, 0x0)",
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: fallen off the bus",
    "NVRM: GPU at PCI:0000:91:00: GPU-b6c3",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): ",
    "Data {0x1}",
    "mlx5_core 0000:ab:00.0 mlx5_5: Port: ",
    " Link DOWN",
    "Port module event[error]: module 0, ",
    "ib0: Link up",
    "4,1234,5678901,-;",
    "\\x0a",
    "\n",
    "[12345.678901] ",
    "9" * 5000,
    "\x00",
    "\udcff",
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=80), st.sampled_from(_FRAGMENTS)), max_size=12), st.integers(1, 4))
def test_parser_never_raises(parts, repeat):
    parser = KmsgParser()
    line = "".join(parts)
    for _ in range(repeat):
        for event in parser.feed(line):
            assert isinstance(event, KernelEvent)
            # conversion and the text form of the facts must cope with whatever was parsed
            to_observation(event, 0)
            text = kernel_log.to_attributes(event)
            assert kernel_log.from_attributes(text, message=event.message, xid=event.xid) is not None


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_parser_never_raises_on_bytes(data):
    KmsgParser().feed(data.decode("utf-8", errors="surrogateescape"))
    KmsgParser().feed(data.decode("latin-1"))


def test_long_lines_do_not_blow_up_the_regexes():
    # Unbounded "[\\w.-]+" before a literal made these quadratic (seconds per line) before.
    import time

    lines = ["mlx5_core 0000:ab:00.0 mlx5_5: Port: " * 10 + "9" * 5000, ("Link " + "9" * 5000) * 3]
    started = time.perf_counter()
    assert parse_lines(lines) == []
    assert time.perf_counter() - started < 1.0


_PREFIXES = st.sampled_from(
    ["", "[ 1843.308145] ", "Nov 30 05:33:20 node-7 kernel: ", "4,77,123456,-;", "[Fri Aug 30 11:43:09 2024] "]
)
_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=15)


@settings(max_examples=150, deadline=None)
@given(
    prefix=_PREFIXES,
    xid=st.integers(1, 172),
    domain=st.integers(0, 0xFFFF),
    bus=st.integers(0, 0xFF),
    pid_name=st.one_of(st.none(), st.tuples(st.integers(0, 4_000_000), _NAMES)),
    mig=st.one_of(st.none(), st.tuples(st.integers(0, 14), st.integers(0, 7))),
    text=st.text(alphabet="abcdefghij ABCDEF0123456789:.()", max_size=40),
)
def test_generated_xid_lines_round_trip(prefix, xid, domain, bus, pid_name, mig, text):
    loc = f"PCI:{domain:04x}:{bus:02x}:00" + (f" GPU-I:{mig[0]:02d} GPU-CI:{mig[1]:02d}" if mig else "")
    fields = f"pid={pid_name[0]}, name={pid_name[1]}, " if pid_name else ""
    (e,) = KmsgParser().feed(f"{prefix}NVRM: Xid ({loc}): {xid}, {fields}{text}")
    assert (e.xid, e.pci) == (xid, f"{domain:04x}:{bus:02x}:00.0")
    assert (e.pid, e.process) == (pid_name if pid_name else (None, None))
    assert (e.gpu_instance, e.compute_instance) == (mig if mig else (None, None))
    assert e.message == text.strip()


def test_journalctl_short_output_of_the_multiline_probe_message():
    # `journalctl -k` prints the continuation lines of one multi-line entry indented under the message.
    lines = [
        "Nov 30 05:33:20 gpu-node-03 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0",
        "                                    NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "                                    NVRM: fallen off the bus and is not responding to commands.",
    ]
    (e,) = parse_lines(lines)
    assert (e.kind, e.pci) == (KernelEventKind.FALLEN_OFF_BUS, "0000:b3:00.0")
    assert e.raw == "\n".join(lines)


# --- every wording of a GPU lost from the bus, in every rendering (issue #37 item 7) ------------------


def _wordings() -> list[tuple[dict[str, str], list[str]]]:
    """The blocks of fallen_off_bus_wordings.txt: (header fields, message lines)."""
    blocks = []
    for block in (FIXTURES / "fallen_off_bus_wordings.txt").read_text().split("\n\n"):
        lines = block.strip().splitlines()
        header = [line for line in lines if line.startswith("# kind=")]
        if not header:
            continue
        fields = dict(part.split("=", 1) for part in header[0][2:].split(" ")[:2])
        blocks.append((fields, [line for line in lines if not line.startswith("#")]))
    return blocks


_STAMP = "[   49.261458] "
_SYSLOG = "Dec  4 10:00:00 gpu-node-03 kernel: "
# How a message of one or more lines reaches the parser: each entry is the list of inputs fed to it.
_RENDERINGS = {
    "bare": lambda lines: lines,
    # dmesg prints one multi-line record with its continuation lines indented under the first
    "dmesg": lambda lines: [_STAMP + lines[0]] + [" " * len(_STAMP) + line for line in lines[1:]],
    # kernels before the lockless ring buffer stored each line as its own record
    "dmesg_each_line": lambda lines: [_STAMP + line for line in lines],
    "dmesg_ctime": lambda lines: ["[Thu Dec  4 10:00:00 2025] " + line for line in lines],
    "syslog": lambda lines: [_SYSLOG + line for line in lines],
    "syslog_with_dmesg_stamp": lambda lines: [_SYSLOG + _STAMP + line for line in lines],
    # /proc/kmsg, `dmesg -r` and klogd keep the level prefix; the reports had <4>
    "level_prefix": lambda lines: ["<4>" + line for line in lines],
    "level_prefix_with_stamp": lambda lines: ["<3>" + _STAMP + line for line in lines],
    # one /dev/kmsg record, the newlines escaped as the kmsg ABI does
    "kmsg_record": lambda lines: ["3,1208,49261458,-;" + "\\x0a".join(lines)],
    # one journald entry: MESSAGE holds the newlines
    "journald_entry": lambda lines: ["\n".join(lines)],
    # rsyslog writes a journald entry's newlines as #012 (its default control-character escape)
    "rsyslog_escaped": lambda lines: [_SYSLOG + "#012".join(lines)],
}


@pytest.mark.parametrize("rendering", sorted(_RENDERINGS))
@pytest.mark.parametrize(
    ("fields", "lines"), _wordings(), ids=[f"{f['kind']}-{lines[0][:28]}" for f, lines in _wordings()]
)
def test_every_wording_of_a_gpu_lost_from_the_bus_is_one_event(fields, lines, rendering):
    """Issue #37 item 7: a GPU lost without an Xid line is caught, whatever the driver or the log printed."""
    events = parse_lines(_RENDERINGS[rendering](lines))
    assert [(e.kind.value, e.pci) for e in events] == [(fields["kind"], fields["pci"])], events
    (e,) = events
    assert "fallen off the bus" in e.message
    assert e.xid == (79 if e.kind is KernelEventKind.XID else None)


def test_the_wordings_fixture_covers_the_older_wording_and_the_three_without_an_xid():
    kinds = [fields["kind"] for fields, _ in _wordings()]
    assert kinds.count("fallen_off_bus") == 3
    assert any(lines == ["NVRM: GPU at 0000:01:00.0 has fallen off the bus."] for _, lines in _wordings())


def test_older_drivers_fallen_off_bus_burst():
    """Bumblebee #554: an older driver prints the message twice, with no Xid; both are events of that GPU."""
    events = fixture_events("dmesg_old_fallen_off_bus.txt")
    assert [(e.kind, e.pci, e.xid, e.kernel_time_us) for e in events] == [
        (KernelEventKind.FALLEN_OFF_BUS, "0000:01:00.0", None, 49261458),
        (KernelEventKind.FALLEN_OFF_BUS, "0000:01:00.0", None, 49261472),
    ]
    assert events[0].message == "has fallen off the bus."


def test_the_older_wording_takes_the_gpu_uuid_from_an_earlier_gpu_at_line():
    events = parse_lines(
        [
            "NVRM: GPU at PCI:0000:01:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
            "NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
        ]
    )
    assert [(e.kind, e.gpu_uuid) for e in events] == [
        (KernelEventKind.FALLEN_OFF_BUS, "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b")
    ]


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: fallen off the bus and is not responding to commands.",  # a continuation line on its own
        "NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:667)",  # an init failure, not a lost GPU
        "NVRM: RmInitAdapter failed! (0x26:0xffff:1281)",
        "NVRM: rm_init_adapter failed for device bearing minor number 0",
        "Unable to determine the device handle for GPU0000:01:00.0: GPU has fallen off the bus.",  # nvidia-smi
    ],
)
def test_lines_that_are_not_a_gpu_lost_from_the_bus(line):
    assert [e for e in parse_lines([line]) if e.kind is KernelEventKind.FALLEN_OFF_BUS] == []


@pytest.mark.parametrize("number", ["0", "141202", "99999999999"])
def test_an_xid_number_outside_the_catalogs_range_is_no_event(number):
    """A garbled Xid number (the kmsg fuzzer made 141202 from a real line) is dropped at the parser.

    Before, the agent sent it and the controller's edge refused the whole batch (xid outside
    [1, XID_MAX]): every event spooled behind it waited on a batch that could never be taken.
    """
    assert parse_lines([XID_79.replace(": 79,", f": {number},")]) == []


def test_the_largest_xid_the_controller_takes_is_parsed():
    from rasd.common.vocabulary import XID_MAX

    (event,) = parse_lines([XID_79.replace(": 79,", f": {XID_MAX},")])
    assert event.xid == XID_MAX
