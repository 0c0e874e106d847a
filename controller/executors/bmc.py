"""The out-of-band rung: power-cycle a node through its BMC with Redfish (the ``sushy`` client).

The repair core asks for `rasd.controller.core.remediation.actions.PowerCycleBmc` when a node's agent is gone and
a reboot cannot be sent in band. `RedfishPowerCycler` carries it out:

1. look up the node's BMC in `BmcSettings.nodes` (URL, user, a password from an environment variable
   or a file; the password is never logged or put in an outcome or error);
2. find the ComputerSystem: the one named by ``system`` (its Id, UUID, Name or ``@odata.id``), or the
   BMC's only system;
3. choose the reset: a node that is powered off gets ``On``; otherwise ``PowerCycle`` when the
   system's ``ResetType@Redfish.AllowableValues`` lists it (a real AC-style cycle), else
   ``ForceRestart``;
4. ``POST …/Actions/ComputerSystem.Reset {"ResetType": …}``;
5. poll ``PowerState`` until the cycle is seen: the state leaves ``On`` and comes back (or, from off,
   reaches ``On``). Many BMCs report ``On`` throughout a ``ForceRestart``; if the state never leaves
   ``On`` within ``transition_window_s`` the outcome is ``RESET_UNOBSERVED`` (accepted, not seen; the
   agent's reconnect with a new boot id is then the proof). If the node is not ``On`` again within
   ``timeout_s``, `BmcTimeoutError` says what was observed.

Idempotency (a power cycle is destructive, so it is **at most once** per ticket): the caller passes a
``journal``, a ``MutableMapping[str, str]`` the service may persist (a dict is enough within one
process). Before the reset is POSTed, ``journal[ticket_id]`` is set to a JSON record
(``{"node": …, "reset_type": …, "state": "requested"}``) and later updated with the result. A ticket
already in the journal is not cycled again: the call returns ``ALREADY_REQUESTED``. The entry is
removed only when the BMC definitely refused the request (an HTTP 4xx answer to the POST: nothing
happened); an ambiguous failure (connection lost mid-POST, 5xx) keeps it, so a retry cannot cycle the
node twice. The ladder's timeout then climbs.

The call blocks (HTTP, and polling with ``sleep``): the service runs it in a thread (see `executors`).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import pathlib
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

import pydantic
import structlog

from rasd.common import settings as settings_check
from rasd.controller.core.remediation import actions

log = structlog.get_logger("rasd.controller")


class BmcError(Exception):
    """Base of the BMC errors."""


class BmcNotConfiguredError(BmcError):
    """The node has no BMC entry, or its password cannot be read (names the variable or file)."""


class BmcUnavailableError(BmcError):
    """The BMC could not be reached or answered 5xx; retrying later may work."""


class BmcRejectedError(BmcError):
    """The BMC refused: bad credentials, or no usable reset type."""


class BmcSystemNotFoundError(BmcError):
    """The BMC has no ComputerSystem matching the configured ``system``."""


class BmcTimeoutError(BmcError):
    """The reset was sent but the node did not come back ``On`` in time."""


class BmcSettingsError(ValueError):
    """Bad BMC settings; the message starts with the offending key's path."""


class BmcStatus(enum.StrEnum):
    """What a power-cycle call observed."""

    POWER_CYCLED = "power_cycled"
    """PowerState left On after the reset and came back On."""
    RESET_UNOBSERVED = "reset_unobserved"
    """The BMC accepted the reset but PowerState stayed On through the transition window."""
    POWERED_ON = "powered_on"
    """The node was off; ResetType On was sent and PowerState reached On."""
    ALREADY_REQUESTED = "already_requested"
    """The journal already holds this ticket's power cycle; the BMC was not contacted."""


