"""The power budget tree: cluster -> row -> rack -> node, each domain with an optional budget.

This module owns the shape of the tree, its validation and its run-time updates. Every update
returns a new tree; a tree is never changed in place. It also owns the index arrays the vectorised
allocator and apply planner use to sum per-GPU values into every domain.

Rules checked here:
- Every domain's budget is at least the sum of its children's minimum caps (a node's minimum is
  the sum of its GPUs' NVML minimum limits), so some set of caps within every budget always exists.
- Names are unique across the whole tree (nodes are named by node id).
- A parent's budget may be smaller than the sum of its children's budgets: that is oversubscription,
  and the allocator keeps every level within its own budget.

Pure: no I/O, no logging, no clock reads.

Config shape (the `[power.tree]` TOML table)::

    name = "cluster"          # optional
    budget_w = 800000
    [[rows]]
    name = "row-a"
    budget_w = 400000         # optional below the cluster: no budget of its own
    [[rows.racks]]
    name = "rack-a1"
    budget_w = 40000
    [[rows.racks.nodes]]
    name = "node-001"
    budget_w = 5600
    min_w = 1600              # optional; normally set from the GPU inventory
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

LEVELS = ("cluster", "row", "rack", "node")
"""Levels from the root down; `Domain.level` is one of these."""

_CHILD_KEY = {"cluster": "rows", "row": "racks", "rack": "nodes"}


class PowerTreeError(ValueError):
    """A tree mapping or update is invalid; `key` names the offending entry or domain."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"power tree: {key}: {message}")
        self.key = key


@dataclasses.dataclass(frozen=True)
class Domain:
    """One node of the budget tree."""

    name: str
    """Unique name; for the node level, the node id agents use."""

    level: str
    """One of LEVELS."""

    parent: str | None
    """Name of the parent domain; None for the cluster."""

    budget_w: int | None
    """Limit on the sum of caps that may be in force below this domain, W; None = no own limit."""

    min_w: int
    """Sum of the minimum caps below this domain, W (for a node: its GPUs' NVML minimums)."""


