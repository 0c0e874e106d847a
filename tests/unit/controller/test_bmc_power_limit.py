"""Out-of-band node power limits through Redfish Chassis → Power → PowerControl → PowerLimit.

sushy-emulator serves no Power resource, so these run against the stub BMC at the HTTP edge
(tests/fakes/redfish_stub.py), which the test starts.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

from rasd.controller.executors import bmc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "fakes"))
import redfish_stub

ENV = {"BMC_PW": "secret"}


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


def _limiter(url: str, **node) -> bmc.RedfishPowerLimiter:
    settings = bmc.BmcSettings.from_mapping(
        {
            "nodes": {"n1": {"url": url, "username": "admin", "password_env": "BMC_PW", **node}},
            "retry_delay_s": 0.01,
        }
    )
    return bmc.RedfishPowerLimiter(settings, environ=ENV)


def test_a_limit_is_patched_and_read_back(stub_bmc):
    stub = stub_bmc()
    limiter = _limiter(stub.url)
    assert limiter.configured("n1") and not limiter.configured("n2")

    assert limiter.set_node_limit("n1", 3200) == 3200
    assert stub.power_limit_w == 3200
    assert limiter.set_node_limit("n1", None) is None  # lifted
    assert stub.power_limit_patches == [3200, None]


def test_a_bmc_that_ignores_the_limit_is_read_back_as_it_is(stub_bmc):
    stub = stub_bmc(honour_power_limit=False)
    # The caller must not count the node as limited: the read-back shows no limit.
    assert _limiter(stub.url).set_node_limit("n1", 3200) is None
    assert stub.power_limit_patches == [3200]


def test_an_unknown_chassis_or_node_is_named(stub_bmc):
    stub = stub_bmc()
    with pytest.raises(bmc.BmcSystemNotFoundError, match="chassis 'blade-7'"):
        _limiter(stub.url, system="blade-7").set_node_limit("n1", 3000)
    with pytest.raises(bmc.BmcNotConfiguredError, match="n2"):
        _limiter(stub.url).set_node_limit("n2", 3000)
    assert _limiter(stub.url, system="1").set_node_limit("n1", 3000) == 3000


def test_an_unreachable_bmc_is_unavailable():
    with pytest.raises(bmc.BmcUnavailableError):
        bmc.RedfishPowerLimiter(
            bmc.BmcSettings.from_mapping(
                {
                    "nodes": {"n1": {"url": "http://127.0.0.1:9", "password_env": "BMC_PW"}},
                    "server_side_retries": 0,
                    "retry_delay_s": 0.01,
                    "request_timeout_s": 2.0,
                }
            ),
            environ=ENV,
        ).set_node_limit("n1", 3000)
