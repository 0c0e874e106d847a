from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Severity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEVERITY_UNSPECIFIED: _ClassVar[Severity]
    SEVERITY_INFO: _ClassVar[Severity]
    SEVERITY_WARNING: _ClassVar[Severity]
    SEVERITY_ERROR: _ClassVar[Severity]
    SEVERITY_FATAL: _ClassVar[Severity]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_XID: _ClassVar[EventKind]
    EVENT_KIND_ECC_DBE: _ClassVar[EventKind]
    EVENT_KIND_ECC_SBE_RATE: _ClassVar[EventKind]
    EVENT_KIND_ROW_REMAP_PENDING: _ClassVar[EventKind]
    EVENT_KIND_ROW_REMAP_FAILURE: _ClassVar[EventKind]
    EVENT_KIND_RETIRED_PAGES: _ClassVar[EventKind]
    EVENT_KIND_FALLEN_OFF_BUS: _ClassVar[EventKind]
    EVENT_KIND_GPU_LOST: _ClassVar[EventKind]
    EVENT_KIND_NVLINK_DOWN: _ClassVar[EventKind]
    EVENT_KIND_NVLINK_ERRORS: _ClassVar[EventKind]
    EVENT_KIND_PCIE_REPLAY: _ClassVar[EventKind]
    EVENT_KIND_IB_LINK_STATE: _ClassVar[EventKind]
    EVENT_KIND_SXID: _ClassVar[EventKind]
    EVENT_KIND_RECOVERY_ACTION: _ClassVar[EventKind]
    EVENT_KIND_POWER_EXCURSION: _ClassVar[EventKind]
    EVENT_KIND_THERMAL: _ClassVar[EventKind]
    EVENT_KIND_SDC_SUSPECT: _ClassVar[EventKind]
    EVENT_KIND_STRAGGLER: _ClassVar[EventKind]
    EVENT_KIND_NODE_LOST: _ClassVar[EventKind]

class TelemetryFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TELEMETRY_FORMAT_UNSPECIFIED: _ClassVar[TelemetryFormat]
    TELEMETRY_FORMAT_RAW: _ClassVar[TelemetryFormat]
    TELEMETRY_FORMAT_SUMMARY: _ClassVar[TelemetryFormat]
SEVERITY_UNSPECIFIED: Severity
SEVERITY_INFO: Severity
SEVERITY_WARNING: Severity
SEVERITY_ERROR: Severity
SEVERITY_FATAL: Severity
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_XID: EventKind
EVENT_KIND_ECC_DBE: EventKind
EVENT_KIND_ECC_SBE_RATE: EventKind
EVENT_KIND_ROW_REMAP_PENDING: EventKind
EVENT_KIND_ROW_REMAP_FAILURE: EventKind
EVENT_KIND_RETIRED_PAGES: EventKind
EVENT_KIND_FALLEN_OFF_BUS: EventKind
EVENT_KIND_GPU_LOST: EventKind
EVENT_KIND_NVLINK_DOWN: EventKind
EVENT_KIND_NVLINK_ERRORS: EventKind
EVENT_KIND_PCIE_REPLAY: EventKind
EVENT_KIND_IB_LINK_STATE: EventKind
EVENT_KIND_SXID: EventKind
EVENT_KIND_RECOVERY_ACTION: EventKind
EVENT_KIND_POWER_EXCURSION: EventKind
EVENT_KIND_THERMAL: EventKind
EVENT_KIND_SDC_SUSPECT: EventKind
EVENT_KIND_STRAGGLER: EventKind
EVENT_KIND_NODE_LOST: EventKind
TELEMETRY_FORMAT_UNSPECIFIED: TelemetryFormat
TELEMETRY_FORMAT_RAW: TelemetryFormat
TELEMETRY_FORMAT_SUMMARY: TelemetryFormat

