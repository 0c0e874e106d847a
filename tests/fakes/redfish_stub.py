"""A stub Redfish BMC for what sushy-emulator cannot show: a system that lists ``PowerCycle``, a
``PowerState`` that stays ``On`` through a reset (as many real BMCs report during ForceRestart), a
BMC that refuses the reset with an HTTP status, and a chassis ``Power`` resource with
``PowerControl[0].PowerLimit`` (sushy-emulator serves no Power resource).

Serves on 127.0.0.1 and a free port: the service root, ``/redfish/v1/Systems``, one system ``1``,
and its ``ComputerSystem.Reset`` action, which records the ``ResetType`` and answers
``reset_status`` (204 by default) without changing ``PowerState``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SYSTEM = "/redfish/v1/Systems/1"
CHASSIS = "/redfish/v1/Chassis/1"
POWER = f"{CHASSIS}/Power"


class StubRedfish:
    """Start with `start`, stop with `stop`; ``resets`` lists the ResetTypes POSTed."""

    def __init__(
        self,
        *,
        allowed: list[str] | None = None,
        power_state: str = "On",
        reset_status: int = 204,
        honour_power_limit: bool = True,
    ) -> None:
        self.allowed = allowed or ["On", "ForceOff", "ForceRestart"]
        self.honour_power_limit = honour_power_limit
        """False: PATCHes are accepted (204) but the limit does not change (a BMC that ignores it)."""
        self.power_limit_w: int | None = None
        self.power_limit_patches: list[int | None] = []
        self.power_state = power_state
        self.reset_status = reset_status
        self.resets: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _document(self, path: str) -> dict[str, Any] | None:
        if path in ("/redfish/v1", "/redfish/v1/"):
            return {
                "@odata.id": "/redfish/v1/",
                "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
                "Id": "RootService",
                "Name": "Stub BMC",
                "RedfishVersion": "1.6.0",
                "Systems": {"@odata.id": "/redfish/v1/Systems"},
                "Chassis": {"@odata.id": "/redfish/v1/Chassis"},
            }
        if path == "/redfish/v1/Chassis":
            return {
                "@odata.id": "/redfish/v1/Chassis",
                "@odata.type": "#ChassisCollection.ChassisCollection",
                "Name": "Chassis",
                "Members@odata.count": 1,
                "Members": [{"@odata.id": CHASSIS}],
            }
        if path == CHASSIS:
            return {
                "@odata.id": CHASSIS,
                "@odata.type": "#Chassis.v1_10_0.Chassis",
                "Id": "1",
                "Name": "stub chassis",
                "Power": {"@odata.id": POWER},
            }
        if path == POWER:
            return {
                "@odata.id": POWER,
                "@odata.type": "#Power.v1_5_0.Power",
                "Id": "Power",
                "Name": "Power",
                "PowerControl": [
                    {
                        "@odata.id": f"{POWER}#/PowerControl/0",
                        "MemberId": "0",
                        "PowerConsumedWatts": 4200,
                        "PowerLimit": {"LimitInWatts": self.power_limit_w, "LimitException": "LogEventOnly"},
                    }
                ],
            }
        if path == "/redfish/v1/Systems":
            return {
                "@odata.id": "/redfish/v1/Systems",
                "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
                "Name": "Systems",
                "Members@odata.count": 1,
                "Members": [{"@odata.id": SYSTEM}],
            }
        if path == SYSTEM:
            return {
                "@odata.id": SYSTEM,
                "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
                "Id": "1",
                "Name": "stub",
                "PowerState": self.power_state,
                "Actions": {
                    "#ComputerSystem.Reset": {
                        "target": f"{SYSTEM}/Actions/ComputerSystem.Reset",
                        "ResetType@Redfish.AllowableValues": self.allowed,
                    }
                },
            }
        return None

    @property
    def url(self) -> str:
        """Base URL."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Serve in a daemon thread."""
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any] | None) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                document = stub._document(self.path.split("?", 1)[0].rstrip("/") or "/redfish/v1")
                self._send(200 if document else 404, document or {"error": {"code": "Base.1.0.ResourceMissing"}})

            def do_PATCH(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != POWER:
                    self._send(405, {"error": {"code": "Base.1.0.OperationNotAllowed"}})
                    return
                limit = body["PowerControl"][0]["PowerLimit"]["LimitInWatts"]
                stub.power_limit_patches.append(limit)
                if stub.honour_power_limit:
                    stub.power_limit_w = limit
                self._send(204, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != f"{SYSTEM}/Actions/ComputerSystem.Reset":
                    self._send(404, {"error": {"code": "Base.1.0.ResourceMissing"}})
                    return
                if stub.reset_status >= 400:
                    self._send(stub.reset_status, {"error": {"code": "Base.1.0.ActionNotSupported", "message": "no"}})
                    return
                stub.resets.append(body.get("ResetType", ""))
                self._send(stub.reset_status, None)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
