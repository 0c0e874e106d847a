"""rasd-sim's BMC: the out-of-band power-cycle rung over the simulated nodes.

The controller carries out ``PowerCycleBmc`` through a `rasd.controller.executors.bmc.BmcPowerCycler`;
in production that is the Redfish one (``[bmc]``), here it is `SimulatedBmc`, handed to the controller
as ``ControllerSettings.power_cycler``. A power cycle boots the node whatever state it is in (it brings
back a node whose reboot never came back: ``SimulatedNodeOps.power_cycle``). A scenario's
``[[action_faults]]`` with ``action = "power_cycle_bmc"`` make it fail (the BMC refuses), not answer
(its Redfish request times out: `BmcUnavailableError`, as the Redfish cycler says it), or hang past the
ladder's deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from rasd.agent import node_ops
from rasd.agent.gpu import simulated
from rasd.controller.executors import bmc


class SimulatedBmc:
    """Power-cycles simulated nodes on the controller's request; satisfies `bmc.BmcPowerCycler`."""

    def __init__(self, faults: Mapping[str, Sequence[simulated.ActionFault]] | None = None) -> None:
        """faults: what goes wrong with each node's BMC, by node id; nodes are attached as they are built."""
        self._nodes: dict[str, node_ops.SimulatedNodeOps] = {}
        self._faults = {node: list(found) for node, found in (faults or {}).items()}
        self._hits: dict[tuple[str, int], int] = {}
        self._skips = {(node, i): f.skip for node, found in self._faults.items() for i, f in enumerate(found)}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.cycles: list[str] = []
        """The nodes power-cycled, in order."""

    def attach(self, node_id: str, ops: node_ops.SimulatedNodeOps) -> None:
        """Give the BMC power over a node (its operations)."""
        self._nodes[node_id] = ops

    def close(self) -> None:
        """End every hang now: the simulation stops."""
        self._closed.set()

    def power_cycle(self, node_id: str, *, reason: str, ticket_id: str) -> bmc.BmcOutcome:
        """Boot the node, unless a scripted fault says its BMC fails, does not answer or hangs.

        Raises:
            bmc.BmcNotConfiguredError: no such simulated node.
            bmc.BmcRejectedError: a ``fail`` fault.
            bmc.BmcUnavailableError: a ``no_answer`` fault.
            bmc.BmcTimeoutError: a ``hang`` fault, once its hang_s passed (or the simulation stops).
        """
        del reason
        ops = self._nodes.get(node_id)
        if ops is None:
            raise bmc.BmcNotConfiguredError(f"node {node_id}: no simulated BMC")
        fault = self._fault(node_id)
        if fault is not None:
            if fault.outcome == "no_answer":
                raise bmc.BmcUnavailableError(f"node {node_id}: the BMC does not answer ({fault.describe()})")
            if fault.outcome in ("hang", "slow"):
                self._closed.wait(fault.hang_s)
            if fault.outcome == "hang":
                raise bmc.BmcTimeoutError(f"node {node_id}: the BMC accepted the reset and never finished it")
            if fault.outcome == "fail":
                raise bmc.BmcRejectedError(f"node {node_id}: {fault.describe()}")
        was_down = ops.down
        ops.power_cycle()
        self.cycles.append(node_id)
        return bmc.BmcOutcome(
            node_id=node_id,
            ticket_id=ticket_id,
            status=bmc.BmcStatus.POWERED_ON if was_down else bmc.BmcStatus.POWER_CYCLED,
            detail="simulated: the node booted" + (" (it was down)" if was_down else ""),
            reset_type="On" if was_down else "PowerCycle",
            observed=("Off", "On") if was_down else ("On", "Off", "On"),
        )

    def _fault(self, node_id: str) -> simulated.ActionFault | None:
        """The scripted BMC fault that hits this call (counted), or None."""
        with self._lock:
            for index, fault in enumerate(self._faults.get(node_id, ())):
                key = (node_id, index)
                if fault.times and self._hits.get(key, 0) >= fault.times:
                    continue
                if self._skips[key]:
                    self._skips[key] -= 1
                    return None
                self._hits[key] = self._hits.get(key, 0) + 1
                return fault
        return None
