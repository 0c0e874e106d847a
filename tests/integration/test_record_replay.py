"""Record a simulated run, replay it unchanged (no difference) and under a changed ladder (the expected ones)."""

from __future__ import annotations

import json

import pytest

from rasd.controller.observability import recording
from rasd.sim import main as sim_main
from rasd.sim import replay

SCENARIO = """
name = "replay-small"
[workload]
period_s = 1.0
[[faults]]                 # application fault: the ladder restarts the process
at_s = 1.0
node = 0
gpu = 1
kind = "xid"
xid = 13
message = "NVRM: Xid (PCI:0000:19:00): 13, pid=4242, name=python, Graphics Exception"
[[faults]]                 # HBM: uncorrectable ECC → quarantine the GPU, reset it, validate, release
at_s = 1.5
node = 1
gpu = 2
kind = "xid"
xid = 48
message = "NVRM: Xid (PCI:0000:1a:00): 48, pid=5151, name=python, An uncorrectable double bit error (DBE)"
[[operator]]               # a training job accuses node 1's GPU 0 of silent data corruption
at_s = 2.0
action = "accuse_sdc"
node = 1
gpu = 0
reason = "loss spike"
[remediation.disruption]
breaker_quarantine_pct = 60.0
max_disrupted_nodes_pct = 50.0
storm_cooldown_s = 0.0
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One recorded run of the small scenario (2 nodes × 4 GPUs, 7 s)."""
    return _record(SCENARIO, tmp_path_factory.mktemp("record"), duration_s=7)


def _record(scenario: str, root, *, duration_s: float):
    """rasd-sim on 2 nodes × 4 GPUs for duration_s with the scenario, recorded; the recording's path."""
    scenario_file = root / "scenario.toml"
    scenario_file.write_text(scenario)
    path = root / "run.rasdrec"
    code = sim_main.main(
        ["--nodes", "2", "--gpus-per-node", "4", "--duration-s", str(duration_s), "--scenario", str(scenario_file),
         "--out", str(root / "run"), "--table-interval-s", "0", "--seed", "3", "--record", str(path)]
    )  # fmt: skip
    assert code == 0
    return path


def test_the_recording_holds_streams_commands_and_decisions(recorded):
    rec = recording.read(recorded)
    assert rec.header.format_version == recording.FORMAT_VERSION and rec.truncated_at is None
    kinds = {}
    for entry in rec.entries:
        which = entry.WhichOneof("entry")
        key = entry.inbound.WhichOneof("payload") if which == "inbound" else which
        kinds[key] = kinds.get(key, 0) + 1
    # The agents send telemetry summaries (TELEMETRY_FORMAT_SUMMARY), one a second per node.
    assert kinds["hello"] == 2 and kinds["summary"] >= 2 * 5 and kinds["events"] >= 2
    assert kinds["accusation"] == 1 and kinds["closed"] == 2
    assert kinds["action_result"] >= 3 and kinds["outbound_command"] >= 3
    decided = [e.decision.kind for e in rec.entries if e.WhichOneof("entry") == "decision"]
    assert {"restart_process", "quarantine_gpu", "reset_gpu", "run_validation", "release"} <= set(decided)
    # The recorded policy is the scenario's: its relaxed disruption budget survives the round trip.
    assert rec.policy.disruption.max_disrupted_nodes_pct == 50.0
    assert all(e.at_unix_ns >= rec.header.started_unix_ns for e in rec.entries)
    assert all(e.session_id for e in rec.entries if e.WhichOneof("entry") in ("inbound", "closed"))


def test_unchanged_replay_decides_exactly_what_the_recorded_run_decided(recorded, tmp_path):
    report = _replay(recorded, tmp_path)
    assert report["differences"] == 0 and report["diff"] == []
    assert report["decisions"]["recorded"] == report["decisions"]["replayed"] >= 8
    # Every command the replay sent was sent in the recording and answered from it.
    assert report["results"]["synthesized"] == 0 and report["synthesized_results"] == []
    assert report["results"]["recorded"] >= 3
    assert report["skipped"] == []
    assert report["policy"] == {"source": "as recorded", "changed": {}}
    assert "**0 decision(s) differ.**" in (tmp_path / "out" / "replay.md").read_text()


