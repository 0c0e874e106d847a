"""What every rasd Prometheus exporter shares: `rasd_build_info`, and no `_created` series.

prometheus_client adds a `_created` sample to every counter and histogram by default; Prometheus
stores each as a series of its own, which nearly doubled the count, and nothing reads them.
"""

from __future__ import annotations

from collections.abc import Iterable

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rasd.common import VERSION


class BuildInfoCollector(Collector):
    """`rasd_build_info{version}` 1: the Prometheus convention for joining a version onto other series."""

    def __init__(self, version: str = VERSION) -> None:
        """Export version (rasd's own by default)."""
        self._version = version

    def collect(self) -> Iterable[Metric]:
        """Yield the one build-info series."""
        info = GaugeMetricFamily("rasd_build_info", "Always 1; labelled with rasd's version.", labels=["version"])
        info.add_metric([self._version], 1)
        yield info


def prepare_registry(registry: CollectorRegistry) -> None:
    """Register `rasd_build_info` on registry and turn `_created` series off (process-wide: a library switch)."""
    prometheus_client.disable_created_metrics()
    registry.register(BuildInfoCollector())
