"""The READMEs' Kubernetes installs, exactly as written, render to a controller that starts serving.

The commands are read out of README.md ("Kubernetes (Helm)"), the chart's README ("With PostgreSQL
(production)") and the operator guide, so this test breaks when any of them changes. The rendered controller's
arguments must name only files its mounts provide; every Secret and ConfigMap it mounts or reads
must be rendered by the chart, issued by cert-manager from a rendered Certificate, or made by the
README's own commands; and the container's argument list, with the mounts laid out in a folder,
must start a controller that reports SERVING and answers rasctl over mutual TLS."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import grpc
import helm_python as helm
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rasd.common import devcerts
from rasd.controller import main as controller_main

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "fakes"))
import kube_api

REPO = pathlib.Path(__file__).resolve().parents[3]
CERT_MANAGER_SECRET_KEYS = {"tls.crt", "tls.key", "ca.crt"}
"""What cert-manager writes into a Certificate's Secret; ca.crt only when a CA or self-signed issuer signs."""


INSTALLS = {
    "README.md": ("README.md", "\n## Kubernetes (Helm)\n", "\n## "),
    "helm/rasd/README.md": ("helm/rasd/README.md", "\n### With PostgreSQL (production)\n", "\n### "),
    "docs/operator-guide.md": (
        "docs/operator-guide.md",
        "\n### On Kubernetes with Helm: PostgreSQL, replicas and the leader\n",
        "\n### ",
    ),
}
"""Where each documented install is: the file, its section's heading, and what starts the next section."""


