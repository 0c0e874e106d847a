"""The Redfish power cycle against a real Redfish server: sushy-tools' ``sushy-emulator`` with its fake
driver, started here on 127.0.0.1 with HTTP basic auth.

The fake driver applies a power change 1-11 s (random) after the request, like slow hardware. The
emulator is launched with that delay pinned to 2 s (the launcher replaces the driver module's
``random``), so a cycle is observed in at most ~2 s and a timeout test can be sure the node is still
off. Nothing else about the emulator is changed.
"""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import bcrypt
import pytest

from rasd.controller.core.remediation import actions
from rasd.controller.executors import bmc

PASSWORD = "s3cret-bmc-pw"
SYSTEMS = {
    "gpu-node-1": ("6a1f8a2e-0000-4000-8000-000000000001", "On"),
    "gpu-node-2": ("6a1f8a2e-0000-4000-8000-000000000002", "Off"),
    "gpu-node-3": ("6a1f8a2e-0000-4000-8000-000000000003", "On"),
    "gpu-node-4": ("6a1f8a2e-0000-4000-8000-000000000004", "On"),
}
_LAUNCH = (
    "import sys\n"
    "from sushy_tools.emulator.resources.systems import fakedriver\n"
    "class _Pinned:\n"
    "    @staticmethod\n"
    "    def randint(a, b):\n"
    "        return 2\n"
    "fakedriver.random = _Pinned\n"
    "from sushy_tools.emulator import main\n"
    "sys.exit(main.main())\n"
)


