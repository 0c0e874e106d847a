"""rasd-validate end to end on the CPU: --json on a healthy run, each --inject-fault, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rasd.validation.faults import FAULT_CHECKS, FaultKind

torch = pytest.importorskip("torch")


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    from rasd.validation.main import main

    code = main(["--suite", "quick", "--device", "cpu", "--json", "--seed", "5", *args])
    return code, json.loads(capsys.readouterr().out)


def test_quick_cpu_json_passes_on_a_healthy_machine(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = cli_json(capsys)
    assert code == 0
    assert report["verdict"] == "pass"
    assert {k: report[k] for k in ("suite", "device", "seed", "gpus")} == {
        "suite": "quick",
        "device": "cpu",
        "seed": 5,
        "gpus": [0, 1, 2],
    }
    assert report["started"] <= report["finished"]
    assert 0 < report["duration_s"] < report["time_budget_s"] == 300
    assert [c["check"] for c in report["checks"]] == ["V0", "V1", "V3", "V2", "V4", "V5", "V6"]
    verdicts = {c["check"]: c["verdict"] for c in report["checks"]}
    assert verdicts.pop("V0") == "skipped"  # standalone: no telemetry source
    assert set(verdicts.values()) == {"pass"}
    for check in report["checks"][1:]:
        assert [g["gpu"] for g in check["gpus"]] == [0, 1, 2]
        assert all(set(g) == {"gpu", "verdict", "reason", "duration_s", "evidence"} for g in check["gpus"])


EXPECTED_EXIT = {FaultKind.DRIFT: 2}


@pytest.mark.parametrize("kind", list(FaultKind), ids=[k.value for k in FaultKind])
def test_each_injected_fault_fails_the_quick_suite_naming_check_and_location(
    capsys: pytest.CaptureFixture[str], kind: FaultKind
) -> None:
    code, report = cli_json(capsys, "--inject-fault", kind.value)
    assert code == EXPECTED_EXIT.get(kind, 1)
    assert report["fault_injection"]["kind"] == kind.value
    flagged = {c["check"]: c for c in report["checks"] if c["verdict"] not in ("pass", "skipped")}
    assert set(flagged) == FAULT_CHECKS[kind]
    for check_id, check in flagged.items():
        bad = [g for g in check["gpus"] if g["verdict"] != "pass"]
        if kind is FaultKind.DRIFT:
            assert check["verdict"] == "software_drift" and len(bad) == 3
        else:
            assert check["verdict"] == "fail"
            assert [g["gpu"] for g in bad] == [2]  # the default target: the last GPU
            assert bad[0]["reason"].startswith(f"{check_id} ")  # names the check
        assert bad[0]["evidence"][0]["location"]  # and the location


def test_health_json_feeds_v0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    health = tmp_path / "health.json"
    health.write_text(json.dumps({"gpus": {"1": {"row_remap_pending": True}, "0": {"row_remap_pending": False}}}))
    code, report = cli_json(capsys, "--gpus", "0,1", "--checks", "V0", "--health-json", str(health))
    assert code == 1
    gpus = {g["gpu"]: g for g in report["checks"][0]["gpus"]}
    assert gpus[0]["verdict"] == "pass"
    assert gpus[1]["verdict"] == "fail" and "reset the GPU" in gpus[1]["reason"]


def test_record_golden_then_validate_against_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden = tmp_path / "golden.json"
    code, _ = cli_json(capsys, "--checks", "V2", "--golden", str(golden), "--record-golden")
    assert code == 0 and golden.exists()
    code, report = cli_json(capsys, "--checks", "V2", "--golden", str(golden))
    assert code == 0
    assert "golden and peers" in report["checks"][0]["gpus"][0]["reason"]


def test_a_tiny_budget_reports_incomplete_with_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = cli_json(capsys, "--time-budget-s", "1")
    assert code == 3
    assert report["verdict"] == "incomplete"
    assert any("budget" in c["reason"] for c in report["checks"])


def test_ecc_json_feeds_the_v4_ecc_watch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ecc = tmp_path / "ecc.json"
    ecc.write_text(json.dumps({"gpus": {"0": {"correctable": 4, "uncorrectable": 0}}}))
    code, report = cli_json(capsys, "--gpus", "0,1", "--checks", "V4", "--ecc-json", str(ecc))
    assert code == 0  # counters did not move during the test
    gpus = {g["gpu"]: g for g in report["checks"][0]["gpus"]}
    assert "ECC watch unavailable" not in gpus[0]["reason"]
    assert "ECC watch unavailable" in gpus[1]["reason"]  # the file knows nothing of gpu 1


def test_bad_inputs_are_usage_errors_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rasd.validation.main import main

    bad_golden = tmp_path / "golden.json"
    bad_golden.write_text(json.dumps({"format": 99}))
    assert main(["--device", "cpu", "--golden", str(bad_golden)]) == 2
    assert "not a rasd golden store" in capsys.readouterr().err
    bad_health = tmp_path / "health.json"
    bad_health.write_text(json.dumps({"gpus": {"0": {"remap_pendng": True}}}))
    assert main(["--device", "cpu", "--health-json", str(bad_health)]) == 2
    assert "unknown health fields" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", "--gpus", "0,1", "--inject-fault", "bitflip", "--inject-gpu", "5"])
    assert exc.value.code == 2