def test_a_ladder_without_restarts_resets_the_gpu_instead(recorded, tmp_path):
    policy_file = tmp_path / "no-restart.toml"
    policy_file.write_text("[remediation.escalation]\nmax_attempts_restart_process = 0\n")
    report = _replay(recorded, tmp_path, "--policy", str(policy_file))
    assert report["policy"]["changed"] == {"escalation.max_attempts_restart_process": {"recorded": 2, "replayed": 0}}
    rows = report["diff"]
    # Only the Xid 13 ticket on node-000 changes; the Xid 48 reset and the accusation are as recorded.
    assert {r["node_id"] for r in rows} == {"node-000"}
    assert {r["ticket_id"] for r in rows} == {rows[0]["ticket_id"]} and "xid:13" in rows[0]["ticket_id"]
    summary = [(r["change"], r["recorded_action"], r["replayed_action"], r["depends_on_synthesized"]) for r in rows]
    assert summary == [
        ("only_replayed", "", "quarantine_gpu", False),
        ("changed", "restart_process", "reset_gpu", False),
        ("only_replayed", "", "run_validation(post-repair)", True),
        ("only_replayed", "", "release(gpu)", True),
    ]
    changed = rows[1]
    assert "restart_process" in changed["reason"] and "reset_gpu" in changed["reason"]
    assert changed["recorded_reason"] and changed["gpu_uuid"].startswith("GPU-")
    # The reset was never sent in the recording: its result (and the validation's) are synthesized and listed.
    assert [s["kind"] for s in report["synthesized_results"]] == ["reset_gpu", "run_validation"]
    assert all(s["outcome"].startswith("SUCCEEDED") for s in report["synthesized_results"])
    # The recorded restart's result has no command to answer in the replay: it is never fed.
    unchanged = _replay(recorded, tmp_path / "unchanged")
    assert report["results"]["recorded"] == unchanged["results"]["recorded"] - 1
    table = (tmp_path / "out" / "replay.md").read_text()
    assert "| changed | restart_process | reset_gpu |" in table
    assert "4 decision(s) differ" in table


def test_an_accusation_written_after_a_later_entry_is_replayed_at_its_own_time(recorded, tmp_path):
    """The recorder writes an accusation once its commit is done, with the time it was made; an entry
    written meanwhile comes first in the file with a later time. Its replay keeps the recorded time,
    so its ticket (whose id holds that time) is the recorded one (under load in CI it came 50 ms later)."""
    rec = recording.read(recorded)
    entries = list(rec.entries)
    (at,) = [i for i, e in enumerate(entries) if e.WhichOneof("entry") == "accusation"]
    accusation = entries[at]
    later = next(i for i in range(at + 1, len(entries)) if entries[i].at_unix_ns > accusation.at_unix_ns)
    entries.insert(later, entries.pop(at))  # now after an entry 'later' with a later time
    raced = tmp_path / "raced.rasdrec"
    with open(raced, "wb") as out:
        out.write(recording.MAGIC)
        for message in (rec.header, *entries):
            data = message.SerializeToString()
            out.write(recording._varint(len(data)) + data)
    report = _replay(raced, tmp_path)
    assert report["differences"] == 0 and report["diff"] == []


def test_a_policy_file_with_a_bad_key_is_refused_by_name(recorded, tmp_path, capsys):
    policy_file = tmp_path / "bad.toml"
    policy_file.write_text("[remediation.escalation]\nmax_attempts_reset_gpu = -1\n")
    with pytest.raises(SystemExit):
        sim_main.main(["--replay", str(recorded), "--policy", str(policy_file), "--out", str(tmp_path / "o")])
    assert "escalation.max_attempts_reset_gpu: must be >= 0" in capsys.readouterr().err


def _replay(path, tmp_path, *extra):
    code = sim_main.main(["--replay", str(path), "--out", str(tmp_path / "out"), *extra])
    assert code == 0
    report = json.loads((tmp_path / "out" / "replay.json").read_text())
    assert report == json.loads(json.dumps(report))
    assert replay.markdown(report) == (tmp_path / "out" / "replay.md").read_text()
    return report


BY_HAND = """
name = "replay-by-hand"
[workload]
period_s = 1.0
[[operator]]               # a person quarantines node 0's GPU 3 ...
at_s = 0.5
action = "quarantine"
node = 0
gpu = 3
reason = "fan noise"
[[faults]]                 # ... the ladder repairs it, and its release leaves the person's hold in place ...
at_s = 1.0
node = 0
gpu = 3
kind = "xid"
xid = 48
message = "NVRM: Xid (PCI:0000:1b:00): 48, pid=5151, name=python, An uncorrectable double bit error (DBE)"
[[operator]]               # ... which the person lifts, without validation
at_s = 4.0
action = "release"
node = 0
gpu = 3
force = true
reason = "fan replaced"
[[operator]]
at_s = 4.2
action = "pause_automation"
reason = "maintenance window"
[[operator]]
at_s = 4.4
action = "resume_automation"
[[operator]]               # a release of what is not quarantined: refused, and asked again in the replay
at_s = 4.6
action = "release"
node = 1
reason = "nothing to release"
"""


def test_operators_quarantines_releases_and_pauses_are_recorded_and_replayed(tmp_path):
    """What a person did by hand is a replay input: without it the replay releases a GPU the person held."""
    path = _record(BY_HAND, tmp_path, duration_s=6)
    rec = recording.read(path)
    by_hand = [e.operator_action for e in rec.entries if e.WhichOneof("entry") == "operator_action"]
    assert [(a.action, a.actor, a.force) for a in by_hand] == [
        ("quarantine", "operator", False), ("release", "operator", True), ("pause", "operator", False),
        ("resume", "operator", False), ("release", "operator", False),
    ]  # fmt: skip
    report = _replay(path, tmp_path)
    assert report["inputs"]["operator_action"] == 5
    # Unfed, the replayed ladder releases the GPU its repair is done with, which the person's hold kept.
    assert report["differences"] == 0 and report["diff"] == [], report["diff"]
    refused = [line.split(": ", 1)[1] for line in report["skipped"]]
    assert refused == ["refused in the replay: node-001 is not quarantined"]
