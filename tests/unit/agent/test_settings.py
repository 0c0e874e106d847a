"""The agent's typed settings: agent.toml and flags into AgentSettings, and every bad value named.

An operator's typo must fail at start with the key's path, what it accepts and what it got, never
pass silently or surface later as a KeyError deep in the runtime.
"""

from __future__ import annotations

import pathlib
import tomllib

import pytest

from rasd.agent import main as agent_main
from rasd.agent import settings as agent_settings

HOST = agent_settings.HostDefaults(hostname="gpu-node-7", ib_sysfs_present=False)


def _load(table=None, argv=(), host=HOST):
    flags = vars(agent_main.build_parser().parse_args(list(argv)))
    return agent_settings.load(table or {}, flags, host)


def test_no_file_and_no_flags_give_the_documented_defaults():
    settings = _load()
    assert settings.node_id == "gpu-node-7"
    assert settings.link.controller_address == "127.0.0.1:7443"
    assert settings.gpu == agent_settings.GpuSettings(backend="nvml")
    assert settings.kernel_log.source == "kmsg"  # with nvml
    assert settings.spool.state_dir == pathlib.Path("/var/lib/rasd-agent")
    assert settings.metrics == agent_settings.MetricsSettings(port=8455, nvlink_per_link=False)
    assert _load({"metrics_nvlink_per_link": True}).metrics.nvlink_per_link is True
    assert settings.failsafe == agent_settings.FailsafeSettings(power_limit_w=None, after_s=300.0)
    assert settings.actions.destructive_enabled is False
    assert settings.commands == agent_settings.CommandSettings()
    assert settings.ib.sysfs_root == ""
    assert _load(host=agent_settings.HostDefaults("h", ib_sysfs_present=True)).ib.sysfs_root == "/sys/class/infiniband"


def test_the_shipped_agent_toml_loads_into_every_group(repo_root):
    table = tomllib.loads((repo_root / "agent/packaging/agent.toml").read_text())
    settings = _load(table)
    # `rasd-agent install` writes this file on every node: the node id is the host's, labels are per node.
    assert settings.node_id == "gpu-node-7" and "node_id" not in table
    assert settings.labels == {} and table["labels"] == {}
    assert settings.gpu.backend == "nvml" and settings.kernel_log.source == "kmsg"
    assert settings.kernel_log.kmsg_path == "/dev/kmsg"
    assert settings.ib.sysfs_root == "/sys/class/infiniband"
    assert settings.failsafe == agent_settings.FailsafeSettings(power_limit_w=500, after_s=300.0)
    assert settings.commands.reset_gpu == ("nvidia-smi", "--gpu-reset", "-i", "{gpu_uuid}")
    assert settings.commands.trough_filler == ()


def test_flags_win_over_the_file():
    table = {"gpus": 4, "backend": "nvml", "labels": {"rack": "r1", "row": "w1"}, "metrics_port": 8455}
    settings = _load(
        table,
        ["--gpus", "2", "--backend", "simulated", "--label", "rack=r9", "--metrics-port", "0",
         "--enable-destructive-actions", "--state-dir", "/tmp/agent"],
    )  # fmt: skip
    assert settings.gpu.gpus == 2 and settings.gpu.backend == "simulated"
    assert settings.kernel_log.source == "none"  # the default follows the backend
    assert settings.labels == {"rack": "r9", "row": "w1"}
    assert settings.metrics.port == 0  # a flag of 0 is a value, not "not given"
    assert settings.actions.destructive_enabled is True
    assert settings.spool.state_dir == pathlib.Path("/tmp/agent")


def test_the_sampling_table_sets_the_rates():
    settings = _load({"sampling": {"power_sample_interval_ms": 50, "counter_interval_ms": 500, "buffer_s": 30}})
    assert settings.sampling == agent_settings.SamplingSettings(
        power_sample_interval_ms=50, counter_interval_ms=500, event_poll_interval_ms=200, buffer_s=30.0
    )


