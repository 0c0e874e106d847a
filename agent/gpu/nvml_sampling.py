"""The NVML backend's readings: power, and the RAS and power counters, in as few NVML calls as NVML allows.

The hot path of the agent, so the calls made here and their order are what the agent costs a node
(bench/RESULTS.md "Agent overhead"):

* **power**: where the driver keeps its own power samples (`nvmlDeviceGetSamples` with
  NVML_TOTAL_POWER_SAMPLES, probed at open: `probe_power_buffer`), one call per GPU per read
  (`read_power_samples`, about once a second) returns every sample since the last one, and the
  agent no longer wakes at 10 Hz to read power. Elsewhere `read_power` reads the instant-power
  field per GPU at the sampler's rate (nvmlDeviceGetPowerUsage is a 1 s average on Ampere and
  newer), and nvmlDeviceGetPowerUsage where that field is absent;
* **counters** (1 Hz): one `nvmlDeviceGetFieldValues` per GPU for every counter NVML has a field
  id for (`COUNTER_FIELDS`: limits, energy, ECC, retired pages, row remaps, PCIe replays, the
  recovery action, the smoothing state), plus temperature, utilisation and clock event reasons,
  which have none (nvml.h up to NVML_FI_MAX 308: field 82 is the memory's temperature, 193-196 the
  thresholds, and 74/76/269-271 the cumulative time in ns each clock event reason was active, not
  the current reasons mask). A field an older driver does not know falls back to its function,
  once known absent;
* **NVLink** (every `nvlink_interval_s`): state and error counters of every link in one field-value
  call (`link` as scope), the per-link functions (~4 calls a link) where those fields are absent;
  with them the PCIe link's width and generation (two calls; the link's best once per GPU).

A lost GPU is skipped, never read as zero; a counter the GPU does not support is None, never 0.
"""

from __future__ import annotations

import array
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from rasd.agent.core import model
from rasd.agent.gpu import nvml_device as device

# NVML field ids (nvml.h) of the counters read in one call; units are those of the functions they
# replace (mW, mJ, counts, 0/1 flags).
FI_ECC_SBE_VOL = 3
FI_ECC_DBE_VOL = 4
FI_ECC_SBE_AGG = 5
FI_ECC_DBE_AGG = 6
FI_RETIRED_SBE = 29
FI_RETIRED_DBE = 30
FI_RETIRED_PENDING = 31
FI_TOTAL_ENERGY = 83
FI_PCIE_REPLAY = 94
FI_REMAPPED_COR = 142
FI_REMAPPED_UNC = 143
FI_REMAPPED_PENDING = 144
FI_REMAPPED_FAILURE = 145
FI_NVLINK_REPLAY = 161
FI_NVLINK_RECOVERY = 162
FI_NVLINK_CRC = 163
FI_NVLINK_STATE = 165
FI_POWER_CURRENT_LIMIT = 190
FI_POWER_REQUESTED_LIMIT = 192

COUNTER_FIELDS = (
    FI_POWER_CURRENT_LIMIT, FI_POWER_REQUESTED_LIMIT, FI_TOTAL_ENERGY,
    FI_ECC_SBE_VOL, FI_ECC_DBE_VOL, FI_ECC_SBE_AGG, FI_ECC_DBE_AGG,
    FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING,
    FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE,
    FI_PCIE_REPLAY, device.FI_RECOVERY_ACTION, device.FI_PWR_SMOOTHING_ENABLED,
)  # fmt: skip
"""Read in one nvmlDeviceGetFieldValues call per GPU and counters read."""

# NVML_NVLINK_STATE_* of field 165: INACTIVE 0, ACTIVE 1, SLEEP 2 (low power, still up),
# ACTIVE_TRAFFIC_DISABLED 3 (carries nothing: as good as down for a job).
_NVLINK_UP_STATES = frozenset({1, 2})
_TOTAL_POWER_SAMPLES = 0  # NVML_TOTAL_POWER_SAMPLES (nvmlSamplingType_t)
_POWER_INSTANT = (device.FI_POWER_INSTANT,)


@dataclasses.dataclass(frozen=True)
class PowerBufferProbe:
    """What the driver's power-sample buffer looked like at open."""

    usable: bool
    why: str
    """Why not, or its sample spacing."""


