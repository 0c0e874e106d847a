"""The controller's settings: controller.toml, $RASD_* and flags, their precedence, and errors naming key and source."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from rasd.controller import config as config_mod
from rasd.controller import main, stragglers, wiring
from rasd.controller.observability import metrics
from rasd.controller.store import repo


def test_shipped_example_loads(repo_root):
    config = main.load_config(repo_root / "controller/packaging/controller.toml")
    assert config["remediation_policy"].disruption.max_disrupted_nodes == 8
    assert config["quarantine"]["adapter"] == "record"
    assert "bmc" not in config


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[remediaton]\n", "remediaton"),
        ("[remediation.escalation]\nmax_attempts_reset_gpu = -1\n", "remediation.escalation.max_attempts_reset_gpu"),
        ("[quarantine]\nadapter = 'carrier-pigeon'\n", "adapter"),
    ],
)
def test_bad_config_is_named(tmp_path, text, complaint):
    path = tmp_path / "controller.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=complaint.replace(".", r"\.")):
        main.load_config(path)


@pytest.mark.parametrize(
    ("argv", "bound"),
    [
        (["--insecure"], "127.0.0.1"),  # was 0.0.0.0 (issue #37 item 18)
        (["--insecure", "--metrics-addr", "0.0.0.0"], "0.0.0.0"),
        (["--tls-ca", "ca.pem"], "0.0.0.0"),  # mutual TLS, in the cluster: its scraper reaches the pod
        (["--metrics-addr", "10.0.0.7"], "10.0.0.7"),
    ],
)
def test_a_plaintext_controller_binds_its_metrics_to_loopback_unless_told(argv, bound):
    args = main.build_parser().parse_args(argv)
    config, _tables = config_mod.load(environ={}, flags=config_mod.flags_of(args))
    assert main.metrics_bind_address(config, args.insecure) == bound


def _settings(argv, environ, monkeypatch):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    parser = main.build_parser()
    return main.settings_from_args(parser, parser.parse_args(["--insecure", *argv]))


def test_each_source_gives_the_same_settings(tmp_path, monkeypatch):
    path = tmp_path / "controller.toml"
    path.write_text('db = "sqlite:///x.db"\nno_remediation = true\n[leader]\nlease_s = 20\n')
    from_file = _settings(["--config", str(path)], {}, monkeypatch)
    from_env = _settings([], {"RASD_DB": "sqlite:///x.db", "RASD_NO_REMEDIATION": "true",
                              "RASD_LEADER__LEASE_S": "20"}, monkeypatch)  # fmt: skip
    monkeypatch.delenv("RASD_DB")
    monkeypatch.delenv("RASD_NO_REMEDIATION")
    monkeypatch.delenv("RASD_LEADER__LEASE_S")
    from_flags = _settings(["--db", "sqlite:///x.db", "--no-remediation"], {}, monkeypatch)
    for settings in (from_file, from_env, from_flags):
        assert (settings.db_url, settings.remediation) == ("sqlite:///x.db", False)
    assert from_file.leader.lease_s == from_env.leader.lease_s == 20.0


def test_the_straggler_tables_reach_the_watch_a_left_out_key_keeping_the_watchs_default(tmp_path, monkeypatch):
    """[stragglers] (issue #40): the rungs an operator turns off, and detection, reach the live watch."""
    path = tmp_path / "controller.toml"
    path.write_text(
        "[stragglers.actions]\nquarantine = false\nsteps_per_rung = 3\n[stragglers.detection]\nthreshold = 20.0\n"
    )
    settings = _settings(["--config", str(path)], {"RASD_STRAGGLERS__ACTIONS__RAISE_CAP": "false"}, monkeypatch)
    configured = settings.ingest.stragglers
    assert (configured.actions.quarantine, configured.actions.raise_cap, configured.actions.steps_per_rung) == (
        False, False, 3,
    )  # fmt: skip
    assert configured.detection.threshold == 20.0
    # min_spread_s is the live watch's 30 ms floor, not the offline default, though [detection] was set
    assert configured.detection.min_spread_s == stragglers.LIVE_POLICY.min_spread_s
    store = repo.Store.open(f"sqlite:///{tmp_path / 'rasd.db'}")
    try:
        wired = wiring.single_replica(store, metrics.ControllerMetrics(CollectorRegistry()), settings=settings.ingest)
        watch = wired.ingest.stragglers
        assert (watch.policy, watch.grouping, watch.action_policy) == (
            configured.detection, configured.steps, configured.actions,
        )  # fmt: skip
    finally:
        store.close()


def test_flags_beat_the_environment_which_beats_the_file(tmp_path, monkeypatch):
    path = tmp_path / "controller.toml"
    path.write_text('db = "sqlite:///file.db"\nlog_level = "debug"\n[leader]\nlease_s = 20\nrenew_s = 2\n')
    environ = {"RASD_DB": "sqlite:///env.db", "RASD_LEADER__LEASE_S": "30", "RASD_BMC_PASSWORD": "not a setting"}
    settings = _settings(["--config", str(path), "--db", "sqlite:///flag.db"], environ, monkeypatch)
    assert settings.db_url == "sqlite:///flag.db"  # flag over env over file
    assert settings.leader.lease_s == 30.0  # env over file
    assert settings.leader.renew_s == 2.0  # the file's, where nothing else sets it
    config, _tables = config_mod.load(file=path, environ=environ)
    assert (config.db, config.log_level) == ("sqlite:///env.db", "debug")
    assert config.listen == "127.0.0.1:7443"  # the default, where no source sets it


@pytest.mark.parametrize(
    ("text", "environ", "flags", "line"),
    [
        (  # an unknown key, with the keys the table knows
            "[leader]\nlease = 3\n", {}, {},
            "leader.lease ({path}): unknown setting (known: election, lease_s, relay_poll_s, renew_s, replica_id)",
        ),
        (  # a wrong type from the environment, named by its variable
            "", {"RASD_LEADER__LEASE_S": "fast"}, {},
            "leader.lease_s (env RASD_LEADER__LEASE_S): expected a number, got \"fast\"",
        ),
        (  # a bad enum value: the allowed ones listed
            "", {"RASD_QUARANTINE__ADAPTER": "pigeon"}, {},
            "quarantine.adapter (env RASD_QUARANTINE__ADAPTER): "
            "expected 'record', 'kubernetes' or 'slurm', got \"pigeon\"",
        ),
        (  # a flag out of range
            "", {}, {"metrics_port": 70000},
            "metrics_port (--metrics-port): expected an integer in -1..65535, got 70000",
        ),
        (  # a type from the file, deep in a table
            "[remediation.escalation]\nmax_attempts_reset_gpu = '2'\n", {}, {},
            "remediation.escalation.max_attempts_reset_gpu ({path}): expected an integer, got \"2\"",
        ),
        (  # a rule between two keys, checked after the types, still naming the source
            "", {"RASD_LEADER__RENEW_S": "10"}, {},
            "leader.renew_s (env RASD_LEADER__RENEW_S): must be at most lease_s / 2, got 10.0",
        ),
        (  # a BMC that is no http(s) URL: the pattern the chart's schema has too
            '[bmc.nodes.gpu-001]\nurl = "ftp://10.0.0.11"\npassword_env = "BMC_PASSWORD"\n', {}, {},
            'bmc.nodes.gpu-001.url ({path}): expected a string matching ^https?://, got "ftp://10.0.0.11"',
        ),
        (  # a straggler rung count that cannot mean anything, deep in [stragglers]
            "", {"RASD_STRAGGLERS__ACTIONS__STEPS_PER_RUNG": "0"}, {},
            "stragglers.actions.steps_per_rung (env RASD_STRAGGLERS__ACTIONS__STEPS_PER_RUNG): must be >= 1, got 0",
        ),
        (  # a bad Xid override: the actions listed
            '[remediation.classification.xid_action_overrides]\n13 = "explode"\n', {}, {},
            "remediation.classification.xid_action_overrides.13 ({path}): expected 'none', 'restart_process', "
            "'reset_gpu', 'reboot_node', 'rma', 'contact_support' or 'investigate', got \"explode\"",
        ),
    ],
)  # fmt: skip
def test_a_bad_setting_is_refused_naming_key_source_and_allowed_values(tmp_path, text, environ, flags, line):
    path = tmp_path / "controller.toml"
    path.write_text(text)
    with pytest.raises(config_mod.ConfigError) as raised:
        config_mod.load(file=path, environ=environ, flags=flags)
    assert str(raised.value).splitlines() == [line.format(path=path)]


def test_every_problem_is_reported_at_once_and_nothing_is_used(tmp_path, monkeypatch, capsys):
    path = tmp_path / "controller.toml"
    path.write_text("[leader]\nelection = 'raft'\n[power]\ndraw_window_s = 0\n")
    monkeypatch.setenv("RASD_METRICS_PORT", "many")
    with pytest.raises(SystemExit):
        main.settings_from_argv(["--insecure", "--config", str(path)])
    err = capsys.readouterr().err
    assert 'metrics_port (env RASD_METRICS_PORT): expected an integer, got "many"' in err
    assert f"leader.election ({path}): expected 'auto', 'lease' or 'static', got \"raft\"" in err
    assert f"power.draw_window_s ({path}): expected a number > 0, got 0" in err


def test_an_odd_key_is_quoted_and_cut_in_the_message(tmp_path):
    """A key is echoed as typed unless it holds control characters or runs long (a log line, a terminal)."""
    path = tmp_path / "controller.toml"
    path.write_text('[leader]\n"\\u001b[2J' + "k" * 200 + '" = 1\n')
    with pytest.raises(config_mod.ConfigError) as raised:
        config_mod.load(file=path, environ={})
    (line,) = str(raised.value).splitlines()
    assert line.startswith('leader."\\u001b[2Jkkk') and "\x1b" not in line and len(line) < 300
    assert "unknown setting (known: election, lease_s" in line
