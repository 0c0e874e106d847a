"""The controller's exposition next to the agents' (issue #38 item 5): no series name in common but build
info, so a `sum by (node)` over everything Prometheus scraped counts each GPU once; no `_created`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rasd.agent import metrics as agent_metrics
from rasd.agent.gpu import simulated
from rasd.common import VERSION, exposition
from rasd.controller.core import fleet
from rasd.controller.observability import metrics


def _controller_exposition(latest: dict[str, fleet.GpuLatest], gpu_nodes: dict[str, str]) -> str:
    registry = CollectorRegistry()
    controller_metrics = metrics.ControllerMetrics(registry)
    controller_metrics.power_samples.inc()
    controller_metrics.store_flush_seconds.observe(0.002)
    controller_metrics.incident_opened("xid:79", "gpu")
    registry.register(metrics.FleetCollector(lambda: latest, lambda: gpu_nodes, dict))
    return generate_latest(registry).decode()


def _agent_exposition(backend: simulated.SimulatedBackend) -> str:
    registry = CollectorRegistry()
    exposition.prepare_registry(registry)
    power = {r.gpu_uuid: r for r in backend.read_power(1)}
    counters = {c.gpu_uuid: c for c in backend.read_counters(1)}
    stats = {"spool_depth": 0, "connected": 1.0, "power_samples": 1, "failsafe_applied": 0}
    registry.register(
        agent_metrics.AgentCollector(
            "node-a", "node-a", backend.inventory(), lambda: power, lambda: counters, lambda: stats, dict
        )
    )
    return generate_latest(registry).decode()


def _names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def test_the_controller_and_the_agent_share_no_series_name_but_build_info():
    backend = simulated.SimulatedBackend("node-a", 2, 0)
    latest = {g.uuid: fleet.GpuLatest(power_w=300.0, enforced_power_limit_w=700) for g in backend.inventory()}
    controller = _controller_exposition(latest, {uuid: "node-a" for uuid in latest})
    agent = _agent_exposition(backend)
    assert _names(controller) & _names(agent) == {"rasd_build_info"}
    view = {
        family.name: [sample.labels for sample in family.samples]
        for family in text_string_to_metric_families(controller)
        if family.name.startswith("rasd_controller_gpu_")
    }
    assert sorted(view) == ["rasd_controller_gpu_power_limit_watts", "rasd_controller_gpu_power_watts"]
    assert sorted(labels["UUID"] for labels in view["rasd_controller_gpu_power_watts"]) == sorted(latest)
    assert all(
        labels == {"node": "node-a", "UUID": labels["UUID"]} for labels in view["rasd_controller_gpu_power_watts"]
    )


def test_no_created_series_and_one_build_info_series():
    text = _controller_exposition({}, {})
    assert "rasd_power_samples_total 1.0" in text and "rasd_store_flush_seconds_count 1.0" in text
    assert "_created" not in text
    build = [line for line in text.splitlines() if line.startswith("rasd_build_info")]
    assert build == [f'rasd_build_info{{version="{VERSION}"}} 1.0']
