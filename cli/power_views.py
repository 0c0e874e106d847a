"""rasctl's power commands: the budget tree (status), run-time budgets, and the power policy.

rasctl get power [-o ...]                   the tree: budget, allocated, target, drawn, headroom; swing now
rasctl set budget DOMAIN WATTS              change one domain's budget (persisted, enforced at once)
rasctl delete budget DOMAIN                 remove a domain's own budget (not the cluster's)
rasctl get power-policy [-o json|yaml]      the policy in force, as TOML
rasctl set power-policy [--file F] [K=V ..] replace it: F's TOML (or the current policy) with K=V changes

(The spellings ``power status``, ``power budget set|clear``, ``power policy show|set`` still work.)
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tomllib
from typing import Any, TextIO

from rasd.api.v1 import admin_service_pb2 as admin_pb
from rasd.api.v1 import admin_service_pb2_grpc as admin_grpc
from rasd.cli import output


def parse_changes(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs with TOML values ("control_period_s=2", "peak_cap_enabled=true").

    Raises:
        ValueError: a pair without "=", or a value that is not a TOML value.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"policy change {pair!r} is not KEY=VALUE")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            raise ValueError(f"policy change {pair!r}: {value!r} is not a TOML value (quote strings)") from None
    return out


def _toml(mapping: dict[str, Any]) -> str:
    """The policy changes as a TOML table (written by a TOML writer: strings quoted and escaped by the spec)."""
    import tomli_w  # only `rasctl power policy set` writes TOML

    return tomli_w.dumps(mapping)


def run(args: argparse.Namespace, stub: admin_grpc.AdminServiceStub, out: TextIO, timeout: float) -> None:
    """Carry out one `rasctl power ...` command."""
    if args.power_command == "status":
        from rasd.cli import kinds, listings

        status = stub.GetPowerStatus(admin_pb.GetPowerStatusRequest(), timeout=timeout)
        items = kinds.domains(status) if args.output == "name" else [status]
        listings.render(kinds.power_listing(), items, args.output, 0, out)
    elif args.power_command == "budget":
        clear = args.budget_command == "clear"
        response = stub.SetPowerBudget(
            admin_pb.SetPowerBudgetRequest(
                domain_id=args.domain, budget_w=0 if clear else args.watts, clear=clear, reason=args.reason
            ),
            timeout=timeout,
        )
        domain = response.domain
        budget = f"{domain.budget_w} W" if domain.has_budget else "no own budget"
        print(f"{output.printable(domain.level)} {output.printable(domain.domain_id)}: {budget}", file=out)
    elif args.policy_command == "show":
        text = stub.GetPowerPolicy(admin_pb.GetPowerPolicyRequest(), timeout=timeout).policy_toml
        _show_policy(text, args.output, out)
    else:
        if args.file:
            text = sys.stdin.read() if args.file == "-" else pathlib.Path(args.file).read_text()
        else:
            text = stub.GetPowerPolicy(admin_pb.GetPowerPolicyRequest(), timeout=timeout).policy_toml
        policy = {**tomllib.loads(text), **parse_changes(args.changes)}
        response = stub.SetPowerPolicy(
            admin_pb.SetPowerPolicyRequest(policy_toml=_toml(policy), reason=args.reason), timeout=timeout
        )
        out.write(response.policy_toml)


def _show_policy(text: str, form: str, out: TextIO) -> None:
    """The policy as TOML (table, wide), JSON or YAML; ``-o name`` is the one name it has."""
    from rasd.cli import listings

    if form == "json":
        output.dump_json(tomllib.loads(text), out)
    elif form == "yaml":
        listings.dump_yaml(tomllib.loads(text), out)
    elif form == "name":
        print("power-policy/current", file=out)
    else:
        out.write(text)


def _kw(watts: float) -> str:
    return f"{watts / 1000:.1f}"


def status_table(status: admin_pb.GetPowerStatusResponse, out: TextIO) -> None:
    """The tree, indented by level, then one line on the swing and smoothing."""
    output.table(*status_rows(status), out)
    status_footer(status, out)


def status_rows(status: admin_pb.GetPowerStatusResponse) -> output.Rows:
    """The tree, indented by level: budget, allocated, target, drawn, headroom."""
    rows: list[list[Any]] = []

    def walk(domain: admin_pb.PowerDomain, depth: int) -> None:
        rows.append(
            [
                "  " * depth + domain.domain_id,
                domain.level,
                _kw(domain.budget_w) if domain.has_budget else "-",
                _kw(domain.allocated_w),
                _kw(domain.target_w),
                _kw(domain.drawn_w),
                _kw(domain.headroom_w) if domain.has_budget else "-",
            ]
        )
        for child in domain.children:
            walk(child, depth + 1)

    if status.HasField("root"):
        walk(status.root, 0)
    return ["DOMAIN", "LEVEL", "BUDGET kW", "ALLOCATED kW", "TARGET kW", "DRAWN kW", "HEADROOM kW"], rows


def status_footer(status: admin_pb.GetPowerStatusResponse, out: TextIO) -> None:
    """One line on the swing and smoothing; the domains over budget."""
    smoothing = (
        f"{output.printable(status.smoothing_mode)}, floor {status.smoothing_floor_w:.0f} W/GPU"
        if status.smoothing_active
        else "off"
    )
    period = f"{status.swing_period_s:.2f} s" if status.swing_period_s else "-"
    print(
        f"swing now: {_kw(status.swing_p2p_w)} kW peak-to-peak, period {period}, "
        f"max ramp {_kw(status.max_ramp_w_per_s)} kW/s; smoothing {smoothing}; "
        f"stranded {_kw(status.stranded_w)} kW; periods {status.periods}",
        file=out,
    )
    if status.over_budget:
        over = ", ".join(output.printable(name) for name in status.over_budget)
        print(f"over budget until decreases are confirmed: {over}", file=out)