def _readme_commands(path: str, heading: str, next_heading: str) -> list[list[str]]:
    """The shell commands of every ```sh block in one section, a here-document's body left out."""
    text = (REPO / path).read_text()
    assert heading in text, f"{path} has no section {heading.strip()!r}"
    section = text.split(heading, 1)[1].split(next_heading, 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, f"{path}, {heading.strip()}: no ```sh block"
    commands = []
    for block in blocks:
        heredoc_end = None
        for line in block.replace("\\\n", " ").splitlines():
            if heredoc_end is not None:
                heredoc_end = None if line.strip() == heredoc_end else heredoc_end
                continue
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(shlex.split(line))
                opened = re.search(r"<<\s*'?(\w+)'?", line)
                heredoc_end = opened.group(1) if opened else None
    return commands


def _set_value(values: dict[str, Any], assignment: str) -> None:
    """One `helm --set key.path=value` (scalars only: anything else fails, so the test keeps up)."""
    path, sep, raw = assignment.partition("=")
    assert sep and not re.search(r"[,\[\]{}]", assignment), f"--set {assignment!r}: more than this parser reads"
    value: Any = {"true": True, "false": False, "null": None}.get(raw, raw)
    if isinstance(value, str) and re.fullmatch(r"-?\d+", raw):
        value = int(raw)
    *parents, leaf = path.split(".")
    for key in parents:
        values = values.setdefault(key, {})
    values[leaf] = value


class ReadmeInstall:
    """What the README's commands do: the Secrets kubectl makes, and helm install's arguments."""

    def __init__(self, commands: list[list[str]]) -> None:
        self.secrets: dict[tuple[str, str], set[str]] = {}
        self.release = self.chart = self.namespace = ""
        self.values: dict[str, Any] = {}
        for argv in commands:
            if argv[:1] == ["kubectl"] and "secret" in argv:
                self._kubectl_secret(argv)
            elif argv[:2] == ["helm", "install"]:
                self._helm_install(argv[2:])
        assert self.release, "README.md's Helm section has no helm install"

    def _kubectl_secret(self, argv: list[str]) -> None:
        namespace = argv[argv.index("-n") + 1] if "-n" in argv else "default"
        name = argv[argv.index("generic") + 1]
        keys = {arg.split("=", 1)[1].split("=", 1)[0] for arg in argv if arg.startswith("--from-")}
        self.secrets[(namespace, name)] = keys

    def _helm_install(self, argv: list[str]) -> None:
        positional = []
        args = iter(argv)
        for arg in args:
            if arg in ("-n", "--namespace"):
                self.namespace = next(args)
            elif arg == "--set":
                _set_value(self.values, next(args))
            elif arg.startswith("--set="):
                _set_value(self.values, arg.removeprefix("--set="))
            else:
                assert not arg.startswith("-"), f"helm install {arg}: more than this test reads"
                positional.append(arg)
        self.release, self.chart = positional


@pytest.fixture(scope="module", params=sorted(INSTALLS))
def install(request) -> ReadmeInstall:
    return ReadmeInstall(_readme_commands(*INSTALLS[request.param]))


@pytest.fixture(scope="module")
def objects(install) -> dict[tuple[str, str], dict[str, Any]]:
    with helm.Chart.load(REPO / install.chart) as chart:
        manifests = chart.render(install.values, name=install.release, namespace=install.namespace)
    rendered = {}
    for path, text in manifests.items():
        if path.endswith(".yaml"):
            for doc in yaml.safe_load_all(text):
                if doc:
                    rendered[(doc["kind"], doc["metadata"]["name"])] = doc
    return rendered


def _controller(objects: Mapping[tuple[str, str], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (deployment,) = [obj for (kind, _), obj in objects.items() if kind == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def _secret_keys(name: str, install: ReadmeInstall, objects: Mapping[tuple[str, str], dict[str, Any]]) -> set[str]:
    """The keys Secret name will hold, and who makes it; fails when nobody does."""
    if (install.namespace, name) in install.secrets:
        return install.secrets[(install.namespace, name)]
    if ("Secret", name) in objects:
        return set(objects[("Secret", name)].get("data", {})) | set(objects[("Secret", name)].get("stringData", {}))
    certificates = [obj for (kind, _), obj in objects.items() if kind == "Certificate"]
    for certificate in certificates:
        if certificate["spec"]["secretName"] == name:
            issuer = certificate["spec"]["issuerRef"]
            signer = objects.get((issuer["kind"], issuer["name"]))
            assert signer is not None, f"Certificate {name}'s issuer {issuer} is not rendered: who signs it?"
            assert "ca" in signer["spec"] or "selfSigned" in signer["spec"], "only CA issuers write ca.crt"
            if "ca" in signer["spec"]:
                _secret_keys(signer["spec"]["ca"]["secretName"], install, objects)  # the CA's own Secret
            return CERT_MANAGER_SECRET_KEYS
    pytest.fail(f"Secret {name}: neither rendered, issued by cert-manager, nor made by the README's commands")


def _files(container: dict[str, Any], args: list[str]) -> list[str]:
    """The absolute file paths the controller's arguments name (a sqlite URL's file included)."""
    paths = [arg for arg in args if arg.startswith("/")]
    paths += [arg.removeprefix("sqlite:///") for arg in args if arg.startswith("sqlite:////")]
    return paths


def test_the_readme_installs_the_chart_with_tls_and_makes_the_database_secret(install):
    assert install.chart == "./helm/rasd"
    assert install.values["tls"]["certManager"]["enabled"] is True
    assert ("rasd", "rasd-db") in install.secrets


def test_every_file_the_controller_reads_is_mounted_from_something_that_exists(install, objects):
    pod, container = _controller(objects)
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    env = {}
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert ref["key"] in _secret_keys(ref["name"], install, objects), f"env {item['name']}: {ref}"
            env[item["name"]] = "postgresql+psycopg://from-the-secret/rasd"
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in container["args"]]
    parsed = controller_main.build_parser().parse_args(args)
    assert parsed.tls_ca and parsed.tls_cert and parsed.tls_key, "no TLS: the controller exits off loopback"
    assert parsed.config is not None
    for path in _files(container, args):
        mount = next(
            (m for m in container["volumeMounts"] if path == m["mountPath"] or path.startswith(m["mountPath"] + "/")),
            None,
        )
        assert mount is not None, f"{path} is named in the arguments but not mounted"
        volume = volumes[mount["name"]]
        key = mount.get("subPath") or path.removeprefix(mount["mountPath"] + "/")
        if "secret" in volume:
            assert key in _secret_keys(volume["secret"]["secretName"], install, objects), f"{path}: no key {key}"
        elif "configMap" in volume:
            configmap = objects.get(("ConfigMap", volume["configMap"]["name"]))
            assert configmap is not None, f"{path}: ConfigMap {volume['configMap']['name']} is not rendered"
            assert key in configmap["data"], f"{path}: ConfigMap has no key {key}"
    for volume in volumes.values():
        if "secret" in volume:
            _secret_keys(volume["secret"]["secretName"], install, objects)


def _lay_out_mounts(
    root: pathlib.Path, container: dict[str, Any], objects: Mapping[tuple[str, str], dict[str, Any]], pki: Any
) -> dict[str, pathlib.Path]:
    """Each mount as a folder under root, filled as the kubelet would: mountPath → local path."""
    local = {}
    volumes = {v["name"]: v for v in _controller(objects)[0]["volumes"]}
    for mount in container["volumeMounts"]:
        where = root / mount["mountPath"].lstrip("/")
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(objects[("ConfigMap", volume["configMap"]["name"])]["data"][mount["subPath"]])
        elif "secret" in volume:  # the cert-manager Secret, with a dev CA standing in for the issuer's
            where.mkdir(parents=True)
            for key, source in (
                ("ca.crt", pki.ca.cert),
                ("tls.crt", pki.controller.cert),
                ("tls.key", pki.controller.key),
            ):
                (where / key).write_bytes(source.read_bytes())
        else:
            where.mkdir(parents=True, exist_ok=True)
        local[mount["mountPath"]] = where
    return local


@pytest.fixture
def started(install, objects, tmp_path, free_ports) -> Iterator[tuple[int, Any, subprocess.Popen[bytes], int]]:
    """The controller container's arguments, run here: mounts under tmp_path, free ports, SQLite for the URL."""
    _, container = _controller(objects)
    certificate = objects[("Certificate", install.release)]
    pki = devcerts.init(tmp_path / "pki", [], controller_names=certificate["spec"]["dnsNames"])
    local = _lay_out_mounts(tmp_path / "pod", container, objects, pki)
    grpc_port, health_port, metrics_port = free_ports(3)
    ports = {"--listen": grpc_port, "--health-listen": health_port}
    args = list(container["args"])
    for i, arg in enumerate(args):
        flag = args[i - 1] if i else ""
        if flag in ports:
            args[i] = f"{arg.rsplit(':', 1)[0]}:{ports[flag]}"  # still 0.0.0.0: TLS is required there
        elif flag == "--metrics-port":
            args[i] = str(metrics_port)
        for mount_path, where in local.items():
            if arg == mount_path or arg.startswith(mount_path + "/"):
                args[i] = str(where) + arg.removeprefix(mount_path)
    env = {**os.environ, "POD_NAME": f"{install.release}-0"}
    # The store's URL comes from the Secret as $RASD_DB; the README's PostgreSQL is not here, so its URL
    # is the one thing replaced.
    assert "RASD_DB" in {item["name"] for item in container["env"]}
    env["RASD_DB"] = f"sqlite:///{tmp_path / 'rasd.db'}"
    # The Kubernetes quarantine adapter reads the in-cluster config in a pod; here a kubeconfig to a
    # fake API server stands in for it (the only other thing replaced).
    api = kube_api.FakeKubeApi()
    api.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        })
    )  # fmt: skip
    env["KUBECONFIG"] = str(kubeconfig)
    process = subprocess.Popen(
        [sys.executable, "-m", "rasd.controller.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        yield grpc_port, pki, process, health_port
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        api.stop()


def test_the_rendered_controller_starts_serving_mutual_tls(started, objects):
    grpc_port, pki, process, health_port = started
    status = None
    with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
            except grpc.RpcError:
                status = None
            if status == health_pb2.HealthCheckResponse.SERVING:
                break
            time.sleep(0.2)
    if process.poll() is not None:
        output = process.stdout.read().decode() if process.stdout is not None else ""
        pytest.fail(f"the controller exited ({process.returncode}): {output[-2000:]}")
    assert status == health_pb2.HealthCheckResponse.SERVING
    # rasctl over mutual TLS, checking the serving certificate's name as the Service's DNS name.
    admin = pki.operators["admin"]
    service_name = objects[("Certificate", "rasd")]["spec"]["dnsNames"][-1]
    result = subprocess.run(
        [sys.executable, "-m", "rasd.cli.main", "--controller", f"127.0.0.1:{grpc_port}",
         "--tls-ca", str(pki.ca.cert), "--tls-cert", str(admin.cert), "--tls-key", str(admin.key),
         "--tls-server-name", service_name, "automation", "status"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "automation running\n"), result.stderr