@dataclasses.dataclass(frozen=True)
class TreeIndex:
    """Dense integer indexes of a tree, for vectorised sums (built once per tree)."""

    node_names: tuple[str, ...]
    rack_names: tuple[str, ...]
    row_names: tuple[str, ...]
    cluster_name: str
    node_of_name: Mapping[str, int]
    rack_of_node: np.ndarray
    """Index of each node's rack."""
    row_of_rack: np.ndarray
    """Index of each rack's row."""
    node_budget_w: np.ndarray
    """Budget per node, float, +inf where the domain has no own budget (likewise below)."""
    rack_budget_w: np.ndarray
    row_budget_w: np.ndarray
    cluster_budget_w: float

    def level_budgets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Budgets of (nodes, racks, rows, cluster) as float arrays; +inf = no own limit."""
        return (
            self.node_budget_w,
            self.rack_budget_w,
            self.row_budget_w,
            np.array([self.cluster_budget_w], dtype=np.float64),
        )

    def sums(self, node_idx: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, ...]:
        """Sum per-GPU `values` into every level.

        Args:
            node_idx: Each GPU's node index (into `node_names`).
            values: One value per GPU.

        Returns:
            (per node, per rack, per row, cluster as a 1-element array), float64.
        """
        by_node = np.bincount(node_idx, weights=values, minlength=len(self.node_names))
        by_rack = np.bincount(self.rack_of_node, weights=by_node, minlength=len(self.rack_names))
        by_row = np.bincount(self.row_of_rack, weights=by_rack, minlength=len(self.row_names))
        return by_node, by_rack, by_row, np.array([by_row.sum()])

    def over_budget(self, node_idx: np.ndarray, values: np.ndarray) -> list[str]:
        """Names of the domains whose summed `values` exceed their budget (empty when none)."""
        names = (self.node_names, self.rack_names, self.row_names, (self.cluster_name,))
        over: list[str] = []
        for level_names, sums, budgets in zip(names, self.sums(node_idx, values), self.level_budgets(), strict=True):
            for i in np.flatnonzero(sums > budgets):
                over.append(level_names[i])
        return over


@dataclasses.dataclass(frozen=True)
class PowerTree:
    """A validated budget tree. Build it with `from_mapping`; change it with the `with_*` methods."""

    domains: tuple[Domain, ...]
    """Every domain, parents before children."""

    index: TreeIndex = dataclasses.field(init=False, compare=False, repr=False)
    """Dense indexes for the vectorised allocator (derived from `domains`)."""

    def __post_init__(self) -> None:
        _validate(self.domains)
        object.__setattr__(self, "index", _build_index(self.domains))

    # Construction -------------------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> PowerTree:
        """Build a tree from a TOML-style table (see the module docstring).

        Args:
            mapping: The cluster table with nested `rows`, `racks` and `nodes` arrays of tables.

        Returns:
            The validated tree.

        Raises:
            PowerTreeError: Naming the offending key path, e.g. `rows[0].racks[1].nodes[2].budget_w`.
        """
        domains: list[Domain] = []
        _parse(mapping, "cluster", None, "", domains)
        return cls(tuple(_with_rolled_up_mins(domains)))

    def to_mapping(self) -> dict[str, Any]:
        """Return the tree as a TOML-style mapping; `from_mapping` round-trips it."""
        children: dict[str | None, list[Domain]] = {}
        for d in self.domains:
            children.setdefault(d.parent, []).append(d)

        def render(d: Domain) -> dict[str, Any]:
            out: dict[str, Any] = {"name": d.name}
            if d.budget_w is not None:
                out["budget_w"] = d.budget_w
            if d.level == "node":
                out["min_w"] = d.min_w
            else:
                out[_CHILD_KEY[d.level]] = [render(c) for c in children.get(d.name, [])]
            return out

        return render(self.domains[0])

    # Queries ------------------------------------------------------------------------------------

    def domain(self, name: str) -> Domain:
        """The domain called `name`.

        Raises:
            KeyError: No such domain.
        """
        for d in self.domains:
            if d.name == name:
                return d
        raise KeyError(name)

    def ancestors(self, name: str) -> tuple[str, ...]:
        """Names from `name`'s parent up to the cluster."""
        by_name = {d.name: d for d in self.domains}
        out: list[str] = []
        parent = by_name[name].parent
        while parent is not None:
            out.append(parent)
            parent = by_name[parent].parent
        return tuple(out)

    # Updates (each returns a new tree) ----------------------------------------------------------

    def with_budget(self, name: str, budget_w: float | None) -> PowerTree:
        """Return a tree with `name`'s budget set (AdminService `power budget set`).

        Args:
            name: A domain name.
            budget_w: The new budget, W; None removes a non-cluster domain's own limit.

        Returns:
            The new tree.

        Raises:
            PowerTreeError: Unknown domain, a bad value, or a budget below the sum of the minimum caps
                below it (the message gives that sum).
        """
        if name not in {d.name for d in self.domains}:
            raise PowerTreeError(name, "no such domain")
        budget = _check_budget(budget_w, name, required=self.domain(name).level == "cluster")
        return PowerTree(tuple(dataclasses.replace(d, budget_w=budget) if d.name == name else d for d in self.domains))

    def with_node_mins(self, node_min_w: Mapping[str, float]) -> PowerTree:
        """Return a tree with nodes' minimum caps replaced (from the GPU inventory the agents report).

        Args:
            node_min_w: Node name -> sum of its GPUs' minimum caps, W.

        Returns:
            The new tree, with the minimums rolled up to every ancestor.

        Raises:
            PowerTreeError: Unknown node, a bad value, or a minimum above some budget on the way up.
        """
        nodes = {d.name for d in self.domains if d.level == "node"}
        for name, value in node_min_w.items():
            if name not in nodes:
                raise PowerTreeError(name, "no such node")
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise PowerTreeError(f"{name}.min_w", f"expected a number >= 0, got {value!r}")
        replaced = [
            dataclasses.replace(d, min_w=math.ceil(node_min_w[d.name])) if d.name in node_min_w else d
            for d in self.domains
        ]
        return PowerTree(tuple(_with_rolled_up_mins(replaced)))


def _check_budget(value: Any, key: str, *, required: bool) -> int | None:
    if value is None:
        if required:
            raise PowerTreeError(key, "the cluster needs a budget")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PowerTreeError(key, f"expected a finite number of watts, got {value!r}")
    if value < 0:
        raise PowerTreeError(key, f"must be >= 0, got {value!r}")
    # Whole watts, rounded down: the wire carries integer watts and rounding down never loosens a budget.
    return math.floor(value)


