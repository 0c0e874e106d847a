"""Health sources other than the GPU backend: the kernel log and InfiniBand sysfs counters.

`KernelLogPump` runs a kernel-log follower (/dev/kmsg or journalctl) in a worker thread, parses each
record into facts (the controller classifies them), maps the PCI address to the GPU's UUID and hands
the observations to the agent together with the record's cursor. The agent spools both in one
transaction, and at start-up the spool's cursor (not the follower's own file) decides where to
resume. A SIGKILL at any instant therefore neither loses a kernel event nor reports it twice.

`IbPoller` reads /sys/class/infiniband counters and port states and reports what changed.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence

from rasd.agent import ib_sysfs, kmsg_source, wire
from rasd.agent.core import kmsg, model
from rasd.common.kernel_log import KernelEvent

Deliver = Callable[[list[model.Observation], tuple[str, str] | None], None]


def pci_to_uuid(inventory: Sequence[model.GpuInfo]) -> dict[str, str]:
    """Map every normal form of each GPU's PCI address to its UUID."""
    mapping = {}
    for gpu in inventory:
        normal = kmsg.normalize_pci(gpu.pci_bus_id)
        if normal:
            mapping[normal] = gpu.uuid
    return mapping


class KernelLogPump:
    """Follows the kernel log in a thread and delivers its observations with their cursor."""

    def __init__(
        self,
        follower: kmsg_source.KmsgFollower | kmsg_source.JournalFollower,
        *,
        source_name: str,
        inventory: Sequence[model.GpuInfo],
        deliver: Deliver,
        clock: Callable[[], int] = time.time_ns,
        saved_cursor: str | None = None,
        reopen_s: float = 1.0,
    ) -> None:
        """Prepare the pump; saved_cursor is the spool's cursor for this source, which wins."""
        self.follower = follower
        self.source_name = source_name
        self._deliver = deliver
        self._clock = clock
        self._pci = pci_to_uuid(inventory)
        self._known = frozenset(gpu.uuid for gpu in inventory)
        self._parser = kmsg.KmsgParser()
        self._reopen_s = reopen_s
        self.records_read = 0
        self.events_delivered = 0
        if saved_cursor is not None:
            # The spool is the authority: the follower's own file may be ahead (lines without events
            # committed after the last spooled event) or behind (killed between spool and file).
            follower.cursor.save(json.loads(saved_cursor))

    def run(self, stop: threading.Event) -> None:
        """Follow until stop is set. A plain file or closed FIFO is reopened after reopen_s."""
        while not stop.is_set():
            for record in self.follower.records(stop):
                self.records_read += 1
                observations = [self._observation(event) for event in self._parser.feed(record.line)]
                if observations:
                    cursor = None
                    if record.cursor:
                        position = dict(self.follower.cursor.load())
                        position.update(self._position(record))
                        cursor = (self.source_name, json.dumps(position, sort_keys=True))
                    self._deliver(observations, cursor)
                    self.events_delivered += len(observations)
                self.follower.commit(record)
            stop.wait(self._reopen_s)

    def _position(self, record: kmsg_source.KernelLogRecord) -> dict[str, str]:
        if isinstance(self.follower, kmsg_source.KmsgFollower):
            return self.follower.position(record)
        return {"source": "journal", "cursor": record.cursor}

    def _observation(self, event: KernelEvent) -> model.Observation:
        return observation_for(event, self._clock(), pci_map=self._pci, known_gpus=self._known)


def observation_for(
    event: KernelEvent, observed_unix_ns: int, *, pci_map: dict[str, str], known_gpus: frozenset[str]
) -> model.Observation:
    """A kernel event as an observation, its GPU named by this node's inventory.

    The GPU is the one at the event's PCI address; failing that, the UUID the kernel printed if it is
    one of this node's GPUs. Any other UUID (a GPU the backend does not show, or garbage in the log)
    goes to ``attributes[wire.UNANNOUNCED_GPU_ATTRIBUTE]`` only: the controller refuses events about GPUs
    a node did not announce, and one such event would block the spool behind it.
    """
    observation = kmsg.to_observation(event, observed_unix_ns)
    gpu_uuid = pci_map.get(event.pci or "", "")
    if gpu_uuid:
        return dataclasses.replace(observation, gpu_uuid=gpu_uuid)
    if observation.gpu_uuid and observation.gpu_uuid not in known_gpus:
        attributes = {**observation.attributes, wire.UNANNOUNCED_GPU_ATTRIBUTE: observation.gpu_uuid}
        return dataclasses.replace(observation, gpu_uuid="", attributes=attributes)
    return observation


class IbPoller:
    """Polls InfiniBand port states and counters and reports changes."""

    def __init__(self, root: str, *, clock: Callable[[], int] = time.time_ns) -> None:
        """Read ports under root (normally /sys/class/infiniband)."""
        self.root = root
        self._clock = clock
        self._previous: ib_sysfs.IbReadings | None = None

    def poll(self) -> tuple[model.Observation, ...]:
        """One reading; the first one is the baseline and reports nothing."""
        current = ib_sysfs.read_ib_ports(self.root)
        observations = ib_sysfs.ib_observations(self._previous, current, observed_unix_ns=self._clock())
        self._previous = current
        return observations
