"""Commands to agents and their results: domain values <-> rasd.api.v1 messages.

Outbound, a repair ladder's action (`actions.Action`) or an operator's validation run becomes a
`Command`; inbound, an `ActionResult` becomes an `AgentResult`. Results and relayed commands cross
replicas through the store as serialized messages (`result_to_bytes`, `command_from_bytes`). The
services hold a `Command` only as an opaque value they pass on (the power loop builds its own).
"""

from __future__ import annotations

from collections.abc import Sequence

from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.controller.core import agent_messages as msgs
from rasd.controller.core.remediation import actions
from rasd.controller.core.remediation import policy as policy_mod

Command = commands_pb.Command
"""A command as it goes on the wire (what `Ingest.send_command` and `Ingest.dispatch` take)."""


def agent_command(
    action: actions.Action,
    policy: policy_mod.EscalationPolicy,
    node_gpus: Sequence[str],
    now_unix_ns: int,
    *,
    deadline_unix_ns: int | None = None,
) -> commands_pb.Command:
    """The wire command for an agent action.

    Its deadline is deadline_unix_ns, by default the action kind's timeout from now. A command sent
    again passes when the ladder's wait for it runs out: the agent grants it the span between the
    two stamps (`rasd.agent.runtime.on_local_clock`), so it refuses to start one the ladder has
    given up on meanwhile.
    """
    timeout_s = policy.timeout_s(action.kind)
    command = commands_pb.Command(
        command_id=action.command_id,
        issued_unix_ns=now_unix_ns,
        deadline_unix_ns=now_unix_ns + int(timeout_s * 1e9) if deadline_unix_ns is None else deadline_unix_ns,
        reason=action.reason,
    )
    if isinstance(action, actions.RestartProcess):
        command.restart_process.CopyFrom(commands_pb.RestartProcess(gpu_uuid=action.gpu_uuid, grace_s=action.grace_s))
    elif isinstance(action, actions.ResetGpu):
        command.reset_gpu.CopyFrom(commands_pb.ResetGpu(gpu_uuid=action.gpu_uuid))
    elif isinstance(action, actions.RebootNode):
        command.reboot_node.CopyFrom(commands_pb.RebootNode())
    elif isinstance(action, actions.RunValidation):
        gpus = list(action.gpu_uuids)
        if not gpus and action.exclude_gpu_uuids:
            gpus = [g for g in node_gpus if g not in action.exclude_gpu_uuids]
        command.run_validation.CopyFrom(commands_pb.RunValidation(suite=action.suite, gpu_uuids=gpus, seed=action.seed))
    return command


def validation_command(run: msgs.ValidationRun) -> commands_pb.Command:
    """The wire command of an operator's validation run."""
    return commands_pb.Command(
        command_id=run.command_id,
        issued_unix_ns=run.issued_unix_ns,
        deadline_unix_ns=run.deadline_unix_ns,
        reason=run.reason,
        run_validation=commands_pb.RunValidation(suite=run.suite, gpu_uuids=list(run.gpu_uuids), seed=run.seed),
    )


def command_kind(command: commands_pb.Command) -> str:
    """The action a command carries ("reset_gpu", "set_power_cap", ...; "unknown" when none)."""
    return command.WhichOneof("action") or "unknown"


def command_to_bytes(command: commands_pb.Command) -> bytes:
    """A command serialized, to relay it through the store."""
    return command.SerializeToString()


def command_from_bytes(payload: bytes) -> commands_pb.Command:
    """A relayed command (`command_to_bytes`)."""
    return commands_pb.Command.FromString(payload)


_INT64_MAX = 2**63 - 1


def stamp_agent_deadline(command: commands_pb.Command, agent_ahead_ns: int | None) -> None:
    """Give command its deadline on the agent's clock (``deadline_agent_unix_ns``), once the offset is bounded.

    agent_ahead_ns: how far the agent's clock runs ahead of the controller's at least
    (`ingest.streams.Session.agent_ahead_ns`); None: not known yet, no agent deadline (0).
    """
    if command.deadline_unix_ns and agent_ahead_ns is not None:
        # Within 1 ns .. 2**63 - 1 whatever the offset: the edge bounds every agent stamp
        # (`validate_input`), and a deadline outside int64 raised in the middle of a dispatch.
        command.deadline_agent_unix_ns = min(max(command.deadline_unix_ns + agent_ahead_ns, 1), _INT64_MAX)
    else:
        command.deadline_agent_unix_ns = 0


def result_from_wire(result: commands_pb.ActionResult) -> msgs.AgentResult:
    """An ActionResult (checked at the edge: its outcome is a known one) as an `AgentResult`."""
    return msgs.AgentResult(
        command_id=result.command_id,
        outcome=msgs.Outcome(result.outcome),
        message=result.message,
        started_unix_ns=result.started_unix_ns,
        finished_unix_ns=result.finished_unix_ns,
        enforced_limits=tuple(
            msgs.EnforcedLimit(
                gpu_uuid=limit.gpu_uuid,
                power_limit_w=limit.power_limit_w,
                slew_target_w=limit.slew_target_w,
                max_raise_w_per_s=limit.max_raise_w_per_s,
            )
            for limit in result.enforced_limits
        ),
        verdicts=tuple(
            msgs.CheckVerdict(
                check=v.check, gpu_uuid=v.gpu_uuid, verdict=v.verdict, evidence=v.evidence, duration_s=v.duration_s
            )
            for v in result.verdicts
        ),
        validation_verdict=result.validation_verdict,
        replayed=result.replayed,
        severity=result.severity,
    )


def result_to_wire(result: msgs.AgentResult) -> commands_pb.ActionResult:
    """An `AgentResult` as the ActionResult it came from (`result_from_wire` inverted)."""
    return commands_pb.ActionResult(
        command_id=result.command_id,
        outcome=int(result.outcome),
        message=result.message,
        started_unix_ns=result.started_unix_ns,
        finished_unix_ns=result.finished_unix_ns,
        enforced_limits=[
            commands_pb.GpuPowerLimit(
                gpu_uuid=limit.gpu_uuid,
                power_limit_w=limit.power_limit_w,
                slew_target_w=limit.slew_target_w,
                max_raise_w_per_s=limit.max_raise_w_per_s,
            )
            for limit in result.enforced_limits
        ],
        verdicts=[
            commands_pb.CheckVerdict(
                check=v.check, gpu_uuid=v.gpu_uuid, verdict=v.verdict, evidence=v.evidence, duration_s=v.duration_s
            )
            for v in result.verdicts
        ],
        validation_verdict=result.validation_verdict,
        replayed=result.replayed,
        severity=result.severity,
    )


def result_to_bytes(result: msgs.AgentResult) -> bytes:
    """A result serialized as its ActionResult, to relay it to the leader through the store."""
    return result_to_wire(result).SerializeToString()


def result_from_bytes(payload: bytes) -> msgs.AgentResult:
    """A relayed result (`result_to_bytes`, or an ActionResult another replica stored as it came)."""
    return result_from_wire(commands_pb.ActionResult.FromString(payload))
