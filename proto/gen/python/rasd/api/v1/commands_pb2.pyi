from rasd.api.v1 import health_pb2 as _health_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ActionOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTION_OUTCOME_UNSPECIFIED: _ClassVar[ActionOutcome]
    ACTION_OUTCOME_SUCCEEDED: _ClassVar[ActionOutcome]
    ACTION_OUTCOME_FAILED: _ClassVar[ActionOutcome]
    ACTION_OUTCOME_REFUSED: _ClassVar[ActionOutcome]
    ACTION_OUTCOME_NOT_SUPPORTED: _ClassVar[ActionOutcome]
    ACTION_OUTCOME_TIMED_OUT: _ClassVar[ActionOutcome]
    ACTION_OUTCOME_DRY_RUN: _ClassVar[ActionOutcome]
ACTION_OUTCOME_UNSPECIFIED: ActionOutcome
ACTION_OUTCOME_SUCCEEDED: ActionOutcome
ACTION_OUTCOME_FAILED: ActionOutcome
ACTION_OUTCOME_REFUSED: ActionOutcome
ACTION_OUTCOME_NOT_SUPPORTED: ActionOutcome
ACTION_OUTCOME_TIMED_OUT: ActionOutcome
ACTION_OUTCOME_DRY_RUN: ActionOutcome

class GpuPowerLimit(_message.Message):
    __slots__ = ("gpu_uuid", "power_limit_w", "max_raise_w_per_s", "slew_target_w")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    MAX_RAISE_W_PER_S_FIELD_NUMBER: _ClassVar[int]
    SLEW_TARGET_W_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    power_limit_w: int
    max_raise_w_per_s: float
    slew_target_w: int
    def __init__(self, gpu_uuid: _Optional[str] = ..., power_limit_w: _Optional[int] = ..., max_raise_w_per_s: _Optional[float] = ..., slew_target_w: _Optional[int] = ...) -> None: ...

