"""Classification tables: every catalog Xid, the recovery-action field, and the counter thresholds."""

from __future__ import annotations

import pytest

from rasd.common import xid_catalog
from rasd.common.kernel_log import KernelEvent, KernelEventKind
from rasd.controller.core.remediation import classify, policy
from rasd.controller.core.remediation import events as health

EventKind = health.EventKind
Severity = health.Severity
Action = classify.RecommendedAction
Component = classify.Component
CATALOG = xid_catalog.load_catalog()
POLICY = policy.ClassificationPolicy()
T0 = 1_780_000_000.0


def event(kind: EventKind, gpu: str = "GPU-1", **fields: object) -> health.HealthEvent:
    return health.HealthEvent(node_id="n1", kind=kind, observed_at=T0, gpu_uuid=gpu, **fields)


def run(ev: health.HealthEvent, pol: policy.ClassificationPolicy = POLICY, changes: int = 0) -> classify.Classification:
    return classify.classify(ev, catalog=CATALOG, policy=pol, ib_state_changes_in_window=changes)


_SEVERITY = {"info": Severity.INFO, "warning": Severity.WARNING, "error": Severity.ERROR, "fatal": Severity.FATAL}


@pytest.mark.parametrize("entry", [e for e in CATALOG.entries() if e.xid not in (79, 154)], ids=lambda e: f"xid{e.xid}")
def test_every_catalog_xid_follows_nvidias_bucket(entry):
    result = run(event(EventKind.XID, xid=entry.xid))
    assert result.action.value == xid_catalog.recommended_action(entry)
    assert result.severity is _SEVERITY[xid_catalog.default_severity(entry)]
    assert result.fault_key == f"xid:{entry.xid}"
    assert entry.immediate_action in result.reason or "unassigned" in result.reason


@pytest.mark.parametrize(
    ("xid", "action", "component"),
    [
        (13, Action.RESTART_PROCESS, Component.GPU),
        (31, Action.RESTART_PROCESS, Component.GPU),
        (43, Action.NONE, Component.GPU),
        (45, Action.NONE, Component.GPU),
        (48, Action.RESET_GPU, Component.GPU),
        (61, Action.CONTACT_SUPPORT, Component.GPU),
        (63, Action.NONE, Component.GPU),
        (74, Action.RESET_GPU, Component.NVLINK),
        (79, Action.REBOOT_NODE, Component.GPU),
        (92, Action.NONE, Component.GPU),
        (95, Action.RESET_GPU, Component.GPU),
        (119, Action.RESET_GPU, Component.GPU),
        (149, Action.RESET_GPU, Component.NVLINK),
    ],
)
def test_well_known_xids(xid, action, component):
    result = run(event(EventKind.XID, xid=xid))
    assert (result.action, result.component) == (action, component)


def test_xid79_is_at_least_a_reboot_even_when_site_policy_says_reset():
    pol = policy.ClassificationPolicy.from_mapping({"xid_action_overrides": {"79": "reset_gpu"}})
    result = run(event(EventKind.XID, xid=79), pol)
    assert result.action is Action.REBOOT_NODE
    assert result.severity is Severity.FATAL


def test_site_override_replaces_the_catalog_bucket():
    pol = policy.ClassificationPolicy.from_mapping({"xid_action_overrides": {"13": "reset_gpu"}})
    result = run(event(EventKind.XID, xid=13), pol)
    assert result.action is Action.RESET_GPU
    assert "site policy" in result.reason


def test_unknown_xid_asks_a_person():
    result = run(event(EventKind.XID, xid=9999))
    assert (result.action, result.severity) == (Action.INVESTIGATE, Severity.WARNING)


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", Action.REBOOT_NODE),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", Action.RESET_GPU),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", Action.RESET_GPU),
        ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", Action.RESTART_PROCESS),
        ("GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)", Action.NONE),
        ("GPU recovery action changed to something new", Action.INVESTIGATE),
    ],
)
def test_xid154_follows_its_recovery_action_text(text, action):
    result = run(event(EventKind.XID, xid=154, message=text))
    assert result.action is action
    assert result.fault_key == "recovery_action"


