from rasd.api.v1 import agent_service_pb2 as _agent_service_pb2
from rasd.api.v1 import commands_pb2 as _commands_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecordingHeader(_message.Message):
    __slots__ = ("format_version", "controller_version", "started_unix_ns", "remediation_policy_json", "recorder")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    REMEDIATION_POLICY_JSON_FIELD_NUMBER: _ClassVar[int]
    RECORDER_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    controller_version: str
    started_unix_ns: int
    remediation_policy_json: str
    recorder: str
    def __init__(self, format_version: _Optional[int] = ..., controller_version: _Optional[str] = ..., started_unix_ns: _Optional[int] = ..., remediation_policy_json: _Optional[str] = ..., recorder: _Optional[str] = ...) -> None: ...

class RecordedDecision(_message.Message):
    __slots__ = ("command_id", "ticket_id", "step", "kind", "gpu_uuid", "reason", "action_json")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTION_JSON_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    ticket_id: str
    step: int
    kind: str
    gpu_uuid: str
    reason: str
    action_json: str
    def __init__(self, command_id: _Optional[str] = ..., ticket_id: _Optional[str] = ..., step: _Optional[int] = ..., kind: _Optional[str] = ..., gpu_uuid: _Optional[str] = ..., reason: _Optional[str] = ..., action_json: _Optional[str] = ...) -> None: ...

class RecordedAccusation(_message.Message):
    __slots__ = ("gpu_uuid", "reason", "accuser")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACCUSER_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    reason: str
    accuser: str
    def __init__(self, gpu_uuid: _Optional[str] = ..., reason: _Optional[str] = ..., accuser: _Optional[str] = ...) -> None: ...

class RecordedNodeLost(_message.Message):
    __slots__ = ("message", "last_seen_unix_ns")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    message: str
    last_seen_unix_ns: int
    def __init__(self, message: _Optional[str] = ..., last_seen_unix_ns: _Optional[int] = ...) -> None: ...

class RecordedOperatorAction(_message.Message):
    __slots__ = ("action", "gpu_uuid", "reason", "actor", "force")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    action: str
    gpu_uuid: str
    reason: str
    actor: str
    force: bool
    def __init__(self, action: _Optional[str] = ..., gpu_uuid: _Optional[str] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class RecordedStreamClosed(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RecordedEntry(_message.Message):
    __slots__ = ("at_unix_ns", "node_id", "session_id", "inbound", "outbound_command", "closed", "decision", "accusation", "node_lost", "operator_action")
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    INBOUND_FIELD_NUMBER: _ClassVar[int]
    OUTBOUND_COMMAND_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    ACCUSATION_FIELD_NUMBER: _ClassVar[int]
    NODE_LOST_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_ACTION_FIELD_NUMBER: _ClassVar[int]
    at_unix_ns: int
    node_id: str
    session_id: str
    inbound: _agent_service_pb2.AgentMessage
    outbound_command: _commands_pb2.Command
    closed: RecordedStreamClosed
    decision: RecordedDecision
    accusation: RecordedAccusation
    node_lost: RecordedNodeLost
    operator_action: RecordedOperatorAction
    def __init__(self, at_unix_ns: _Optional[int] = ..., node_id: _Optional[str] = ..., session_id: _Optional[str] = ..., inbound: _Optional[_Union[_agent_service_pb2.AgentMessage, _Mapping]] = ..., outbound_command: _Optional[_Union[_commands_pb2.Command, _Mapping]] = ..., closed: _Optional[_Union[RecordedStreamClosed, _Mapping]] = ..., decision: _Optional[_Union[RecordedDecision, _Mapping]] = ..., accusation: _Optional[_Union[RecordedAccusation, _Mapping]] = ..., node_lost: _Optional[_Union[RecordedNodeLost, _Mapping]] = ..., operator_action: _Optional[_Union[RecordedOperatorAction, _Mapping]] = ...) -> None: ...