@dataclasses.dataclass(frozen=True)
class BmcOutcome:
    """What one power-cycle call did."""

    node_id: str
    ticket_id: str
    status: BmcStatus
    detail: str
    """One sentence for the audit log and the action result message."""
    reset_type: str = ""
    """The ResetType POSTed ("" when none was)."""
    system: str = ""
    """The ComputerSystem's ``@odata.id``."""
    observed: tuple[str, ...] = ()
    """PowerState readings, consecutive repeats folded ("On", "Off", "On")."""
    elapsed_s: float = 0.0
    """From the reset POST to the decisive reading."""

    def __str__(self) -> str:
        return f"bmc: power cycle {self.node_id}: {self.status}: {self.detail}"


@runtime_checkable
class BmcPowerCycler(Protocol):
    """Power-cycles a node out of band; at most once per ticket."""

    def power_cycle(self, node_id: str, *, reason: str, ticket_id: str) -> BmcOutcome:
        """Power-cycle ``node_id`` through its BMC and report what was observed."""
        ...


# --------------------------------------------------------------------------------------------
# Settings


@dataclasses.dataclass(frozen=True)
class BmcNodeSettings:
    """One node's BMC."""

    url: Annotated[str, pydantic.Field(pattern=r"^https?://")]
    """The BMC's base URL ("https://10.1.2.3"); the service root is ``/redfish/v1/`` below it."""
    username: str = ""
    password_env: str = ""
    """Name of the environment variable holding the password (e.g. from a Kubernetes Secret)."""
    password_file: str = ""
    """File holding the password (first line; a mounted Secret). Exactly one of the two is set."""
    system: str = ""
    """The ComputerSystem: Id, UUID, Name or ``@odata.id``; empty: the BMC's only system."""
    verify_tls: bool = True
    """Verify the BMC's certificate (many BMCs ship self-signed ones: prefer ``ca_file``)."""
    ca_file: str = ""
    """CA bundle to verify the BMC's certificate with."""


