"""The NVML backend's readings: power at the sampler's rate, and the RAS and power counters.

The hot path of the agent: `read_power` runs at 10 Hz and `read_counters` at 1 Hz on every GPU, so
the calls made here and their order are what the agent costs a node (bench/RESULTS.md). A lost GPU
is skipped, never read as zero; a counter the GPU does not support is None, never 0. Per-link
NVLink state and error counters (~4 calls per link) move slowly and are read only every
`nvlink_interval_s`.
"""

from __future__ import annotations

from collections.abc import Sequence

from rasd.agent.core import model
from rasd.agent.gpu import nvml_device as device


class NvmlSampler:
    """Reads power and counters of the node's live GPUs.

    Args:
        devices: The node's GPUs and the NVML call discipline.
        nvlink_interval_s: How often per-link NVLink state and error counters are read again.
    """

    def __init__(self, devices: device.NvmlDevices, *, nvlink_interval_s: float) -> None:
        """Bind the sampler to the node's GPUs."""
        self._devices = devices
        # Per-link state and error counters are ~4 NVML calls per link (72 per H100) and move slowly;
        # reading them every nvlink_interval_s keeps the agent under 1% of a core (bench/RESULTS.md).
        self._nvlink_interval_ns = int(nvlink_interval_s * 1e9)

    def read_power(self, now_unix_ns: int) -> Sequence[model.PowerReading]:
        """Instant power of every answering GPU; lost or power-blind GPUs are skipped, never zero."""
        readings = []
        for g in self._devices.gpus:
            if g.lost:
                continue
            try:
                power_mw = self._power_mw(g)
            except device.Lost:
                self._devices.mark_lost(g, now_unix_ns, "power read")
                continue
            if power_mw is not None:
                readings.append(model.PowerReading(g.uuid, now_unix_ns, power_mw / 1000.0))
        return readings

    def read_counters(self, now_unix_ns: int) -> Sequence[model.GpuCounters]:
        """Counters of every answering GPU; a field the GPU does not support is None, never 0."""
        out = []
        for g in self._devices.gpus:
            if g.lost:
                continue
            try:
                out.append(self._counters(g, now_unix_ns))
            except device.Lost:
                self._devices.mark_lost(g, now_unix_ns, "counter read")
        return out

    def _power_mw(self, g: device.NvmlGpu) -> int | None:
        # nvmlDeviceGetPowerUsage is a 1 s average on Ampere (except GA100) and newer; the instant
        # field is what a 10 Hz sampler needs. Fall back where the field is absent (older drivers).
        instant = self._devices.fields(g, [device.FI_POWER_INSTANT])[device.FI_POWER_INSTANT]
        if instant is not None:
            return int(instant)
        return self._devices.optional(g, "power_usage", self._devices.n.nvmlDeviceGetPowerUsage)

    def _counters(self, g: device.NvmlGpu, now_unix_ns: int) -> model.GpuCounters:
        n, opt = self._devices.n, self._devices.optional
        enforced_mw = opt(g, "enforced_limit", n.nvmlDeviceGetEnforcedPowerLimit)
        requested_mw = opt(g, "requested_limit", n.nvmlDeviceGetPowerManagementLimit)
        # nvmlDeviceGetTemperature is deprecated in 13.0; its V replacement is missing in older drivers.
        temperature = opt(g, "temperature_v", n.nvmlDeviceGetTemperatureV, n.NVML_TEMPERATURE_GPU)
        if temperature is None and "temperature_v" in g.absent:
            temperature = opt(g, "temperature", n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU)
        utilization = opt(g, "utilization", n.nvmlDeviceGetUtilizationRates)
        reasons = opt(g, "clock_events", n.nvmlDeviceGetCurrentClocksEventReasons)
        if reasons is None and "clock_events" in g.absent:
            reasons = opt(g, "clock_throttle", n.nvmlDeviceGetCurrentClocksThrottleReasons)
        ecc = {
            (kind, counter): opt(g, f"ecc:{kind}:{counter}", n.nvmlDeviceGetTotalEccErrors, kind, counter)
            for kind in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
            for counter in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC)
        }
        # Page retirement is the pre-Ampere mechanism (NOT_SUPPORTED on Ampere+, which remaps rows).
        sbe_pages = opt(
            g,
            "retired_sbe",
            n.nvmlDeviceGetRetiredPages,
            n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        dbe_pages = opt(
            g, "retired_dbe", n.nvmlDeviceGetRetiredPages, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        pages_pending = opt(g, "retired_pending", n.nvmlDeviceGetRetiredPagesPendingStatus)
        remap = opt(g, "remapped_rows", n.nvmlDeviceGetRemappedRows)  # (corr, unc, pending, failure)
        fields = self._devices.fields(g, [device.FI_RECOVERY_ACTION, device.FI_PWR_SMOOTHING_ENABLED])
        smoothing = fields[device.FI_PWR_SMOOTHING_ENABLED]
        vol, agg = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC
        sbe, dbe = n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return model.GpuCounters(
            gpu_uuid=g.uuid,
            sample_unix_ns=now_unix_ns,
            enforced_power_limit_w=None if enforced_mw is None else device.w_up(enforced_mw),
            requested_power_limit_w=None if requested_mw is None else device.w_up(requested_mw),
            total_energy_mj=opt(g, "energy", n.nvmlDeviceGetTotalEnergyConsumption),
            temperature_c=temperature,
            utilization_gpu_pct=None if utilization is None else utilization.gpu,
            clock_event_reasons=reasons,
            ecc_sbe_volatile=ecc[(sbe, vol)],
            ecc_dbe_volatile=ecc[(dbe, vol)],
            ecc_sbe_aggregate=ecc[(sbe, agg)],
            ecc_dbe_aggregate=ecc[(dbe, agg)],
            retired_pages_sbe=None if sbe_pages is None else len(sbe_pages),
            retired_pages_dbe=None if dbe_pages is None else len(dbe_pages),
            retired_pages_pending=None if pages_pending is None else bool(pages_pending),
            remapped_rows_correctable=None if remap is None else remap[0],
            remapped_rows_uncorrectable=None if remap is None else remap[1],
            remapped_rows_pending=None if remap is None else bool(remap[2]),
            remapped_rows_failure=None if remap is None else bool(remap[3]),
            pcie_replay_count=opt(g, "pcie_replay", n.nvmlDeviceGetPcieReplayCounter),
            recovery_action=fields[device.FI_RECOVERY_ACTION],
            nvlinks=self._nvlinks_due(g, now_unix_ns),
            power_smoothing_enabled=None if smoothing is None else bool(smoothing),
            nvlink_sample_unix_ns=g.nvlinks_unix_ns,
        )

    def _nvlinks_due(self, g: device.NvmlGpu, now_unix_ns: int) -> tuple[model.NvLinkCounters, ...]:
        """The links' counters, read again only when the last reading is nvlink_interval_s old."""
        if g.nvlinks_unix_ns is None or now_unix_ns - g.nvlinks_unix_ns >= self._nvlink_interval_ns:
            g.nvlinks = self._nvlink_counters(g)
            g.nvlinks_unix_ns = now_unix_ns
        return g.nvlinks

    def _nvlink_counters(self, g: device.NvmlGpu) -> tuple[model.NvLinkCounters, ...]:
        n, out = self._devices.n, []
        for link in g.links:
            state = self._devices.optional(g, f"nvlink_state:{link}", n.nvmlDeviceGetNvLinkState, link)
            if state is None:
                continue  # unknown this sample: reporting it inactive would raise a false NVLINK_DOWN

            def counter(kind: int, link: int = link) -> int | None:
                # NOT_SUPPORTED on Blackwell (NVLink5); those GPUs report None here.
                return self._devices.optional(g, f"nvlink:{link}:{kind}", n.nvmlDeviceGetNvLinkErrorCounter, link, kind)

            out.append(
                model.NvLinkCounters(
                    link=link,
                    active=state == n.NVML_FEATURE_ENABLED,
                    # Flit CRC: the counter nvidia-smi and DCGM report as "CRC errors".
                    crc_errors=counter(n.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                    replay_errors=counter(n.NVML_NVLINK_ERROR_DL_REPLAY),
                    recovery_errors=counter(n.NVML_NVLINK_ERROR_DL_RECOVERY),
                )
            )
        return tuple(out)
