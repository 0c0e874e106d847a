"""rasctl's command line (issue #39 item 2): verb-noun spellings and their old ones, global flags
anywhere, -o, --since, completion, and a start that imports only what the command needs."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys

import pytest

from rasd.cli import completion, listings
from rasd.cli import main as rasctl
from rasd.cli.parser import build_parser

NOW_NS = 1_800_000_000 * 10**9

SAME = [
    (["get", "nodes", "-l", "rack=r1"], ["nodes", "-l", "rack=r1"]),
    (["describe", "node", "n1"], ["node", "n1"]),
    (["get", "events", "--node", "n1", "--since", "1h"], ["events", "--node", "n1", "--since", "1h"]),
    (["get", "incidents", "--open"], ["incidents", "--open"]),
    (["get", "repairs", "-o", "wide"], ["repairs", "-o", "wide"]),
    (["get", "validations"], ["validations"]),
    (["get", "audit", "--limit", "5"], ["audit", "--limit", "5"]),
    (["get", "sdc", "--json"], ["sdc", "list", "--json"]),
    (["get", "rma", "--pending"], ["rma", "list", "--pending"]),
    (["describe", "rma", "r1"], ["rma", "show", "r1"]),
    (["approve", "rma", "r1"], ["rma", "approve", "r1"]),
    (["accuse", "n1/g1", "--reason", "x"], ["sdc", "accuse", "n1/g1", "--reason", "x"]),
    (["forget-owner", "n1/g1", "--reason", "x"], ["gpu", "forget-owner", "n1/g1", "--reason", "x"]),
    (["get", "automation", "-o", "json"], ["automation", "status", "--json"]),
    (["pause", "automation", "--reason", "x"], ["automation", "pause", "--reason", "x"]),
    (["resume", "automation"], ["automation", "resume"]),
    (["get", "power"], ["power", "status"]),
    (["get", "power-policy", "-o", "json"], ["power", "policy", "show", "--json"]),
    (["set", "power-policy", "a=1"], ["power", "policy", "set", "a=1"]),
    (["set", "budget", "rack-1", "900"], ["power", "budget", "set", "rack-1", "900"]),
    (["delete", "budget", "rack-1"], ["power", "budget", "clear", "rack-1"]),
    (["create", "certs", "--dir", "d"], ["certs", "init", "--dir", "d"]),
    (["create", "token", "--name", "a", "--role", "viewer"], ["tokens", "new", "--name", "a", "--role", "viewer"]),
    (["classify", "kmsg"], ["kmsg", "classify"]),
]
"""(verb-noun spelling, its old spelling)."""
_SPELLING_ONLY = {"resource", "kind"}
"""Fields only the verb-noun spelling sets (which of its sub-commands was taken): the dispatch never reads them."""


def _parsed(argv: list[str]) -> dict[str, object]:
    return {k: v for k, v in vars(build_parser().parse_args(argv)).items() if k not in _SPELLING_ONLY}


@pytest.mark.parametrize(("new", "old"), SAME, ids=[" ".join(n) for n, _ in SAME])
def test_old_spellings_parse_to_the_same_command(new, old):
    assert _parsed(new) == _parsed(old)


def test_old_spellings_are_not_in_help():
    shown = build_parser().format_help()
    assert "get" in shown and "describe" in shown
    for old in ("nodes", "incidents", "rma", "sdc", "automation", "power", "certs", "tokens", "kmsg"):
        assert f"\n    {old} " not in shown, old


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_flags_anywhere(where):
    flags = ["--controller", "ctl:7443", "--timeout-s", "3", "--token", "t", "--context", "c"]
    argv = [*flags, "get", "nodes"] if where == "before" else ["get", "nodes", *flags]
    args = build_parser().parse_args(argv)
    assert (args.controller, args.timeout_s, args.token, args.context) == ("ctl:7443", 3.0, "t", "c")
    assert build_parser().parse_args(["nodes", *flags]).controller == "ctl:7443"


def test_an_unset_global_flag_leaves_the_one_before_the_command():
    args = build_parser().parse_args(["--controller", "ctl:7443", "get", "events"])
    assert args.controller == "ctl:7443" and args.token is None


def test_output_forms_and_the_json_alias():
    assert build_parser().parse_args(["get", "events", "--json"]).output == "json"
    for form in ("json", "yaml", "wide", "name"):
        assert build_parser().parse_args(["get", "rma", "-o", form]).output == form
    with pytest.raises(SystemExit):
        build_parser().parse_args(["get", "rma", "-o", "xml"])


@pytest.mark.parametrize(
    ("text", "expected_ns"),
    [
        ("", 0),
        ("10m", NOW_NS - 600 * 10**9),
        ("2h", NOW_NS - 7200 * 10**9),
        ("1h30m", NOW_NS - 5400 * 10**9),
        ("1d", NOW_NS - 86400 * 10**9),
        ("2027-01-15T08:00:00Z", 1_800_000_000 * 10**9),  # NOW_NS is that moment
        ("2027-01-15T09:00:00+01:00", 1_800_000_000 * 10**9),
        ("2027-01-15T07:59:00z", NOW_NS - 60 * 10**9),
    ],
)
def test_since_takes_durations_and_rfc3339(text, expected_ns):
    assert listings.since_unix_ns(text, NOW_NS) == expected_ns


@pytest.mark.parametrize("text", ["yesterday", "10", "2027-01-15", "2027-01-15T08:00:00", "-5m", "5 m"])
def test_since_refuses_what_it_cannot_read_and_says_what_it_takes(text):
    with pytest.raises(ValueError, match=r"--since .*duration \(10m, 2h, 1h30m\) or an RFC 3339 time"):
        listings.since_unix_ns(text, NOW_NS)


def test_a_bad_since_is_a_usage_error_before_dialling():
    out, err = io.StringIO(), io.StringIO()
    assert rasctl.run(["--controller", "127.0.0.1:1", "get", "events", "--since", "soon"], out, err) == 2
    assert "--since 'soon'" in err.getvalue()


def test_yaml_is_safe_block_yaml():
    out = io.StringIO()
    listings.dump_yaml([{"node_id": "n1", "message": "a: b\n- c", "n": 3}], out)
    import yaml

    assert yaml.safe_load(out.getvalue()) == [{"node_id": "n1", "message": "a: b\n- c", "n": 3}]
    assert "!!python" not in out.getvalue()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    ("line", "expected", "absent"),
    [
        ("rasctl ", {"get", "describe", "config", "completion", "--controller"}, {"nodes", "rma"}),
        ("rasctl ge", {"get"}, {"describe"}),
        ("rasctl get ", {"nodes", "events", "incidents", "repairs", "power-policy"}, {"get"}),
        ("rasctl --controller x:1 get ev", {"events"}, set()),
        ("rasctl get events --", {"--watch", "--since", "--output", "--node", "--controller"}, set()),
        ("rasctl config ", {"use-context", "get-contexts"}, set()),
        ("rasctl completion ", {"bash", "zsh"}, set()),
    ],
)
def test_bash_completion_completes_commands_and_flags(line, expected, absent):
    words = line.split(" ")
    script = completion.script("bash", build_parser())
    program = (
        f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
        '_rasctl; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    offered = set(done.stdout.split())
    assert expected <= offered and not (absent & offered), offered


def test_completion_commands_print_their_scripts():
    for shell, first in (("bash", "_rasctl() {"), ("zsh", "autoload -U +X bashcompinit && bashcompinit")):
        out = io.StringIO()
        assert rasctl.run(["completion", shell], out, io.StringIO()) == 0
        assert out.getvalue().startswith(first) and "complete -F _rasctl rasctl" in out.getvalue()


HEAVY = ("grpc", "google.protobuf", "yaml", "structlog", "cryptography", "rasd.api.v1.admin_service_pb2")


def _imported(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_help_completion_and_config_import_no_grpc_protobuf_yaml_or_cryptography():
    """rasctl's start (bench/rasctl_startup.py times it): what --help does not need, it does not import."""
    for argv in (["completion", "bash"], ["config", "get-contexts"]):
        modules = _imported(
            "import io, os\nos.environ['RASCTL_CONFIG'] = os.devnull\nfrom rasd.cli import main\n"
            f"main.run({argv!r}, io.StringIO(), io.StringIO())"
        )
        assert not {m for m in modules if m.startswith(HEAVY)}, argv
    modules = _imported("from rasd.cli import main\ntry:\n    main.build_parser().parse_args(['--help'])\n"
                        "except SystemExit:\n    pass")  # fmt: skip
    assert not {m for m in modules if m.startswith(HEAVY)}