def _parse(table: Any, level: str, parent: str | None, path: str, out: list[Domain]) -> None:
    where = path or "<cluster>"
    if not isinstance(table, Mapping):
        raise PowerTreeError(where, "expected a table")
    prefix = f"{path}." if path else ""
    allowed = {"name", "budget_w"} | ({"min_w"} if level == "node" else {_CHILD_KEY[level]})
    for key in table:
        if key not in allowed:
            raise PowerTreeError(f"{prefix}{key}", f"unknown key for a {level}")
    name = table.get("name", "cluster" if level == "cluster" else None)
    if not isinstance(name, str) or not name:
        raise PowerTreeError(f"{prefix}name", "expected a non-empty string")
    budget = _check_budget(table.get("budget_w"), f"{prefix}budget_w", required=level == "cluster")
    min_w = 0
    if level == "node":
        raw_min = table.get("min_w", 0)
        if isinstance(raw_min, bool) or not isinstance(raw_min, int | float) or not raw_min >= 0:
            raise PowerTreeError(f"{prefix}min_w", f"expected a number >= 0, got {raw_min!r}")
        min_w = math.ceil(raw_min)
    out.append(Domain(name=name, level=level, parent=parent, budget_w=budget, min_w=min_w))
    if level == "node":
        return
    child_key = _CHILD_KEY[level]
    children = table.get(child_key)
    if not isinstance(children, Sequence) or isinstance(children, str) or not children:
        raise PowerTreeError(f"{prefix}{child_key}", "expected a non-empty array of tables")
    child_level = LEVELS[LEVELS.index(level) + 1]
    for i, child in enumerate(children):
        _parse(child, child_level, name, f"{prefix}{child_key}[{i}]", out)


def _with_rolled_up_mins(domains: Sequence[Domain]) -> list[Domain]:
    """Recompute every non-node domain's min_w as the sum of its children's."""
    mins = {d.name: d.min_w for d in domains if d.level == "node"}
    for level in ("rack", "row", "cluster"):
        for d in domains:
            if d.level == level:
                mins[d.name] = 0
        for d in domains:
            if d.level == LEVELS[LEVELS.index(level) + 1] and d.parent is not None:
                mins[d.parent] = mins.get(d.parent, 0) + mins[d.name]
    return [dataclasses.replace(d, min_w=mins.get(d.name, 0)) for d in domains]


def _validate(domains: Sequence[Domain]) -> None:
    if not domains or domains[0].level != "cluster" or domains[0].parent is not None:
        raise PowerTreeError("<cluster>", "the first domain must be the cluster")
    seen: dict[str, Domain] = {}
    for d in domains:
        if d.name in seen:
            raise PowerTreeError(d.name, "duplicate domain name")
        if d.level not in LEVELS:
            raise PowerTreeError(d.name, f"unknown level {d.level!r}")
        if d.parent is not None:
            parent = seen.get(d.parent)
            if parent is None or LEVELS.index(parent.level) + 1 != LEVELS.index(d.level):
                raise PowerTreeError(d.name, f"parent {d.parent!r} is not a {LEVELS[LEVELS.index(d.level) - 1]}")
        elif d.level != "cluster":
            raise PowerTreeError(d.name, "only the cluster has no parent")
        seen[d.name] = d
    for d in domains:
        if d.budget_w is not None and d.budget_w < d.min_w:
            raise PowerTreeError(
                d.name,
                f"budget {d.budget_w} W is below the sum of the minimum caps below it ({d.min_w} W)",
            )
    if domains[0].budget_w is None:
        raise PowerTreeError(domains[0].name, "the cluster needs a budget")
    for level in ("row", "rack", "node"):
        parents_with_children = {d.parent for d in domains if d.level == level}
        for d in domains:
            if d.level == LEVELS[LEVELS.index(level) - 1] and d.name not in parents_with_children:
                raise PowerTreeError(d.name, f"a {d.level} needs at least one {level}")


def _build_index(domains: Sequence[Domain]) -> TreeIndex:
    def names(level: str) -> tuple[str, ...]:
        return tuple(d.name for d in domains if d.level == level)

    def budgets(level: str) -> np.ndarray:
        return np.array(
            [math.inf if d.budget_w is None else float(d.budget_w) for d in domains if d.level == level],
            dtype=np.float64,
        )

    node_names, rack_names, row_names = names("node"), names("rack"), names("row")
    rack_pos = {n: i for i, n in enumerate(rack_names)}
    row_pos = {n: i for i, n in enumerate(row_names)}
    cluster = domains[0]
    return TreeIndex(
        node_names=node_names,
        rack_names=rack_names,
        row_names=row_names,
        cluster_name=cluster.name,
        node_of_name={n: i for i, n in enumerate(node_names)},
        rack_of_node=np.array([rack_pos[d.parent] for d in domains if d.level == "node"], dtype=np.intp),
        row_of_rack=np.array([row_pos[d.parent] for d in domains if d.level == "rack"], dtype=np.intp),
        node_budget_w=budgets("node"),
        rack_budget_w=budgets("rack"),
        row_budget_w=budgets("row"),
        cluster_budget_w=float(cluster.budget_w if cluster.budget_w is not None else math.inf),
    )