class GpuInfo(_message.Message):
    __slots__ = ("uuid", "model", "pci_bus_id", "serial", "vbios_version", "memory_total_mib", "power_limit_min_w", "power_limit_max_w", "power_limit_default_w", "power_smoothing_supported", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    VBIOS_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_MIB_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_MIN_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_MAX_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_DEFAULT_W_FIELD_NUMBER: _ClassVar[int]
    POWER_SMOOTHING_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    model: str
    pci_bus_id: str
    serial: str
    vbios_version: str
    memory_total_mib: int
    power_limit_min_w: int
    power_limit_max_w: int
    power_limit_default_w: int
    power_smoothing_supported: bool
    labels: _containers.ScalarMap[str, str]
    def __init__(self, uuid: _Optional[str] = ..., model: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., serial: _Optional[str] = ..., vbios_version: _Optional[str] = ..., memory_total_mib: _Optional[int] = ..., power_limit_min_w: _Optional[int] = ..., power_limit_max_w: _Optional[int] = ..., power_limit_default_w: _Optional[int] = ..., power_smoothing_supported: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PowerSeries(_message.Message):
    __slots__ = ("gpu_uuid", "first_sample_unix_ns", "sample_interval_ms", "power_w")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    FIRST_SAMPLE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    first_sample_unix_ns: int
    sample_interval_ms: int
    power_w: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, gpu_uuid: _Optional[str] = ..., first_sample_unix_ns: _Optional[int] = ..., sample_interval_ms: _Optional[int] = ..., power_w: _Optional[_Iterable[float]] = ...) -> None: ...

class NvLinkCounters(_message.Message):
    __slots__ = ("link", "active", "crc_errors", "replay_errors", "recovery_errors")
    LINK_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    CRC_ERRORS_FIELD_NUMBER: _ClassVar[int]
    REPLAY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    link: int
    active: bool
    crc_errors: int
    replay_errors: int
    recovery_errors: int
    def __init__(self, link: _Optional[int] = ..., active: _Optional[bool] = ..., crc_errors: _Optional[int] = ..., replay_errors: _Optional[int] = ..., recovery_errors: _Optional[int] = ...) -> None: ...

class GpuCounters(_message.Message):
    __slots__ = ("gpu_uuid", "sample_unix_ns", "enforced_power_limit_w", "requested_power_limit_w", "total_energy_mj", "temperature_c", "utilization_gpu_pct", "clock_event_reasons", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure", "pcie_replay_count", "recovery_action", "nvlinks", "power_smoothing_enabled", "nvlink_sample_unix_ns", "power_limit_slew_target_w", "pcie_link_width", "pcie_link_width_max", "pcie_link_gen", "pcie_link_gen_max")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ENFORCED_POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ENERGY_MJ_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_GPU_PCT_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_DBE_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    ECC_DBE_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_SBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_DBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_FAILURE_FIELD_NUMBER: _ClassVar[int]
    PCIE_REPLAY_COUNT_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ACTION_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_FIELD_NUMBER: _ClassVar[int]
    POWER_SMOOTHING_ENABLED_FIELD_NUMBER: _ClassVar[int]
    NVLINK_SAMPLE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_SLEW_TARGET_W_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_WIDTH_MAX_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_GEN_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_GEN_MAX_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    sample_unix_ns: int
    enforced_power_limit_w: int
    requested_power_limit_w: int
    total_energy_mj: int
    temperature_c: int
    utilization_gpu_pct: int
    clock_event_reasons: int
    ecc_sbe_volatile: int
    ecc_dbe_volatile: int
    ecc_sbe_aggregate: int
    ecc_dbe_aggregate: int
    retired_pages_sbe: int
    retired_pages_dbe: int
    retired_pages_pending: bool
    remapped_rows_correctable: int
    remapped_rows_uncorrectable: int
    remapped_rows_pending: bool
    remapped_rows_failure: bool
    pcie_replay_count: int
    recovery_action: int
    nvlinks: _containers.RepeatedCompositeFieldContainer[NvLinkCounters]
    power_smoothing_enabled: bool
    nvlink_sample_unix_ns: int
    power_limit_slew_target_w: int
    pcie_link_width: int
    pcie_link_width_max: int
    pcie_link_gen: int
    pcie_link_gen_max: int
    def __init__(self, gpu_uuid: _Optional[str] = ..., sample_unix_ns: _Optional[int] = ..., enforced_power_limit_w: _Optional[int] = ..., requested_power_limit_w: _Optional[int] = ..., total_energy_mj: _Optional[int] = ..., temperature_c: _Optional[int] = ..., utilization_gpu_pct: _Optional[int] = ..., clock_event_reasons: _Optional[int] = ..., ecc_sbe_volatile: _Optional[int] = ..., ecc_dbe_volatile: _Optional[int] = ..., ecc_sbe_aggregate: _Optional[int] = ..., ecc_dbe_aggregate: _Optional[int] = ..., retired_pages_sbe: _Optional[int] = ..., retired_pages_dbe: _Optional[int] = ..., retired_pages_pending: _Optional[bool] = ..., remapped_rows_correctable: _Optional[int] = ..., remapped_rows_uncorrectable: _Optional[int] = ..., remapped_rows_pending: _Optional[bool] = ..., remapped_rows_failure: _Optional[bool] = ..., pcie_replay_count: _Optional[int] = ..., recovery_action: _Optional[int] = ..., nvlinks: _Optional[_Iterable[_Union[NvLinkCounters, _Mapping]]] = ..., power_smoothing_enabled: _Optional[bool] = ..., nvlink_sample_unix_ns: _Optional[int] = ..., power_limit_slew_target_w: _Optional[int] = ..., pcie_link_width: _Optional[int] = ..., pcie_link_width_max: _Optional[int] = ..., pcie_link_gen: _Optional[int] = ..., pcie_link_gen_max: _Optional[int] = ...) -> None: ...

class TelemetryBatch(_message.Message):
    __slots__ = ("power", "counters")
    POWER_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    power: _containers.RepeatedCompositeFieldContainer[PowerSeries]
    counters: _containers.RepeatedCompositeFieldContainer[GpuCounters]
    def __init__(self, power: _Optional[_Iterable[_Union[PowerSeries, _Mapping]]] = ..., counters: _Optional[_Iterable[_Union[GpuCounters, _Mapping]]] = ...) -> None: ...

class GpuPowerSummary(_message.Message):
    __slots__ = ("gpu_uuid", "samples", "mean_w", "min_w", "max_w", "last_w", "last_sample_unix_ns", "counters_sample_unix_ns", "enforced_power_limit_w", "power_limit_slew_target_w", "clock_event_reasons", "utilization_gpu_pct", "falling_edge_unix_ns")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MEAN_W_FIELD_NUMBER: _ClassVar[int]
    MIN_W_FIELD_NUMBER: _ClassVar[int]
    MAX_W_FIELD_NUMBER: _ClassVar[int]
    LAST_W_FIELD_NUMBER: _ClassVar[int]
    LAST_SAMPLE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_SAMPLE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ENFORCED_POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_SLEW_TARGET_W_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_GPU_PCT_FIELD_NUMBER: _ClassVar[int]
    FALLING_EDGE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    samples: int
    mean_w: float
    min_w: float
    max_w: float
    last_w: float
    last_sample_unix_ns: int
    counters_sample_unix_ns: int
    enforced_power_limit_w: int
    power_limit_slew_target_w: int
    clock_event_reasons: int
    utilization_gpu_pct: int
    falling_edge_unix_ns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, gpu_uuid: _Optional[str] = ..., samples: _Optional[int] = ..., mean_w: _Optional[float] = ..., min_w: _Optional[float] = ..., max_w: _Optional[float] = ..., last_w: _Optional[float] = ..., last_sample_unix_ns: _Optional[int] = ..., counters_sample_unix_ns: _Optional[int] = ..., enforced_power_limit_w: _Optional[int] = ..., power_limit_slew_target_w: _Optional[int] = ..., clock_event_reasons: _Optional[int] = ..., utilization_gpu_pct: _Optional[int] = ..., falling_edge_unix_ns: _Optional[_Iterable[int]] = ...) -> None: ...

class NodePowerSeries(_message.Message):
    __slots__ = ("first_sample_unix_ns", "sample_interval_ms", "power_w", "gpus")
    FIRST_SAMPLE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    first_sample_unix_ns: int
    sample_interval_ms: int
    power_w: _containers.RepeatedScalarFieldContainer[float]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, first_sample_unix_ns: _Optional[int] = ..., sample_interval_ms: _Optional[int] = ..., power_w: _Optional[_Iterable[float]] = ..., gpus: _Optional[_Iterable[int]] = ...) -> None: ...