class NvmlSampler:
    """Reads power and counters of the node's live GPUs.

    Args:
        devices: The node's GPUs and the NVML call discipline.
        nvlink_interval_s: How often per-link NVLink state and error counters are read again.
    """

    def __init__(self, devices: device.NvmlDevices, *, nvlink_interval_s: float) -> None:
        """Bind the sampler to the node's GPUs."""
        self._devices = devices
        # Per-link state and error counters move slowly; reading them every nvlink_interval_s keeps
        # the agent's cost down (bench/RESULTS.md).
        self._nvlink_interval_ns = int(nvlink_interval_s * 1e9)
        n = devices.n
        sbe, dbe = n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        vol, agg = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC
        retire_sbe = n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        retire_dbe = n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR

        def call(key: str, fn: Callable[..., Any], *args: Any) -> Callable[[device.NvmlGpu], Any]:
            return lambda g: devices.optional(g, key, fn, *args)

        def pages(key: str, cause: int) -> Callable[[device.NvmlGpu], Any]:
            return lambda g: (
                None if (got := devices.optional(g, key, n.nvmlDeviceGetRetiredPages, cause)) is None else len(got)
            )

        def remap(index: int) -> Callable[[device.NvmlGpu], Any]:
            return lambda g: (
                None
                if (rows := devices.optional(g, "remapped_rows", n.nvmlDeviceGetRemappedRows)) is None
                else rows[index]
            )

        # A field an older driver lacks is read through the function the field replaces.
        fallbacks: dict[int, Callable[[device.NvmlGpu], Any]] = {
            FI_POWER_CURRENT_LIMIT: call("enforced_limit", n.nvmlDeviceGetEnforcedPowerLimit),
            FI_POWER_REQUESTED_LIMIT: call("requested_limit", n.nvmlDeviceGetPowerManagementLimit),
            FI_TOTAL_ENERGY: call("energy", n.nvmlDeviceGetTotalEnergyConsumption),
            FI_ECC_SBE_VOL: call("ecc:sbe:vol", n.nvmlDeviceGetTotalEccErrors, sbe, vol),
            FI_ECC_DBE_VOL: call("ecc:dbe:vol", n.nvmlDeviceGetTotalEccErrors, dbe, vol),
            FI_ECC_SBE_AGG: call("ecc:sbe:agg", n.nvmlDeviceGetTotalEccErrors, sbe, agg),
            FI_ECC_DBE_AGG: call("ecc:dbe:agg", n.nvmlDeviceGetTotalEccErrors, dbe, agg),
            FI_RETIRED_SBE: pages("retired_sbe", retire_sbe),
            FI_RETIRED_DBE: pages("retired_dbe", retire_dbe),
            FI_RETIRED_PENDING: call("retired_pending", n.nvmlDeviceGetRetiredPagesPendingStatus),
            FI_REMAPPED_COR: remap(0),
            FI_REMAPPED_UNC: remap(1),
            FI_REMAPPED_PENDING: remap(2),
            FI_REMAPPED_FAILURE: remap(3),
            FI_PCIE_REPLAY: call("pcie_replay", n.nvmlDeviceGetPcieReplayCounter),
        }
        # With the field's absence key (as `NvmlDevices.fields` records it), built once.
        self._fallbacks = tuple((field_id, f"field:{field_id}", fn) for field_id, fn in fallbacks.items())

    # ----- power ------------------------------------------------------------------------------------

    def probe_power_buffer(self, max_spacing_ms: float) -> PowerBufferProbe:
        """Whether every GPU's driver buffer holds power samples at least every max_spacing_ms.

        Reads each buffer whole (and marks it read, so the first `read_power_samples` returns only
        newer samples). A buffer that is absent, empty or sparser than the agent's own sampling
        would be leaves the agent polling `read_power`.
        """
        n = self._devices.n
        for g in self._devices.gpus:
            if g.lost:
                continue
            try:
                got = self._devices.optional(g, "power_samples", n.nvmlDeviceGetSamples, _TOTAL_POWER_SAMPLES, 0)
            except device.Lost:
                self._devices.mark_lost(g, None, "power buffer probe")
                continue
            if got is None:
                why = "not supported" if "power_samples" in g.absent else "empty"
                return PowerBufferProbe(False, f"{g.uuid}: power sample buffer {why}")
            stamps = [s.timeStamp for s in got[1]]
            if len(stamps) < 3:
                return PowerBufferProbe(False, f"{g.uuid}: {len(stamps)} power samples in the buffer")
            gaps = sorted(b - a for a, b in itertools.pairwise(stamps))
            spacing_ms = gaps[len(gaps) // 2] / 1000
            if spacing_ms > max_spacing_ms:
                return PowerBufferProbe(False, f"{g.uuid}: power samples every {spacing_ms:g} ms")
            g.power_seen_us = stamps[-1]
        return PowerBufferProbe(True, "driver power-sample buffer")

    def read_power_samples(self, now_unix_ns: int) -> Sequence[model.PowerSamples]:
        """Every answering GPU's power samples since the last read, from the driver's buffer (W, Unix ns).

        NOT_FOUND (no sample since the last read) is no sample, not an error.
        """
        out = []
        for g in self._devices.gpus:
            if g.lost:
                continue
            try:
                got = self._devices.optional(g, "power_samples", self._samples_since, g.power_seen_us)
            except device.Lost:
                self._devices.mark_lost(g, now_unix_ns, "power sample read")
                continue
            if got is None or not got[0]:
                continue
            stamps_us, values_mw = got
            # Into flat arrays: the driver's CPU timestamps are µs since 1970, the draws mW.
            times = array.array("q", [t * 1000 for t in stamps_us])
            out.append(model.PowerSamples(g.uuid, times, array.array("d", [mw / 1000.0 for mw in values_mw])))
            g.power_seen_us = stamps_us[-1]
        return out

    def _samples_since(self, handle: Any, last_seen_us: int) -> tuple[Sequence[int], Sequence[float]]:
        """(timestamps µs, draws mW) newer than last_seen_us: one direct call, or pynvml's wrapper."""
        devices = self._devices
        if devices.direct.usable:
            return devices.direct.samples(handle, _TOTAL_POWER_SAMPLES, last_seen_us)
        value_type, samples = devices.n.nvmlDeviceGetSamples(handle, _TOTAL_POWER_SAMPLES, last_seen_us)
        member = device.FIELD_UNION.get(value_type)
        if member is None:
            return (), ()
        return [s.timeStamp for s in samples], [getattr(s.sampleValue, member) for s in samples]

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

    def _power_mw(self, g: device.NvmlGpu) -> int | None:
        # nvmlDeviceGetPowerUsage is a 1 s average on Ampere (except GA100) and newer; the instant
        # field is what a 10 Hz sampler needs. Fall back where the field is absent (older drivers).
        instant = self._devices.fields(g, _POWER_INSTANT)[device.FI_POWER_INSTANT]
        if instant is not None:
            return int(instant)
        return self._devices.optional(g, "power_usage", self._devices.n.nvmlDeviceGetPowerUsage)

    # ----- counters ---------------------------------------------------------------------------------

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

    def _counter_values(self, g: device.NvmlGpu) -> dict[int, Any]:
        """COUNTER_FIELDS by id: one field-value call, then the functions of fields this driver lacks."""
        values = self._devices.fields(g, COUNTER_FIELDS)
        for field_id, key, fallback in self._fallbacks:
            if key in g.absent:
                values[field_id] = fallback(g)
        return values

    def _counters(self, g: device.NvmlGpu, now_unix_ns: int) -> model.GpuCounters:
        n, opt = self._devices.n, self._devices.optional
        v = self._counter_values(g)
        # nvmlDeviceGetTemperature is deprecated in 13.0; its V replacement is missing in older drivers.
        temperature = opt(g, "temperature_v", n.nvmlDeviceGetTemperatureV, n.NVML_TEMPERATURE_GPU)
        if temperature is None and "temperature_v" in g.absent:
            temperature = opt(g, "temperature", n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU)
        utilization = opt(g, "utilization", n.nvmlDeviceGetUtilizationRates)
        reasons = opt(g, "clock_events", n.nvmlDeviceGetCurrentClocksEventReasons)
        if reasons is None and "clock_events" in g.absent:
            reasons = opt(g, "clock_throttle", n.nvmlDeviceGetCurrentClocksThrottleReasons)
        enforced_mw, requested_mw = v[FI_POWER_CURRENT_LIMIT], v[FI_POWER_REQUESTED_LIMIT]
        smoothing = v[device.FI_PWR_SMOOTHING_ENABLED]
        nvlinks = self._nvlinks_due(g, now_unix_ns)  # also refreshes g.pcie_link
        width_max, gen_max = g.pcie_link_max or (None, None)
        return model.GpuCounters(
            gpu_uuid=g.uuid,
            sample_unix_ns=now_unix_ns,
            enforced_power_limit_w=None if enforced_mw is None else device.w_up(int(enforced_mw)),
            requested_power_limit_w=None if requested_mw is None else device.w_up(int(requested_mw)),
            total_energy_mj=_int(v[FI_TOTAL_ENERGY]),
            temperature_c=temperature,
            utilization_gpu_pct=None if utilization is None else utilization.gpu,
            clock_event_reasons=reasons,
            ecc_sbe_volatile=_int(v[FI_ECC_SBE_VOL]),
            ecc_dbe_volatile=_int(v[FI_ECC_DBE_VOL]),
            ecc_sbe_aggregate=_int(v[FI_ECC_SBE_AGG]),
            ecc_dbe_aggregate=_int(v[FI_ECC_DBE_AGG]),
            # Page retirement is the pre-Ampere mechanism (NOT_SUPPORTED on Ampere+, which remaps rows).
            retired_pages_sbe=_int(v[FI_RETIRED_SBE]),
            retired_pages_dbe=_int(v[FI_RETIRED_DBE]),
            retired_pages_pending=_flag(v[FI_RETIRED_PENDING]),
            remapped_rows_correctable=_int(v[FI_REMAPPED_COR]),
            remapped_rows_uncorrectable=_int(v[FI_REMAPPED_UNC]),
            remapped_rows_pending=_flag(v[FI_REMAPPED_PENDING]),
            remapped_rows_failure=_flag(v[FI_REMAPPED_FAILURE]),
            pcie_replay_count=_int(v[FI_PCIE_REPLAY]),
            recovery_action=_int(v[device.FI_RECOVERY_ACTION]),
            nvlinks=nvlinks,
            power_smoothing_enabled=_flag(smoothing),
            nvlink_sample_unix_ns=g.nvlinks_unix_ns,
            pcie_link_width=g.pcie_link[0],
            pcie_link_width_max=width_max,
            pcie_link_gen=g.pcie_link[1],
            pcie_link_gen_max=gen_max,
        )

    # ----- NVLink -----------------------------------------------------------------------------------

    def _nvlinks_due(self, g: device.NvmlGpu, now_unix_ns: int) -> tuple[model.NvLinkCounters, ...]:
        """The links' counters, read again only when the last reading is nvlink_interval_s old."""
        if g.nvlinks_unix_ns is None or now_unix_ns - g.nvlinks_unix_ns >= self._nvlink_interval_ns:
            g.nvlinks = self._nvlink_counters(g)
            g.nvlinks_unix_ns = now_unix_ns
            self._read_pcie_link(g)
        return g.nvlinks

    def _read_pcie_link(self, g: device.NvmlGpu) -> None:
        """The PCIe link's width and generation, and once per GPU its best (the GPU and the slot together).

        A link trains down rarely: two calls with the NVLinks' reading, not at the counters' rate.
        """
        n, opt = self._devices.n, self._devices.optional
        if g.pcie_link_max is None:
            g.pcie_link_max = (
                opt(g, "pcie_width_max", n.nvmlDeviceGetMaxPcieLinkWidth),
                opt(g, "pcie_gen_max", n.nvmlDeviceGetMaxPcieLinkGeneration),
            )
        g.pcie_link = (
            opt(g, "pcie_width", n.nvmlDeviceGetCurrPcieLinkWidth),
            opt(g, "pcie_gen", n.nvmlDeviceGetCurrPcieLinkGeneration),
        )

    def _nvlink_counters(self, g: device.NvmlGpu) -> tuple[model.NvLinkCounters, ...]:
        """Every link's state and errors: one field-value call (scope = link), per-link calls where absent."""
        if not g.links:
            return ()
        wanted = tuple((field_id, link) for link in g.links for field_id in _LINK_FIELDS)
        values = self._devices.scoped_fields(g, wanted)
        n, out = self._devices.n, []
        for link in g.links:
            state = values[(FI_NVLINK_STATE, link)]
            if f"field:{FI_NVLINK_STATE}:{link}" in g.absent:
                enabled = self._devices.optional(g, f"nvlink_state:{link}", n.nvmlDeviceGetNvLinkState, link)
                state = None if enabled is None else (1 if enabled == n.NVML_FEATURE_ENABLED else 0)
            if state is None:
                continue  # unknown this sample: reporting it inactive would raise a false NVLINK_DOWN

            def counter(field_id: int, kind: int, link: int = link) -> int | None:
                if f"field:{field_id}:{link}" not in g.absent:
                    return _int(values[(field_id, link)])
                # NOT_SUPPORTED on Blackwell (NVLink5) too; those GPUs report None here.
                return self._devices.optional(g, f"nvlink:{link}:{kind}", n.nvmlDeviceGetNvLinkErrorCounter, link, kind)

            out.append(
                model.NvLinkCounters(
                    link=link,
                    active=int(state) in _NVLINK_UP_STATES,
                    # Flit CRC: the counter nvidia-smi and DCGM report as "CRC errors" (field 163, DL_CRC).
                    crc_errors=counter(FI_NVLINK_CRC, n.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                    replay_errors=counter(FI_NVLINK_REPLAY, n.NVML_NVLINK_ERROR_DL_REPLAY),
                    recovery_errors=counter(FI_NVLINK_RECOVERY, n.NVML_NVLINK_ERROR_DL_RECOVERY),
                )
            )
        return tuple(out)


_LINK_FIELDS = (FI_NVLINK_STATE, FI_NVLINK_CRC, FI_NVLINK_REPLAY, FI_NVLINK_RECOVERY)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)
