"""Power core values <-> rasd.api.v1 messages: the power loop's commands, their results, and its status.

The only power module that touches protobuf: the loop hands it the period's commands as data
(`core.power.commands`) and gets wire `Command`s to send; it hands back each `ActionResult` as a
`CommandResult` of plain values; and AdminService's GetPowerStatus gets the status from here.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.controller.core.power import apply as power_apply
from rasd.controller.core.power import commands
from rasd.controller.core.power import status as power_status

NOT_EXECUTED = frozenset(
    {
        commands_pb.ACTION_OUTCOME_TIMED_OUT,
        commands_pb.ACTION_OUTCOME_REFUSED,
        commands_pb.ACTION_OUTCOME_DRY_RUN,
        commands_pb.ACTION_OUTCOME_NOT_SUPPORTED,
    }
)
"""Outcomes after which the agent did not and will not change the limit (an ack without read-back)."""


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """An agent's answer to a power command, as plain values."""

    outcome: str
    """The outcome's name (`ACTION_OUTCOME_SUCCEEDED` ...)."""
    succeeded: bool
    executed: bool
    """False when the agent did not and will not carry it out (refused, timed out, dry run, not supported)."""
    message: str
    finished_unix_ns: int
    """When the agent finished it, agent clock (0: not said)."""
    in_force_w: Mapping[str, float]
    """For SetPowerCap: GPU -> the limit read back, at the target of a raise still slewing (the most
    that may be in force, `apply.in_force_w`)."""


def result_from_wire(result: commands_pb.ActionResult) -> CommandResult:
    """An ActionResult as a `CommandResult`."""
    return CommandResult(
        outcome=commands_pb.ActionOutcome.Name(result.outcome),
        succeeded=result.outcome == commands_pb.ACTION_OUTCOME_SUCCEEDED,
        executed=result.outcome not in NOT_EXECUTED,
        message=result.message,
        finished_unix_ns=result.finished_unix_ns,
        # A slewing raise is confirmed at its target (see power_apply): the agent has taken it.
        in_force_w={
            limit.gpu_uuid: power_apply.in_force_w(limit.power_limit_w, limit.slew_target_w)
            for limit in result.enforced_limits
        },
    )


def cap_acks(result: CommandResult, limits: Sequence[power_apply.CapCommand], at_s: float) -> list[power_apply.CapAck]:
    """The per-GPU acks of one SetPowerCap's result (read back at `at_s`, controller time).

    A GPU with a read-back is acked at it; without one, only an outcome after which the agent did not
    and will not change the limit acks it (with no value); otherwise it stays pending until a
    read-back newer than its deadline.
    """
    out = []
    for c in limits:
        if c.gpu_uuid in result.in_force_w:
            out.append(power_apply.CapAck(c.command_id, c.gpu_uuid, float(result.in_force_w[c.gpu_uuid]), at_s))
        elif not result.executed:
            out.append(power_apply.CapAck(c.command_id, c.gpu_uuid, None, at_s))
    return out


def command_to_wire(
    command: commands.SetCaps | commands.SetSmoothing | commands.SetTroughFiller, *, issued_unix_ns: int
) -> commands_pb.Command:
    """One power command as a wire `Command`; a SetPowerCap keeps its apply-state id, others get a fresh one."""
    if isinstance(command, commands.SetCaps):
        first = command.limits[0]
        return commands_pb.Command(
            command_id=first.command_id,
            issued_unix_ns=issued_unix_ns,
            deadline_unix_ns=int(first.deadline_s * 1e9),
            reason=command.reason,
            set_power_cap=commands_pb.SetPowerCap(
                limits=[
                    commands_pb.GpuPowerLimit(
                        gpu_uuid=c.gpu_uuid, power_limit_w=c.limit_w, max_raise_w_per_s=c.max_raise_w_per_s
                    )
                    for c in command.limits
                ]
            ),
        )
    wire = commands_pb.Command(
        command_id=uuid.uuid4().hex,
        issued_unix_ns=issued_unix_ns,
        deadline_unix_ns=int(command.deadline_s * 1e9),
        reason=command.reason,
    )
    if isinstance(command, commands.SetSmoothing):
        profile = commands_pb.SetPowerSmoothing(gpu_uuids=command.gpu_uuids, enabled=command.enabled)
        if command.enabled:
            profile.floor_pct = command.floor_pct
            profile.ramp_up_w_per_s = command.ramp_up_w_per_s
            profile.ramp_down_w_per_s = command.ramp_down_w_per_s
        wire.set_power_smoothing.CopyFrom(profile)
    else:
        wire.set_trough_filler.CopyFrom(
            commands_pb.SetTroughFiller(
                gpu_uuids=command.gpu_uuids,
                enabled=command.enabled,
                floor_w=command.floor_w,
                ramp_down_w_per_s=command.ramp_down_w_per_s,
            )
        )
    return wire


def domain_to_wire(domain: power_status.DomainStatus) -> admin_pb.PowerDomain:
    """One domain and its subtree."""
    return admin_pb.PowerDomain(
        domain_id=domain.name,
        level=domain.level,
        budget_w=domain.budget_w or 0,
        has_budget=domain.budget_w is not None,
        allocated_w=round(domain.allocated_w),
        target_w=round(domain.target_w),
        drawn_w=domain.drawn_w,
        headroom_w=domain.headroom_w or 0.0,
        children=[domain_to_wire(c) for c in domain.children],
    )


def power_status_to_wire(status: power_status.PowerStatus) -> admin_pb.GetPowerStatusResponse:
    """The whole status: tree, swing now, smoothing, stranded power, the last decision."""
    response = admin_pb.GetPowerStatusResponse(
        stranded_w=status.stranded_w,
        over_budget=list(status.over_budget),
        updated_unix_ns=int(status.at_unix_s * 1e9),
        periods=status.periods,
        reason=status.reason,
        smoothing_mode=status.smoothing.mode if status.smoothing is not None else "off",
        smoothing_active=status.smoothing is not None and status.smoothing.active,
        smoothing_floor_w=status.smoothing.floor_w if status.smoothing is not None else 0.0,
    )
    if status.root is not None:
        response.root.CopyFrom(domain_to_wire(status.root))
    if status.swing is not None:
        response.swing_p2p_w = status.swing.p2p_w
        response.swing_period_s = status.swing.period_s or 0.0
        response.max_ramp_w_per_s = status.swing.max_ramp_1s_w_per_s or 0.0
    return response
