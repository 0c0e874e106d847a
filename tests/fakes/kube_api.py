"""A fake Kubernetes API server at the HTTP edge: just enough of core/v1 Nodes and Events.

It serves, on 127.0.0.1 and a free port:

- ``GET /api/v1/nodes/{name}`` and ``GET /api/v1/nodes``;
- ``PATCH /api/v1/nodes/{name}`` and ``PATCH /api/v1/nodes/{name}/status`` with
  ``application/strategic-merge-patch+json`` only (anything else → 415), applying the strategic-merge
  rules the real server uses for the fields rasd touches: maps merge and ``null`` deletes a key,
  ``spec.taints`` is replaced as a whole, ``status.conditions`` merges by ``type`` and honours
  ``{"$patch": "delete"}``; the main resource ignores ``status`` and the status subresource ignores
  everything else; a ``metadata.resourceVersion`` in the patch is a precondition (409 when stale);
  taints are validated (label-value syntax, effect, duplicates → 422);
- ``POST /api/v1/namespaces/{ns}/events`` (201);
- ``GET /api/v1/nodes?labelSelector=…`` (equality selectors: ``k=v``, ``k!=v``, ``k``, comma-joined);
- pods and PodDisruptionBudgets (`add_pod`, `add_pdb`): ``GET /api/v1/pods?fieldSelector=spec.nodeName=…``
  and ``POST /api/v1/namespaces/{ns}/pods/{name}/eviction`` (a ``policy/v1`` Eviction) with the
  disruption controller's arithmetic: a PDB's desired healthy count is ``minAvailable`` (an integer or
  a percentage of its expected pods) or expected − ``maxUnavailable``; an eviction that would leave
  fewer healthy matching pods is 429 with the real server's message and cause; a pod under two PDBs
  is 500; otherwise the pod is deleted at once (201).

Every change bumps the node's ``resourceVersion``. Tests can inject a concurrent writer
(`FakeKubeApi.race_next`), make the server answer 503 (``unavailable``), add a round-trip time to
every answer (``latency_s``), and read every request.

Run as a program (``python tests/fakes/kube_api.py --nodes FILE --latency-ms 5``), it serves the
nodes named in FILE (one per line) until its stdin closes, and prints its URL first: the remediation
benchmark's API server, in a process of its own as a real one would be.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
_NODE = re.compile(r"^/api/v1/nodes/([^/]+)(/status)?$")
_EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
_EVICTION = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction$")
STRATEGIC = "application/strategic-merge-patch+json"


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def _merge(target: dict[str, Any], patch: dict[str, Any], path: str = "") -> None:
    for key, value in patch.items():
        here = f"{path}.{key}" if path else key
        if value is None:
            target.pop(key, None)
        elif here == "status.conditions":
            target[key] = _merge_conditions(target.get(key) or [], value)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value, here)
        else:
            target[key] = copy.deepcopy(value)


def _merge_conditions(current: list[dict[str, Any]], patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [dict(c) for c in current]
    for item in patch:
        kind = item.get("type")
        existing = next((c for c in out if c.get("type") == kind), None)
        if item.get("$patch") == "delete":
            out = [c for c in out if c.get("type") != kind]
        elif existing is not None:
            existing.update(item)
        else:
            out.append(dict(item))
    return out


def _taint_errors(taints: list[dict[str, Any]]) -> list[str]:
    errors, seen = [], set()
    for i, taint in enumerate(taints):
        if not taint.get("key"):
            errors.append(f"spec.taints[{i}].key: Required value")
        value = taint.get("value", "")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(f"spec.taints[{i}].value: Invalid value: {value!r}: a valid label must be ...")
        if taint.get("effect") not in _EFFECTS:
            errors.append(f"spec.taints[{i}].effect: Unsupported value: {taint.get('effect')!r}")
        if (taint.get("key"), taint.get("effect")) in seen:
            errors.append(f"spec.taints[{i}]: Duplicate value")
        seen.add((taint.get("key"), taint.get("effect")))
    return errors


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selector: ``k=v``, ``k==v``, ``k!=v`` and ``k`` (exists), comma-joined."""
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term not in labels:
            return False
    return True


