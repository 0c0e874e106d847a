"""`rasd-agent check`: each check says ok, warn or fail with what to fix, against real files, a real
dev CA and a real controller over mutual TLS; the exit code is 1 when any check failed.

The GPU check runs against the NVML double in tests/unit/agent/gpu/test_doctor_gpus.py.
"""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import threading

import pytest

from rasd.agent import doctor
from rasd.agent import settings as agent_settings
from rasd.common import devcerts, tls
from rasd.controller import server
from rasd.controller.rpc import authn

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)


@pytest.fixture
def pki(tmp_path):
    return devcerts.init(tmp_path / "certs", ["node-a"], now=NOW)


def _settings(pki, node_id="node-a", pair=None, **fields):
    pair = pair or pki.nodes[node_id]
    files = tls.TlsFiles(pki.ca.cert, pair.cert, pair.key)
    return agent_settings.AgentSettings(node_id=node_id, tls=agent_settings.TlsSettings(files=files), **fields)


def test_a_valid_node_certificate_is_ok(pki):
    finding = doctor.check_certificate(_settings(pki), NOW + datetime.timedelta(days=1))
    assert finding == doctor.Finding(
        "certificate", "ok", f"{pki.nodes['node-a'].cert}: node node-a, valid 29 more days"
    )


@pytest.mark.parametrize(
    ("days_later", "status", "detail_end"),
    [
        (20, "warn", "expires in 10 days (2026-03-31)"),
        (31, "fail", "expired on 2026-03-31"),
        (-1, "fail", "is not valid until 2026-03-01 11:55 UTC"),
    ],
)
def test_certificate_dates_are_judged_against_now(pki, days_later, status, detail_end):
    finding = doctor.check_certificate(_settings(pki), NOW + datetime.timedelta(days=days_later))
    assert (finding.status, finding.detail) == (status, f"{pki.nodes['node-a'].cert} {detail_end}")
    assert finding.fix


def test_a_certificate_for_another_node_fails_naming_both(pki):
    finding = doctor.check_certificate(_settings(pki, "node-b", pki.nodes["node-a"]), NOW)
    assert finding.status == "fail"
    assert "speaks for 'node-a', but this agent's node_id is 'node-b'" in finding.detail
    assert finding.fix == 'node_id = "node-a" in agent.toml, or a certificate for node-b'


def test_an_operator_certificate_is_not_a_node_certificate(pki):
    finding = doctor.check_certificate(_settings(pki, "dev-viewer", pki.operators["viewer"]), NOW)
    assert (finding.status, finding.detail) == (
        "fail",
        f"{pki.operators['viewer'].cert} is not a node certificate (OU=viewer)",
    )


def test_a_certificate_from_another_ca_fails(pki, tmp_path):
    other = devcerts.init(tmp_path / "other", ["node-a"], now=NOW)
    finding = doctor.check_certificate(_settings(pki, "node-a", other.nodes["node-a"]), NOW)
    assert (finding.status, finding.detail) == (
        "fail",
        f"{other.nodes['node-a'].cert} is not issued by the CA in {pki.ca.cert}",
    )


def test_missing_certificate_files_are_named(pki, tmp_path):
    missing = devcerts.Pair(tmp_path / "nowhere/agent.crt", tmp_path / "nowhere/agent.key")
    finding = doctor.check_certificate(_settings(pki, "node-a", missing), NOW)
    assert (finding.status, finding.detail) == ("fail", f"{missing.cert}: No such file or directory")
    assert finding.fix == f"put ca.crt, agent.crt and agent.key in {missing.cert.parent}"


def test_plaintext_is_a_warning():
    finding = doctor.check_certificate(agent_settings.AgentSettings(node_id="n"), NOW)
    assert finding.status == "warn" and "plaintext" in finding.detail


