from rasd.api.v1 import health_pb2 as _health_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ComponentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPONENT_STATE_UNSPECIFIED: _ClassVar[ComponentState]
    COMPONENT_STATE_HEALTHY: _ClassVar[ComponentState]
    COMPONENT_STATE_DEGRADED: _ClassVar[ComponentState]
    COMPONENT_STATE_REPAIRING: _ClassVar[ComponentState]
    COMPONENT_STATE_QUARANTINED: _ClassVar[ComponentState]
    COMPONENT_STATE_VALIDATING: _ClassVar[ComponentState]
    COMPONENT_STATE_RMA: _ClassVar[ComponentState]
    COMPONENT_STATE_OFFLINE: _ClassVar[ComponentState]
COMPONENT_STATE_UNSPECIFIED: ComponentState
COMPONENT_STATE_HEALTHY: ComponentState
COMPONENT_STATE_DEGRADED: ComponentState
COMPONENT_STATE_REPAIRING: ComponentState
COMPONENT_STATE_QUARANTINED: ComponentState
COMPONENT_STATE_VALIDATING: ComponentState
COMPONENT_STATE_RMA: ComponentState
COMPONENT_STATE_OFFLINE: ComponentState

class Target(_message.Message):
    __slots__ = ("node_id", "gpu_uuid")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpu_uuid: str
    def __init__(self, node_id: _Optional[str] = ..., gpu_uuid: _Optional[str] = ...) -> None: ...

