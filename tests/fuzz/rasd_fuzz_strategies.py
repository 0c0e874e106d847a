"""Hypothesis strategies for fuzzing rasd's wire input: random, structure-aware and mutated-valid messages.

* `message(cls)`: any instance of a protobuf message class, built from its descriptor (every field
  type, nested messages, repeated fields and maps), with hostile values for every scalar type.
* `agent_message(gpus)`: a well-formed AgentMessage from an agent whose GPUs are `gpus`.
* `field_mutated(base)`: a value of `base` with one scalar somewhere inside set to a hostile value.
* `byte_mutated(base)`: the serialized bytes of a value of `base`, flipped, cut, spliced; parsed
  back (None when protobuf refuses the bytes, as gRPC's deserializer would).
* `kernel_line(real_lines)`: arbitrary bytes, or real kernel log lines mutated at the byte level,
  decoded the way the kernel-log followers decode them.
"""

from __future__ import annotations

import math

from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message as pb_message
from hypothesis import strategies as st

from rasd.api.v1 import agent_service_pb2 as agent_pb
from rasd.api.v1 import commands_pb2 as commands_pb
from rasd.api.v1 import health_pb2 as health_pb

FD = pb_descriptor.FieldDescriptor

GPU_UUID_SHAPES = [
    "GPU-00000000-0000-4000-8000-000000000000",
    "MIG-11111111-2222-4333-8444-555555555555",
    "GPU-",
    "gpu-00000000-0000-4000-8000-000000000000x",
    "GPU-zzzzzzzz-0000-4000-8000-000000000000",
]
HOSTILE_TEXT = [
    "",
    "\x00",
    "node\x00a",
    "../../etc/passwd",
    "'; DROP TABLE audit_log; --",
    "\u202egnp.exe",
    "🙂" * 10,
    "a" * 253,
    "a" * 254,
    "x" * 5000,
    " ",
    "\n\r\t",
    "%s%s%n",
    *GPU_UUID_SHAPES,
]
INT_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63), 2**64 - 1, 2**63]
FLOAT_EDGES = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e308, -1e-308, 5000.0, 5000.5, -1.0]

_INT_BOUNDS = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
    FD.TYPE_ENUM: (-(2**31), 2**31 - 1),
}


def text() -> st.SearchStrategy[str]:
    """Strings an attacker would try, and random ones."""
    return st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=40))


def scalar(field: pb_descriptor.FieldDescriptor) -> st.SearchStrategy[object]:
    """A value of the field's scalar type: edges, hostile and random ones, always assignable."""
    kind = field.type
    if kind in _INT_BOUNDS:
        lo, hi = _INT_BOUNDS[kind]
        edges = [v for v in INT_EDGES if lo <= v <= hi]
        small = st.integers(min_value=max(lo, -64), max_value=min(hi, 64))
        return st.one_of(st.sampled_from(edges), small, st.integers(min_value=lo, max_value=hi))
    if kind == FD.TYPE_FLOAT:
        return st.one_of(st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 5000.5, -1.0]), st.floats(width=32))
    if kind == FD.TYPE_DOUBLE:
        return st.one_of(st.sampled_from(FLOAT_EDGES), st.floats())
    if kind == FD.TYPE_BOOL:
        return st.booleans()
    if kind == FD.TYPE_STRING:
        return text()
    if kind == FD.TYPE_BYTES:
        return st.binary(max_size=32)
    raise TypeError(f"no scalar strategy for {field.full_name}")


def _is_map(field: pb_descriptor.FieldDescriptor) -> bool:
    return field.type == FD.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _field_value(field: pb_descriptor.FieldDescriptor, cls_of, depth: int) -> st.SearchStrategy[object]:
    if _is_map(field):
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        if value_field.type == FD.TYPE_MESSAGE:
            values = message(cls_of(value_field.message_type), depth + 1)
        else:
            values = scalar(value_field)
        return st.dictionaries(scalar(key_field), values, max_size=3)
    one = message(cls_of(field.message_type), depth + 1) if field.type == FD.TYPE_MESSAGE else scalar(field)
    if field.is_repeated:
        return st.lists(one, max_size=3)
    return one


