"""rasctl's command line: verb-noun commands in kubectl's habits, built without importing gRPC.

``rasctl get nodes|events|incidents|repairs|validations|audit|sdc|rma|power|power-policy|automation``,
``describe node|rma``, ``quarantine|release|validate|accuse|forget-owner TARGET``, ``approve rma``,
``pause|resume automation``, ``set|delete budget``, ``set power-policy``, ``create certs|token``,
``classify kmsg``, ``config get-contexts|use-context|current-context``, ``completion bash|zsh``.

Global flags (``--controller``, ``--context``, ``--timeout-s``, the credentials) are taken before or
after the command. Every listing takes ``-o json|yaml|wide|name`` (``--json`` is ``-o json``). The
spellings before the verb-noun shape (``nodes``, ``node X``, ``rma list``, ``sdc accuse``,
``power status``, ...) still parse to the same command; they are left out of ``--help``.

Each leaf sets the fields the dispatch in `rasd.cli.main` reads (``command`` and its group's
sub-command), so a new spelling and its old one give the same namespace.
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

from rasd.cli import old_spellings

OUTPUTS = ("json", "yaml", "wide", "name")
"""What ``-o`` may ask for; without it a listing is an aligned table."""
GLOBAL_FLAGS = (
    ("--controller", "controller address host:port ($RASD_CONTROLLER, the context's, or 127.0.0.1:7443)"),
    ("--context", "the contexts file's context to use (default: its current-context)"),
    ("--timeout-s", "RPC deadline in seconds (default 10; a --watch streams until interrupted)"),
    ("--tls-ca", "CA bundle of the controller ($RASD_TLS_CA)"),
    ("--tls-cert", "your client certificate ($RASD_TLS_CERT)"),
    ("--tls-key", "its private key ($RASD_TLS_KEY)"),
    (
        "--tls-server-name",
        "the name to check the controller's certificate against when --controller is another address, "
        "e.g. rasd.rasd.svc through a port-forward ($RASD_TLS_SERVER_NAME)",
    ),
    ("--token", "bearer token ($RASD_TOKEN)"),
)
"""Flags every command takes, anywhere on the line; unset ones are settled by `rasd.cli.contexts.settle`."""


def _globals(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The global flags: on the top parser with None (unset), on every sub-command without a default.

    A sub-command's flag left out must not overwrite the top one's value (argparse copies a
    sub-command's defaults over the namespace), hence SUPPRESS there.
    """
    group = parser.add_argument_group("global flags")
    for flag, help_text in GLOBAL_FLAGS:
        kwargs: dict[str, Any] = {"default": None if top else argparse.SUPPRESS, "help": help_text}
        if flag == "--timeout-s":
            kwargs["type"] = float
        group.add_argument(flag, **kwargs)


def add_output(parser: argparse.ArgumentParser, *, watch: bool = False, since: bool = False) -> None:
    """``-o``/``--json`` on a listing; ``--watch`` and ``--since`` where the controller serves them."""
    parser.add_argument("-o", "--output", choices=OUTPUTS, default="", help="json, yaml, wide or name (default: table)")
    parser.add_argument("--json", dest="output", action="store_const", const="json", help="the same as -o json")
    if watch:
        parser.add_argument("-w", "--watch", action="store_true", help="after the listing, print changes as they come")
    if since:
        parser.add_argument("--since", default="", metavar="WHEN", help="only since then: a duration (10m, 2h, 1h30m) "
                            "or an RFC 3339 time (2026-12-05T08:00:00Z)")  # fmt: skip


def _leaf(group: Any, name: str, help_text: str, **fields: Any) -> argparse.ArgumentParser:
    """A command under group that sets fields (the dispatch's names) in the namespace."""
    leaf = group.add_parser(name, help=help_text, description=help_text)
    leaf.set_defaults(**fields)
    return leaf


def _node_filter(parser: argparse.ArgumentParser, limit: int | None = 100, *, open_filter: bool = False) -> None:
    parser.add_argument("--node", default="", help="only this node's")
    if open_filter:
        parser.add_argument("--open", action="store_true", help="only open ones")
    if limit is not None:
        parser.add_argument("--limit", type=int, default=limit, help="at most this many (default %(default)s)")