def test_kernel_log_readable_missing_and_off(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,2,-;NVRM: loaded\n")
    readable = doctor.check_kernel_log(agent_settings.KernelLogSettings(source="kmsg", kmsg_path=str(kmsg)))
    assert readable == doctor.Finding("kernel-log", "ok", f"{kmsg} readable")
    missing = doctor.check_kernel_log(agent_settings.KernelLogSettings(source="kmsg", kmsg_path=str(tmp_path / "no")))
    assert (missing.status, missing.detail) == ("fail", f"{tmp_path / 'no'}: No such file or directory")
    off = doctor.check_kernel_log(agent_settings.KernelLogSettings(source="none"))
    assert off.status == "warn" and off.fix == 'kernel_log = "kmsg" in agent.toml'


def test_spool_space_thresholds(tmp_path):
    assert doctor.check_spool(tmp_path).status == "ok"
    assert doctor.check_spool(tmp_path, warn_free_bytes=1 << 62).status == "warn"
    full = doctor.check_spool(tmp_path / "not-yet", warn_free_bytes=1 << 62, fail_free_bytes=1 << 61)
    assert full.status == "fail" and full.detail.startswith(f"{tmp_path / 'not-yet'} (not yet created; {tmp_path}): ")
    (tmp_path / "a-file").write_text("")
    assert doctor.check_spool(tmp_path / "a-file").detail == f"{tmp_path / 'a-file'} is not a writable folder"


def test_labels_missing_is_a_warning():
    assert doctor.check_labels({}).status == "warn"
    assert doctor.check_labels({"rack": "r1", "row": "w"}) == doctor.Finding("labels", "ok", "rack=r1, row=w")


def test_the_clock_check_reads_the_kernels_ntp_state():
    finding = doctor.check_clock()
    assert finding.check == "clock" and finding.status in ("ok", "warn")
    assert finding.status == "ok" or "not synchronised" in finding.detail


class _RunningController:
    """A real controller with the dev certificates, on its own event loop thread."""

    def __init__(self, tmp_path, pki, port):
        security = authn.SecuritySettings(tls=tls.TlsFiles(pki.ca.cert, pki.controller.cert, pki.controller.key))
        self.controller = server.Controller(
            server.ControllerSettings(
                listen=f"127.0.0.1:{port}",
                db_url=f"sqlite:///{tmp_path / 'rasd.db'}",
                metrics_port=None,
                security=security,
            )
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.controller.start(), self.loop).result(timeout=60)

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.controller.stop(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def live_pki(tmp_path):
    return devcerts.init(tmp_path / "live-certs", ["node-a"])


def test_the_controller_answers_over_the_nodes_mutual_tls(tmp_path, live_pki, free_port):
    running = _RunningController(tmp_path, live_pki, free_port)
    try:
        settings = _settings(live_pki, link=agent_settings.LinkSettings(controller_address=f"127.0.0.1:{free_port}"))
        finding = doctor.check_controller(settings)
    finally:
        running.stop()
    assert finding.status == "ok", finding
    assert finding.detail.startswith(f"127.0.0.1:{free_port} answered SERVING over mutual TLS in ")


def test_a_controller_nobody_listens_on_fails_saying_so(live_pki, free_port):
    settings = _settings(live_pki, link=agent_settings.LinkSettings(controller_address=f"127.0.0.1:{free_port}"))
    finding = doctor.check_controller(settings, timeout_s=5)
    assert finding.status == "fail" and finding.detail.startswith(f"127.0.0.1:{free_port} (mutual TLS): UNAVAILABLE")
    assert finding.fix.startswith(f"nothing listens at 127.0.0.1:{free_port}")


def test_a_controller_of_another_ca_fails_the_handshake(tmp_path, live_pki, free_port):
    other = devcerts.init(tmp_path / "other", ["node-a"])
    running = _RunningController(tmp_path, other, free_port)
    try:
        settings = _settings(live_pki, link=agent_settings.LinkSettings(controller_address=f"127.0.0.1:{free_port}"))
        finding = doctor.check_controller(settings)
    finally:
        running.stop()
    assert finding.status == "fail" and "CERTIFICATE_VERIFY_FAILED" in finding.detail
    assert finding.fix.startswith(f"the controller's certificate does not chain to {live_pki.ca.cert}")


def test_the_check_command_prints_one_line_per_check_and_exits_1_on_a_failure(tmp_path, live_pki, venv_bin, free_port):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    node = live_pki.nodes["node-a"]
    argv = [
        str(venv_bin / "rasd-agent"), "check", "--backend", "simulated", "--gpus", "2", "--node-id", "node-a",
        "--controller", f"127.0.0.1:{free_port}", "--state-dir", str(tmp_path / "state"), "--kernel-log", "kmsg",
        "--kmsg-path", str(kmsg), "--label", "rack=r1", "--tls-ca", str(live_pki.ca.cert), "--tls-cert",
        str(node.cert), "--tls-key", str(node.key), "--timeout-s", "3",
    ]  # fmt: skip
    nobody = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    running = _RunningController(tmp_path, live_pki, free_port)
    try:
        served = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        running.stop()
    checks = ["config", "gpus", "kernel-log", "certificate", "controller", "clock", "spool", "labels"]
    for done in (nobody, served):
        assert [line.split()[1] for line in done.stdout.splitlines()] == checks, done.stdout + done.stderr
    status = {line.split()[1]: line.split()[0] for line in served.stdout.splitlines()}
    assert served.returncode == 0 and {s for c, s in status.items() if c != "clock"} == {"ok"}, served.stdout
    failed = [line for line in nobody.stdout.splitlines() if line.startswith("fail")]
    assert nobody.returncode == 1 and [line.split()[1] for line in failed] == ["controller"]
    assert "; fix: nothing listens at" in failed[0]


def test_the_check_command_names_a_bad_setting(venv_bin, tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text('gpus = "many"\nbackend = "simulated"\ninsecure = true\n')
    done = subprocess.run(
        [str(venv_bin / "rasd-agent"), "check", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    (line,) = done.stdout.splitlines()
    assert line.startswith('fail  config      gpus (agent.toml): expected an integer, got "many"')


def test_the_agent_without_the_nvml_extra_says_so_in_one_line(tmp_path):
    """`pip install rasd` without [nvml]: pynvml is not importable (None in sys.modules is what Python
    does for a module it must not import). The agent prints one line naming the extra, no traceback."""
    program = (
        "import sys; sys.modules['pynvml'] = None\n"
        "from rasd.agent import main\n"
        f"sys.exit(main.main(['--insecure', '--backend', 'nvml', '--metrics-port', '-1', "
        f"'--state-dir', {str(tmp_path)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "rasd-agent: the nvml backend needs the nvml extra, which is not installed: pip install 'rasd[nvml]' "
        "(or --backend simulated)"
    ]


def test_exit_code_is_1_only_when_something_failed():
    ok, warn, fail = (doctor.Finding("x", status, "") for status in ("ok", "warn", "fail"))
    assert (doctor.exit_code([ok, warn]), doctor.exit_code([ok, fail])) == (0, 1)
    assert fail.line() == "fail  x           "
    assert doctor.Finding("spool", "warn", "low", "free space").line() == "warn  spool       low; fix: free space"