class Emulator:
    def __init__(self, root, port):
        self.root = root
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = root / "emulator.log"
        htpasswd = root / "htpasswd"
        htpasswd.write_text(f"admin:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
        systems = [
            {"uuid": uuid, "name": name, "power_state": state, "external_notifier": False, "nics": []}
            for name, (uuid, state) in SYSTEMS.items()
        ]
        config = root / "emulator.conf"
        config.write_text(
            f"SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n"
            f"SUSHY_EMULATOR_LISTEN_PORT = {port}\n"
            f"SUSHY_EMULATOR_FAKE_DRIVER = True\n"
            f"SUSHY_EMULATOR_STATE_DIR = {str(root / 'state')!r}\n"
            f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n"
            f"SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}\n"
        )
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, "--config", str(config)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s=30.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sushy-emulator exited: {self.log_path.read_text()}")
            try:
                urllib.request.urlopen(f"{self.url}/redfish/v1/", timeout=1).close()
                return
            except urllib.error.HTTPError:
                return  # 401: up, and asking for credentials
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sushy-emulator did not start: {self.log_path.read_text()}")

    def resets(self, uuid):
        return self.log_path.read_text().count(f"POST /redfish/v1/Systems/{uuid}/Actions/ComputerSystem.Reset")

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    emu = Emulator(tmp_path_factory.mktemp("redfish"), _free_port())
    try:
        emu.wait_ready()
        yield emu
    finally:
        emu.stop()


def _settings(url, **overrides):
    nodes = {
        name: {"url": url, "username": "admin", "password_env": "BMC_PW", "system": name}
        for name in ("gpu-node-1", "gpu-node-2", "gpu-node-3")
    }
    nodes["gpu-node-4"] = {
        "url": url,
        "username": "admin",
        "password_env": "BMC_PW",
        "system": SYSTEMS["gpu-node-4"][0],
    }
    nodes["stray"] = {"url": url, "username": "admin", "password_env": "BMC_PW", "system": "nope"}
    nodes["wrong-pw"] = {"url": url, "username": "admin", "password_env": "BAD_PW"}
    data = {"nodes": nodes, "poll_interval_s": 0.1, "timeout_s": 15.0, "transition_window_s": 10.0}
    data.update(overrides)
    return bmc.BmcSettings.from_mapping(data)


ENV = {"BMC_PW": PASSWORD, "BAD_PW": "not-the-password"}


def test_power_cycle_sees_power_leave_and_return(emulator):
    journal: dict[str, str] = {}
    cycler = bmc.RedfishPowerCycler(_settings(emulator.url), journal, environ=ENV)

    outcome = cycler.power_cycle("gpu-node-1", reason="agent gone after Xid 79", ticket_id="t-1")

    assert outcome.status is bmc.BmcStatus.POWER_CYCLED
    assert outcome.reset_type == "ForceRestart", "the emulator does not list PowerCycle"
    assert outcome.observed[0] == "On" and "Off" in outcome.observed and outcome.observed[-1] == "On"
    assert outcome.system.endswith(SYSTEMS["gpu-node-1"][0])
    assert json.loads(journal["t-1"])["state"] == "power_cycled"
    assert emulator.resets(SYSTEMS["gpu-node-1"][0]) == 1


def test_the_same_ticket_is_never_cycled_twice(emulator):
    journal = {"t-2": json.dumps({"node": "gpu-node-4", "state": "power_cycled"})}
    cycler = bmc.RedfishPowerCycler(_settings(emulator.url), journal, environ=ENV)

    outcome = cycler.power_cycle("gpu-node-4", reason="r", ticket_id="t-2")

    assert outcome.status is bmc.BmcStatus.ALREADY_REQUESTED and "not repeated" in str(outcome)
    assert emulator.resets(SYSTEMS["gpu-node-4"][0]) == 0


def test_system_named_by_uuid_and_a_second_ticket_cycles_again(emulator):
    journal: dict[str, str] = {}
    cycler = bmc.RedfishPowerCycler(_settings(emulator.url), journal, environ=ENV)

    first = cycler.power_cycle("gpu-node-4", reason="r", ticket_id="t-4a")
    repeat = cycler.power_cycle("gpu-node-4", reason="r", ticket_id="t-4a")

    assert first.status is bmc.BmcStatus.POWER_CYCLED
    assert repeat.status is bmc.BmcStatus.ALREADY_REQUESTED
    assert emulator.resets(SYSTEMS["gpu-node-4"][0]) == 1


def test_a_powered_off_node_is_powered_on(emulator):
    cycler = bmc.RedfishPowerCycler(_settings(emulator.url), {}, environ=ENV)

    outcome = cycler.power_cycle("gpu-node-2", reason="r", ticket_id="t-3")

    assert outcome.status is bmc.BmcStatus.POWERED_ON
    assert outcome.reset_type == "On" and outcome.observed == ("Off", "On")


def test_unknown_system_is_a_clear_error(emulator):
    journal: dict[str, str] = {}
    cycler = bmc.RedfishPowerCycler(_settings(emulator.url), journal, environ=ENV)

    with pytest.raises(bmc.BmcSystemNotFoundError, match=r"no system 'nope' \(it has: /redfish/v1/Systems/"):
        cycler.power_cycle("stray", reason="r", ticket_id="t-5")
    assert journal == {}, "nothing was requested"


def test_wrong_password_is_rejected_without_naming_it(emulator):
    cycler = bmc.RedfishPowerCycler(_settings(emulator.url), {}, environ=ENV)

    with pytest.raises(bmc.BmcRejectedError, match="access denied") as caught:
        cycler.power_cycle("wrong-pw", reason="r", ticket_id="t-6")
    assert "not-the-password" not in str(caught.value)


def test_node_that_does_not_come_back_times_out_with_what_was_seen(emulator):
    """A fake clock jumps ahead on every sleep: the 5 s timeout passes while the emulated node is
    still off (its power comes back no sooner than 1 s of real time later)."""
    now = [0.0]
    journal: dict[str, str] = {}
    cycler = bmc.RedfishPowerCycler(
        _settings(emulator.url, poll_interval_s=1.0, timeout_s=5.0, transition_window_s=2.0),
        journal,
        environ=ENV,
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )

    with pytest.raises(bmc.BmcTimeoutError, match=r"not On within 5 s after ForceRestart \(observed On -> Off\)"):
        cycler.power_cycle("gpu-node-3", reason="r", ticket_id="t-7")
    assert json.loads(journal["t-7"])["state"] == "timed_out"


def test_unreachable_bmc_is_retryable():
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    journal: dict[str, str] = {}
    cycler = bmc.RedfishPowerCycler(_settings(url, request_timeout_s=2.0, retry_delay_s=0.01), journal, environ=ENV)

    with pytest.raises(bmc.BmcUnavailableError, match="gpu-node-1"):
        cycler.power_cycle("gpu-node-1", reason="r", ticket_id="t-8")
    assert journal == {}


def test_missing_password_and_unknown_node_are_configuration_errors(tmp_path):
    cycler = bmc.RedfishPowerCycler(_settings("http://127.0.0.1:9"), {}, environ={})

    with pytest.raises(bmc.BmcNotConfiguredError, match="environment variable BMC_PW is not set"):
        cycler.power_cycle("gpu-node-1", reason="r", ticket_id="t")
    with pytest.raises(bmc.BmcNotConfiguredError, match="no BMC configured for node n9"):
        cycler.power_cycle("n9", reason="r", ticket_id="t")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"node": {}}, "bmc.node: unknown setting"),
        ({"nodes": {"n1": {"username": "a", "password_env": "X"}}}, "bmc.nodes.n1.url: required"),
        ({"nodes": {"n1": {"url": "10.0.0.1", "password_env": "X"}}}, "bmc.nodes.n1.url: expected a string matching"),
        ({"nodes": {"n1": {"url": "https://b", "password": "hunter2"}}}, "bmc.nodes.n1.password: unknown setting"),
        ({"nodes": {"n1": {"url": "https://b"}}}, "bmc.nodes.n1.password_env: set exactly one"),
        ({"timeout_s": 0}, "bmc.timeout_s: must be > 0"),
        ({"auth": "digest"}, "bmc.auth: expected 'basic' or 'session', got \"digest\""),
        (
            {"nodes": {"n1": {"url": "https://b", "password_env": "X", "verify_tls": "no"}}},
            'verify_tls: expected true or false, got "no"',
        ),
    ],
)
def test_settings_name_the_bad_key(data, message):
    with pytest.raises(bmc.BmcSettingsError, match=message):
        bmc.BmcSettings.from_mapping(data)


