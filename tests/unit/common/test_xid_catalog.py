"""The packaged XID catalog, the bucket mapping, recovery actions and the NVLink5 decode sheet."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from rasd.common import xid_catalog
from rasd.common.xid_catalog import (
    RECOMMENDED_ACTIONS,
    SEVERITIES,
    RecoveryAction,
    XidEntry,
    bucket_policy,
    decode_nvlink5,
    default_severity,
    load_catalog,
    load_nvlink5_rules,
    parse_catalog_csv,
    parse_recovery_action_text,
    recommended_action,
)

REFERENCE = Path("/work/shared/reference")


def test_catalog_has_every_row_of_nvidias_sheet():
    catalog = load_catalog()
    assert len(catalog.entries()) == 172
    assert [e.xid for e in catalog.entries()] == sorted(e.xid for e in catalog.entries())
    assert catalog.entries()[0].xid == 1
    assert load_catalog() is catalog  # cached


def test_entry_fields_come_from_the_right_columns():
    e = load_catalog().get(79)
    assert e is not None
    assert e.mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert e.description == "GPU has fallen off the bus"
    assert e.immediate_action == "RESTART_BM"
    assert e.investigatory_action == "CONTACT_SUPPORT"
    assert e.xid154_linkage == "CUDA 12.7; GPU driver R565"
    assert e.applies_to == frozenset({"A100", "H100", "B100", "GB200"})
    assert e.trigger_conditions.startswith("This event is logged when the GPU driver attempts")


def test_applies_to_follows_the_yes_columns():
    catalog = load_catalog()
    assert catalog.get(74).applies_to == frozenset({"A100", "H100"})
    assert catalog.get(144).applies_to == frozenset({"B100", "GB200"})
    assert catalog.get(1).applies_to == frozenset()


def test_multiline_workbook_cells_are_collapsed_in_names():
    assert load_catalog().get(13).mnemonic == "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY"


def test_contains_and_get_for_unknown_codes():
    catalog = load_catalog()
    assert 48 in catalog
    assert 9999 not in catalog
    assert "48" not in catalog
    assert catalog.get(9999) is None


def test_packaged_csv_is_a_verbatim_copy_of_the_reference():
    if not REFERENCE.exists():
        pytest.skip("shared reference folder not present")
    packaged = Path(xid_catalog.__file__).parent / "data"
    for name in (
        "nvidia-xid-catalog.csv",
        "nvidia-xid-resolution-buckets.csv",
        "nvidia-xid-nvlink5-decode.csv",
    ):
        assert (packaged / name).read_bytes() == (REFERENCE / name).read_bytes(), name


def test_columns_are_found_by_name_not_position():
    # A future sheet with one more product column in front of the buckets still parses.
    text = (
        'Type (XID),Code,Mnemonic,Description,"Applies to\nA100","Applies to\nZ900",'
        '"Resolution Bucket \n(Immediate Action)",Resolution Bucket (Investigatory Action),'
        "Xid 154 linkage,Trigger Conditions\n"
        "XID,48,DBE,Double Bit,NO,YES,RESET_GPU,CONTACT_SUPPORT,,when\n"
        "XID,notanumber,X,Y,NO,NO,IGNORE,IGNORE,,\n"
    )
    catalog = parse_catalog_csv(text)
    assert [e.xid for e in catalog.entries()] == [48]
    assert catalog.get(48).applies_to == frozenset({"Z900"})
    assert catalog.get(48).immediate_action == "RESET_GPU"


@pytest.mark.parametrize(
    ("xid", "action", "severity"),
    [
        (43, "none", "info"),  # IGNORE
        (13, "restart_process", "error"),  # RESTART_APP
        (31, "restart_process", "error"),
        (95, "reset_gpu", "fatal"),  # RESET_GPU
        (79, "reboot_node", "fatal"),  # RESTART_BM
        (151, "reboot_node", "fatal"),  # RESTART_VM
        (48, "reset_gpu", "fatal"),  # WORKFLOW_XID_48
        (45, "none", "warning"),  # WORKFLOW_XID_45: secondary
        (74, "reset_gpu", "fatal"),  # WORKFLOW_NVLINK_ERR
        (149, "reset_gpu", "fatal"),  # WORKFLOW_NVLINK5_ERR
        (1, "contact_support", "error"),  # CONTACT_SUPPORT
        (78, "investigate", "warning"),  # UPDATE_SWFW
        (54, "investigate", "warning"),  # CHECK_MECHANICALS
        (159, "investigate", "warning"),  # CHECK_UVM
        (162, "investigate", "warning"),  # no bucket yet
        (154, "investigate", "warning"),  # XID_154 without the parsed action
    ],
)
def test_bucket_mapping(xid, action, severity):
    entry = load_catalog().get(xid)
    assert recommended_action(entry) == action
    assert default_severity(entry) == severity


def test_every_catalog_entry_maps_to_a_known_word():
    for entry in load_catalog().entries():
        assert recommended_action(entry) in RECOMMENDED_ACTIONS
        assert default_severity(entry) in SEVERITIES


def test_every_bucket_in_the_glossary_that_the_catalog_uses_has_an_explicit_rule():
    # Catch NVIDIA adding a bucket to the catalog that we silently treat as "investigate".
    with (Path(xid_catalog.__file__).parent / "data" / "nvidia-xid-resolution-buckets.csv").open() as f:
        glossary = {row[0].strip() for row in csv.reader(f) if row}
    used = {e.immediate_action for e in load_catalog().entries()}
    explicit = set(xid_catalog._BUCKET_POLICY) | {"XID_154"}
    investigate = {b for b in used if b.startswith("CHECK_") or b == ""}
    assert used <= explicit | investigate
    assert (used - {""}) <= glossary


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (RecoveryAction.NONE, ("none", "info")),
        (RecoveryAction.GPU_RESET, ("reset_gpu", "fatal")),
        (RecoveryAction.NODE_REBOOT, ("reboot_node", "fatal")),
        (RecoveryAction.DRAIN_P2P, ("restart_process", "warning")),
        (RecoveryAction.DRAIN_AND_RESET, ("reset_gpu", "fatal")),
    ],
)
def test_xid_154_follows_the_recovery_action(action, expected):
    entry = load_catalog().get(154)
    assert (recommended_action(entry, action), default_severity(entry, action)) == expected
    # The recovery action only matters for Xid 154.
    assert recommended_action(load_catalog().get(13), action) == "restart_process"


def test_recovery_action_values_match_nvml_field_230():
    assert [int(a) for a in RecoveryAction][:5] == [0, 1, 2, 3, 4]
    assert RecoveryAction(2) is RecoveryAction.NODE_REBOOT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Node Reboot Required", RecoveryAction.NODE_REBOOT),
        ("GPU Reset Required", RecoveryAction.GPU_RESET),
        ("Drain P2P", RecoveryAction.DRAIN_P2P),
        ("Drain and Reset", RecoveryAction.DRAIN_AND_RESET),
        ("None", RecoveryAction.NONE),
        ("(None)", RecoveryAction.NONE),
        ("  node reboot required ", RecoveryAction.NODE_REBOOT),
        ("NODE_REBOOT", RecoveryAction.NODE_REBOOT),
        ("OS Reboot", RecoveryAction.NODE_REBOOT),  # seen in 610-series driver logs
        ("PF FLR", RecoveryAction.GPU_RESET),
        ("Reset", RecoveryAction.GPU_RESET),  # nvidia-smi -q "GPU Recovery Action : Reset"
        ("launch the missiles", None),
        ("", None),
    ],
)
def test_parse_recovery_action_text(text, expected):
    assert parse_recovery_action_text(text) is expected


def test_bucket_policy_is_case_and_space_tolerant():
    assert bucket_policy(" reset_gpu ") == ("reset_gpu", "fatal")
    assert bucket_policy("SOMETHING_NEW") == ("investigate", "warning")


def test_entries_are_frozen():
    entry = load_catalog().get(48)
    assert isinstance(entry, XidEntry)
    with pytest.raises(AttributeError):
        entry.xid = 1  # type: ignore[misc]


# --- NVLink5 decode ------------------------------------------------------------------------------


def test_nvlink5_sheet_is_loaded():
    rules = load_nvlink5_rules()
    assert len(rules) == 95
    assert {r.xid for r in rules} == {144, 145, 146, 147, 148, 149, 150}
    assert all(len(r.intr_mask_v1) == 32 and len(r.intr_mask_v2) == 32 for r in rules)


@pytest.mark.parametrize(
    ("xid", "intr", "status", "subcode", "fmt", "bucket", "investigate"),
    [
        # gpud PR #1160/#1174 examples (real driver lines), decoded by hand from NVIDIA's sheet:
        # V1 subcode = IntrInfo[9:5..0], V1 link-down reason = IntrInfo[25:20].
        (149, 0x025001C6, 0x0, "NETIR_LINK_EVT", "V1", "RESET_GPU", "INVESTIGATE_PEER_DEVICE"),
        (149, 0x026001C6, 0x0, "NETIR_LINK_EVT", "V1", "IGNORE", "INVESTIGATE_SW/USER"),
        (149, 0x000FE406, 0x0, "NETIR", "V1", "RESET_GPU", "SYMPATHETIC_REPORT_SOLO"),
        (145, 0x0409A0C2, 0x8, "RLW_RXPIPE", "V1", "IGNORE", "CONTACT_SUPPORT"),
        # V2 subcode = IntrInfo[6:0]
        (144, 0x00000001, 0x8, "SAW_MVB", "V2", "IGNORE", "CONTACT_SUPPORT"),
        (144, 0x00000001, 0x2, "SAW_MVB", "V2", "RESET_GPU", "CONTACT_SUPPORT"),
        # "0x00000000/0xFFFFFFFF" error-status cell accepts both values
        (150, 0x0, 0xFFFFFFFF, "", "V1", "RESET_GPU", "CONTACT_SUPPORT"),
    ],
)
def test_decode_nvlink5(xid, intr, status, subcode, fmt, bucket, investigate):
    d = decode_nvlink5(xid, intr, status, subcode=subcode)
    assert d is not None
    assert (d.driver_format, d.immediate_action, d.rule.investigatory_action) == (fmt, bucket, investigate)


def test_decode_nvlink5_action_2_promotes_the_bucket():
    # RLW_RXPIPE rows are "Non-fatal*": when IntrInfo bit 10 is set (V1), Action 2 (RESET_GPU) applies.
    plain = decode_nvlink5(145, 0x000000C2, 0x1, subcode="RLW_RXPIPE")
    promoted = decode_nvlink5(145, 0x000004C2, 0x1, subcode="RLW_RXPIPE")
    assert plain.immediate_action == "IGNORE"
    assert promoted.immediate_action == "RESET_GPU"
    assert promoted.rule.severity == "Non-fatal*"


def test_decode_nvlink5_v2_subcode_names():
    # V2 drivers print NETIR_LINK_DOWN where V1 printed NETIR_LINK_EVT; subcode 0010001 in IntrInfo[6:0].
    d = decode_nvlink5(149, (0b100101 << 20) | 0b0010001, 0, subcode="NETIR_LINK_DOWN")
    assert d is not None
    assert (d.driver_format, d.subcode, d.rule.investigatory_action) == (
        "V2",
        "NETIR_LINK_DOWN",
        "INVESTIGATE_PEER_DEVICE",
    )


def test_decode_nvlink5_falls_back_to_registers_when_the_subcode_name_is_unknown():
    d = decode_nvlink5(149, 0x025001C6, 0, subcode="SOME_FUTURE_NAME")
    assert d is not None and d.subcode == "NETIR_LINK_EVT"


def test_decode_nvlink5_no_match():
    assert decode_nvlink5(144, 0xFFFFFFFF, 0x12345, subcode="SAW_MVB") is None
    assert decode_nvlink5(13, 0, 0) is None


def test_parse_nvlink5_csv_skips_junk_rows():
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow(["Xid", "Subcode", "m1", "m2", "es", "bucket", "a2m1", "a2m2", "a2", "inv", "sev", "hw", "loc"])
    w.writerow(["note", "x"])
    w.writerow(["144", "A/B", "-" * 32, "-" * 32, "0x1", "IGNORE", "", "", "", "IGNORE", "Non-fatal", "HW", ""])
    (rule,) = xid_catalog.parse_nvlink5_csv(text.getvalue())
    assert (rule.subcode_v1, rule.subcode_v2, rule.error_status) == ("A", "B", frozenset({1}))
