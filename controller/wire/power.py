"""Converts the power loop's status into AdminService messages (GetPowerStatus)."""

from __future__ import annotations

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.controller.power import loop as power_loop


def domain_to_wire(domain: power_loop.DomainStatus) -> admin_pb.PowerDomain:
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


def power_status_to_wire(status: power_loop.PowerStatus) -> admin_pb.GetPowerStatusResponse:
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
