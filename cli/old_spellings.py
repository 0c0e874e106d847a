"""rasctl's spellings from before the verb-noun shape, kept so that scripts written for them still run.

Each parses to the namespace of its verb-noun spelling (`rasd.cli.parser`): ``nodes`` is
``get nodes``, ``node X`` is ``describe node X``, ``rma list|show|approve`` are ``get rma``,
``describe rma``, ``approve rma``, ``sdc list|accuse`` are ``get sdc`` and ``accuse``,
``gpu forget-owner`` is ``forget-owner``, ``automation pause|resume|status`` are ``pause|resume
automation`` and ``get automation``, ``power status|budget|policy`` are ``get power``, ``set|delete
budget``, ``get|set power-policy``, ``certs init`` and ``tokens new`` are ``create certs|token``,
``kmsg classify`` is ``classify kmsg``. They are not shown in ``--help``.
"""

from __future__ import annotations

from typing import Any


def add(commands: Any) -> None:
    """Add the old spellings to rasctl's top-level sub-commands."""
    from rasd.cli import parser as p

    nodes = commands.add_parser("nodes")
    nodes.set_defaults(command="nodes")
    nodes.add_argument("-l", "--selector", action="append", default=[], metavar="KEY=VALUE")
    p.add_output(nodes, watch=True)
    node = commands.add_parser("node")
    node.add_argument("node_id")
    p.add_output(node)
    for name, limit, open_filter, watch in (
        ("events", 50, False, True),
        ("incidents", 100, True, True),
        ("repairs", 100, True, True),
        ("validations", 100, False, False),
    ):
        listing = commands.add_parser(name)
        p._node_filter(listing, limit, open_filter=open_filter)
        p.add_output(listing, watch=watch, since=name == "events")
    audit = commands.add_parser("audit")
    audit.add_argument("--limit", type=int, default=50)
    p.add_output(audit, since=True)
    _groups(commands)


def _group(commands: Any, name: str, dest: str) -> Any:
    return commands.add_parser(name).add_subparsers(dest=dest, required=True)


def _groups(commands: Any) -> None:
    from rasd.cli import parser as p

    sdc = _group(commands, "sdc", "sdc_command")
    accuse = sdc.add_parser("accuse")
    accuse.add_argument("target", metavar="NODE/GPU")
    accuse.add_argument("--reason", required=True)
    sdc_list = sdc.add_parser("list")
    sdc_list.add_argument("--limit", type=int, default=100)
    p.add_output(sdc_list)
    rma = _group(commands, "rma", "rma_command")
    rma_list = rma.add_parser("list")
    rma_list.add_argument("--pending", action="store_true")
    p.add_output(rma_list)
    p.add_output(rma.add_parser("show"))
    rma.choices["show"].add_argument("rma_id")
    rma.add_parser("approve").add_argument("rma_id")
    forget = _group(commands, "gpu", "gpu_command").add_parser("forget-owner")
    forget.add_argument("target", metavar="NODE/GPU")
    forget.add_argument("--reason", required=True)
    automation = commands.add_parser("automation")
    automation.add_argument("action", choices=("pause", "resume", "status"))
    automation.add_argument("--reason", default="")
    p.add_output(automation)
    kmsg = _group(commands, "kmsg", "kmsg_command")
    kmsg.add_parser("classify")
    p.certs_arguments(_group(commands, "certs", "certs_command").add_parser("init"))
    p.token_arguments(_group(commands, "tokens", "tokens_command").add_parser("new"))
    _power(commands)


def _power(commands: Any) -> None:
    from rasd.cli import parser as p

    power = _group(commands, "power", "power_command")
    p.add_output(power.add_parser("status"))
    budget = power.add_parser("budget").add_subparsers(dest="budget_command", required=True)
    budget_set = budget.add_parser("set")
    budget_set.add_argument("domain")
    budget_set.add_argument("watts", type=p.watts)
    budget_set.add_argument("--reason", default="operator")
    budget_clear = budget.add_parser("clear")
    budget_clear.add_argument("domain")
    budget_clear.add_argument("--reason", default="operator")
    policy = power.add_parser("policy").add_subparsers(dest="policy_command", required=True)
    p.add_output(policy.add_parser("show"))
    change = policy.add_parser("set")
    change.add_argument("--file")
    change.add_argument("changes", nargs="*", metavar="KEY=VALUE")
    change.add_argument("--reason", default="operator")
