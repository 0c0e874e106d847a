"""Spooled events go out in a form the controller accepts, whatever GPU they were spooled about."""

from __future__ import annotations

from rasd.agent import wire
from rasd.agent.core import model

PRESENT = "GPU-00000000-0000-4000-8000-000000000001"
GONE = "GPU-00000000-0000-4000-8000-000000000002"
"""Fell off the bus before the agent restarted: NVML no longer enumerates it, the Hello omits it."""


def _spooled(seq: int, gpu_uuid: str, attributes: dict[str, str] | None = None) -> model.SpooledEvent:
    return model.SpooledEvent(
        seq,
        model.Observation(
            model.EventKind.FALLEN_OFF_BUS,
            1_000,
            "GPU has fallen off the bus",
            "kmsg",
            gpu_uuid=gpu_uuid,
            xid=79,
            severity=model.Severity.FATAL,
            attributes=attributes or {},
        ),
    )


def test_an_event_about_a_gpu_not_announced_goes_out_about_the_node_naming_the_gpu():
    batch = wire.events([_spooled(1, GONE, {"pid": "7"}), _spooled(2, PRESENT)], frozenset({PRESENT})).events.events

    assert batch[0].gpu_uuid == ""
    assert dict(batch[0].attributes) == {wire.UNANNOUNCED_GPU_ATTRIBUTE: GONE, "pid": "7"}
    assert (batch[0].seq, batch[0].xid, batch[0].severity) == (1, 79, int(model.Severity.FATAL))
    assert batch[1].gpu_uuid == PRESENT
    assert dict(batch[1].attributes) == {}


def test_the_gpu_attribute_survives_the_cut_to_the_attribute_limit():
    crowded = {f"key-{i:03d}": "v" for i in range(wire.MAX_ATTRIBUTES)}

    (event,) = wire.events([_spooled(1, GONE, crowded)], frozenset({PRESENT})).events.events

    assert len(event.attributes) == wire.MAX_ATTRIBUTES
    assert event.attributes[wire.UNANNOUNCED_GPU_ATTRIBUTE] == GONE