def _add_get(commands: Any) -> None:
    """``get RESOURCE``: every listing."""
    get = commands.add_parser("get", help="list a resource: nodes, events, incidents, repairs, stragglers, ...")
    resources = get.add_subparsers(dest="resource", required=True, metavar="RESOURCE")
    nodes = _leaf(resources, "nodes", "the fleet: nodes, GPUs, state, last seen, power draw and cap", command="nodes")
    nodes.add_argument("-l", "--selector", action="append", default=[], metavar="KEY=VALUE", help="label filter")
    add_output(nodes, watch=True)
    events = _leaf(resources, "events", "stored health events, newest first", command="events")
    _node_filter(events, 50)
    add_output(events, watch=True, since=True)
    incidents = _leaf(resources, "incidents", "correlated incidents, newest first", command="incidents")
    _node_filter(incidents, open_filter=True)
    add_output(incidents, watch=True)
    repairs = _leaf(resources, "repairs", "repair tickets: state, rung and why", command="repairs")
    _node_filter(repairs, open_filter=True)
    add_output(repairs, watch=True)
    validations = _leaf(resources, "validations", "validation runs and verdicts", command="validations")
    _node_filter(validations)
    add_output(validations)
    audit = _leaf(resources, "audit", "who did what, when, to what, why, and how it ended", command="audit")
    audit.add_argument("--limit", type=int, default=50, help="at most this many (default %(default)s)")
    add_output(audit, since=True)
    sdc = _leaf(resources, "sdc", "GPUs with SDC history, most suspicious first", command="sdc", sdc_command="list")
    sdc.add_argument("--limit", type=int, default=100)
    add_output(sdc)
    stragglers = _leaf(resources, "stragglers", "GPUs whose power edge lags their job's step after step, in the "
                       "order named, with score, lag and why", command="stragglers")  # fmt: skip
    stragglers.add_argument("--limit", type=int, default=100, help="at most this many (default %(default)s)")
    add_output(stragglers)
    rma = _leaf(resources, "rma", "RMA tickets", command="rma", rma_command="list")
    rma.add_argument("--pending", action="store_true")
    add_output(rma)
    power = _leaf(resources, "power", "the budget tree: budget, allocated, drawn, headroom; swing now",
                  command="power", power_command="status")  # fmt: skip
    add_output(power)
    policy = _leaf(resources, "power-policy", "the power policy in force (TOML)",
                   command="power", power_command="policy", policy_command="show")  # fmt: skip
    add_output(policy)
    automation = _leaf(resources, "automation", "whether automated repairs run, and why not",
                       command="automation", action="status", reason="")  # fmt: skip
    add_output(automation)


def _add_describe(commands: Any) -> None:
    describe = commands.add_parser("describe", help="one object in detail: node NODE, rma ID")
    kinds = describe.add_subparsers(dest="kind", required=True, metavar="KIND")
    node = _leaf(kinds, "node", "one node: GPUs, telemetry, ladder position with reasons, quarantines, events",
                 command="node")  # fmt: skip
    node.add_argument("node_id")
    add_output(node)
    rma = _leaf(kinds, "rma", "one RMA ticket with its evidence bundle", command="rma", rma_command="show")
    rma.add_argument("rma_id")
    add_output(rma)


def _add_changes(commands: Any) -> None:
    """The verbs that change something."""
    quarantine = _leaf(commands, "quarantine", "take NODE or NODE/GPU out of scheduling", command="quarantine")
    quarantine.add_argument("target", metavar="NODE[/GPU]")
    quarantine.add_argument("--reason", required=True)
    release = _leaf(commands, "release", "return NODE or NODE/GPU to service (needs a passing validation, or --force)",
                    command="release")  # fmt: skip
    release.add_argument("target", metavar="NODE[/GPU]")
    release.add_argument("--reason", default="operator release")
    release.add_argument("--force", action="store_true", help="release without validation (audited)")
    validate = _leaf(commands, "validate", "run a validation suite on NODE or NODE/GPU", command="validate")
    validate.add_argument("target", metavar="NODE[/GPU]")
    validate.add_argument("--suite", default="quick", choices=("quick", "accusation", "post-repair"))
    validate.add_argument("--seed", type=int, default=0)
    accuse = _leaf(commands, "accuse", "accuse NODE/GPU of silent data corruption: quarantine, run the accusation "
                   "suite", command="sdc", sdc_command="accuse")  # fmt: skip
    accuse.add_argument("target", metavar="NODE/GPU")
    accuse.add_argument("--reason", required=True)
    forget = _leaf(commands, "forget-owner", "NODE/GPU was moved out of NODE by hand: the next node whose Hello "
                   "lists the GPU owns it (admin)", command="gpu", gpu_command="forget-owner")  # fmt: skip
    forget.add_argument("target", metavar="NODE/GPU")
    forget.add_argument("--reason", required=True)
    approve = commands.add_parser("approve", help="approve rma ID")
    approve_kinds = approve.add_subparsers(dest="kind", required=True, metavar="KIND")
    _leaf(approve_kinds, "rma", "approve a pending RMA ticket", command="rma", rma_command="approve").add_argument(
        "rma_id"
    )
    for verb, help_text in (("pause", "pause automated repairs"), ("resume", "resume automated repairs")):
        group = commands.add_parser(verb, help=f"{help_text}: {verb} automation").add_subparsers(
            dest="kind", required=True, metavar="KIND"
        )
        leaf = _leaf(group, "automation", help_text, command="automation", action=verb, output="")
        leaf.add_argument("--reason", default="")
    _add_power_changes(commands)