class TelemetrySummary(_message.Message):
    __slots__ = ("gpus", "node_power", "full_rate", "counters")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODE_POWER_FIELD_NUMBER: _ClassVar[int]
    FULL_RATE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuPowerSummary]
    node_power: NodePowerSeries
    full_rate: _containers.RepeatedCompositeFieldContainer[PowerSeries]
    counters: _containers.RepeatedCompositeFieldContainer[GpuCounters]
    def __init__(self, gpus: _Optional[_Iterable[_Union[GpuPowerSummary, _Mapping]]] = ..., node_power: _Optional[_Union[NodePowerSeries, _Mapping]] = ..., full_rate: _Optional[_Iterable[_Union[PowerSeries, _Mapping]]] = ..., counters: _Optional[_Iterable[_Union[GpuCounters, _Mapping]]] = ...) -> None: ...

class HealthEvent(_message.Message):
    __slots__ = ("seq", "observed_unix_ns", "kind", "gpu_uuid", "xid", "severity", "message", "source", "attributes", "kernel_log")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    KERNEL_LOG_FIELD_NUMBER: _ClassVar[int]
    seq: int
    observed_unix_ns: int
    kind: EventKind
    gpu_uuid: str
    xid: int
    severity: Severity
    message: str
    source: str
    attributes: _containers.ScalarMap[str, str]
    kernel_log: KernelLogFacts
    def __init__(self, seq: _Optional[int] = ..., observed_unix_ns: _Optional[int] = ..., kind: _Optional[_Union[EventKind, str]] = ..., gpu_uuid: _Optional[str] = ..., xid: _Optional[int] = ..., severity: _Optional[_Union[Severity, str]] = ..., message: _Optional[str] = ..., source: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ..., kernel_log: _Optional[_Union[KernelLogFacts, _Mapping]] = ...) -> None: ...