class GpuStatus(_message.Message):
    __slots__ = ("uuid", "model", "state", "power_w", "power_limit_w", "power_limit_min_w", "power_limit_max_w", "temperature_c", "utilization_gpu_pct", "last_sample_unix_ns", "pci_bus_id")
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_MIN_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_MAX_W_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_GPU_PCT_FIELD_NUMBER: _ClassVar[int]
    LAST_SAMPLE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    model: str
    state: ComponentState
    power_w: float
    power_limit_w: int
    power_limit_min_w: int
    power_limit_max_w: int
    temperature_c: int
    utilization_gpu_pct: int
    last_sample_unix_ns: int
    pci_bus_id: str
    def __init__(self, uuid: _Optional[str] = ..., model: _Optional[str] = ..., state: _Optional[_Union[ComponentState, str]] = ..., power_w: _Optional[float] = ..., power_limit_w: _Optional[int] = ..., power_limit_min_w: _Optional[int] = ..., power_limit_max_w: _Optional[int] = ..., temperature_c: _Optional[int] = ..., utilization_gpu_pct: _Optional[int] = ..., last_sample_unix_ns: _Optional[int] = ..., pci_bus_id: _Optional[str] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "state", "connected", "last_seen_unix_ns", "boot_id", "agent_version", "backend", "labels", "gpus", "power_draw_w", "power_cap_w", "hostname")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    POWER_DRAW_W_FIELD_NUMBER: _ClassVar[int]
    POWER_CAP_W_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: ComponentState
    connected: bool
    last_seen_unix_ns: int
    boot_id: str
    agent_version: str
    backend: str
    labels: _containers.ScalarMap[str, str]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuStatus]
    power_draw_w: float
    power_cap_w: int
    hostname: str
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[_Union[ComponentState, str]] = ..., connected: _Optional[bool] = ..., last_seen_unix_ns: _Optional[int] = ..., boot_id: _Optional[str] = ..., agent_version: _Optional[str] = ..., backend: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., gpus: _Optional[_Iterable[_Union[GpuStatus, _Mapping]]] = ..., power_draw_w: _Optional[float] = ..., power_cap_w: _Optional[int] = ..., hostname: _Optional[str] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("label_selector", "page_size", "page_token")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    label_selector: _containers.ScalarMap[str, str]
    page_size: int
    page_token: str
    def __init__(self, label_selector: _Optional[_Mapping[str, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "next_page_token")
    NODES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    next_page_token: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class GetNodeResponse(_message.Message):
    __slots__ = ("node", "recent_events", "repairs", "quarantines")
    NODE_FIELD_NUMBER: _ClassVar[int]
    RECENT_EVENTS_FIELD_NUMBER: _ClassVar[int]
    REPAIRS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINES_FIELD_NUMBER: _ClassVar[int]
    node: NodeStatus
    recent_events: _containers.RepeatedCompositeFieldContainer[StoredEvent]
    repairs: _containers.RepeatedCompositeFieldContainer[Repair]
    quarantines: _containers.RepeatedCompositeFieldContainer[QuarantineRecord]
    def __init__(self, node: _Optional[_Union[NodeStatus, _Mapping]] = ..., recent_events: _Optional[_Iterable[_Union[StoredEvent, _Mapping]]] = ..., repairs: _Optional[_Iterable[_Union[Repair, _Mapping]]] = ..., quarantines: _Optional[_Iterable[_Union[QuarantineRecord, _Mapping]]] = ...) -> None: ...

class QuarantineRecord(_message.Message):
    __slots__ = ("target", "port", "reason", "source", "since_unix_ns")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    target: Target
    port: str
    reason: str
    source: str
    since_unix_ns: int
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., port: _Optional[str] = ..., reason: _Optional[str] = ..., source: _Optional[str] = ..., since_unix_ns: _Optional[int] = ...) -> None: ...

class StoredEvent(_message.Message):
    __slots__ = ("node_id", "event", "received_unix_ns")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    event: _health_pb2.HealthEvent
    received_unix_ns: int
    def __init__(self, node_id: _Optional[str] = ..., event: _Optional[_Union[_health_pb2.HealthEvent, _Mapping]] = ..., received_unix_ns: _Optional[int] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("node_id", "since_unix_ns", "limit", "page_token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    since_unix_ns: int
    limit: int
    page_token: str
    def __init__(self, node_id: _Optional[str] = ..., since_unix_ns: _Optional[int] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[StoredEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[StoredEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Incident(_message.Message):
    __slots__ = ("incident_id", "target", "cause", "severity", "opened_unix_ns", "closed_unix_ns", "event_seqs", "state")
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    OPENED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    EVENT_SEQS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    incident_id: str
    target: Target
    cause: str
    severity: _health_pb2.Severity
    opened_unix_ns: int
    closed_unix_ns: int
    event_seqs: _containers.RepeatedScalarFieldContainer[int]
    state: str
    def __init__(self, incident_id: _Optional[str] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., cause: _Optional[str] = ..., severity: _Optional[_Union[_health_pb2.Severity, str]] = ..., opened_unix_ns: _Optional[int] = ..., closed_unix_ns: _Optional[int] = ..., event_seqs: _Optional[_Iterable[int]] = ..., state: _Optional[str] = ...) -> None: ...

class ListIncidentsRequest(_message.Message):
    __slots__ = ("node_id", "open_only", "limit", "page_token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_ONLY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    open_only: bool
    limit: int
    page_token: str
    def __init__(self, node_id: _Optional[str] = ..., open_only: _Optional[bool] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListIncidentsResponse(_message.Message):
    __slots__ = ("incidents", "next_page_token")
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    incidents: _containers.RepeatedCompositeFieldContainer[Incident]
    next_page_token: str
    def __init__(self, incidents: _Optional[_Iterable[_Union[Incident, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RepairStep(_message.Message):
    __slots__ = ("command_id", "rung", "outcome", "reason", "at_unix_ns")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    RUNG_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    rung: str
    outcome: str
    reason: str
    at_unix_ns: int
    def __init__(self, command_id: _Optional[str] = ..., rung: _Optional[str] = ..., outcome: _Optional[str] = ..., reason: _Optional[str] = ..., at_unix_ns: _Optional[int] = ...) -> None: ...

class Repair(_message.Message):
    __slots__ = ("ticket_id", "target", "incident_id", "state", "rung", "reason", "steps", "opened_unix_ns", "updated_unix_ns")
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUNG_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    OPENED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ticket_id: str
    target: Target
    incident_id: str
    state: str
    rung: str
    reason: str
    steps: _containers.RepeatedCompositeFieldContainer[RepairStep]
    opened_unix_ns: int
    updated_unix_ns: int
    def __init__(self, ticket_id: _Optional[str] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., incident_id: _Optional[str] = ..., state: _Optional[str] = ..., rung: _Optional[str] = ..., reason: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[RepairStep, _Mapping]]] = ..., opened_unix_ns: _Optional[int] = ..., updated_unix_ns: _Optional[int] = ...) -> None: ...

class ListRepairsRequest(_message.Message):
    __slots__ = ("node_id", "open_only", "limit", "page_token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_ONLY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    open_only: bool
    limit: int
    page_token: str
    def __init__(self, node_id: _Optional[str] = ..., open_only: _Optional[bool] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRepairsResponse(_message.Message):
    __slots__ = ("repairs", "next_page_token")
    REPAIRS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    repairs: _containers.RepeatedCompositeFieldContainer[Repair]
    next_page_token: str
    def __init__(self, repairs: _Optional[_Iterable[_Union[Repair, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class QuarantineRequest(_message.Message):
    __slots__ = ("target", "reason")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    target: Target
    reason: str
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class QuarantineResponse(_message.Message):
    __slots__ = ("target", "state")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    target: Target
    state: ComponentState
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., state: _Optional[_Union[ComponentState, str]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("target", "reason", "force")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    target: Target
    reason: str
    force: bool
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., reason: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("target", "state")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    target: Target
    state: ComponentState
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., state: _Optional[_Union[ComponentState, str]] = ...) -> None: ...

class ValidateRequest(_message.Message):
    __slots__ = ("target", "suite", "seed")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SUITE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    target: Target
    suite: str
    seed: int
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., suite: _Optional[str] = ..., seed: _Optional[int] = ...) -> None: ...

class ValidateResponse(_message.Message):
    __slots__ = ("validation_id", "command_id")
    VALIDATION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    validation_id: str
    command_id: str
    def __init__(self, validation_id: _Optional[str] = ..., command_id: _Optional[str] = ...) -> None: ...

class AccuseSdcRequest(_message.Message):
    __slots__ = ("target", "reason", "accuser")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACCUSER_FIELD_NUMBER: _ClassVar[int]
    target: Target
    reason: str
    accuser: str
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., reason: _Optional[str] = ..., accuser: _Optional[str] = ...) -> None: ...

class AccuseSdcResponse(_message.Message):
    __slots__ = ("incident_id",)
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    incident_id: str
    def __init__(self, incident_id: _Optional[str] = ...) -> None: ...

class Validation(_message.Message):
    __slots__ = ("validation_id", "target", "suite", "verdict", "started_unix_ns", "finished_unix_ns", "evidence_json")
    VALIDATION_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SUITE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    validation_id: str
    target: Target
    suite: str
    verdict: str
    started_unix_ns: int
    finished_unix_ns: int
    evidence_json: str
    def __init__(self, validation_id: _Optional[str] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., suite: _Optional[str] = ..., verdict: _Optional[str] = ..., started_unix_ns: _Optional[int] = ..., finished_unix_ns: _Optional[int] = ..., evidence_json: _Optional[str] = ...) -> None: ...

class ListValidationsRequest(_message.Message):
    __slots__ = ("node_id", "limit", "page_token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    limit: int
    page_token: str
    def __init__(self, node_id: _Optional[str] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListValidationsResponse(_message.Message):
    __slots__ = ("validations", "next_page_token")
    VALIDATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    validations: _containers.RepeatedCompositeFieldContainer[Validation]
    next_page_token: str
    def __init__(self, validations: _Optional[_Iterable[_Union[Validation, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SdcGpu(_message.Message):
    __slots__ = ("target", "suspicion", "accusations", "runs", "fails", "suspects", "passes", "last_verdict", "last_unix_ns", "watch_until_unix_ns")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SUSPICION_FIELD_NUMBER: _ClassVar[int]
    ACCUSATIONS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    FAILS_FIELD_NUMBER: _ClassVar[int]
    SUSPECTS_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    LAST_VERDICT_FIELD_NUMBER: _ClassVar[int]
    LAST_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    WATCH_UNTIL_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    target: Target
    suspicion: float
    accusations: int
    runs: int
    fails: int
    suspects: int
    passes: int
    last_verdict: str
    last_unix_ns: int
    watch_until_unix_ns: int
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., suspicion: _Optional[float] = ..., accusations: _Optional[int] = ..., runs: _Optional[int] = ..., fails: _Optional[int] = ..., suspects: _Optional[int] = ..., passes: _Optional[int] = ..., last_verdict: _Optional[str] = ..., last_unix_ns: _Optional[int] = ..., watch_until_unix_ns: _Optional[int] = ...) -> None: ...

class StragglerRecord(_message.Message):
    __slots__ = ("target", "score", "mean_lag_s", "steps", "reason", "named_unix_ns", "action", "action_reason")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    MEAN_LAG_S_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NAMED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ACTION_REASON_FIELD_NUMBER: _ClassVar[int]
    target: Target
    score: float
    mean_lag_s: float
    steps: int
    reason: str
    named_unix_ns: int
    action: str
    action_reason: str
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., score: _Optional[float] = ..., mean_lag_s: _Optional[float] = ..., steps: _Optional[int] = ..., reason: _Optional[str] = ..., named_unix_ns: _Optional[int] = ..., action: _Optional[str] = ..., action_reason: _Optional[str] = ...) -> None: ...

class ListStragglersRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class JobStall(_message.Message):
    __slots__ = ("named_unix_ns", "silent_s", "period_s", "busy_gpus", "gpus", "suspect", "silent_nodes", "reason")
    NAMED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SILENT_S_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    BUSY_GPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SUSPECT_FIELD_NUMBER: _ClassVar[int]
    SILENT_NODES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    named_unix_ns: int
    silent_s: float
    period_s: float
    busy_gpus: int
    gpus: int
    suspect: Target
    silent_nodes: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, named_unix_ns: _Optional[int] = ..., silent_s: _Optional[float] = ..., period_s: _Optional[float] = ..., busy_gpus: _Optional[int] = ..., gpus: _Optional[int] = ..., suspect: _Optional[_Union[Target, _Mapping]] = ..., silent_nodes: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ListStragglersResponse(_message.Message):
    __slots__ = ("stragglers", "steps_judged", "stall")
    STRAGGLERS_FIELD_NUMBER: _ClassVar[int]
    STEPS_JUDGED_FIELD_NUMBER: _ClassVar[int]
    STALL_FIELD_NUMBER: _ClassVar[int]
    stragglers: _containers.RepeatedCompositeFieldContainer[StragglerRecord]
    steps_judged: int
    stall: JobStall
    def __init__(self, stragglers: _Optional[_Iterable[_Union[StragglerRecord, _Mapping]]] = ..., steps_judged: _Optional[int] = ..., stall: _Optional[_Union[JobStall, _Mapping]] = ...) -> None: ...

class ListSdcRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ListSdcResponse(_message.Message):
    __slots__ = ("gpus",)
    GPUS_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[SdcGpu]
    def __init__(self, gpus: _Optional[_Iterable[_Union[SdcGpu, _Mapping]]] = ...) -> None: ...

class PowerDomain(_message.Message):
    __slots__ = ("domain_id", "level", "budget_w", "allocated_w", "drawn_w", "children", "headroom_w", "has_budget", "target_w")
    DOMAIN_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    BUDGET_W_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_W_FIELD_NUMBER: _ClassVar[int]
    DRAWN_W_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_W_FIELD_NUMBER: _ClassVar[int]
    HAS_BUDGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_W_FIELD_NUMBER: _ClassVar[int]
    domain_id: str
    level: str
    budget_w: int
    allocated_w: int
    drawn_w: float
    children: _containers.RepeatedCompositeFieldContainer[PowerDomain]
    headroom_w: float
    has_budget: bool
    target_w: int
    def __init__(self, domain_id: _Optional[str] = ..., level: _Optional[str] = ..., budget_w: _Optional[int] = ..., allocated_w: _Optional[int] = ..., drawn_w: _Optional[float] = ..., children: _Optional[_Iterable[_Union[PowerDomain, _Mapping]]] = ..., headroom_w: _Optional[float] = ..., has_budget: _Optional[bool] = ..., target_w: _Optional[int] = ...) -> None: ...

class GetPowerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPowerStatusResponse(_message.Message):
    __slots__ = ("root", "swing_p2p_w", "swing_period_s", "smoothing_active", "max_ramp_w_per_s", "smoothing_mode", "smoothing_floor_w", "stranded_w", "over_budget", "updated_unix_ns", "periods", "reason")
    ROOT_FIELD_NUMBER: _ClassVar[int]
    SWING_P2P_W_FIELD_NUMBER: _ClassVar[int]
    SWING_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    SMOOTHING_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    MAX_RAMP_W_PER_S_FIELD_NUMBER: _ClassVar[int]
    SMOOTHING_MODE_FIELD_NUMBER: _ClassVar[int]
    SMOOTHING_FLOOR_W_FIELD_NUMBER: _ClassVar[int]
    STRANDED_W_FIELD_NUMBER: _ClassVar[int]
    OVER_BUDGET_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PERIODS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    root: PowerDomain
    swing_p2p_w: float
    swing_period_s: float
    smoothing_active: bool
    max_ramp_w_per_s: float
    smoothing_mode: str
    smoothing_floor_w: float
    stranded_w: float
    over_budget: _containers.RepeatedScalarFieldContainer[str]
    updated_unix_ns: int
    periods: int
    reason: str
    def __init__(self, root: _Optional[_Union[PowerDomain, _Mapping]] = ..., swing_p2p_w: _Optional[float] = ..., swing_period_s: _Optional[float] = ..., smoothing_active: _Optional[bool] = ..., max_ramp_w_per_s: _Optional[float] = ..., smoothing_mode: _Optional[str] = ..., smoothing_floor_w: _Optional[float] = ..., stranded_w: _Optional[float] = ..., over_budget: _Optional[_Iterable[str]] = ..., updated_unix_ns: _Optional[int] = ..., periods: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SetPowerBudgetRequest(_message.Message):
    __slots__ = ("domain_id", "budget_w", "reason", "clear")
    DOMAIN_ID_FIELD_NUMBER: _ClassVar[int]
    BUDGET_W_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    domain_id: str
    budget_w: int
    reason: str
    clear: bool
    def __init__(self, domain_id: _Optional[str] = ..., budget_w: _Optional[int] = ..., reason: _Optional[str] = ..., clear: _Optional[bool] = ...) -> None: ...

class SetPowerBudgetResponse(_message.Message):
    __slots__ = ("domain",)
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    domain: PowerDomain
    def __init__(self, domain: _Optional[_Union[PowerDomain, _Mapping]] = ...) -> None: ...

class GetPowerPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPowerPolicyResponse(_message.Message):
    __slots__ = ("policy_toml",)
    POLICY_TOML_FIELD_NUMBER: _ClassVar[int]
    policy_toml: str
    def __init__(self, policy_toml: _Optional[str] = ...) -> None: ...

class SetPowerPolicyRequest(_message.Message):
    __slots__ = ("policy_toml", "reason")
    POLICY_TOML_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    policy_toml: str
    reason: str
    def __init__(self, policy_toml: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SetPowerPolicyResponse(_message.Message):
    __slots__ = ("policy_toml",)
    POLICY_TOML_FIELD_NUMBER: _ClassVar[int]
    policy_toml: str
    def __init__(self, policy_toml: _Optional[str] = ...) -> None: ...

class RmaTicket(_message.Message):
    __slots__ = ("rma_id", "target", "state", "reason", "evidence_json", "opened_unix_ns", "gpus_per_technician_hour", "gpus_returned")
    RMA_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    OPENED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_TECHNICIAN_HOUR_FIELD_NUMBER: _ClassVar[int]
    GPUS_RETURNED_FIELD_NUMBER: _ClassVar[int]
    rma_id: str
    target: Target
    state: str
    reason: str
    evidence_json: str
    opened_unix_ns: int
    gpus_per_technician_hour: float
    gpus_returned: int
    def __init__(self, rma_id: _Optional[str] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., evidence_json: _Optional[str] = ..., opened_unix_ns: _Optional[int] = ..., gpus_per_technician_hour: _Optional[float] = ..., gpus_returned: _Optional[int] = ...) -> None: ...

class ListRmaRequest(_message.Message):
    __slots__ = ("pending_only",)
    PENDING_ONLY_FIELD_NUMBER: _ClassVar[int]
    pending_only: bool
    def __init__(self, pending_only: _Optional[bool] = ...) -> None: ...

class ListRmaResponse(_message.Message):
    __slots__ = ("tickets",)
    TICKETS_FIELD_NUMBER: _ClassVar[int]
    tickets: _containers.RepeatedCompositeFieldContainer[RmaTicket]
    def __init__(self, tickets: _Optional[_Iterable[_Union[RmaTicket, _Mapping]]] = ...) -> None: ...

class GetRmaRequest(_message.Message):
    __slots__ = ("rma_id",)
    RMA_ID_FIELD_NUMBER: _ClassVar[int]
    rma_id: str
    def __init__(self, rma_id: _Optional[str] = ...) -> None: ...

class GetRmaResponse(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: RmaTicket
    def __init__(self, ticket: _Optional[_Union[RmaTicket, _Mapping]] = ...) -> None: ...

class ApproveRmaRequest(_message.Message):
    __slots__ = ("rma_id", "reason")
    RMA_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    rma_id: str
    reason: str
    def __init__(self, rma_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ApproveRmaResponse(_message.Message):
    __slots__ = ("ticket",)
    TICKET_FIELD_NUMBER: _ClassVar[int]
    ticket: RmaTicket
    def __init__(self, ticket: _Optional[_Union[RmaTicket, _Mapping]] = ...) -> None: ...

class ForgetGpuOwnerRequest(_message.Message):
    __slots__ = ("target", "reason")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    target: Target
    reason: str
    def __init__(self, target: _Optional[_Union[Target, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class ForgetGpuOwnerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetAutomationPausedRequest(_message.Message):
    __slots__ = ("paused", "reason")
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    reason: str
    def __init__(self, paused: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class AutomationStatus(_message.Message):
    __slots__ = ("paused", "breaker_tripped", "reason", "since_unix_ns")
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    BREAKER_TRIPPED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    breaker_tripped: bool
    reason: str
    since_unix_ns: int
    def __init__(self, paused: _Optional[bool] = ..., breaker_tripped: _Optional[bool] = ..., reason: _Optional[str] = ..., since_unix_ns: _Optional[int] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("at_unix_ns", "actor", "action", "target", "reason", "outcome", "peer", "dropped_before")
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    at_unix_ns: int
    actor: str
    action: str
    target: Target
    reason: str
    outcome: str
    peer: str
    dropped_before: int
    def __init__(self, at_unix_ns: _Optional[int] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., reason: _Optional[str] = ..., outcome: _Optional[str] = ..., peer: _Optional[str] = ..., dropped_before: _Optional[int] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("since_unix_ns", "limit", "page_token")
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    since_unix_ns: int
    limit: int
    page_token: str
    def __init__(self, since_unix_ns: _Optional[int] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("records", "next_page_token")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[AuditRecord]
    next_page_token: str
    def __init__(self, records: _Optional[_Iterable[_Union[AuditRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetAutomationStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchNodesRequest(_message.Message):
    __slots__ = ("label_selector",)
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    label_selector: _containers.ScalarMap[str, str]
    def __init__(self, label_selector: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WatchNodesResponse(_message.Message):
    __slots__ = ("nodes", "resync")
    NODES_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    resync: bool
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., resync: _Optional[bool] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("node_id", "since_unix_ns")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    since_unix_ns: int
    def __init__(self, node_id: _Optional[str] = ..., since_unix_ns: _Optional[int] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("events", "resync")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[StoredEvent]
    resync: bool
    def __init__(self, events: _Optional[_Iterable[_Union[StoredEvent, _Mapping]]] = ..., resync: _Optional[bool] = ...) -> None: ...

class WatchIncidentsRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class WatchIncidentsResponse(_message.Message):
    __slots__ = ("incidents", "resync")
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    incidents: _containers.RepeatedCompositeFieldContainer[Incident]
    resync: bool
    def __init__(self, incidents: _Optional[_Iterable[_Union[Incident, _Mapping]]] = ..., resync: _Optional[bool] = ...) -> None: ...

class WatchRepairsRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class WatchRepairsResponse(_message.Message):
    __slots__ = ("repairs", "resync")
    REPAIRS_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    repairs: _containers.RepeatedCompositeFieldContainer[Repair]
    resync: bool
    def __init__(self, repairs: _Optional[_Iterable[_Union[Repair, _Mapping]]] = ..., resync: _Optional[bool] = ...) -> None: ...