@dataclasses.dataclass(frozen=True)
class BmcSettings:
    """Per-node BMC access and the timing of a power cycle."""

    nodes: Mapping[str, BmcNodeSettings] = dataclasses.field(default_factory=dict)
    """node_id → its BMC."""
    timeout_s: float = 600.0
    """How long after the reset the node may take to report ``On`` again."""
    transition_window_s: float = 60.0
    """If PowerState never leaves ``On`` within this long after a restart, report RESET_UNOBSERVED."""
    poll_interval_s: float = 2.0
    """Seconds between PowerState readings."""
    request_timeout_s: float = 30.0
    """Timeout of each Redfish request."""
    server_side_retries: int = 2
    """How often sushy tries a request that cannot connect or gets a 5xx (0: sushy's 3)."""
    retry_delay_s: float = 3.0
    """Seconds between those tries."""
    auth: Literal["basic", "session"] = "basic"
    """"basic" (HTTP basic auth per request: nothing to leak) or "session" (an X-Auth-Token session,
    deleted afterwards; for BMCs that disable basic auth)."""
    prefer_power_cycle: bool = True
    """Use ResetType PowerCycle where the system allows it; otherwise (or if false) ForceRestart."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, prefix: str = "bmc.") -> BmcSettings:
        """Build from a dict (the ``[bmc]`` TOML table), naming any unknown key or bad value.

        Example::

            BmcSettings.from_mapping({"nodes": {"gpu-001": {"url": "https://10.0.0.11",
                                                            "username": "rasd",
                                                            "password_env": "RASD_BMC_PASSWORD"}}})

        Raises:
            BmcSettingsError: e.g. ``"bmc.nodes.gpu-001.password_env: set exactly one of password_env
                and password_file"``.
        """
        settings = cls(**settings_check.typed_values(cls, data, prefix, BmcSettingsError))
        for node_id, node in settings.nodes.items():
            path = f"{prefix}nodes.{node_id}."
            _require(
                bool(node.password_env) != bool(node.password_file),
                f"{path}password_env",
                "set exactly one of password_env and password_file",
                (node.password_env, node.password_file),
            )
        for name in ("timeout_s", "transition_window_s", "poll_interval_s", "request_timeout_s", "retry_delay_s"):
            _require(getattr(settings, name) > 0, f"{prefix}{name}", "must be > 0", getattr(settings, name))
        _require(settings.server_side_retries >= 0, f"{prefix}server_side_retries", "must be >= 0",
                 settings.server_side_retries)  # fmt: skip
        return settings


def _require(ok: bool, path: str, message: str, value: Any) -> None:
    settings_check.require(ok, path, message, value, BmcSettingsError)


# --------------------------------------------------------------------------------------------
# Redfish


class RedfishPowerCycler:
    """Power-cycles nodes through Redfish ``ComputerSystem.Reset`` with the ``sushy`` client.

    Args:
        settings: the BMCs and timings.
        journal: ticket_id → JSON record of the power cycle; see the module docstring.
        environ: where ``password_env`` is looked up (default: ``os.environ``).
        clock: monotonic seconds (injected by tests).
        sleep: waits between polls (injected by tests).
    """

    def __init__(
        self,
        settings: BmcSettings,
        journal: MutableMapping[str, str],
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._settings = settings
        self._journal = journal
        self._environ = os.environ if environ is None else environ
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()

    def power_cycle(self, node_id: str, *, reason: str, ticket_id: str) -> BmcOutcome:
        """Power-cycle ``node_id`` once for ``ticket_id``.

        Args:
            node_id: the node; must have an entry in ``settings.nodes``.
            reason: why (logged with the request).
            ticket_id: the repair ticket; the journal key.

        Returns:
            POWER_CYCLED, POWERED_ON, RESET_UNOBSERVED, or ALREADY_REQUESTED for a repeat.

        Raises:
            BmcNotConfiguredError: no BMC entry, or the password cannot be read.
            BmcUnavailableError: the BMC cannot be reached (retry later).
            BmcRejectedError: bad credentials, or no usable reset type.
            BmcSystemNotFoundError: no such ComputerSystem.
            BmcTimeoutError: the node did not come back On within ``timeout_s``.
        """
        with self._lock:  # executors run in threads: one call per ticket at a time
            previous = self._journal.get(ticket_id)
            if previous is None and ticket_id in self._in_flight:
                previous = "in progress in another call"
            if previous is None:
                self._in_flight.add(ticket_id)
        if previous is not None:
            return BmcOutcome(
                node_id,
                ticket_id,
                BmcStatus.ALREADY_REQUESTED,
                f"this ticket's power cycle was already requested ({previous}); not repeated",
            )
        try:
            return self._power_cycle(node_id, reason, ticket_id)
        finally:
            with self._lock:
                self._in_flight.discard(ticket_id)

    # ---- internals ------------------------------------------------------------------------

    def _power_cycle(self, node_id: str, reason: str, ticket_id: str) -> BmcOutcome:
        import sushy  # optional extra: imported only when a power cycle runs
        from sushy import auth as sushy_auth
        from sushy import connector as sushy_connector

        node = self._settings.nodes.get(node_id)
        if node is None:
            raise BmcNotConfiguredError(f"no BMC configured for node {node_id}")
        password = self._password(node_id, node)
        verify: bool | str = node.ca_file or node.verify_tls
        connector = sushy_connector.Connector(
            node.url,
            verify=verify,
            server_side_retries=self._settings.server_side_retries,
            server_side_retries_delay=self._settings.retry_delay_s,
            default_request_timeout=self._settings.request_timeout_s,
            connect_timeout=min(10.0, self._settings.request_timeout_s),
        )
        auth_cls = sushy_auth.BasicAuth if self._settings.auth == "basic" else sushy_auth.SessionAuth
        auth = auth_cls(username=node.username, password=password)
        try:
            try:
                root = sushy.Sushy(node.url, auth=auth, connector=connector)
                system = self._find_system(root, node, node_id)
                initial = _state(system)
                reset_type = self._choose_reset(system, initial, node_id)
            except sushy.exceptions.SushyError as exc:
                raise _map_error(exc, node_id, node.url, "connect") from exc
            record = {"node": node_id, "system": system.path, "reset_type": reset_type, "state": "requested"}
            self._journal[ticket_id] = json.dumps(record, sort_keys=True)
            log.warning(
                "bmc_power_cycle_requested",
                node=node_id,
                bmc=node.url,
                system=system.path,
                reset_type=reset_type,
                power_state=initial,
                ticket=ticket_id,
                reason=reason,
            )
            try:
                system.reset_system(sushy.ResetType(reset_type))
            except sushy.exceptions.SushyError as exc:
                status = getattr(exc, "status_code", None)
                if status is not None and 400 <= status < 500:
                    del self._journal[ticket_id]  # refused outright: nothing happened, a retry may run
                else:
                    self._journal[ticket_id] = json.dumps({**record, "state": "reset_failed"}, sort_keys=True)
                raise _map_error(exc, node_id, node.url, f"reset {reset_type}") from exc
            outcome = self._watch(system, node_id, ticket_id, reset_type, initial, record)
        finally:
            auth.close()
            connector.close()
        self._journal[ticket_id] = json.dumps({**record, "state": str(outcome.status)}, sort_keys=True)
        log.warning(
            "bmc_power_cycle_done",
            node=node_id,
            ticket=ticket_id,
            status=str(outcome.status),
            observed=list(outcome.observed),
            elapsed_s=round(outcome.elapsed_s, 1),
        )
        return outcome

    def _password(self, node_id: str, node: BmcNodeSettings) -> str:
        if node.password_env:
            value = self._environ.get(node.password_env)
            if not value:
                raise BmcNotConfiguredError(f"node {node_id}: environment variable {node.password_env} is not set")
            return value
        try:
            return pathlib.Path(node.password_file).read_text().splitlines()[0]
        except (OSError, IndexError) as exc:
            raise BmcNotConfiguredError(
                f"node {node_id}: cannot read password_file {node.password_file} ({type(exc).__name__})"
            ) from exc

    def _find_system(self, root: Any, node: BmcNodeSettings, node_id: str) -> Any:
        collection = root.get_system_collection()
        paths = sorted(collection.members_identities)
        if not node.system:
            if len(paths) != 1:
                raise BmcSystemNotFoundError(
                    f"node {node_id}: BMC {node.url} has {len(paths)} systems ({', '.join(paths)}); "
                    "set system to choose one"
                )
            return root.get_system(paths[0])
        wanted = node.system
        for path in paths:
            if path.rstrip("/") == wanted.rstrip("/") or path.rstrip("/").rsplit("/", 1)[-1] == wanted:
                return root.get_system(path)
        for path in paths:  # match by UUID or Name: needs each system's document
            system = root.get_system(path)
            if wanted in (system.uuid, system.name):
                return system
        raise BmcSystemNotFoundError(
            f"node {node_id}: BMC {node.url} has no system {wanted!r} (it has: {', '.join(paths) or 'none'})"
        )

    def _choose_reset(self, system: Any, power_state: str, node_id: str) -> str:
        import sushy

        allowed = system.get_allowed_reset_system_values()
        # sushy answers "every ResetType" when the BMC lists none; then PowerCycle is not known to work.
        known = allowed != set(sushy.ResetType)
        names = {value.value for value in allowed}
        if power_state == "Off":
            for candidate in ("On", "ForceOn"):
                if candidate in names:
                    return candidate
        elif self._settings.prefer_power_cycle and known and "PowerCycle" in names:
            return "PowerCycle"
        elif "ForceRestart" in names:
            return "ForceRestart"
        raise BmcRejectedError(
            f"node {node_id}: system {system.path} allows no usable reset from PowerState {power_state} "
            f"(allowed: {', '.join(sorted(names))})"
        )

    def _watch(
        self, system: Any, node_id: str, ticket_id: str, reset_type: str, initial: str, record: dict[str, Any]
    ) -> BmcOutcome:
        import sushy

        start = self._clock()
        observed = [initial]
        left_on = initial != "On"
        while True:
            elapsed = self._clock() - start
            if elapsed >= self._settings.timeout_s:
                self._journal[ticket_id] = json.dumps({**record, "state": "timed_out"}, sort_keys=True)
                raise BmcTimeoutError(
                    f"node {node_id}: PowerState not On within {self._settings.timeout_s:g} s after {reset_type} "
                    f"(observed {' -> '.join(observed)})"
                )
            self._sleep(self._settings.poll_interval_s)
            try:
                system.refresh(force=True)
                state = _state(system)
            except sushy.exceptions.SushyError as exc:  # BMCs often drop out while the host cycles
                state = f"unreadable ({type(exc).__name__})"
            if state != observed[-1]:
                observed.append(state)
            elapsed = self._clock() - start
            if state == "On" and left_on:
                status = BmcStatus.POWERED_ON if initial == "Off" else BmcStatus.POWER_CYCLED
                seen = " -> ".join(observed)
                return BmcOutcome(
                    node_id, ticket_id, status, f"{reset_type} accepted; PowerState {seen} in {elapsed:.1f} s",
                    reset_type, system.path, tuple(observed), elapsed,
                )  # fmt: skip
            if state != "On":
                left_on = True
            elif elapsed >= self._settings.transition_window_s:
                return BmcOutcome(
                    node_id, ticket_id, BmcStatus.RESET_UNOBSERVED,
                    f"{reset_type} accepted but PowerState stayed On for {elapsed:.0f} s; "
                    "confirm by the agent reconnecting with a new boot id",
                    reset_type, system.path, tuple(observed), elapsed,
                )  # fmt: skip


def _state(system: Any) -> str:
    state = system.power_state
    return str(getattr(state, "value", state) or "Unknown")


def _map_error(exc: Exception, node_id: str, url: str, what: str) -> BmcError:
    import sushy

    text = f"node {node_id}: BMC {url}: {what}: {exc}"
    if isinstance(exc, sushy.exceptions.AccessError):
        return BmcRejectedError(f"node {node_id}: BMC {url}: {what}: access denied (check username/password)")
    if isinstance(exc, sushy.exceptions.ResourceNotFoundError):
        return BmcSystemNotFoundError(text)
    if isinstance(exc, sushy.exceptions.ConnectionError | sushy.exceptions.ServerSideError):
        return BmcUnavailableError(text)
    if isinstance(exc, sushy.exceptions.HTTPError):
        return BmcRejectedError(text)
    return BmcUnavailableError(text)


def executors(cycler: BmcPowerCycler) -> dict[str, Callable[[actions.Action], BmcOutcome]]:
    """The ``{"power_cycle_bmc": callable}`` entry for the remediation service's executor table."""

    def run(action: actions.Action) -> BmcOutcome:
        if not isinstance(action, actions.PowerCycleBmc):
            raise TypeError(f"not a BMC power cycle: {action.kind}")
        return cycler.power_cycle(action.node_id, reason=action.reason, ticket_id=action.ticket_id)

    return {actions.PowerCycleBmc.kind: run}