@pytest.mark.parametrize(
    ("table", "argv", "message"),
    [
        # AgentSettings itself
        ({"node_id": ""}, (), 'node_id (agent.toml): expected a string of at least 1 character, got ""'),
        ({"labels": {"rack": 12}}, (), "labels.rack (agent.toml): expected a string, got 12"),
        ({}, ("--label", "oops"), '--label: expected KEY=VALUE, got "oops"'),
        ({"log_level": "loud"}, (), 'log_level (agent.toml): expected one of debug, info, warning, error, got "loud"'),
        # link
        ({"controller": "rasd"}, (), 'controller (agent.toml): expected host:port, got "rasd"'),
        # tls
        ({"tls": {"ca": 7}}, (), "tls.ca (agent.toml): expected a string, got 7"),
        ({"insecure": "yes"}, (), 'insecure (agent.toml): expected true or false, got "yes"'),
        ({"tls": "on"}, (), 'tls (agent.toml): expected a table, got "on"'),
        # gpu
        ({"backend": "cuda"}, (), "backend (agent.toml): expected 'simulated' or 'nvml', got \"cuda\""),
        ({}, ("--gpus", "99"), "gpus (--gpus): expected an integer in 1..64, got 99"),
        ({"sim_step_period_s": -1}, (), "sim_step_period_s (agent.toml): expected a number >= 0, got -1"),
        # sampling
        (
            {"sampling": {"power_sample_interval_ms": "fast"}},
            (),
            'sampling.power_sample_interval_ms (agent.toml): expected an integer, got "fast"',
        ),
        ({"sampling": {"buffer_s": 0}}, (), "sampling.buffer_s (agent.toml): expected a number > 0, got 0"),
        ({"sampling": {"power_hz": 10}}, (), "sampling.power_hz (agent.toml): unknown setting (known: buffer_s, "),
        # spool
        ({"state_dir": 5}, (), "state_dir (agent.toml): expected a string, got 5"),
        # kernel log
        ({"kernel_log": "dmesg"}, (), "kernel_log (agent.toml): expected 'kmsg', 'journal' or 'none', got \"dmesg\""),
        ({"kmsg_path": ""}, (), 'kmsg_path (agent.toml): expected a string of at least 1 character, got ""'),
        # ib
        ({"ib_sysfs_root": False}, (), "ib_sysfs_root (agent.toml): expected a string, got false"),
        # power fail-safe
        (
            {"failsafe_power_limit_w": 20},
            (),
            "failsafe_power_limit_w (agent.toml): expected an integer in 50..5000, got 20",
        ),
        ({}, ("--failsafe-after-s", "-5"), "failsafe_after_s (--failsafe-after-s): expected a number >= 0, got -5.0"),
        # metrics
        ({"metrics_port": 70000}, (), "metrics_port (agent.toml): expected an integer in -1..65535, got 70000"),
        ({"metrics_port": True}, (), "metrics_port (agent.toml): expected an integer, got true"),
        # actions and their commands
        ({"destructive_actions": 1}, (), "destructive_actions (agent.toml): expected true or false, got 1"),
        (
            {"metrics_nvlink_per_link": "yes"},
            (),
            'metrics_nvlink_per_link (agent.toml): expected true or false, got "yes"',
        ),
        (
            {"commands": {"reboot": []}},
            (),
            "commands.reboot (agent.toml): expected a list of at least 1 item, got []",
        ),
        (
            {"commands": {"timeout_s": 5}},
            (),
            "commands.timeout_s (agent.toml): unknown setting (known: list_compute_apps, ",
        ),
        # the file's top level
        ({"contoller": "x:1"}, (), "contoller (agent.toml): unknown setting (known: backend, commands, controller, "),
    ],
)
def test_a_bad_value_is_named_by_its_key_path(table, argv, message):
    with pytest.raises(agent_settings.SettingsError) as raised:
        _load(table, argv)
    assert str(raised.value).startswith(message)


def test_the_message_names_the_config_file_it_came_from():
    with pytest.raises(agent_settings.SettingsError, match=r"^gpus \(site\.toml\): expected an integer in 1\.\.64"):
        agent_settings.load({"gpus": 0}, {}, HOST, file_name="site.toml")


def test_a_bad_config_file_stops_the_daemon_with_the_message(tmp_path, capsys):
    config = tmp_path / "agent.toml"
    config.write_text('backend = "simulated"\ninsecure = true\n[sampling]\npower_sample_interval_ms = "fast"\n')
    with pytest.raises(SystemExit) as raised:
        agent_main.main(["--config", str(config)])
    assert raised.value.code == 2
    assert 'sampling.power_sample_interval_ms (agent.toml): expected an integer, got "fast"' in capsys.readouterr().err


def test_a_file_that_is_not_toml_is_named(tmp_path, capsys):
    config = tmp_path / "agent.toml"
    config.write_text("backend = simulated\n")  # unquoted string
    with pytest.raises(SystemExit):
        agent_main.main(["--config", str(config)])
    assert f"{config}: not valid TOML" in capsys.readouterr().err


def test_every_flag_of_the_parser_maps_to_a_key_path():
    parser = agent_main.build_parser()
    flags = {
        action.dest: action.option_strings[0]
        for action in parser._actions
        if action.option_strings and action.dest not in ("help", "version", "config", "label")
    }
    assert flags == {dest: flag for dest, (_, flag) in agent_settings.FLAGS.items()}


def test_a_plaintext_agent_binds_its_metrics_to_loopback_unless_told():
    """Issue #37 item 18: with --insecure (a loopback controller) the exporter still bound every interface."""
    assert _load().metrics.addr == "0.0.0.0"  # mutual TLS: the cluster's scraper reaches the node
    assert _load(argv=["--insecure"]).metrics.addr == "127.0.0.1"
    assert _load({"insecure": True}).metrics.addr == "127.0.0.1"
    assert _load(argv=["--insecure", "--metrics-addr", "0.0.0.0"]).metrics.addr == "0.0.0.0"
    assert _load({"insecure": True, "metrics_addr": "10.0.0.7"}).metrics.addr == "10.0.0.7"
    with pytest.raises(agent_settings.SettingsError, match="metrics_addr"):
        _load({"metrics_addr": ""})


def test_rasd_variables_sit_between_the_file_and_the_flags():
    environ = {"RASD_GPUS": "4", "RASD_SAMPLING__BUFFER_S": "30", "RASD_AGENT_ARGS": "--gpus 9"}  # ARGS: not a key
    flags = vars(agent_main.build_parser().parse_args(["--gpus", "2"]))
    settings = agent_settings.load({"gpus": 6, "seed": 1}, flags, HOST, environ=environ)
    assert (settings.gpu.gpus, settings.sampling.buffer_s, settings.gpu.seed) == (2, 30.0, 1)  # flag, env, file
    assert agent_settings.load({"gpus": 6}, {}, HOST, environ=environ).gpu.gpus == 4  # env over file
    with pytest.raises(agent_settings.SettingsError) as raised:
        agent_settings.load({"gpus": 0}, {}, HOST, environ={"RASD_SAMPLING__BUFFER_S": "long"})
    assert str(raised.value).splitlines() == [  # every problem at once, each with its source
        "gpus (agent.toml): expected an integer in 1..64, got 0",
        'sampling.buffer_s (env RASD_SAMPLING__BUFFER_S): expected a number, got "long"',
    ]
