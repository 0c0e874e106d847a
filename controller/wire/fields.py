"""The fields of an AgentMessage by name, as the edge checks name them, and the fixed set of labels for them.

A refused message is counted in ``rasd_wire_rejections_total`` by the field that was wrong. The
field's name as an error gives it carries what the sender chose: list indices
(``events.events[3].seq``) and map keys (``hello.labels['rack']``). A label value made from it
minted a series per key: a Hello label key holding ``]`` slipped past the index stripping, and
22,000 streams made 22,032 series. The label is now the field's place in the message, taken from
the proto's own descriptors (`agent_message_fields`), and ``other`` for any name that is not one.
"""

from __future__ import annotations

import functools
import re

from google.protobuf.descriptor import Descriptor

from rasd.api.v1 import agent_service_pb2 as agent_pb

OTHER = "other"
"""The label of a field name that is not a place in an AgentMessage."""

_INDEX_RE = re.compile(r"\[\d+\]")
_MAX_DEPTH = 8
"""Nesting followed at most (the messages are not recursive; this only keeps the walk finite)."""


@functools.cache
def agent_message_fields() -> frozenset[str]:
    """Every place in an AgentMessage, as `rejection_label` writes it: ``events.events[].seq``, ``hello.labels[]``.

    A repeated field or a map is there by itself (its count) and with ``[]`` (one of its items);
    ``payload`` names the oneof itself (an empty or unknown payload).
    """
    names = {"payload"}
    for field in agent_pb.AgentMessage.DESCRIPTOR.oneofs_by_name["payload"].fields:
        names.add(field.name)
        _walk(field.message_type, field.name, names, 1)
    return frozenset(names)


def _walk(descriptor: Descriptor, prefix: str, names: set[str], depth: int) -> None:
    for field in descriptor.fields:
        path = f"{prefix}.{field.name}"
        names.add(path)
        item = path
        if field.is_repeated:
            item = f"{path}[]"
            names.add(item)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                continue  # map<string, string>: a key and its value are named by the map
        if field.message_type is not None and depth < _MAX_DEPTH:
            _walk(field.message_type, item, names, depth + 1)


def rejection_label(field: str) -> str:
    """The place in an AgentMessage a field name points at (indices and map keys as ``[]``), or ``other``.

    A map key is the only part of a name that can hold a quote, and maps hold strings, so a key is
    always the last part: everything from the first ``['`` or ``["`` is that key, whatever it holds.
    """
    starts = [at for at in (field.find("['"), field.find('["')) if at >= 0]
    if starts and field.endswith("]"):
        field = field[: min(starts)] + "[]"
    name = _INDEX_RE.sub("[]", field)
    return name if name in agent_message_fields() else OTHER
