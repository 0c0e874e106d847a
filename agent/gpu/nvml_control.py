"""The NVML backend's controls: GPU power limits, confirmed by reading them back, and power smoothing.

A power limit is set in mW and read back: the requested limit must be what was asked (a set that
"succeeded" without effect is an error: the power budget relies on it, DESIGN.md §2.1), and the
enforced limit is awaited briefly, because the limiter takes a new limit a little after the call
returns. Power smoothing writes rasd's preset profile (floor and ramp rates), activates it and
switches the feature on or off (Blackwell and newer; setters need root). NVML errors become the
`rasd.agent.gpu` errors that say why (NoPermission, InvalidValue, NotSupported, GpuLost).
"""

from __future__ import annotations

import time
from typing import Any

from rasd.agent import gpu as backend_api
from rasd.agent.gpu import nvml_device as device

_SMOOTHING_PROFILE = 0  # the preset profile rasd writes and activates

# How long set_power_limit waits for the limiter to take a new limit, and how often it looks. An H200
# took 10-12 ms; a limit still not taken after 250 ms is reported as it stands (unconfirmed).
_ENFORCE_SETTLE_S = 0.25
_ENFORCE_POLL_S = 0.002


class NvmlControl:
    """Sets power limits and power-smoothing profiles on the node's GPUs."""

    def __init__(self, devices: device.NvmlDevices) -> None:
        """Bind the controls to the node's GPUs."""
        self._devices = devices

    def set_power_limit(self, gpu_uuid: str, power_limit_w: int) -> int:
        """Set the GPU's power limit (W), then read back and return the enforced limit (W).

        The enforced limit can be lower than the request when an out-of-band limit (BMC) is lower.

        Raises:
            GpuNotFound: The UUID is not one of this node's GPUs.
            InvalidValue: The limit is outside the GPU's constraints.
            NoPermission: The agent is not root.
            NotSupported: The GPU cannot be capped.
            GpuLost: The GPU fell off the bus.
            BackendError: The set call returned success but the limit did not change.
        """
        g = self._devices.live_gpu(gpu_uuid)
        n = self._devices.n
        limit_mw = int(power_limit_w) * 1000
        try:
            lo_mw, hi_mw = n.nvmlDeviceGetPowerManagementLimitConstraints(g.handle)
            if not lo_mw <= limit_mw <= hi_mw:
                raise backend_api.InvalidValue(
                    f"{gpu_uuid}: {power_limit_w} W outside [{lo_mw / 1000:g}, {hi_mw / 1000:g}] W"
                )
            before_mw = n.nvmlDeviceGetEnforcedPowerLimit(g.handle)
            self._set_limit_mw(g, limit_mw)
            requested_mw = n.nvmlDeviceGetPowerManagementLimit(g.handle)
            enforced_mw = self._settled_enforced_mw(g, requested_mw, before_mw)
        except n.NVMLError as e:
            if e.value == device.GPU_IS_LOST:
                self._devices.mark_lost(g, None, "set power limit")
                raise backend_api.GpuLost(gpu_uuid) from e
            raise self._set_error(e, f"{gpu_uuid}: set power limit {power_limit_w} W", "set power limit") from e
        # Read back: a set that "succeeded" without effect (the _v2 path, or a driver that ignores it)
        # must not be reported as applied; the power budget relies on this (DESIGN §2.1).
        if abs(requested_mw - limit_mw) >= 1000:
            raise backend_api.BackendError(
                f"{gpu_uuid}: set {limit_mw} mW but the driver reports {requested_mw} mW requested"
            )
        return device.w_up(enforced_mw)

    def set_power_smoothing(
        self, gpu_uuid: str, *, enabled: bool, floor_pct: float, ramp_up_w_per_s: float, ramp_down_w_per_s: float
    ) -> None:
        """Write floor and ramp rates into rasd's preset profile, activate it, and switch smoothing on/off.

        rasd owns preset profile 0. Ramp rates go to NVML in W/s (its read-back fields report mW/s).
        Blackwell and newer only; setters need root.

        Raises:
            GpuNotFound, GpuLost, NotSupported, NoPermission, InvalidValue: as for set_power_limit.
        """
        g = self._devices.live_gpu(gpu_uuid)
        if g.info is not None and not g.info.power_smoothing_supported:
            raise backend_api.NotSupported(f"{gpu_uuid}: no power-smoothing hardware")
        n = self._devices.n
        try:
            profile = n.c_nvmlPowerSmoothingProfile_v1_t()
            profile.profileId = _SMOOTHING_PROFILE
            for param, value in (
                (n.NVML_POWER_SMOOTHING_PROFILE_PARAM_PERCENT_TMP_FLOOR, float(floor_pct)),
                # The set call takes W/s (NVML's nvmlDevicePowerSmoothingUpdatePresetProfileParam); only the
                # read-back fields (NVML_FI_PWR_SMOOTHING_PROFILE_RAMP_*_RATE) are in mW/s.
                (n.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_UP_RATE, float(ramp_up_w_per_s)),
                (n.NVML_POWER_SMOOTHING_PROFILE_PARAM_RAMP_DOWN_RATE, float(ramp_down_w_per_s)),
            ):
                profile.paramId = param
                profile.value = value
                # These wrappers pass the struct through as given: the caller must byref() it.
                n.nvmlDevicePowerSmoothingUpdatePresetProfileParam(g.handle, n.byref(profile))
            n.nvmlDevicePowerSmoothingActivatePresetProfile(g.handle, n.byref(profile))
            state = n.c_nvmlPowerSmoothingState_v1_t()
            state.state = n.NVML_FEATURE_ENABLED if enabled else n.NVML_FEATURE_DISABLED
            n.nvmlDevicePowerSmoothingSetState(g.handle, n.byref(state))
        except n.NVMLError as e:
            if e.value == device.GPU_IS_LOST:
                self._devices.mark_lost(g, None, "set power smoothing")
                raise backend_api.GpuLost(gpu_uuid) from e
            raise self._set_error(e, f"{gpu_uuid}: set power smoothing", "set power smoothing") from e

    def _set_limit_mw(self, g: device.NvmlGpu, limit_mw: int) -> None:
        n = self._devices.n
        try:
            # v1 checks its return code, so NO_PERMISSION etc. raise.
            n.nvmlDeviceSetPowerManagementLimit(g.handle, limit_mw)
            return
        except n.NVMLError as e:
            if e.value != device.FUNCTION_NOT_FOUND:
                raise
        # Only a driver without the v1 symbol gets here. pynvml's nvmlDeviceSetPowerManagementLimit_v2
        # ignores the C return code and always returns 0 (nvml-api.md §9.1), so call the C symbol
        # through pynvml's own lookup and check the code ourselves.
        value = n.c_nvmlPowerValue_v2_t()
        value.version = n.nvmlPowerValue_v2
        value.powerScope = n.NVML_POWER_SCOPE_GPU
        value.powerValueMw = limit_mw
        ret = n._nvmlGetFunctionPointer("nvmlDeviceSetPowerManagementLimit_v2")(g.handle, n.byref(value))
        if ret != n.NVML_SUCCESS:
            raise n.NVMLError(ret)

    def _settled_enforced_mw(self, g: device.NvmlGpu, requested_mw: int, before_mw: int) -> int:
        """The enforced limit once the limiter has taken the new request, or as it stands after the settle time.

        The power limiter takes a new limit a little after the set call returns: on an H200 (driver
        580.159) the enforced limit still read the old value at once and followed 10-12 ms after the
        set (bench/RESULTS.md "NVML on a real GPU"). Returning that first read would report a cap that
        was in fact applied as unconfirmed (a decrease) or not yet raised. Polls until the enforced
        limit equals the request, or has moved to below it (an out-of-band limit holds it lower), for at
        most _ENFORCE_SETTLE_S; whatever it reads then is the truth the controller gets.
        """
        n = self._devices.n
        deadline = time.monotonic() + _ENFORCE_SETTLE_S
        enforced_mw = n.nvmlDeviceGetEnforcedPowerLimit(g.handle)
        while enforced_mw != requested_mw and (enforced_mw > requested_mw or enforced_mw == before_mw):
            if time.monotonic() >= deadline:
                break
            time.sleep(_ENFORCE_POLL_S)
            enforced_mw = n.nvmlDeviceGetEnforcedPowerLimit(g.handle)
        return enforced_mw

    def _set_error(self, e: Any, what: str, during: str) -> backend_api.BackendError:
        """The error a failed set raises: why it failed, or the library's failure."""
        what = f"{what}: {e}"
        if e.value == device.NO_PERMISSION:
            return backend_api.NoPermission(what)
        if e.value == device.INVALID_ARGUMENT:
            return backend_api.InvalidValue(what)
        if e.value in device.ABSENT:
            return backend_api.NotSupported(what)
        return self._devices.library_error(e, during)