def _class_of(descriptor: pb_descriptor.Descriptor) -> type[pb_message.Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def _build(cls: type[pb_message.Message], values: dict[str, object]) -> pb_message.Message:
    instance = cls()
    for name, value in values.items():
        field = cls.DESCRIPTOR.fields_by_name[name]
        if _is_map(field):
            target = getattr(instance, name)
            for key, item in value.items():  # type: ignore[attr-defined]
                if isinstance(item, pb_message.Message):
                    target[key].CopyFrom(item)
                else:
                    target[key] = item
        elif field.is_repeated:
            target = getattr(instance, name)
            for item in value:  # type: ignore[attr-defined]
                if isinstance(item, pb_message.Message):
                    target.add().CopyFrom(item)
                else:
                    target.append(item)
        elif isinstance(value, pb_message.Message):
            getattr(instance, name).CopyFrom(value)
        else:
            setattr(instance, name, value)
    return instance


def message(cls: type[pb_message.Message], depth: int = 0) -> st.SearchStrategy[pb_message.Message]:
    """Any instance of cls, built from its descriptor; nesting stops at depth 3."""
    fields = {}
    for field in cls.DESCRIPTOR.fields:
        if depth >= 3 and field.type == FD.TYPE_MESSAGE:
            continue
        fields[field.name] = _field_value(field, _class_of, depth)
    return st.fixed_dictionaries({}, optional=fields).map(lambda values: _build(cls, values))


# -- well-formed agent messages ----------------------------------------------------------------------
NOW_NS = 1_800_000_000 * 1_000_000_000
_kinds = [v for v in health_pb.EventKind.values() if v]
_severities = list(health_pb.Severity.values())
_outcomes = [v for v in commands_pb.ActionOutcome.values() if v]


def agent_message(gpus: list[str]) -> st.SearchStrategy[agent_pb.AgentMessage]:
    """An AgentMessage a healthy agent with these GPUs could send (seqs 1..40, to collide on purpose)."""
    gpu = st.sampled_from(gpus)
    power = st.builds(
        health_pb.PowerSeries,
        gpu_uuid=gpu,
        first_sample_unix_ns=st.integers(NOW_NS, NOW_NS + 10**12),
        sample_interval_ms=st.sampled_from([100, 1000]),
        power_w=st.lists(st.floats(0, 1000, width=32), max_size=20),
    )
    counters = st.builds(
        health_pb.GpuCounters,
        gpu_uuid=gpu,
        sample_unix_ns=st.integers(NOW_NS, NOW_NS + 10**12),
        temperature_c=st.integers(20, 95),
        utilization_gpu_pct=st.integers(0, 100),
        enforced_power_limit_w=st.integers(100, 700),
        ecc_dbe_volatile=st.integers(0, 10),
    )
    kernel_facts = st.builds(
        health_pb.KernelLogFacts,
        raw=st.text(max_size=60),
        pci_bus_id=st.sampled_from(["", "0000:18:00.0", "0000:3b:00.0"]),
        pid=st.integers(0, 2**63 - 1),
        process_name=st.text(max_size=20),
        nvlink=st.integers(-(2**31), 2**31 - 1),
        nvlink_registers=st.lists(st.integers(0, 2**32 - 1), max_size=16),
        nvlink_subcode=st.sampled_from(["", "NETIR_LINK_EVT", "SAW_MVB", "RLW_REMAP"]),
        recovery_action=st.integers(0, 2**32 - 1),
        sxid=st.integers(0, 2**32 - 1),
        sxid_fatal=st.booleans(),
        ib_device=st.text(max_size=12),
        ib_port=st.integers(0, 2**32 - 1),
        ib_state=st.sampled_from(["", "DOWN", "ACTIVE", "MODULE_ERROR"]),
    )
    event = st.builds(
        health_pb.HealthEvent,
        seq=st.integers(1, 40),
        observed_unix_ns=st.integers(NOW_NS, NOW_NS + 10**12),
        kind=st.sampled_from(_kinds),
        gpu_uuid=st.one_of(gpu, st.just("")),
        xid=st.integers(1, 200),
        severity=st.sampled_from(_severities),
        message=st.text(max_size=60),
        source=st.sampled_from(["kmsg", "nvml", "simulated", "journal"]),
        attributes=st.dictionaries(
            st.sampled_from(["raw", "pci", "reason", "kernel_event", "registers", "sxid_fatal"]),
            st.text(max_size=30) | st.sampled_from(["xid", "sxid", "ib_link", "0x1 0x8", "true"]),
            max_size=3,
        ),
        kernel_log=st.none() | kernel_facts,
    )
    result = st.builds(
        commands_pb.ActionResult,
        command_id=st.uuids().map(lambda u: u.hex),
        outcome=st.sampled_from(_outcomes),
        message=st.text(max_size=60),
        started_unix_ns=st.integers(NOW_NS, NOW_NS + 10**12),
        finished_unix_ns=st.integers(NOW_NS, NOW_NS + 10**12),
        enforced_limits=st.lists(
            st.builds(commands_pb.GpuPowerLimit, gpu_uuid=gpu, power_limit_w=st.integers(100, 700)), max_size=2
        ),
    )
    heartbeat = st.builds(
        agent_pb.Heartbeat, sent_unix_ns=st.integers(NOW_NS, NOW_NS + 10**12), spool_depth=st.integers(0, 10**6)
    )
    return st.one_of(
        st.builds(
            health_pb.TelemetryBatch, power=st.lists(power, max_size=3), counters=st.lists(counters, max_size=3)
        ).map(lambda t: agent_pb.AgentMessage(telemetry=t)),
        st.lists(event, min_size=1, max_size=5).map(
            lambda events: agent_pb.AgentMessage(events=agent_pb.HealthEventBatch(events=events))
        ),
        result.map(lambda r: agent_pb.AgentMessage(action_result=r)),
        heartbeat.map(lambda h: agent_pb.AgentMessage(heartbeat=h)),
    )


# -- mutations ---------------------------------------------------------------------------------------
def _slots(instance: pb_message.Message) -> list[tuple[pb_message.Message, pb_descriptor.FieldDescriptor, int | None]]:
    """Every scalar place inside a message: (container, field, index in a repeated field or None)."""
    out: list[tuple[pb_message.Message, pb_descriptor.FieldDescriptor, int | None]] = []
    for field in instance.DESCRIPTOR.fields:
        if _is_map(field):
            out.append((instance, field, -1))
        elif field.type == FD.TYPE_MESSAGE:
            if field.is_repeated:
                for item in getattr(instance, field.name):
                    out.extend(_slots(item))
            elif instance.HasField(field.name):
                out.extend(_slots(getattr(instance, field.name)))
        elif field.is_repeated:
            out.extend((instance, field, i) for i in range(len(getattr(instance, field.name))))
        else:
            out.append((instance, field, None))
    return out


@st.composite
def field_mutated(draw, base: st.SearchStrategy[pb_message.Message]) -> pb_message.Message:
    """A value of base with one scalar (or one map entry) set to a hostile value."""
    instance = draw(base)
    slots = _slots(instance)
    if not slots:
        return instance
    container, field, index = slots[draw(st.integers(0, len(slots) - 1))]
    if index == -1:
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        getattr(container, field.name)[draw(scalar(key_field))] = draw(scalar(value_field))
    elif index is None:
        setattr(container, field.name, draw(scalar(field)))
    else:
        getattr(container, field.name)[index] = draw(scalar(field))
    return instance


@st.composite
def mutated_bytes(draw, data: bytes) -> bytes:
    """data with a few byte-level edits: flip, insert, delete, duplicate a slice, truncate."""
    buffer = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "splice", "truncate"]))
        at = draw(st.integers(0, len(buffer))) if buffer else 0
        if op == "flip" and buffer:
            at = min(at, len(buffer) - 1)
            buffer[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            buffer[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and buffer:
            del buffer[at : at + draw(st.integers(1, 4))]
        elif op == "splice" and buffer:
            end = draw(st.integers(at, len(buffer)))
            buffer[at:at] = buffer[at:end]
        elif op == "truncate":
            del buffer[at:]
    return bytes(buffer)


@st.composite
def byte_mutated(draw, base: st.SearchStrategy[pb_message.Message]) -> pb_message.Message | None:
    """A value of base serialized, mutated at the byte level and parsed back (None if it does not parse)."""
    instance = draw(base)
    data = draw(mutated_bytes(instance.SerializeToString()))
    parsed = type(instance)()
    try:
        parsed.ParseFromString(data)
    except pb_message.DecodeError:
        return None
    return parsed


@st.composite
def random_bytes_message(draw, cls: type[pb_message.Message]) -> pb_message.Message | None:
    """Random bytes parsed as cls (None when they do not parse)."""
    parsed = cls()
    try:
        parsed.ParseFromString(draw(st.binary(max_size=120)))
    except pb_message.DecodeError:
        return None
    return parsed


def hostile_agent_message(gpus: list[str]) -> st.SearchStrategy[agent_pb.AgentMessage | None]:
    """The mix the fuzz tests draw from: valid, field-mutated, byte-mutated, random-structure, random bytes."""
    valid = agent_message(gpus)
    return st.one_of(
        valid,
        field_mutated(valid),
        field_mutated(valid),
        byte_mutated(valid),
        message(agent_pb.AgentMessage),
        random_bytes_message(agent_pb.AgentMessage),
    )


def kernel_line(real_lines: list[str]) -> st.SearchStrategy[str]:
    """A kernel log input: arbitrary bytes or a mutated real line, decoded like the followers do."""
    real = st.sampled_from(real_lines)
    as_bytes = st.one_of(
        st.binary(max_size=300),
        real.map(str.encode).flatmap(mutated_bytes),
        st.tuples(real, real).map(lambda pair: (pair[0][: len(pair[0]) // 2] + pair[1]).encode()),
        real.map(str.encode),
    )
    return st.one_of(as_bytes.map(lambda b: b.decode("utf-8", errors="replace")), st.text(max_size=200))


# -- cheap amplification -----------------------------------------------------------------------------
# Hypothesis draws a few base messages and a seeded Random per example; these plain-Python mutations
# then derive many more inputs from them. A failure still reproduces: the seed is part of the example.
def _hostile_scalar(field: pb_descriptor.FieldDescriptor, rng) -> object:  # type: ignore[no-untyped-def]
    kind = field.type
    if kind in _INT_BOUNDS:
        lo, hi = _INT_BOUNDS[kind]
        edges = [v for v in INT_EDGES if lo <= v <= hi]
        return rng.choice(edges) if rng.random() < 0.6 else rng.randint(lo, hi)
    if kind == FD.TYPE_FLOAT:
        return rng.choice([0.0, -0.0, math.nan, math.inf, -math.inf, 5000.5, -1.0, rng.uniform(-1e6, 1e6)])
    if kind == FD.TYPE_DOUBLE:
        return rng.choice([*FLOAT_EDGES, rng.uniform(-1e9, 1e9)])
    if kind == FD.TYPE_BOOL:
        return rng.random() < 0.5
    if kind == FD.TYPE_STRING:
        return rng.choice(HOSTILE_TEXT)
    return bytes(rng.randrange(256) for _ in range(rng.randrange(8)))


def mutate(instance: pb_message.Message, rng) -> pb_message.Message | None:  # type: ignore[no-untyped-def]
    """One derived input: a hostile value in one field, or byte edits of the serialized message."""
    if rng.random() < 0.5:
        copy = type(instance)()
        copy.CopyFrom(instance)
        slots = _slots(copy)
        if not slots:
            return copy
        container, field, index = rng.choice(slots)
        if index == -1:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            getattr(container, field.name)[_hostile_scalar(key_field, rng)] = _hostile_scalar(value_field, rng)
        elif index is None:
            setattr(container, field.name, _hostile_scalar(field, rng))
        else:
            getattr(container, field.name)[index] = _hostile_scalar(field, rng)
        return copy
    buffer = bytearray(instance.SerializeToString())
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(buffer) + 1)
        op = rng.randrange(4)
        if op == 0 and buffer:
            buffer[min(at, len(buffer) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            buffer[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif op == 2:
            del buffer[at : at + rng.randint(1, 4)]
        else:
            del buffer[at:]
    parsed = type(instance)()
    try:
        parsed.ParseFromString(bytes(buffer))
    except pb_message.DecodeError:
        return None
    return parsed


def amplified(bases: list, rng, total: int) -> list:  # type: ignore[no-untyped-def]
    """bases followed by derived inputs, `total` in all; mutations start from the parseable bases."""
    seeds = [b for b in bases if b is not None]
    derived = [mutate(rng.choice(seeds), rng) for _ in range(total - len(bases))] if seeds else []
    out = list(bases) + derived
    rng.shuffle(out)
    return out


def mutate_line(line: str, rng) -> str:  # type: ignore[no-untyped-def]
    """A kernel log line with byte edits, decoded as the followers decode."""
    buffer = bytearray(line.encode())
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(buffer) + 1)
        op = rng.randrange(5)
        if op == 0 and buffer:
            buffer[min(at, len(buffer) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            buffer[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2:
            del buffer[at : at + rng.randint(1, 8)]
        elif op == 3:
            end = rng.randint(at, len(buffer))
            buffer[at:at] = buffer[at:end]
        else:
            del buffer[at:]
    return bytes(buffer).decode("utf-8", errors="replace")