def _add_power_changes(commands: Any) -> None:
    """``set budget``, ``delete budget``, ``set power-policy``."""
    set_kinds = commands.add_parser("set", help="set budget DOMAIN WATTS, set power-policy").add_subparsers(
        dest="kind", required=True, metavar="KIND"
    )
    budget_set = _leaf(set_kinds, "budget", "set DOMAIN's power budget to WATTS (persisted, enforced at once)",
                       command="power", power_command="budget", budget_command="set")  # fmt: skip
    budget_set.add_argument("domain")
    budget_set.add_argument("watts", type=watts)
    budget_set.add_argument("--reason", default="operator")
    policy = _leaf(set_kinds, "power-policy", "replace the power policy", command="power", power_command="policy",
                   policy_command="set")  # fmt: skip
    policy.add_argument("--file", help="TOML file with the whole policy ('-' reads stdin)")
    policy.add_argument("changes", nargs="*", metavar="KEY=VALUE", help="changes on top (TOML values)")
    policy.add_argument("--reason", default="operator")
    delete_kinds = commands.add_parser("delete", help="delete budget DOMAIN").add_subparsers(
        dest="kind", required=True, metavar="KIND"
    )
    clear = _leaf(delete_kinds, "budget", "remove DOMAIN's own power budget (not the cluster's)",
                  command="power", power_command="budget", budget_command="clear")  # fmt: skip
    clear.add_argument("domain")
    clear.add_argument("--reason", default="operator")


def watts(text: str) -> int:
    """WATTS: a whole, non-negative number of watts."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"WATTS must be a whole number of watts, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"WATTS must be >= 0, got {value}")
    return value


def _add_offline(commands: Any) -> None:
    """The commands that need no controller: create, classify, config, completion."""
    create = commands.add_parser("create", help="create certs (a dev PKI), create token").add_subparsers(
        dest="kind", required=True, metavar="KIND"
    )
    certs = _leaf(create, "certs", "make a throwaway CA, a loopback controller cert, node certs and one operator "
                  "cert per role (not for production)", command="certs", certs_command="init")  # fmt: skip
    certs_arguments(certs)
    token = _leaf(create, "token", "make a bearer token; print it and the line for --tokens-file",
                  command="tokens", tokens_command="new")  # fmt: skip
    token_arguments(token)
    classify = commands.add_parser("classify", help="classify kmsg: kernel-log tools that need no controller")
    _leaf(
        classify.add_subparsers(dest="kind", required=True, metavar="KIND"),
        "kmsg",
        "read kernel log text on stdin; print one JSON object per GPU/IB event found",
        command="kmsg",
        kmsg_command="classify",
    )
    config = commands.add_parser("config", help="the contexts file: get-contexts, use-context, current-context")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="CONFIG_COMMAND")
    config_commands.add_parser("get-contexts", help="the contexts in the file; * marks the current one")
    config_commands.add_parser("use-context", help="make NAME the current context").add_argument("name")
    config_commands.add_parser("current-context", help="the current context's name")
    config.set_defaults(command="config")
    completion = _leaf(commands, "completion", "print a shell completion script: "
                       "source <(rasctl completion bash)", command="completion")  # fmt: skip
    completion.add_argument("shell", choices=("bash", "zsh"))


def certs_arguments(parser: argparse.ArgumentParser) -> None:
    """``create certs`` (``certs init``)."""
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path("dev-certs"), help="output folder")
    parser.add_argument("--nodes", nargs="*", default=[], metavar="NODE", help="node ids that get a client cert")
    parser.add_argument("--controller-name", action="append", default=[], help="extra DNS name or IP of the controller")


def token_arguments(parser: argparse.ArgumentParser) -> None:
    """``create token`` (``tokens new``)."""
    parser.add_argument("--name", required=True, help="who holds it (the audit log's actor: token:NAME)")
    parser.add_argument("--role", required=True, choices=("viewer", "operator", "admin"))


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below parser, each once."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += [sub, *_subcommands(sub)]
    return found


def build_parser() -> argparse.ArgumentParser:
    """The command line of rasctl (module docstring)."""
    from rasd.common import VERSION

    parser = argparse.ArgumentParser(prog="rasctl", description="Operate a rasd-managed GPU fleet.")
    parser.add_argument("--version", action="version", version=f"rasctl {VERSION}")
    _globals(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_get(commands)
    _add_describe(commands)
    _add_changes(commands)
    _add_offline(commands)
    shown = list(commands._choices_actions)
    old_spellings.add(commands)
    commands._choices_actions[:] = shown  # the old spellings parse, and are left out of --help
    for sub in _subcommands(parser):
        _globals(sub, top=False)
    return parser