def open_power_cycler(settings: Mapping[str, Any], journal: MutableMapping[str, str]) -> RedfishPowerCycler:
    """Build the Redfish power cycler from the ``[bmc]`` settings table (see `BmcSettings.from_mapping`)."""
    return RedfishPowerCycler(BmcSettings.from_mapping(settings), journal)


# --------------------------------------------------------------------------------------------
# Out-of-band power limits (the power loop's last line for nodes whose agent is unreachable)


class RedfishPowerLimiter:
    """Sets a node's power limit through Redfish ``Chassis → Power → PowerControl[0].PowerLimit``.

    ``PATCH {"PowerControl": [{"PowerLimit": {"LimitInWatts": N}}]}`` on the chassis' Power resource,
    then a fresh ``GET`` reads the limit back: only a read-back at or below the wanted limit counts
    as confirmed (the power loop then treats the node as drawing at most that). ``None`` lifts the
    limit (``LimitInWatts: null``). sushy models no PowerControl, so this uses sushy's connector for
    the HTTP (auth, retries, TLS) and reads the documents itself. The chassis is the one named by the
    node's ``system`` setting (its Id or ``@odata.id``), else the BMC's only chassis.
    """

    def __init__(self, settings: BmcSettings, *, environ: Mapping[str, str] | None = None) -> None:
        self._settings = settings
        self._environ = os.environ if environ is None else environ
        self._cycler = RedfishPowerCycler(settings, {}, environ=self._environ)

    def configured(self, node_id: str) -> bool:
        """Whether the node has a BMC entry."""
        return node_id in self._settings.nodes

    def set_node_limit(self, node_id: str, limit_w: int | None) -> int | None:
        """Set (None: lift) the node's limit; returns LimitInWatts read back (None: no limit).

        Raises:
            BmcNotConfiguredError, BmcUnavailableError, BmcRejectedError, BmcSystemNotFoundError: as
                for a power cycle; BmcRejectedError also when the chassis has no PowerControl.
        """
        import sushy
        from sushy import connector as sushy_connector

        node = self._settings.nodes.get(node_id)
        if node is None:
            raise BmcNotConfiguredError(f"no BMC configured for node {node_id}")
        password = self._cycler._password(node_id, node)
        connector = sushy_connector.Connector(
            node.url,
            verify=node.ca_file or node.verify_tls,
            server_side_retries=self._settings.server_side_retries,
            server_side_retries_delay=self._settings.retry_delay_s,
            default_request_timeout=self._settings.request_timeout_s,
            connect_timeout=min(10.0, self._settings.request_timeout_s),
        )
        connector.set_http_basic_auth(node.username, password)
        try:
            power_path = self._power_path(connector, node, node_id)
            body = {"PowerControl": [{"PowerLimit": {"LimitInWatts": limit_w}}]}
            connector.patch(power_path, data=body)
            document = connector.get(power_path).json()
        except sushy.exceptions.SushyError as exc:
            raise _map_error(exc, node_id, node.url, f"power limit {limit_w}") from exc
        finally:
            connector.close()
        controls = document.get("PowerControl") or []
        if not controls:
            raise BmcRejectedError(f"node {node_id}: BMC {node.url}: {power_path} has no PowerControl")
        value = (controls[0].get("PowerLimit") or {}).get("LimitInWatts")
        log.warning("bmc_power_limit", node=node_id, bmc=node.url, wanted_w=limit_w, read_back_w=value)
        return None if value is None else int(value)

    def _power_path(self, connector: Any, node: BmcNodeSettings, node_id: str) -> str:
        root = connector.get("/redfish/v1/").json()
        chassis_link = (root.get("Chassis") or {}).get("@odata.id")
        if not chassis_link:
            raise BmcSystemNotFoundError(f"node {node_id}: BMC {node.url} lists no Chassis")
        members = sorted(m["@odata.id"] for m in connector.get(chassis_link).json().get("Members", []))
        if node.system:
            members = [
                m
                for m in members
                if m.rstrip("/") == node.system.rstrip("/") or m.rstrip("/").rsplit("/", 1)[-1] == node.system
            ]
        if len(members) != 1:
            raise BmcSystemNotFoundError(
                f"node {node_id}: BMC {node.url}: expected one chassis {node.system!r}, found {len(members)}"
            )
        power = (connector.get(members[0]).json().get("Power") or {}).get("@odata.id")
        if not power:
            raise BmcRejectedError(f"node {node_id}: BMC {node.url}: chassis {members[0]} has no Power resource")
        return str(power)


def open_power_limiter(settings: Mapping[str, Any]) -> RedfishPowerLimiter:
    """Build the Redfish node power limiter from the ``[bmc]`` settings table."""
    return RedfishPowerLimiter(BmcSettings.from_mapping(settings))