def test_executor_carries_out_the_cores_action():
    journal = {"t": "{}"}
    run = bmc.executors(bmc.open_power_cycler({}, journal))["power_cycle_bmc"]

    outcome = run(actions.PowerCycleBmc(ticket_id="t", step=3, node_id="n1", reason="agent gone"))

    assert outcome.status is bmc.BmcStatus.ALREADY_REQUESTED
    assert isinstance(bmc.open_power_cycler({}, {}), bmc.BmcPowerCycler)


# ---- what the emulator cannot show: a stub BMC ----------------------------------------------

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "fakes"))
import redfish_stub  # noqa: E402


@pytest.fixture
def stub_bmc():
    stubs = []

    def make(**kwargs):
        stub = redfish_stub.StubRedfish(**kwargs)
        stub.start()
        stubs.append(stub)
        return stub

    yield make
    for stub in stubs:
        stub.stop()


def _stub_cycler(url, journal, now):
    settings = bmc.BmcSettings.from_mapping(
        {
            "nodes": {"n1": {"url": url, "username": "admin", "password_env": "BMC_PW"}},
            "poll_interval_s": 1.0,
            "transition_window_s": 3.0,
            "timeout_s": 60.0,
            "retry_delay_s": 0.01,
        }
    )
    return bmc.RedfishPowerCycler(
        settings, journal, environ=ENV, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
    )


def test_power_cycle_is_preferred_and_a_reset_that_stays_on_is_reported_unobserved(stub_bmc):
    stub = stub_bmc(allowed=["On", "ForceOff", "ForceRestart", "PowerCycle"])
    journal: dict[str, str] = {}

    outcome = _stub_cycler(stub.url, journal, [0.0]).power_cycle("n1", reason="r", ticket_id="t")

    assert stub.resets == ["PowerCycle"]
    assert outcome.status is bmc.BmcStatus.RESET_UNOBSERVED and outcome.observed == ("On",)
    assert "new boot id" in outcome.detail
    assert json.loads(journal["t"])["state"] == "reset_unobserved"


def test_a_bmc_that_refuses_the_reset_leaves_no_journal_entry(stub_bmc):
    stub = stub_bmc(allowed=["ForceRestart"], reset_status=400)
    journal: dict[str, str] = {}

    with pytest.raises(bmc.BmcRejectedError, match="reset ForceRestart"):
        _stub_cycler(stub.url, journal, [0.0]).power_cycle("n1", reason="r", ticket_id="t")
    assert journal == {}, "refused outright: nothing happened, so a retry may run"


def test_a_bmc_that_fails_mid_reset_keeps_the_journal_entry(stub_bmc):
    stub = stub_bmc(allowed=["ForceRestart"], reset_status=500)
    journal: dict[str, str] = {}
    cycler = _stub_cycler(stub.url, journal, [0.0])

    with pytest.raises(bmc.BmcUnavailableError):
        cycler.power_cycle("n1", reason="r", ticket_id="t")
    assert json.loads(journal["t"])["state"] == "reset_failed", "ambiguous: never risk a second cycle"


def test_no_usable_reset_type_is_rejected(stub_bmc):
    stub = stub_bmc(allowed=["Nmi", "GracefulShutdown"])

    with pytest.raises(bmc.BmcRejectedError, match="allows no usable reset"):
        _stub_cycler(stub.url, {}, [0.0]).power_cycle("n1", reason="r", ticket_id="t")