class KernelLogFacts(_message.Message):
    __slots__ = ("raw", "pci_bus_id", "pid", "process_name", "kernel_time_us", "gpu_instance", "compute_instance", "nvlink", "nvlink_registers", "nvlink_subcode", "nvlink_fatal", "recovery_action", "previous_recovery_action", "sxid", "sxid_fatal", "nvswitch", "ib_device", "ib_port", "ib_state")
    RAW_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_NAME_FIELD_NUMBER: _ClassVar[int]
    KERNEL_TIME_US_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    NVLINK_FIELD_NUMBER: _ClassVar[int]
    NVLINK_REGISTERS_FIELD_NUMBER: _ClassVar[int]
    NVLINK_SUBCODE_FIELD_NUMBER: _ClassVar[int]
    NVLINK_FATAL_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ACTION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_RECOVERY_ACTION_FIELD_NUMBER: _ClassVar[int]
    SXID_FIELD_NUMBER: _ClassVar[int]
    SXID_FATAL_FIELD_NUMBER: _ClassVar[int]
    NVSWITCH_FIELD_NUMBER: _ClassVar[int]
    IB_DEVICE_FIELD_NUMBER: _ClassVar[int]
    IB_PORT_FIELD_NUMBER: _ClassVar[int]
    IB_STATE_FIELD_NUMBER: _ClassVar[int]
    raw: str
    pci_bus_id: str
    pid: int
    process_name: str
    kernel_time_us: int
    gpu_instance: int
    compute_instance: int
    nvlink: int
    nvlink_registers: _containers.RepeatedScalarFieldContainer[int]
    nvlink_subcode: str
    nvlink_fatal: bool
    recovery_action: int
    previous_recovery_action: int
    sxid: int
    sxid_fatal: bool
    nvswitch: str
    ib_device: str
    ib_port: int
    ib_state: str
    def __init__(self, raw: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., pid: _Optional[int] = ..., process_name: _Optional[str] = ..., kernel_time_us: _Optional[int] = ..., gpu_instance: _Optional[int] = ..., compute_instance: _Optional[int] = ..., nvlink: _Optional[int] = ..., nvlink_registers: _Optional[_Iterable[int]] = ..., nvlink_subcode: _Optional[str] = ..., nvlink_fatal: _Optional[bool] = ..., recovery_action: _Optional[int] = ..., previous_recovery_action: _Optional[int] = ..., sxid: _Optional[int] = ..., sxid_fatal: _Optional[bool] = ..., nvswitch: _Optional[str] = ..., ib_device: _Optional[str] = ..., ib_port: _Optional[int] = ..., ib_state: _Optional[str] = ...) -> None: ...
