"""The Helm chart helm/rasd, rendered and linted by the real Helm library.

helm-python-sdk bundles Helm v4 as a shared library (no helm binary, no network). Every rendered
object is validated against the Kubernetes OpenAPI schemas that kubernetes-validate ships, in strict
mode (unknown fields fail). The ConfigMap's controller.toml must load with the controller's own
`load_config`, the agent's agent.toml with the agent's own `settings.load`, and the rendered
command lines must parse with the programs' own argument parsers.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import re
import textwrap
import tomllib
from collections.abc import Iterator, Mapping
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from rasd.agent import main as agent_main
from rasd.agent import metrics as agent_metrics
from rasd.agent import settings as agent_settings
from rasd.agent import settings_file
from rasd.agent.gpu import simulated
from rasd.common import tls
from rasd.controller import config as config_mod
from rasd.controller import main as controller_main
from rasd.controller import server, stragglers
from rasd.controller.core import straggler, straggler_actions
from rasd.controller.core.power import policy as power_policy
from rasd.controller.core.remediation import policy
from rasd.controller.executors import bmc, quarantine
from rasd.controller.observability import metrics as controller_metrics
from rasd.controller.power import loop as power_loop
from rasd.controller.replication import leader

REPO = pathlib.Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "rasd"
RELEASE = "rasd"
NAMESPACE = "rasd-system"

# A supported release and the newest one kubernetes-validate ships schemas for.
KUBE_VERSIONS = ("1.34.0", "1.37.0")
# Custom resources: their schemas come with their operators' CRDs, not with Kubernetes, so
# kubernetes-validate has none. They are checked field by field in their own tests below.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),  # against its CRD's schema in test_alert_rules.py
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything-on": {
        "controller": {"replicas": 3, "logLevel": "debug", "extraArgs": ["--log-level", "debug"]},
        "database": {"urlSecret": {"name": "rasd-db", "key": "uri"}},
        "config": {
            "remediation": {
                "classification": {"xid_action_overrides": {"13": "reset_gpu"}, "ib_flap_isolation": "port"},
                "correlation": {"sticky_xids": [74, 79], "sticky_window_s": 1000000},
                "escalation": {"max_attempts_reset_gpu": 3, "bmc_power_cycle_enabled": True},
                "disruption": {"max_disrupted_nodes_pct": 2.5, "domain_max_pct": {"rack": 50}},
            },
            "quarantine": {"adapter": "kubernetes", "kubernetes": {"event_namespace": NAMESPACE}},
            "bmc": {
                "timeout_s": 900,
                "nodes": {"gpu-node-0042": {"url": "https://10.0.42.10", "username": "rasd", "password_env": "BMC"}},
            },
        },
        "tls": {"certManager": {"enabled": True, "issuerRef": {"name": "rasd-ca"}, "extraDnsNames": ["rasd.example"]}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "agent": {
            "enabled": True,
            "config": {"destructive_actions": True, "failsafe_power_limit_w": 500, "labels": {"row": "row-3"}},
        },
        "commonLabels": {"team": "gpu-infra"},
    },
    # The default replicas (two, lease election on PostgreSQL) with power management on.
    "power-on-replicas": {
        "config": {
            "power": {
                "draw_window_s": 6.0,
                "policy": {"control_period_s": 2.0, "swing_target_pct": 10.0, "swing_target_w": None},
                "tree": {
                    "budget_w": 800000,
                    "rows": [
                        {
                            "name": "row-a",
                            "racks": [
                                {
                                    "name": "rack-a1",
                                    "budget_w": 40000,
                                    "nodes": [{"name": "gpu-node-0042", "budget_w": 5600}, {"name": "gpu node/43"}],
                                },
                                {"name": "rack-a2", "nodes": [{"name": "gpu-node-0044", "min_w": 1600}]},
                            ],
                        }
                    ],
                },
            }
        }
    },
    "sqlite-persistent-slurm": {
        "controller": {"replicas": 1, "remediation": False},
        "database": {
            "urlSecret": {"name": ""},
            "sqlite": {"persistence": {"enabled": True, "storageClassName": "fast"}},
        },
        "config": {"quarantine": {"adapter": "slurm", "slurm": {"scontrol": "/usr/bin/scontrol"}}},
        "podDisruptionBudget": {"maxUnavailable": None, "minAvailable": "50%"},
        "tls": {"secretName": "rasd-tls-existing"},
        "dashboards": {"enabled": False},
        "serviceAccount": {"create": False, "name": "existing"},
    },
}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (the API server's strict decoding does too)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key_node, deep=deep) for key_node, _ in node.value]
        duplicates = sorted({str(key) for key in keys if keys.count(key) > 1})
        if duplicates:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {duplicates}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: Mapping[str, Any] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """Render like `helm template` and return the objects by (kind, name)."""
    manifests = chart.render(dict(values or {}), name=RELEASE, namespace=NAMESPACE)
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path, text in manifests.items():
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.load_all(text, Loader=_StrictLoader):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in objects, f"{key} rendered twice"
                objects[key] = doc
    return objects


def notes(chart: helm.Chart, values: Mapping[str, Any] | None = None) -> str:
    return chart.render(dict(values or {}), name=RELEASE, namespace=NAMESPACE)["rasd/templates/NOTES.txt"]


def the(objects: Mapping[tuple[str, str], dict[str, Any]], kind: str, name: str = RELEASE) -> dict[str, Any]:
    return objects[(kind, name)]


def controller_container(objects: Mapping[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    (container,) = the(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


# --------------------------------------------------------------------------------------------
# Helm: lint, render, Kubernetes schemas


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_lint_reports_no_errors_and_no_warnings(value_set):
    report = helm.lint(CHART, VALUE_SETS[value_set], strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    problems = [message for message in report["messages"] if message["severity"] >= 2]  # 2 warning, 3 error
    assert problems == []


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_rendered_object_validates_against_the_kubernetes_schemas(chart, value_set, kube_version):
    objects = render(chart, VALUE_SETS[value_set])
    checked = 0
    for (kind, name), obj in objects.items():
        if (obj["apiVersion"], kind) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{kind}/{name} at {'.'.join(map(str, exc.path))}: {exc.message}")
        checked += 1
    assert checked >= 5


def test_default_render_is_the_controller_alone(chart):
    objects = render(chart)
    assert sorted(objects) == [
        ("ConfigMap", RELEASE),
        ("ConfigMap", f"{RELEASE}-dashboards"),
        ("Deployment", RELEASE),
        ("PodDisruptionBudget", RELEASE),
        ("Service", RELEASE),
        ("ServiceAccount", RELEASE),
    ]
    deployment = the(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


def test_everything_on_renders_every_optional_object(chart):
    kinds = {kind for kind, _ in render(chart, VALUE_SETS["everything-on"])}
    assert kinds >= {
        "DaemonSet",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "Certificate",
        "ClusterRole",
        "ClusterRoleBinding",
    }


# --------------------------------------------------------------------------------------------
# values.schema.json and the chart's own checks


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"controller": {"replicas": "two"}}, "at '/controller/replicas': got string, want integer"),
        ({"config": {"quarantine": {"adapter": "carrier-pigeon"}}}, "at '/config/quarantine/adapter'"),
        ({"config": {"remediation": {"escalaton": {}}}}, "additional properties 'escalaton' not allowed"),
        (
            {"config": {"remediation": {"escalation": {"max_attempts_reset_gpu": 1.5}}}},
            "at '/config/remediation/escalation/max_attempts_reset_gpu': got number, want integer",
        ),
        ({"config": {"bmc": {"auth": "kerberos"}}}, "at '/config/bmc/auth'"),
        ({"controller": {"grpcPort": 70000}}, "at '/controller/grpcPort'"),
        ({"agent": {"config": {"node_id": "gpu-1"}}}, "additional properties 'node_id' not allowed"),
        ({"agent": {"config": {"state_dir": "/tmp"}}}, "additional properties 'state_dir' not allowed"),
        ({"agent": {"config": {"log_level": "loud"}}}, "at '/agent/config/log_level'"),
        (
            {"agent": {"config": {"sampling": {"power_sample_interval_ms": 0}}}},
            "at '/agent/config/sampling/power_sample_interval_ms'",
        ),
        ({"servce": {"type": "ClusterIP"}}, "additional properties 'servce' not allowed"),
        ({"config": {"leader": {"lease_s": 0}}}, "at '/config/leader/lease_s': minimum: got 0, want 0.5"),
        ({"config": {"leader": {"election": "raft"}}}, "at '/config/leader/election'"),
        ({"controller": {"replicas": -1}}, "at '/controller/replicas': minimum: got -1, want 0"),
        ({"config": {"power": {"tree": {"budget_w": 1000, "rows": []}}}}, "at '/config/power/tree/rows'"),
        ({"config": {"power": {"policy": {"control_perod_s": 2}}}}, "additional properties 'control_perod_s'"),
    ],
)
def test_schema_rejects_a_bad_value_naming_it(chart, values, complaint):
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert complaint in str(caught.value)


def test_unknown_quarantine_adapter_lists_the_known_ones(chart):
    with pytest.raises(helm.HelmValuesError, match=r"record.*kubernetes.*slurm"):
        chart.validate_schema({"config": {"quarantine": {"adapter": "carrier-pigeon"}}})


def test_more_than_one_replica_needs_postgresql(chart):
    with pytest.raises(helm.HelmRenderError, match=r"replicas > 1 needs PostgreSQL: set database\.urlSecret\.name"):
        chart.render({"database": {"urlSecret": {"name": ""}}}, name=RELEASE, namespace=NAMESPACE)
    single = render(chart, {"controller": {"replicas": 1}, "database": {"urlSecret": {"name": ""}}})
    assert the(single, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}


def test_ingest_workers_render_the_flag_and_need_postgresql(chart):
    """controller.ingestWorkers (issue #36): N processes serving agent streams in each pod."""
    default = controller_container(render(chart))
    assert "--ingest-workers" not in default["args"]
    container = controller_container(render(chart, {"controller": {"ingestWorkers": 4}}))
    args = controller_main.build_parser().parse_args(container["args"])
    config, _tables = config_mod.load(
        environ={"RASD_DB": "postgresql+psycopg://u:p@db/rasd"}, flags=config_mod.flags_of(args)
    )
    assert config.ingest_workers == 4
    sqlite = {"controller": {"replicas": 1, "ingestWorkers": 2}, "database": {"urlSecret": {"name": ""}}}
    with pytest.raises(helm.HelmRenderError, match=r"ingestWorkers > 1 needs PostgreSQL"):
        chart.render(sqlite, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(helm.HelmValuesError, match=r"at '/controller/ingestWorkers'"):
        chart.render({"controller": {"ingestWorkers": 0}}, name=RELEASE, namespace=NAMESPACE)


def test_static_election_on_postgresql_is_refused_where_two_pods_could_lead(chart):
    """Every statically elected pod leads: two replicas, or a rolling update's old and new pod, both act."""
    static = {"config": {"leader": {"election": "static"}}}
    with pytest.raises(helm.HelmRenderError, match=r"election static on PostgreSQL makes every pod a leader"):
        chart.render(static, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(helm.HelmRenderError, match=r"makes every pod a leader"):
        chart.render({**static, "controller": {"replicas": 1}}, name=RELEASE, namespace=NAMESPACE)  # rolling update
    one = render(chart, {**static, "controller": {"replicas": 1, "strategy": {"type": "Recreate"}}})
    assert the(one, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert the(render(chart), "Deployment")["spec"]["replicas"] == 2  # election auto: the lease


def test_replicas_elect_a_leader_named_by_their_pod(chart):
    text = notes(chart)
    assert "2 replicas" in text and "leader" in text and "Secret rasd-db" in text
    env = {e["name"]: e for e in controller_container(render(chart))["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}  # the advertised address
    assert env["RASD_DB"]["valueFrom"]["secretKeyRef"] == {"name": "rasd-db", "key": "url"}
    config = tomllib.loads(the(render(chart), "ConfigMap")["data"]["controller.toml"])
    assert config["leader"] == {"election": "auto", "lease_s": 15.0, "renew_s": 5.0, "relay_poll_s": 0.5}


def test_pdb_takes_exactly_one_bound(chart):
    with pytest.raises(helm.HelmRenderError, match="exactly one of minAvailable and maxUnavailable"):
        chart.render({"podDisruptionBudget": {"minAvailable": 1}}, name=RELEASE, namespace=NAMESPACE)
    pdb = the(render(chart, VALUE_SETS["sqlite-persistent-slurm"]), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == "50%"
    assert "maxUnavailable" not in pdb["spec"]


def test_cert_manager_needs_an_issuer(chart):
    with pytest.raises(helm.HelmRenderError, match=r"issuerRef\.name"):
        chart.render({"tls": {"certManager": {"enabled": True}}}, name=RELEASE, namespace=NAMESPACE)


def test_values_schema_is_the_generated_one():
    """values.schema.json is helm/generate_schema.py's: regenerate it (make schema) after changing a setting."""
    committed = (CHART / "values.schema.json").read_text()
    assert committed == _schema_generator().text(), "helm/rasd/values.schema.json is stale: make schema"


def _schema_generator() -> Any:
    """helm/generate_schema.py, a repository script (like proto/generate.py), loaded as a module."""
    spec = importlib.util.spec_from_file_location("generate_schema", REPO / "helm" / "generate_schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_schema_of_agent_config_is_agent_toml_but_what_the_chart_sets():
    """agent.config takes every agent.toml key the agent loads, except those the chart sets itself."""
    node = json.loads((CHART / "values.schema.json").read_text())["properties"]["agent"]["properties"]["config"]
    assert node["additionalProperties"] is False
    assert set(node["properties"]) == set(settings_file.AgentFile.model_fields) - set(settings_file.CHART_SETS)
    assert {"sampling", "metrics_addr", "commands"} <= set(node["properties"])


@pytest.mark.parametrize(
    ("schema_path", "settings_class"),
    [
        (("remediation", "classification"), policy.ClassificationPolicy),
        (("remediation", "correlation"), policy.CorrelationPolicy),
        (("remediation", "escalation"), policy.EscalationPolicy),
        (("remediation", "disruption"), policy.DisruptionPolicy),
        (("remediation", "sdc"), policy.SdcPolicy),
        (("quarantine",), quarantine.QuarantineSettings),
        (("quarantine", "kubernetes"), quarantine.KubernetesSettings),
        (("quarantine", "slurm"), quarantine.SlurmSettings),
        (("bmc",), bmc.BmcSettings),
        (("bmc", "nodes", "*"), bmc.BmcNodeSettings),
        (("leader",), leader.LeaderSettings),
        (("power",), power_loop.PowerSettings),
        (("power", "policy"), power_policy.PowerPolicy),
        (("stragglers",), stragglers.StragglerSettings),
        (("stragglers", "detection"), straggler.StragglerPolicy),
        (("stragglers", "steps"), straggler.StepGrouping),
        (("stragglers", "actions"), straggler_actions.ActionPolicy),
    ],
)
def test_schema_of_config_knows_exactly_the_controller_settings(schema_path, settings_class):
    """Every table of the schema takes exactly the keys of the settings class the controller builds from it."""
    node = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    for part in schema_path:
        node = node["additionalProperties"] if part == "*" else node["properties"][part]
    assert node["additionalProperties"] is False
    assert set(node["properties"]) == {field.name for field in dataclasses.fields(settings_class)}


# --------------------------------------------------------------------------------------------
# The ConfigMap: controller.toml as the controller reads it


def _controller_toml(objects: Mapping[tuple[str, str], dict[str, Any]]) -> str:
    return the(objects, "ConfigMap")["data"]["controller.toml"]


def test_default_config_is_the_packaged_example(chart):
    rendered = tomllib.loads(_controller_toml(render(chart)))
    packaged = tomllib.loads((REPO / "controller/packaging/controller.toml").read_text())
    assert rendered == packaged


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rendered_controller_toml_loads_with_the_controllers_load_config(chart, value_set, tmp_path):
    values = json.loads(json.dumps(VALUE_SETS[value_set]))
    quarantine_values = values.get("config", {}).get("quarantine", {})
    if quarantine_values.get("adapter") == "kubernetes":
        # Outside a cluster the adapter needs a kubeconfig to build its client (no request is made).
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
            "clusters: [{name: t, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
            "users: [{name: t, user: {token: x}}]\ncontexts: [{name: t, context: {cluster: t, user: t}}]\n"
        )
        quarantine_values["kubernetes"]["kubeconfig"] = str(kubeconfig)
    path = tmp_path / "controller.toml"
    path.write_text(_controller_toml(render(chart, values)))
    config = controller_main.load_config(path)
    if value_set == "everything-on":
        remediation = config["remediation_policy"]
        assert remediation.escalation.max_attempts_reset_gpu == 3
        assert remediation.classification.xid_action_overrides == {13: "reset_gpu"}
        assert remediation.correlation.sticky_xids == (74, 79)
        assert remediation.correlation.sticky_window_s == 1_000_000
        assert remediation.disruption.max_disrupted_nodes_pct == 2.5
        assert config["quarantine"]["kubernetes"]["event_namespace"] == NAMESPACE
        assert config["bmc"]["nodes"]["gpu-node-0042"]["url"] == "https://10.0.42.10"
    else:
        assert "bmc" not in config  # bmc: {} renders no [bmc] table
    if value_set == "power-on-replicas":
        settings = power_loop.PowerSettings.from_mapping(config["power"])
        assert settings.draw_window_s == 6.0 and settings.policy.control_period_s == 2.0
        assert settings.tree.domain("rack-a1").budget_w == 40000 and settings.tree.domain("gpu node/43").level == "node"
        assert settings.tree.domain("gpu-node-0044").min_w == 1600
    else:
        assert "power" not in config  # power: {} renders no [power] table: no power management


def test_the_default_replicas_run_power_management_when_power_is_configured(chart, tmp_path):
    """Two replicas with lease election and a [power] table: the controller builds its power loop, not a refusal.

    Before, a [power] table with lease election was refused at start-up (the loop read telemetry and
    sent caps through its own replica's streams only): the chart's default ran without power management.
    """
    values = VALUE_SETS["power-on-replicas"]
    objects = render(chart, values)
    assert the(objects, "Deployment")["spec"]["replicas"] == 2
    path = tmp_path / "controller.toml"
    path.write_text(_controller_toml(objects))
    config = controller_main.load_config(path)
    # The chart's store is PostgreSQL, where "auto" elects through the lease: the same settings here.
    assert config["leader"].resolved_election("postgresql+psycopg://rasd@db/rasd") == "lease"
    controller = server.Controller(
        server.ControllerSettings(
            db_url=f"sqlite:///{tmp_path / 'rasd.db'}",
            metrics_port=None,
            leader=dataclasses.replace(config["leader"], election="lease"),
            power=config["power"],
            remediation_policy=config["remediation_policy"],
        ),
        registry=CollectorRegistry(),
    )
    try:
        assert controller.leadership.election == "lease"
        assert controller.power is not None, "the power loop runs (on the leader)"
        assert controller.wired.shipper is not None and controller.wired.fleet is not None
    finally:
        controller.wired.thread.close()
        controller.store.close()


def test_toml_writer_keeps_integers_integers_and_quotes_odd_keys(chart):
    values = {
        "config": {
            "bmc": {
                "poll_interval_s": 0.25,
                "nodes": {"rack1.node-7": {"url": "https://10.0.0.7", "password_file": '/run/bmc/"pw"'}},
            }
        }
    }
    text = _controller_toml(render(chart, values))
    assert "max_attempts_reset_gpu = 2\n" in text  # Helm reads YAML numbers as float64; not "2.0"
    assert "poll_interval_s = 0.25\n" in text
    assert '[bmc.nodes."rack1.node-7"]' in text
    assert tomllib.loads(text)["bmc"]["nodes"]["rack1.node-7"]["password_file"] == '/run/bmc/"pw"'


def _checksum(chart: helm.Chart, values: Mapping[str, Any]) -> str:
    return the(render(chart, values), "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_config_checksum_changes_with_the_config_only(chart):
    base = _checksum(chart, {})
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    assert _checksum(chart, {"config": {"remediation": {"escalation": {"max_attempts_reset_gpu": 3}}}}) != base
    assert _checksum(chart, {"config": {"quarantine": {"adapter": "slurm"}}}) != base
    assert _checksum(chart, {"image": {"tag": "0.2.0"}, "controller": {"logLevel": "debug"}}) == base


# --------------------------------------------------------------------------------------------
# The controller's Deployment


def _expand(args: list[str], env: Mapping[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in args]


def test_controller_args_parse_with_the_controllers_parser(chart):
    container = controller_container(render(chart, VALUE_SETS["everything-on"]))
    env = {item["name"]: item for item in container["env"]}
    # The URL comes from the Secret as $RASD_DB, never on the command line (where `ps` shows it).
    assert env["RASD_DB"]["valueFrom"]["secretKeyRef"] == {"name": "rasd-db", "key": "uri"}
    assert not any("postgresql" in arg or arg == "--db" for arg in container["args"])
    args = controller_main.build_parser().parse_args(container["args"])
    assert args.listen == "0.0.0.0:7443"
    environ = {"RASD_DB": "postgresql+psycopg://u:p@db/rasd"}
    config, _tables = config_mod.load(environ=environ, flags=config_mod.flags_of(args))
    assert config.db == "postgresql+psycopg://u:p@db/rasd"
    assert args.config == pathlib.Path("/etc/rasd/controller.toml")
    assert args.metrics_port == 9464
    assert args.metrics_addr == "0.0.0.0"
    assert not args.no_remediation
    assert not args.insecure  # mutual TLS with the mounted Secret (cert-manager's key names)
    assert (args.tls_ca, args.tls_cert, args.tls_key) == (
        pathlib.Path("/etc/rasd/tls/ca.crt"),
        pathlib.Path("/etc/rasd/tls/tls.crt"),
        pathlib.Path("/etc/rasd/tls/tls.key"),
    )


def test_sqlite_store_lives_on_its_volume_and_remediation_can_be_off(chart):
    objects = render(chart, VALUE_SETS["sqlite-persistent-slurm"])
    container = controller_container(objects)
    args = controller_main.build_parser().parse_args(container["args"])
    env = {item["name"]: item for item in container["env"]}
    assert env["RASD_DB"]["value"] == "sqlite:////var/lib/rasd/rasd.db"
    assert args.no_remediation is True
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts["data"] == "/var/lib/rasd"
    volumes = {volume["name"]: volume for volume in the(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == f"{RELEASE}-data"
    pvc = the(objects, "PersistentVolumeClaim", f"{RELEASE}-data")
    assert pvc["spec"]["storageClassName"] == "fast"
    assert the(objects, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}


def test_probes_use_the_grpc_health_service_on_the_health_only_port(chart):
    """grpcPort requires a client certificate the kubelet cannot present: probes use the plaintext
    health-only port the controller serves with --health-listen."""
    container = controller_container(render(chart))
    health_port = next(port["containerPort"] for port in container["ports"] if port["name"] == "health")
    args = controller_main.build_parser().parse_args(container["args"])
    assert args.health_listen == f"0.0.0.0:{health_port}"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": health_port}, probe


def test_probe_mode_tls_exists_only_from_kubernetes_1_37(chart):
    """GRPCAction.mode ("TLS": no certificate verification) is new in the 1.37 API; unset by default."""
    deployment = the(render(chart, {"controller": {"probes": {"mode": "TLS"}}}), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["grpc"] == {"port": 7444, "mode": "TLS"}
    kubernetes_validate.validate(deployment, "1.37.0", strict=True)
    with pytest.raises(kubernetes_validate.ValidationError, match="'mode' was unexpected"):
        kubernetes_validate.validate(deployment, "1.36.0", strict=True)


def test_controller_runs_locked_down(chart):
    objects = render(chart)
    pod = the(objects, "Deployment")["spec"]["template"]["spec"]
    container = controller_container(objects)
    security = container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert "emptyDir" in volumes["tmp"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["automountServiceAccountToken"] is False  # record-only quarantine needs no API token


def test_tls_secret_is_mounted_and_cert_manager_issues_it(chart):
    objects = render(chart, VALUE_SETS["everything-on"])
    cert = the(objects, "Certificate")
    assert cert["spec"]["secretName"] == f"{RELEASE}-tls"
    assert cert["spec"]["issuerRef"] == {"name": "rasd-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert f"{RELEASE}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert "rasd.example" in cert["spec"]["dnsNames"]
    volumes = {v["name"]: v for v in the(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == f"{RELEASE}-tls"
    mounts = {m["name"]: m for m in controller_container(objects)["volumeMounts"]}
    assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/rasd/tls", "readOnly": True}
    assert ("Certificate", RELEASE) not in render(chart, VALUE_SETS["sqlite-persistent-slurm"])


def test_a_self_signed_ca_of_the_releases_own_issues_the_serving_certificate(chart):
    """cert-manager's CA bootstrap: self-signed Issuer → CA Certificate → CA Issuer → the serving certificate."""
    objects = render(chart, {"tls": {"certManager": {"enabled": True, "selfSignedCA": True}}})
    assert the(objects, "Issuer", f"{RELEASE}-selfsigned")["spec"] == {"selfSigned": {}}
    ca = the(objects, "Certificate", f"{RELEASE}-ca")["spec"]
    assert ca["isCA"] is True and ca["secretName"] == f"{RELEASE}-ca"
    assert ca["issuerRef"] == {"name": f"{RELEASE}-selfsigned", "kind": "Issuer", "group": "cert-manager.io"}
    assert the(objects, "Issuer", f"{RELEASE}-ca")["spec"] == {"ca": {"secretName": f"{RELEASE}-ca"}}
    serving = the(objects, "Certificate")["spec"]
    assert serving["issuerRef"] == {"name": f"{RELEASE}-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert serving["secretName"] == f"{RELEASE}-tls"
    volumes = {v["name"]: v for v in the(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == f"{RELEASE}-tls"
    assert "BLOCKER" not in notes(chart, {"tls": {"certManager": {"enabled": True, "selfSignedCA": True}}})


def test_service_and_service_monitor_expose_grpc_and_metrics(chart):
    objects = render(chart, VALUE_SETS["everything-on"])
    service = the(objects, "Service")
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("grpc", 7443, "grpc"),
        ("metrics", 9464, "metrics"),
    }
    pod_labels = the(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = the(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_the_agents_are_scraped_on_their_own_port_by_a_pod_monitor(chart):
    objects = render(chart, VALUE_SETS["everything-on"])
    pod = the(objects, "DaemonSet", f"{RELEASE}-agent")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 8455, "protocol": "TCP"}]
    monitor = the(objects, "PodMonitor", f"{RELEASE}-agent")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    off = {
        **VALUE_SETS["everything-on"],
        "agent": {**VALUE_SETS["everything-on"]["agent"], "config": {"metrics_port": -1}},
    }
    assert "PodMonitor" not in {kind for kind, _ in render(chart, off)}


# --------------------------------------------------------------------------------------------
# RBAC


def _documented_rbac_rules() -> list[dict[str, Any]]:
    """The ClusterRole rules written in rasd.controller.executors.quarantine.k8s's docstring."""
    doc = quarantine.k8s.__doc__ or ""
    block = doc.split("RBAC the controller's ServiceAccount needs", 1)[1].split("::", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line.strip() and not line.startswith("    "):
            break
        lines.append(line)
    return yaml.safe_load(textwrap.dedent("\n".join(lines)))


def test_cluster_role_is_exactly_what_the_kubernetes_adapter_documents(chart):
    objects = render(chart, VALUE_SETS["everything-on"])
    role = the(objects, "ClusterRole", f"{RELEASE}-quarantine")
    assert role["rules"] == _documented_rbac_rules()
    binding = the(objects, "ClusterRoleBinding", f"{RELEASE}-quarantine")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    pod = the(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == RELEASE
    assert pod["automountServiceAccountToken"] is True


def test_no_cluster_role_without_the_kubernetes_adapter(chart):
    for value_set in ("defaults", "sqlite-persistent-slurm"):
        kinds = {kind for kind, _ in render(chart, VALUE_SETS[value_set])}
        assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}, value_set


# --------------------------------------------------------------------------------------------
# The agent DaemonSet


def test_agent_daemonset_reaches_the_node(chart):
    objects = render(chart, VALUE_SETS["everything-on"])
    daemonset = the(objects, "DaemonSet", f"{RELEASE}-agent")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostPID"] is True
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "rasd.io/quarantined", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["automountServiceAccountToken"] is False
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert mounts["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    assert volumes["state"]["hostPath"] == {"path": "/var/lib/rasd-agent", "type": "DirectoryOrCreate"}
    assert mounts["state"]["mountPath"] == "/var/lib/rasd-agent"
    assert container["securityContext"]["privileged"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "nvidia.com/gpu" not in container.get("resources", {}).get("limits", {})
    node_name = next(e for e in container["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_agent_toml_and_args_are_what_the_agent_accepts(chart, tmp_path):
    objects = render(chart, VALUE_SETS["everything-on"])
    (container,) = the(objects, "DaemonSet", f"{RELEASE}-agent")["spec"]["template"]["spec"]["containers"]
    text = the(objects, "ConfigMap", f"{RELEASE}-agent")["data"]["agent.toml"]
    args = agent_main.build_parser().parse_args(_expand(container["args"], {"NODE_NAME": "gpu-node-0042"}))
    assert args.config == pathlib.Path("/etc/rasd/agent.toml")
    host = agent_settings.HostDefaults(hostname="pod-name", ib_sysfs_present=False)
    settings = agent_settings.load(tomllib.loads(text), vars(args), host)
    assert settings.node_id == "gpu-node-0042"
    assert settings.link.controller_address == f"{RELEASE}.{NAMESPACE}.svc:7443"
    assert settings.spool.state_dir == pathlib.Path("/var/lib/rasd-agent")
    assert settings.gpu.backend == "nvml"
    assert settings.kernel_log.source == "kmsg"
    assert settings.actions.destructive_enabled is True
    assert settings.failsafe.power_limit_w == 500
    assert settings.labels == {"row": "row-3"}
    assert settings.commands.reboot[:3] == ("nsenter", "--target", "1")
    # Mutual TLS with this node's certificate from the host.
    assert settings.tls.files == tls.TlsFiles(
        ca=pathlib.Path("/etc/rasd/tls/ca.crt"),
        cert=pathlib.Path("/etc/rasd/tls/agent.crt"),
        key=pathlib.Path("/etc/rasd/tls/agent.key"),
    )
    assert settings.tls.server_name == ""
    volumes = {
        v["name"]: v for v in the(objects, "DaemonSet", f"{RELEASE}-agent")["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["tls"]["hostPath"] == {"path": "/etc/rasd/tls", "type": "Directory"}


def test_agent_is_off_by_default(chart):
    assert not {kind for kind, _ in render(chart)} & {"DaemonSet"}


# --------------------------------------------------------------------------------------------
# The Grafana dashboard


def _series_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names.update(family.name + suffix for suffix in suffixes)
    return names


def _controller_metric_names() -> set[str]:
    """Every series name the controller exposes, built from its own metric definitions."""
    registry = CollectorRegistry()
    controller_metrics.ControllerMetrics(registry)
    registry.register(controller_metrics.FleetCollector(dict, dict, dict))
    return _series_names(registry)


def _agent_metric_names() -> set[str]:
    """Every series name an agent exposes (per-link NVLink on), from its collector over a simulated node."""
    backend = simulated.SimulatedBackend("node-a", 1, 0)
    power = {r.gpu_uuid: r for r in backend.read_power(1)}
    counters = {c.gpu_uuid: c for c in backend.read_counters(1)}
    stats = {"spool_depth": 0, "connected": 1.0, "power_samples": 0, "failsafe_applied": 0}
    registry = CollectorRegistry()
    registry.register(
        agent_metrics.AgentCollector(
            "node-a", "node-a", backend.inventory(), lambda: power, lambda: counters, lambda: stats, dict, True
        )
    )
    return _series_names(registry)


def test_dashboard_uses_only_metrics_rasd_exposes(chart):
    objects = render(chart)
    configmap = the(objects, "ConfigMap", f"{RELEASE}-dashboards")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["rasd-fleet.json"])
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"\brasd_[a-z_]+", expr)}
    assert used - _controller_metric_names() - _agent_metric_names() == set()
    assert used >= {
        "rasd_nodes",
        "rasd_incidents_total",
        "rasd_remediation_actions_total",
        "rasd_quarantined",
        "rasd_breaker_tripped",
        "rasd_fleet_power_watts",
        "rasd_controller_gpu_power_watts",
        "rasd_time_to_first_action_seconds_bucket",
        "rasd_gpu_clock_event_reason",
        "rasd_gpu_ecc_errors_total",
        "rasd_gpu_remapped_rows_pending",
        "rasd_agent_controller_connected",
    }
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert rows == ["Fleet health", "Incidents", "Repairs by rung", "Power and swing", "GPU health (agents)"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
