"""Ingest.node_labels counts its changes, so the budget's fleet view is rebuilt exactly when they change."""

from __future__ import annotations

from rasd.controller.ingest import streams as ingest


def test_every_kind_of_write_moves_the_version():
    labels = ingest.LabelsByNode()
    seen = [labels.version]

    def moved() -> bool:
        seen.append(labels.version)
        return seen[-1] != seen[-2]

    labels["n1"] = {"rack": "r1"}
    assert moved()
    labels["n1"] = {"rack": "r2"}  # a node's new Hello replaces its labels
    assert moved()
    labels.update({"n2": {"rack": "r1"}})
    assert moved()
    labels |= {"n3": {"rack": "r3"}}
    assert moved()
    labels.setdefault("n4", {})
    assert moved()
    del labels["n4"]
    assert moved()
    labels.pop("n3")
    assert moved()
    labels.popitem()
    assert moved()
    labels.clear()
    assert moved()
    assert labels == {}
    _ = labels.get("n1"), list(labels.items()), "n1" in labels  # reads do not
    assert not moved()


def test_it_is_still_a_plain_mapping():
    labels = ingest.LabelsByNode()
    labels["n1"] = {"nvlink_domain": "nvl-0"}
    assert isinstance(labels, dict)
    assert dict(labels) == {"n1": {"nvlink_domain": "nvl-0"}}
