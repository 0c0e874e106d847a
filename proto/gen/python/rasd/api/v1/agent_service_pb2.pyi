from rasd.api.v1 import commands_pb2 as _commands_pb2
from rasd.api.v1 import health_pb2 as _health_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Hello(_message.Message):
    __slots__ = ("node_id", "boot_id", "agent_version", "gpus", "labels", "hostname", "spool_head_seq", "backend", "sent_unix_ns", "spool_id", "spool_acked_seq", "telemetry_formats")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    SPOOL_HEAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SPOOL_ID_FIELD_NUMBER: _ClassVar[int]
    SPOOL_ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FORMATS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    boot_id: str
    agent_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[_health_pb2.GpuInfo]
    labels: _containers.ScalarMap[str, str]
    hostname: str
    spool_head_seq: int
    backend: str
    sent_unix_ns: int
    spool_id: str
    spool_acked_seq: int
    telemetry_formats: _containers.RepeatedScalarFieldContainer[_health_pb2.TelemetryFormat]
    def __init__(self, node_id: _Optional[str] = ..., boot_id: _Optional[str] = ..., agent_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_health_pb2.GpuInfo, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., hostname: _Optional[str] = ..., spool_head_seq: _Optional[int] = ..., backend: _Optional[str] = ..., sent_unix_ns: _Optional[int] = ..., spool_id: _Optional[str] = ..., spool_acked_seq: _Optional[int] = ..., telemetry_formats: _Optional[_Iterable[_Union[_health_pb2.TelemetryFormat, str]]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sent_unix_ns", "spool_depth")
    SENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SPOOL_DEPTH_FIELD_NUMBER: _ClassVar[int]
    sent_unix_ns: int
    spool_depth: int
    def __init__(self, sent_unix_ns: _Optional[int] = ..., spool_depth: _Optional[int] = ...) -> None: ...

class HealthEventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_health_pb2.HealthEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[_health_pb2.HealthEvent, _Mapping]]] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "telemetry", "events", "action_result", "heartbeat", "summary")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ACTION_RESULT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    telemetry: _health_pb2.TelemetryBatch
    events: HealthEventBatch
    action_result: _commands_pb2.ActionResult
    heartbeat: Heartbeat
    summary: _health_pb2.TelemetrySummary
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., telemetry: _Optional[_Union[_health_pb2.TelemetryBatch, _Mapping]] = ..., events: _Optional[_Union[HealthEventBatch, _Mapping]] = ..., action_result: _Optional[_Union[_commands_pb2.ActionResult, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., summary: _Optional[_Union[_health_pb2.TelemetrySummary, _Mapping]] = ...) -> None: ...

class AgentConfig(_message.Message):
    __slots__ = ("power_sample_interval_ms", "counter_interval_ms", "telemetry_send_interval_ms", "heartbeat_interval_ms", "telemetry_format")
    POWER_SAMPLE_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    COUNTER_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_SEND_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FORMAT_FIELD_NUMBER: _ClassVar[int]
    power_sample_interval_ms: int
    counter_interval_ms: int
    telemetry_send_interval_ms: int
    heartbeat_interval_ms: int
    telemetry_format: _health_pb2.TelemetryFormat
    def __init__(self, power_sample_interval_ms: _Optional[int] = ..., counter_interval_ms: _Optional[int] = ..., telemetry_send_interval_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., telemetry_format: _Optional[_Union[_health_pb2.TelemetryFormat, str]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("controller_version", "acked_seq", "config", "session_id")
    CONTROLLER_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    controller_version: str
    acked_seq: int
    config: AgentConfig
    session_id: str
    def __init__(self, controller_version: _Optional[str] = ..., acked_seq: _Optional[int] = ..., config: _Optional[_Union[AgentConfig, _Mapping]] = ..., session_id: _Optional[str] = ...) -> None: ...

class FullRateRequest(_message.Message):
    __slots__ = ("gpu_uuids",)
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, gpu_uuids: _Optional[_Iterable[str]] = ...) -> None: ...

class EventAck(_message.Message):
    __slots__ = ("acked_seq",)
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    acked_seq: int
    def __init__(self, acked_seq: _Optional[int] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("welcome", "ack", "command", "full_rate")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    FULL_RATE_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    ack: EventAck
    command: _commands_pb2.Command
    full_rate: FullRateRequest
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., ack: _Optional[_Union[EventAck, _Mapping]] = ..., command: _Optional[_Union[_commands_pb2.Command, _Mapping]] = ..., full_rate: _Optional[_Union[FullRateRequest, _Mapping]] = ...) -> None: ...