def test_a_listing_imports_grpc_but_not_yaml_structlog_or_cryptography():
    modules = _imported("import rasd.cli.main, rasd.cli.commands, rasd.cli.credentials")
    assert "grpc" in modules
    assert not {m for m in modules if m.startswith(("yaml", "structlog", "cryptography"))}


def _settled(tmp_path, monkeypatch, text: str, *argv: str):  # type: ignore[no-untyped-def]
    from rasd.cli import contexts

    config = tmp_path / "rasctl.toml"
    config.write_text(text)
    monkeypatch.setenv("RASCTL_CONFIG", str(config))
    for name in ("RASD_CONTROLLER", "RASD_TLS_CA", "RASD_TLS_CERT", "RASD_TLS_KEY", "RASD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    args = build_parser().parse_args([*argv, "get", "nodes"])
    contexts.settle(args)
    return args


CONTEXTS = """current-context = "a"
[contexts.a]
controller = "a:1"
tls-ca = "~/ca.crt"
token = "ta"
[contexts.b]
controller = "b:1"
"""


def test_a_flag_wins_over_the_environment_which_wins_over_the_context(tmp_path, monkeypatch):
    args = _settled(tmp_path, monkeypatch, CONTEXTS)
    assert (args.controller, args.token, args.timeout_s) == ("a:1", "ta", 10.0)
    assert args.tls_ca.endswith("/ca.crt") and not args.tls_ca.startswith("~")
    assert _settled(tmp_path, monkeypatch, CONTEXTS, "--context", "b").controller == "b:1"
    monkeypatch.setenv("RASD_CONTROLLER", "env:1")
    from rasd.cli import contexts

    args = build_parser().parse_args(["get", "nodes"])
    contexts.settle(args)
    assert args.controller == "env:1"
    args = build_parser().parse_args(["get", "nodes", "--controller", "flag:1"])
    contexts.settle(args)
    assert args.controller == "flag:1"


def test_without_a_contexts_file_the_defaults_hold(tmp_path, monkeypatch):
    monkeypatch.setenv("RASCTL_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.delenv("RASD_CONTROLLER", raising=False)
    from rasd.cli import contexts

    args = build_parser().parse_args(["get", "nodes"])
    contexts.settle(args)
    assert (args.controller, args.tls_server_name) == ("127.0.0.1:7443", "")


@pytest.mark.parametrize(
    ("text", "argv", "message"),
    [
        ("[contexts.a]\ncontroler = 'x'\n", (), r"contexts\.a\.controler: unknown key; known: controller"),
        ("[contexts.a]\ncontroller = 7443\n", (), r"contexts\.a\.controller: a string, got 7443"),
        ("[contexts\n", (), r"not TOML"),
        ("[contexts.a]\ncontroller = 'x:1'\n", ("--context", "c"), r"context 'c' is not in .*\(contexts: a\)"),
    ],
)
def test_a_bad_contexts_file_is_named_key_by_key(tmp_path, monkeypatch, text, argv, message):
    with pytest.raises(ValueError, match=message):
        _settled(tmp_path, monkeypatch, text, *argv)


def test_a_watch_prints_each_change_in_the_form_asked_and_says_when_it_resynced():
    from rasd.api.v1 import admin_service_pb2 as admin_pb
    from rasd.api.v1 import health_pb2 as health_pb
    from rasd.cli import kinds

    def event(seq: int) -> admin_pb.StoredEvent:
        return admin_pb.StoredEvent(node_id="n1", event=health_pb.HealthEvent(seq=seq, message="m"), received_unix_ns=1)

    answers = [admin_pb.WatchEventsResponse(events=[event(1), event(2)]),
               admin_pb.WatchEventsResponse(events=[event(3)], resync=True)]  # fmt: skip
    printed: dict[str, str] = {}
    for form in ("", "wide", "json", "yaml", "name"):
        out, err = io.StringIO(), io.StringIO()
        listings.follow(kinds.LISTINGS["events"], answers, lambda a: a.events, form, out, err)
        printed[form] = out.getvalue()
        assert err.getvalue().count("fell behind") == 1
    assert printed["name"] == "event/n1/1\nevent/n1/2\nevent/n1/3\n"
    # proto3 JSON writes 64-bit integers as strings, as rasctl get events -o json always has
    assert [json.loads(line)["event"]["seq"] for line in printed["json"].splitlines()] == ["1", "2", "3"]
    import yaml

    assert [doc["event"]["seq"] for doc in yaml.safe_load_all(printed["yaml"])] == ["1", "2", "3"]
    assert "RECEIVED" not in printed[""] and len(printed[""].splitlines()) == 3, "rows, no header again"
    assert len(printed["wide"].splitlines()[0]) > len(printed[""].splitlines()[0])