def _pdb_selects(pdb: dict[str, Any], pod: dict[str, Any]) -> bool:
    if pdb["metadata"]["namespace"] != pod["metadata"]["namespace"]:
        return False
    wanted = (pdb["spec"].get("selector") or {}).get("matchLabels") or {}
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def _pdb_refusal(pdb: dict[str, Any], pods: list[dict[str, Any]]) -> str:
    """The 429 cause's message when evicting one more of the PDB's pods breaks it; "" when allowed."""
    healthy = sum(1 for p in pods if _pdb_selects(pdb, p) and p["status"].get("phase") == "Running")
    expected = pdb["expected_pods"]
    spec = pdb["spec"]
    if "minAvailable" in spec:
        wanted = spec["minAvailable"]
        desired = -(-expected * int(wanted[:-1]) // 100) if isinstance(wanted, str) else int(wanted)
    else:
        desired = expected - int(spec.get("maxUnavailable", 0))
    if healthy - desired >= 1:
        return ""
    name = pdb["metadata"]["name"]
    return f"The disruption budget {name} needs {desired} healthy pods and has {healthy} currently"


class FakeKubeApi:
    """The fake server; `start` it, point ``kubernetes.client.Configuration(host=fake.url)`` at it."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        """(namespace, name) → pod."""
        self.pdbs: list[dict[str, Any]] = []
        self.evicted: list[str] = []
        """``namespace/name`` of the pods evicted, in order."""
        self.refused: list[str] = []
        """``namespace/name`` of each eviction a PDB refused (429), in order."""
        self.on_refusal: Callable[[int], None] | None = None
        """Called (under the server's lock) with the refusal count after each 429: a test's rescheduler."""
        self.requests: list[tuple[str, str, str, Any]] = []  # (method, path, content-type, body)
        self.unavailable = False
        self.latency_s = 0.0
        """Added before every answer (the API server's round trip under load); requests overlap."""
        self._races: list[Callable[[dict[str, Any]], None]] = []
        self._rv = 100
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- test API -------------------------------------------------------------------------

    def add_node(
        self, name: str, *, unschedulable: bool = False, gpus: int = 8, taints: list[dict[str, Any]] | None = None
    ) -> None:
        """Register a Ready node with ``gpus`` ``nvidia.com/gpu`` capacity."""
        with self._lock:
            self._rv += 1
            spec: dict[str, Any] = {}
            if unschedulable:
                spec["unschedulable"] = True
            if taints:
                spec["taints"] = list(taints)
            self.nodes[name] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(self._rv), "labels": {}},
                "spec": spec,
                "status": {
                    "capacity": {"nvidia.com/gpu": str(gpus), "cpu": "64"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                },
            }

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        gpus: int = 0,
        labels: dict[str, str] | None = None,
        owner_kind: str = "ReplicaSet",
    ) -> None:
        """A Running pod on ``node``, requesting ``gpus`` ``nvidia.com/gpu`` (0: none), owned by owner_kind."""
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        with self._lock:
            self.pods[(namespace, name)] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                    "labels": dict(labels or {}),
                    "ownerReferences": [{"kind": owner_kind, "name": f"{name}-owner", "controller": True}],
                },
                "spec": {"nodeName": node, "containers": [{"name": "main", "resources": resources}]},
                "status": {"phase": "Running"},
            }  # fmt: skip

    def add_pdb(
        self,
        namespace: str,
        name: str,
        *,
        match_labels: dict[str, str],
        min_available: int | str | None = None,
        max_unavailable: int | None = None,
        expected_pods: int | None = None,
    ) -> None:
        """A policy/v1 PodDisruptionBudget; expected_pods: its workload's replicas (default: its pods now)."""
        spec: dict[str, Any] = {"selector": {"matchLabels": dict(match_labels)}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        with self._lock:
            pdb = {"metadata": {"name": name, "namespace": namespace}, "spec": spec, "expected_pods": 0}
            matching = sum(1 for p in self.pods.values() if _pdb_selects(pdb, p))
            pdb["expected_pods"] = expected_pods if expected_pods is not None else matching
            self.pdbs.append(pdb)

    def pods_on(self, node: str) -> list[str]:
        """``namespace/name`` of the pods on the node, sorted."""
        with self._lock:
            return sorted(f"{ns}/{n}" for (ns, n), p in self.pods.items() if p["spec"]["nodeName"] == node)

    def node(self, name: str) -> dict[str, Any]:
        """A copy of the stored node."""
        with self._lock:
            return copy.deepcopy(self.nodes[name])

    def race_next(self, mutate: Callable[[dict[str, Any]], None], times: int = 1) -> None:
        """Before each of the next ``times`` guarded PATCHes, another writer changes the node."""
        self._races.extend([mutate] * times)

    def count(self, method: str, path_part: str = "") -> int:
        """How many requests with this method (and path containing ``path_part``) arrived."""
        return sum(1 for m, p, _c, _b in self.requests if m == method and path_part in p)

    @property
    def url(self) -> str:
        """Base URL (``http://127.0.0.1:<port>``)."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Serve on 127.0.0.1 and a free port in a daemon thread."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stalls

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                return json.loads(raw) if raw else None

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_PATCH(self) -> None:
                fake._handle(self, "PATCH")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-kube-api", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ---- request handling -----------------------------------------------------------------

    def _handle(self, handler: Any, method: str) -> None:
        path, _, query = handler.path.partition("?")
        params = {k: v[0] for k, v in urllib.parse.parse_qs(query).items()}
        content_type = handler.headers.get("Content-Type", "")
        body = handler._body()
        self.requests.append((method, path, content_type, body))
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        if self.unavailable:
            handler._send(
                503, _status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
            )
            return
        code, answer = self._route(method, path, content_type, body, params)
        handler._send(code, answer)

    def _route(
        self, method: str, path: str, content_type: str, body: Any, params: dict[str, str]
    ) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path == "/api/v1/nodes":
            selector = params.get("labelSelector", "")
            with self._lock:
                items = [n for n in self.nodes.values() if _selector_matches(selector, n["metadata"].get("labels", {}))]
                return 200, {"kind": "NodeList", "apiVersion": "v1", "items": copy.deepcopy(items)}
        if method == "GET" and path == "/api/v1/pods":
            field = params.get("fieldSelector", "")
            node = field.removeprefix("spec.nodeName=") if field.startswith("spec.nodeName=") else None
            with self._lock:
                items = [p for p in self.pods.values() if node is None or p["spec"]["nodeName"] == node]
                return 200, {"kind": "PodList", "apiVersion": "v1", "items": copy.deepcopy(items)}
        eviction = _EVICTION.match(path)
        if method == "POST" and eviction:
            return self._evict(eviction.group(1), eviction.group(2), body)
        events = _EVENTS.match(path)
        if method == "POST" and events:
            # Like the real server, a missing Content-Type means JSON.
            if content_type.split(";")[0].strip() not in ("", "application/json"):
                return 415, _status(415, "UnsupportedMediaType", f"unsupported content type {content_type!r}")
            if not isinstance(body, dict) or (body.get("involvedObject") or {}).get("kind") != "Node":
                return 422, _status(422, "Invalid", "involvedObject.kind: Required value")
            stored = copy.deepcopy(body)
            stored.setdefault("metadata", {})["namespace"] = events.group(1)
            self.events.append(stored)
            return 201, stored
        match = _NODE.match(path)
        if not match:
            return 404, _status(404, "NotFound", f"the server could not find the requested resource {path}")
        name, subresource = match.group(1), match.group(2)
        with self._lock:
            node = self.nodes.get(name)
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{name}" not found')
            if method == "GET" and not subresource:
                return 200, copy.deepcopy(node)
            if method != "PATCH":
                return 405, _status(405, "MethodNotAllowed", method)
            if content_type.split(";")[0].strip() != STRATEGIC:
                return 415, _status(415, "UnsupportedMediaType", f"this fake accepts only {STRATEGIC}")
            if not isinstance(body, dict):
                return 400, _status(400, "BadRequest", "patch body must be an object")
            patch = copy.deepcopy(body)
            wanted_rv = (patch.get("metadata") or {}).pop("resourceVersion", None)
            if wanted_rv is not None and self._races:
                self._races.pop(0)(node)
                self._rv += 1
                node["metadata"]["resourceVersion"] = str(self._rv)
            if wanted_rv is not None and wanted_rv != node["metadata"]["resourceVersion"]:
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
            updated = copy.deepcopy(node)
            if subresource:
                _merge(updated, {"status": patch.get("status") or {}})
            else:
                patch.pop("status", None)
                _merge(updated, patch)
                errors = _taint_errors((updated.get("spec") or {}).get("taints") or [])
                if errors:
                    return 422, _status(422, "Invalid", f'Node "{name}" is invalid: ' + "; ".join(errors))
            if updated != node:
                self._rv += 1
                updated["metadata"]["resourceVersion"] = str(self._rv)
                self.nodes[name] = updated
            return 200, copy.deepcopy(self.nodes[name])

    def _evict(self, namespace: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or body.get("kind") != "Eviction" or body.get("apiVersion") != "policy/v1":
            return 400, _status(400, "BadRequest", "expected a policy/v1 Eviction")
        with self._lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{name}" not found')
            pdbs = [b for b in self.pdbs if _pdb_selects(b, pod)]
            if len(pdbs) > 1:
                message = (
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
                )
                return 500, _status(500, "InternalError", message)
            refusal = _pdb_refusal(pdbs[0], list(self.pods.values())) if pdbs else ""
            if refusal:
                self.refused.append(f"{namespace}/{name}")
                if self.on_refusal is not None:
                    self.on_refusal(len(self.refused))
                message = "Cannot evict pod as it would violate the pod's disruption budget."
                status = _status(429, "TooManyRequests", message)
                status["details"] = {"causes": [{"reason": "DisruptionBudget", "message": refusal}]}
                return 429, status
            del self.pods[(namespace, name)]
            self.evicted.append(f"{namespace}/{name}")
            return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}


def main(argv: list[str] | None = None) -> int:
    """Serve the nodes named in --nodes until stdin closes; the URL is the first line printed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--nodes", required=True, help="a file with one node name per line")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every answer")
    args = parser.parse_args(argv)
    fake = FakeKubeApi()
    fake.latency_s = args.latency_ms / 1000
    with open(args.nodes, encoding="utf-8") as names:
        for name in (line.strip() for line in names):
            if name:
                fake.add_node(name, gpus=args.gpus)
    fake.start()
    print(fake.url, flush=True)
    sys.stdin.read()  # until the parent closes it (or exits)
    print(json.dumps({"requests": len(fake.requests), "events": len(fake.events)}), flush=True)
    fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