class SetPowerCap(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[GpuPowerLimit]
    def __init__(self, limits: _Optional[_Iterable[_Union[GpuPowerLimit, _Mapping]]] = ...) -> None: ...

class SetPowerSmoothing(_message.Message):
    __slots__ = ("gpu_uuids", "enabled", "floor_pct", "ramp_up_w_per_s", "ramp_down_w_per_s")
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    FLOOR_PCT_FIELD_NUMBER: _ClassVar[int]
    RAMP_UP_W_PER_S_FIELD_NUMBER: _ClassVar[int]
    RAMP_DOWN_W_PER_S_FIELD_NUMBER: _ClassVar[int]
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    enabled: bool
    floor_pct: float
    ramp_up_w_per_s: float
    ramp_down_w_per_s: float
    def __init__(self, gpu_uuids: _Optional[_Iterable[str]] = ..., enabled: _Optional[bool] = ..., floor_pct: _Optional[float] = ..., ramp_up_w_per_s: _Optional[float] = ..., ramp_down_w_per_s: _Optional[float] = ...) -> None: ...

class SetTroughFiller(_message.Message):
    __slots__ = ("gpu_uuids", "enabled", "floor_w", "ramp_down_w_per_s")
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    FLOOR_W_FIELD_NUMBER: _ClassVar[int]
    RAMP_DOWN_W_PER_S_FIELD_NUMBER: _ClassVar[int]
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    enabled: bool
    floor_w: float
    ramp_down_w_per_s: float
    def __init__(self, gpu_uuids: _Optional[_Iterable[str]] = ..., enabled: _Optional[bool] = ..., floor_w: _Optional[float] = ..., ramp_down_w_per_s: _Optional[float] = ...) -> None: ...

class RestartProcess(_message.Message):
    __slots__ = ("gpu_uuid", "pids", "systemd_unit", "grace_s")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    SYSTEMD_UNIT_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    pids: _containers.RepeatedScalarFieldContainer[int]
    systemd_unit: str
    grace_s: float
    def __init__(self, gpu_uuid: _Optional[str] = ..., pids: _Optional[_Iterable[int]] = ..., systemd_unit: _Optional[str] = ..., grace_s: _Optional[float] = ...) -> None: ...

class ResetGpu(_message.Message):
    __slots__ = ("gpu_uuid",)
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    def __init__(self, gpu_uuid: _Optional[str] = ...) -> None: ...

class RebootNode(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunValidation(_message.Message):
    __slots__ = ("suite", "gpu_uuids", "seed")
    SUITE_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    suite: str
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    def __init__(self, suite: _Optional[str] = ..., gpu_uuids: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("command_id", "issued_unix_ns", "deadline_unix_ns", "reason", "deadline_agent_unix_ns", "set_power_cap", "set_power_smoothing", "restart_process", "reset_gpu", "reboot_node", "run_validation", "set_trough_filler")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    ISSUED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AGENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SET_POWER_CAP_FIELD_NUMBER: _ClassVar[int]
    SET_POWER_SMOOTHING_FIELD_NUMBER: _ClassVar[int]
    RESTART_PROCESS_FIELD_NUMBER: _ClassVar[int]
    RESET_GPU_FIELD_NUMBER: _ClassVar[int]
    REBOOT_NODE_FIELD_NUMBER: _ClassVar[int]
    RUN_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    SET_TROUGH_FILLER_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    issued_unix_ns: int
    deadline_unix_ns: int
    reason: str
    deadline_agent_unix_ns: int
    set_power_cap: SetPowerCap
    set_power_smoothing: SetPowerSmoothing
    restart_process: RestartProcess
    reset_gpu: ResetGpu
    reboot_node: RebootNode
    run_validation: RunValidation
    set_trough_filler: SetTroughFiller
    def __init__(self, command_id: _Optional[str] = ..., issued_unix_ns: _Optional[int] = ..., deadline_unix_ns: _Optional[int] = ..., reason: _Optional[str] = ..., deadline_agent_unix_ns: _Optional[int] = ..., set_power_cap: _Optional[_Union[SetPowerCap, _Mapping]] = ..., set_power_smoothing: _Optional[_Union[SetPowerSmoothing, _Mapping]] = ..., restart_process: _Optional[_Union[RestartProcess, _Mapping]] = ..., reset_gpu: _Optional[_Union[ResetGpu, _Mapping]] = ..., reboot_node: _Optional[_Union[RebootNode, _Mapping]] = ..., run_validation: _Optional[_Union[RunValidation, _Mapping]] = ..., set_trough_filler: _Optional[_Union[SetTroughFiller, _Mapping]] = ...) -> None: ...

class CheckVerdict(_message.Message):
    __slots__ = ("check", "gpu_uuid", "verdict", "evidence", "duration_s")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    check: str
    gpu_uuid: str
    verdict: str
    evidence: str
    duration_s: float
    def __init__(self, check: _Optional[str] = ..., gpu_uuid: _Optional[str] = ..., verdict: _Optional[str] = ..., evidence: _Optional[str] = ..., duration_s: _Optional[float] = ...) -> None: ...

class ActionResult(_message.Message):
    __slots__ = ("command_id", "outcome", "message", "started_unix_ns", "finished_unix_ns", "enforced_limits", "verdicts", "validation_verdict", "replayed", "severity")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ENFORCED_LIMITS_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_VERDICT_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    outcome: ActionOutcome
    message: str
    started_unix_ns: int
    finished_unix_ns: int
    enforced_limits: _containers.RepeatedCompositeFieldContainer[GpuPowerLimit]
    verdicts: _containers.RepeatedCompositeFieldContainer[CheckVerdict]
    validation_verdict: str
    replayed: bool
    severity: _health_pb2.Severity
    def __init__(self, command_id: _Optional[str] = ..., outcome: _Optional[_Union[ActionOutcome, str]] = ..., message: _Optional[str] = ..., started_unix_ns: _Optional[int] = ..., finished_unix_ns: _Optional[int] = ..., enforced_limits: _Optional[_Iterable[_Union[GpuPowerLimit, _Mapping]]] = ..., verdicts: _Optional[_Iterable[_Union[CheckVerdict, _Mapping]]] = ..., validation_verdict: _Optional[str] = ..., replayed: _Optional[bool] = ..., severity: _Optional[_Union[_health_pb2.Severity, str]] = ...) -> None: ...