@pytest.mark.parametrize("value", list(xid_catalog.RecoveryAction))
def test_nvml_recovery_action_field_matches_the_catalog_policy(value):
    result = run(event(EventKind.RECOVERY_ACTION, recovery_action=int(value)))
    word, severity = xid_catalog.recovery_action_policy(value)
    assert (result.action.value, result.severity) == (word, _SEVERITY[severity])


def test_recovery_action_field_wins_over_the_message():
    ev = event(EventKind.XID, xid=154, message="... to 0x1 (GPU Reset Required)", recovery_action=2)
    assert run(ev).action is Action.REBOOT_NODE


@pytest.mark.parametrize(
    ("ev", "action", "severity"),
    [
        (event(EventKind.ROW_REMAP_FAILURE), Action.RMA, Severity.FATAL),
        (event(EventKind.ROW_REMAP_PENDING, remapped_rows_uncorrectable=511), Action.RESET_GPU, Severity.WARNING),
        (event(EventKind.ROW_REMAP_PENDING, remapped_rows_uncorrectable=512), Action.RMA, Severity.FATAL),
        (event(EventKind.ECC_DBE), Action.RESET_GPU, Severity.ERROR),
        (event(EventKind.ECC_DBE, remapped_rows_uncorrectable=600), Action.RMA, Severity.FATAL),
        (event(EventKind.RETIRED_PAGES, retired_pages=62), Action.NONE, Severity.INFO),
        (event(EventKind.RETIRED_PAGES, retired_pages=63), Action.RMA, Severity.FATAL),
        (
            event(EventKind.RETIRED_PAGES, retired_pages=5, retired_pages_pending=True),
            Action.RESET_GPU,
            Severity.WARNING,
        ),
        (event(EventKind.ECC_SBE_RATE, ecc_sbe_rate_per_s=9.9), Action.NONE, Severity.INFO),
        (event(EventKind.ECC_SBE_RATE, ecc_sbe_rate_per_s=10.0), Action.NONE, Severity.WARNING),
        (event(EventKind.NVLINK_ERRORS, nvlink_crc_rate_per_s=99.0), Action.NONE, Severity.WARNING),
        (event(EventKind.NVLINK_ERRORS, nvlink_crc_rate_per_s=100.0), Action.RESET_GPU, Severity.ERROR),
        (event(EventKind.NVLINK_DOWN, attributes={"link": "3"}), Action.RESET_GPU, Severity.ERROR),
        (event(EventKind.PCIE_REPLAY, pcie_replay_rate_per_s=1.0), Action.NONE, Severity.WARNING),
        (event(EventKind.PCIE_REPLAY, pcie_replay_rate_per_s=50.0), Action.INVESTIGATE, Severity.ERROR),
        (event(EventKind.FALLEN_OFF_BUS), Action.REBOOT_NODE, Severity.FATAL),
        (event(EventKind.GPU_LOST), Action.REBOOT_NODE, Severity.FATAL),
        (event(EventKind.SDC_SUSPECT), Action.VALIDATE, Severity.ERROR),
        (event(EventKind.THERMAL), Action.NONE, Severity.WARNING),
        (event(EventKind.UNSPECIFIED), Action.NONE, Severity.INFO),
    ],
    ids=lambda v: v.kind.name if isinstance(v, health.HealthEvent) else None,
)
def test_counter_thresholds(ev, action, severity):
    result = run(ev)
    assert (result.action, result.severity) == (action, severity)


def test_nvlink_down_names_the_link():
    result = run(event(EventKind.NVLINK_DOWN, attributes={"link": "3"}))
    assert result.component is Component.NVLINK
    assert result.fault_key == "nvlink_down:3"


@pytest.mark.parametrize(("changes", "action"), [(5, Action.NONE), (6, Action.QUARANTINE_NODE)])
def test_ib_flaps_quarantine_the_node_at_the_threshold(changes, action):
    ev = event(EventKind.IB_LINK_STATE, gpu="", attributes={"ib_device": "mlx5_0", "ib_port": "1", "ib_state": "DOWN"})
    result = run(ev, changes=changes)
    assert result.action is action
    assert result.component is Component.IB_PORT


def test_ib_flaps_with_port_isolation_quarantine_the_port():
    pol = policy.ClassificationPolicy(ib_flap_isolation="port")
    ev = event(EventKind.IB_LINK_STATE, gpu="", attributes={"ib_device": "mlx5_0", "ib_port": "2"})
    result = run(ev, pol, changes=6)
    assert (result.action, result.fault_key) == (Action.QUARANTINE_PORT, "ib_flap:mlx5_0/2")


def test_a_lost_node_is_quarantined_whole_for_a_person():
    result = run(event(EventKind.NODE_LOST, gpu="", message="no replica has heard from its agent for 61 s"))
    assert (result.component, result.severity, result.action) == (
        classify.Component.NODE,
        Severity.FATAL,
        Action.QUARANTINE_NODE,
    )
    assert result.fault_key == "node_lost"
    assert result.reason.startswith("node lost: no replica has heard from its agent for 61 s")


def test_classification_round_trips_through_a_dict():
    result = run(event(EventKind.XID, xid=48))
    assert classify.Classification.from_dict(result.to_dict()) == result


def test_health_enums_mirror_the_wire_enums():
    from rasd.api.v1 import health_pb2

    for kind in EventKind:
        assert health_pb2.EventKind.Value(f"EVENT_KIND_{kind.name}") == kind.value
    for severity in Severity:
        assert health_pb2.Severity.Value(f"SEVERITY_{severity.name}") == severity.value
    assert len(EventKind) == len(health_pb2.EventKind.keys())


def test_health_event_round_trips_through_a_dict():
    ev = event(EventKind.IB_LINK_STATE, attributes={"ib_device": "mlx5_0", "ib_port": "1"}, seq=7)
    assert health.HealthEvent.from_dict(ev.to_dict()) == ev
    assert ev.ib_port == "mlx5_0/1"


XID_149_REGISTERS = "0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000"


def kernel_xid(xid: int, **facts: object) -> KernelEvent:
    return KernelEvent(kind=KernelEventKind.XID, message="", raw="", xid=xid, **facts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("registers", "subcode", "action"),
    [
        ((0x025001C6, 0x0, 0x0), "NETIR_LINK_EVT", Action.RESET_GPU),
        ((0x2600011, 0x0), "NETIR_LINK_DOWN", Action.NONE),
        ((0x2600011, 0x0), "", Action.NONE),  # the registers alone decide
        ((0x2600011,), "NETIR_LINK_DOWN", Action.RESET_GPU),  # no ErrorStatus: undecodable, catalog default
    ],
)
def test_nvlink5_xids_follow_the_register_decode_of_their_kernel_log_facts(registers, subcode, action):
    ev = event(EventKind.XID, xid=149, kernel_log=kernel_xid(149, registers=registers, nvlink_subcode=subcode))
    result = run(ev)  # the catalog carries NVIDIA's decode sheet
    assert result.action is action
    assert result.component is Component.NVLINK
    if action is Action.NONE:
        assert "NVLink5 decode" in result.reason and "IGNORE" in result.reason


@pytest.mark.parametrize(
    ("attributes", "action"),
    [
        ({"kernel_event": "xid", "registers": XID_149_REGISTERS, "nvlink_subcode": "NETIR_LINK_EVT"}, Action.RESET_GPU),
        (
            {"kernel_event": "xid", "registers": "0x02600011 0x00000000", "nvlink_subcode": "NETIR_LINK_DOWN"},
            Action.NONE,
        ),
        ({"kernel_event": "xid", "registers": "not-a-number 0x0"}, Action.RESET_GPU),  # undecodable: catalog default
        ({"registers": "0x02600011 0x00000000"}, Action.RESET_GPU),  # not marked as a kernel event: no facts
    ],
)
def test_nvlink5_decode_reads_an_older_agents_attributes(attributes, action):
    ev = event(EventKind.XID, xid=149, attributes=attributes)
    assert run(ev).action is action


def test_nvlink5_decode_is_skipped_without_the_sheet():
    ev = event(EventKind.XID, xid=149, kernel_log=kernel_xid(149, registers=(0x2600011, 0x0)))
    assert run(ev).action is Action.NONE
    bare = xid_catalog.XidCatalog(CATALOG.entries())
    assert classify.classify(ev, catalog=bare, policy=POLICY).action is Action.RESET_GPU
    assert classify.classify(ev, catalog=CATALOG, policy=POLICY, nvlink5_rules=()).action is Action.RESET_GPU


@pytest.mark.parametrize(
    ("fatal", "severity_given", "expected"),
    [
        (True, Severity.UNSPECIFIED, Severity.ERROR),
        (False, Severity.UNSPECIFIED, Severity.WARNING),
        (False, Severity.FATAL, Severity.WARNING),  # the driver's word wins over a source's rating
        (None, Severity.FATAL, Severity.ERROR),  # no word: the source's rating
        (None, Severity.UNSPECIFIED, Severity.WARNING),
    ],
)
def test_sxid_severity_comes_from_the_drivers_fatal_word(fatal, severity_given, expected):
    facts = KernelEvent(kind=KernelEventKind.SXID, message="", raw="", sxid=20034, sxid_fatal=fatal)
    result = run(event(EventKind.SXID, gpu="", severity=severity_given, kernel_log=facts))
    assert (result.component, result.severity, result.action) == (Component.NODE, expected, Action.INVESTIGATE)
    assert result.fault_key == "sxid:20034"  # the SXid number from the facts


def test_an_older_agents_sxid_attributes_classify_the_same():
    attributes = {"kernel_event": "sxid", "sxid": "20034", "sxid_fatal": "true", "nvswitch": "nvidia-nvswitch1"}
    result = run(event(EventKind.SXID, gpu="", severity=Severity.FATAL, attributes=attributes))
    assert (result.severity, result.fault_key) == (Severity.ERROR, "sxid:20034")


def test_xid_154_takes_its_recovery_action_from_the_facts():
    facts = kernel_xid(154, recovery_action=xid_catalog.RecoveryAction.NODE_REBOOT)
    result = run(event(EventKind.RECOVERY_ACTION, xid=154, message="changed", kernel_log=facts))
    assert (result.action, result.severity) == (Action.REBOOT_NODE, Severity.FATAL)
    assert result.reason.startswith("Xid 154 says NODE_REBOOT")


def test_an_ib_event_names_its_port_and_state_from_the_facts():
    facts = KernelEvent(
        kind=KernelEventKind.IB_LINK, message="", raw="", ib_device="mlx5_0", ib_port=1, ib_state="DOWN"
    )
    ev = event(EventKind.IB_LINK_STATE, gpu="", kernel_log=facts)
    assert ev.ib_port == "mlx5_0/1"
    result = run(ev, changes=1)
    assert (result.fault_key, result.action) == ("ib_state:mlx5_0/1", Action.NONE)
    assert "is DOWN" in result.reason


def test_health_event_with_kernel_log_facts_round_trips_through_a_dict():
    facts = kernel_xid(149, registers=(1, 2), nvlink=3, pci="0000:18:00.0", gpu_uuid="GPU-1")
    ev = event(EventKind.XID, xid=149, kernel_log=facts)
    assert health.HealthEvent.from_dict(ev.to_dict()) == ev


@pytest.mark.parametrize(
    ("rung", "action", "key"),
    [
        ("validate", Action.VALIDATE, "straggler:validate"),
        ("quarantine", Action.INVESTIGATE, "straggler:quarantine"),
        ("restart", Action.RESTART_PROCESS, "job_stall"),
    ],
)
def test_the_straggler_watchs_rungs_validate_isolate_or_restart_the_gpu(rung, action, key):
    result = run(event(EventKind.STRAGGLER, message="the job's steps stopped 31 s ago", attributes={"rung": rung}))
    assert (result.component, result.action, result.fault_key) == (classify.Component.GPU, action, key)
    if rung == "restart":
        assert result.reason.startswith("job stalled: the job's steps stopped 31 s ago; restart the rank")
