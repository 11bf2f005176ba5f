"""The chart in helm/gpuportal rendered by the pinned helm: lint, what it renders with the
default and the production values, the values schema's refusals, and that the chart agrees with
the code it deploys (the portal's ClusterRole, settings, version, hub roles)."""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from importlib.metadata import entry_points
from typing import Any

import pytest
import yaml
from traitlets.config import Config

from policies.isolation import IsolationSettings
from policies.isolation.rbac import portal_cluster_role
from portal.agent.run import AgentSettings, load_agent_settings
from portal.hubroles import HubRolesSpec, custom_scopes, load_roles, render_config
from portal.settings import SERVICE_POLICIES, Settings, load_settings
from spawner.hubconfig import spawner_role
from tests.helm.chart import (
    CHART,
    INSTALL_VALUES,
    PRODUCTION_VALUES,
    Z2JH_VALUES,
    Helm,
    Manifest,
    env_of,
    isolation_of,
    kinds_and_names,
    load_yaml,
    named,
    pod_templates,
)
from tests.support.k8s import REPO_ROOT


def rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """RBAC rules as (apiGroup, resource, verb) triples: what they grant, whatever their order."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# --- lint and render ---------------------------------------------------------------------------


def test_lint_passes_strict_with_default_production_and_install_guide_values(helm: Helm) -> None:
    for extra in ([], ["--values", str(PRODUCTION_VALUES)], ["--values", str(INSTALL_VALUES)]):
        proc = helm.run("lint", "--strict", str(CHART), *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_default_values_render_the_portal_agent_dashboards_and_their_policies(
    helm: Helm,
) -> None:
    objects = helm.render()
    assert kinds_and_names(objects) == {
        ("ServiceAccount", "gpuportal"),
        ("ClusterRole", "gpuportal"),
        ("ClusterRoleBinding", "gpuportal"),
        ("ClusterRole", "gpuportal-hub"),
        ("ClusterRoleBinding", "gpuportal-hub"),
        ("Deployment", "gpuportal"),
        ("Service", "gpuportal"),
        ("ConfigMap", "gpuportal-isolation"),
        ("ServiceAccount", "gpuportal-agent"),
        ("ClusterRole", "gpuportal-agent"),
        ("ClusterRoleBinding", "gpuportal-agent"),
        ("ValidatingAdmissionPolicy", "gpuportal-agent-own-node"),
        ("ValidatingAdmissionPolicyBinding", "gpuportal-agent-own-node"),
        ("DaemonSet", "gpuportal-agent"),
        ("Deployment", "gpuportal-dashboards"),
        ("Service", "gpuportal-dashboards"),
        ("NetworkPolicy", "gpuportal"),
        ("NetworkPolicy", "gpuportal-dashboards"),
    }
    # No database, prices, seed or tokens given: nothing to put in a ConfigMap or Secret.
    portal = named(objects, "Deployment", "gpuportal")["spec"]["template"]
    assert "GPUPORTAL_DATABASE_URL" not in env_of(portal, "portal")
    assert portal["spec"]["volumes"][0] == {"name": "state", "emptyDir": {}}


def test_production_values_render_postgres_prices_seed_and_the_prometheus_source(
    helm: Helm,
) -> None:
    objects = helm.render(release="prod", namespace="gpu", values_files=[PRODUCTION_VALUES])
    names = kinds_and_names(objects)
    assert {
        ("ConfigMap", "prod-gpuportal-pricing"),
        ("ConfigMap", "prod-gpuportal-seed"),
        ("Deployment", "prod-gpuportal-prometheus-source"),
        ("NetworkPolicy", "prod-gpuportal-prometheus-source"),
    } <= names
    # The database URL and tokens come from Secrets made outside the chart.
    assert not [n for k, n in names if k == "Secret"]

    portal = named(objects, "Deployment", "prod-gpuportal")["spec"]["template"]
    env = env_of(portal, "portal")
    assert env["GPUPORTAL_DATABASE_URL"] == {
        "secretKeyRef": {"name": "gpuportal-database", "key": "url"}
    }
    assert env["GPUPORTAL_PRICING_FILE"] == "/etc/gpuportal/pricing/pricing.yaml"
    assert env["JUPYTERHUB_API_TOKEN"] == {
        "secretKeyRef": {"name": "gpuportal-tokens", "key": "portal", "optional": True}
    }
    (container,) = portal["spec"]["containers"]
    assert container["args"] == ["serve", "--seed", "/etc/gpuportal/seed/seed.yaml"]

    production = load_yaml(PRODUCTION_VALUES)
    pricing = named(objects, "ConfigMap", "prod-gpuportal-pricing")["data"]["pricing.yaml"]
    assert yaml.safe_load(pricing) == production["pricing"]
    seed = named(objects, "ConfigMap", "prod-gpuportal-seed")["data"]["seed.yaml"]
    assert yaml.safe_load(seed) == production["portal"]["seed"]

    source = named(objects, "Deployment", "prod-gpuportal-prometheus-source")
    (src,) = source["spec"]["template"]["spec"]["containers"]
    assert src["args"] == ["agent", "--prometheus", "http://prometheus-server.monitoring.svc:80"]
    assert env_of(source["spec"]["template"], "prometheus-source")[
        "GPUPORTAL_AGENT_PORTAL_URL"
    ] == ("http://prod-gpuportal.gpu.svc:8000/services/gpuportal")


def test_a_database_url_value_goes_into_a_secret_not_the_pod(helm: Helm) -> None:
    url = "postgresql+psycopg://gp:s3cret@db:5432/gpuportal"
    objects = helm.render(sets={"database.url": json.dumps(url)})
    secret = named(objects, "Secret", "gpuportal-database")
    assert secret["stringData"] == {"url": url}
    portal = named(objects, "Deployment", "gpuportal")["spec"]["template"]
    assert env_of(portal, "portal")["GPUPORTAL_DATABASE_URL"] == {
        "secretKeyRef": {"name": "gpuportal-database", "key": "url"}
    }
    assert "s3cret" not in yaml.safe_dump(named(objects, "Deployment", "gpuportal"))


def test_optional_parts_can_be_turned_off(helm: Helm) -> None:
    off = {
        "agent.enabled": "false",
        "dashboards.enabled": "false",
        "networkPolicy.enabled": "false",
        "hubRbac.enabled": "false",
    }
    names = kinds_and_names(helm.render(sets=off))
    assert names == {
        ("ServiceAccount", "gpuportal"),
        ("ClusterRole", "gpuportal"),
        ("ClusterRoleBinding", "gpuportal"),
        ("Deployment", "gpuportal"),
        ("Service", "gpuportal"),
        ("ConfigMap", "gpuportal-isolation"),
    }


# --- the portal: one writer, probes, settings ---------------------------------------------------


def test_portal_is_one_replica_by_default_replaced_with_recreate_and_probed_on_ready_and_health(
    helm: Helm,
) -> None:
    deployment = named(helm.render(), "Deployment", "gpuportal")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/services/gpuportal/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/services/gpuportal/health"
    assert c["command"] == ["gpuportal"] and c["args"] == ["serve"]
    # The tenant NetworkPolicies let notebooks reach the portal by these labels and port.
    isolation = isolation_of(helm.render())
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert dict(isolation.portal_pod_labels).items() <= labels.items()
    assert c["ports"][0]["containerPort"] == isolation.portal_api_port


HA = {
    "portal.replicas": "2",
    "portal.leaderElection.enabled": "true",
    "database.url": '"postgresql+psycopg://gp:pw@db:5432/gpuportal"',
}


def test_replicas_elect_a_leader_with_a_lease_they_alone_may_renew(helm: Helm) -> None:
    objects = helm.render(sets=HA)
    deployment = named(objects, "Deployment", "gpuportal")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = env_of(deployment["spec"]["template"], "portal")
    assert env["GPUPORTAL_LEADER_ELECTION"] == "lease"
    assert (env["GPUPORTAL_LEASE_NAME"], env["GPUPORTAL_LEASE_NAMESPACE"]) == (
        "gpuportal-leader",
        "gpuportal",
    )
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    role = named(objects, "Role", "gpuportal-leader-election")
    assert rule_set(role["rules"]) == {
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "update"),
        ("coordination.k8s.io", "leases", "create"),
    }
    (renew,) = [r for r in role["rules"] if "update" in r["verbs"]]
    assert renew["resourceNames"] == ["gpuportal-leader"]
    binding = named(objects, "RoleBinding", "gpuportal-leader-election")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuportal", "namespace": "gpuportal"}
    ]
    # Without the election, neither the variables nor the Role exist.
    plain = helm.render()
    assert "GPUPORTAL_LEADER_ELECTION" not in env_of(
        named(plain, "Deployment", "gpuportal")["spec"]["template"], "portal"
    )
    assert ("Role", "gpuportal-leader-election") not in kinds_and_names(plain)


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        (
            "portal.leaderElection.enabled",
            "at '/portal/leaderElection/enabled': value must be true",
        ),
        ("database.url", "at '/database/url': '' does not match pattern '^postgresql'"),
        (
            "sqlite",
            "at '/database/url': 'sqlite:////var/lib/gpuportal/portal.db' does not match pattern",
        ),
    ],
)
def test_more_replicas_without_election_or_postgresql_are_refused(
    helm: Helm, drop: str, message: str
) -> None:
    sets = {k: v for k, v in HA.items() if k != drop}
    if drop == "sqlite":  # an SQLite URL given: one file on one pod's volume
        sets["database.url"] = '"sqlite:////var/lib/gpuportal/portal.db"'
    proc = helm.template(sets=sets)
    assert proc.returncode != 0 and proc.stdout == ""
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


ROLLING = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "100%"}}
RECREATE = {"type": "Recreate"}
POSTGRES_URL = '"postgresql+psycopg://gp:pw@db:5432/gpuportal"'


@pytest.mark.parametrize(
    ("sets", "strategy"),
    [
        ({}, RECREATE),
        ({"portal.leaderElection.enabled": "true"}, RECREATE),  # SQLite: one file, one pod
        ({"database.url": POSTGRES_URL}, RECREATE),  # no election: the writer guard refuses
        ({"database.existingSecret": '"db"'}, RECREATE),
        ({"portal.leaderElection.enabled": "true", "database.url": POSTGRES_URL}, ROLLING),
        ({"portal.leaderElection.enabled": "true", "database.existingSecret": '"db"'}, ROLLING),
        (HA, ROLLING),
        ({**HA, "portal.replicas": "3"}, ROLLING),
    ],
)
def test_the_portal_is_rolled_only_with_leader_election_on_postgresql(
    helm: Helm, sets: dict[str, str], strategy: dict[str, object]
) -> None:
    deployment = named(helm.render(sets=sets), "Deployment", "gpuportal")
    assert deployment["spec"]["strategy"] == strategy


def test_every_gpuportal_variable_the_chart_sets_is_a_setting_of_the_process_it_configures(
    helm: Helm,
) -> None:
    objects = helm.render(release="prod", namespace="gpu", values_files=[PRODUCTION_VALUES])
    templates = pod_templates(objects)
    checks = {
        ("prod-gpuportal", "portal"): ("GPUPORTAL_", set(Settings.model_fields)),
        ("prod-gpuportal-agent", "agent"): ("GPUPORTAL_AGENT_", set(AgentSettings.model_fields)),
        ("prod-gpuportal-prometheus-source", "prometheus-source"): (
            "GPUPORTAL_AGENT_",
            set(AgentSettings.model_fields),
        ),
    }
    for (workload, container), (prefix, fields) in checks.items():
        names = [n for n in env_of(templates[workload], container) if n.startswith(prefix)]
        assert names, f"{workload} sets no {prefix}* variable"
        unknown = {n for n in names if n.removeprefix(prefix).lower() not in fields}
        assert not unknown, f"{workload} sets variables its settings do not have: {unknown}"


def test_the_rendered_settings_load(helm: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    """The values the chart puts in the environment are valid for the code that reads them."""
    objects = helm.render(
        release="prod",
        namespace="gpu",
        values_files=[PRODUCTION_VALUES],
        sets={
            "portal.settings.tick_interval_s": "0.5",
            "portal.settings.log_format": '"text"',
            "portal.settings.placement_policy": '"binpack"',
        },
    )
    templates = pod_templates(objects)
    for var in [v for v in os.environ if v.startswith(("GPUPORTAL_", "JUPYTERHUB_"))]:
        monkeypatch.delenv(var)
    for name, value in env_of(templates["prod-gpuportal"], "portal").items():
        if name.startswith("GPUPORTAL_") and isinstance(value, str):
            monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.inventory == "kubernetes"
    assert settings.tick_interval_s == 0.5 and settings.log_format == "text"
    assert settings.placement_policy == "binpack"
    assert settings.service_ip == "0.0.0.0" and settings.service_port == 8000
    assert settings.service_prefix == "/services/gpuportal/"
    assert str(settings.pricing_file) == "/etc/gpuportal/pricing/pricing.yaml"

    for name, value in env_of(templates["prod-gpuportal-agent"], "agent").items():
        if name.startswith("GPUPORTAL_AGENT_") and isinstance(value, str):
            monkeypatch.setenv(name, value)
    agent = load_agent_settings()
    assert agent.kubernetes is True
    assert agent.interval_s == 10.0
    assert agent.portal_url == "http://prod-gpuportal.gpu.svc:8000/services/gpuportal"


def test_the_schema_accepts_only_portal_settings_that_exist() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    settings = schema["properties"]["portal"]["properties"]["settings"]["properties"]
    assert set(settings) <= set(Settings.model_fields)
    assert set(settings) <= set(load_yaml(CHART / "values.yaml")["portal"]["settings"])
    # The placement policies the chart accepts are those the service accepts.
    assert settings["placement_policy"]["enum"] == list(SERVICE_POLICIES)


def test_app_version_is_the_package_version() -> None:
    chart = load_yaml(CHART / "Chart.yaml")
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["version"] == "0.1.0"
    assert chart["appVersion"] == project["version"]


def test_the_portal_is_given_isolation_settings_of_its_own_release(helm: Helm) -> None:
    objects = helm.render(release="prod", namespace="gpu")
    isolation = isolation_of(objects)
    deployment = named(objects, "Deployment", "prod-gpuportal")
    pod = deployment["spec"]["template"]
    # Where the hub runs and the pods the tenant NetworkPolicies allow: this release's.
    assert isolation.hub_namespace == "gpu"
    assert dict(isolation.hub_pod_labels) == load_yaml(CHART / "values.yaml")["hub"]["podLabels"]
    assert dict(isolation.portal_pod_labels).items() <= pod["metadata"]["labels"].items()
    assert isolation.portal_pod_labels["app.kubernetes.io/instance"] == "prod"
    assert isolation.portal_service_account == pod["spec"]["serviceAccountName"]
    binding = named(objects, "ClusterRoleBinding", "prod-gpuportal")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": isolation.portal_service_account, "namespace": "gpu"}
    ]
    # The portal reads them from the mounted ConfigMap.
    path = env_of(pod, "portal")["GPUPORTAL_ISOLATION_FILE"]
    (c,) = pod["spec"]["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "isolation"]
    assert path == f"{mount['mountPath']}/isolation.yaml"
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "isolation"]
    assert volume["configMap"]["name"] == "prod-gpuportal-isolation"


def test_isolation_values_win_over_what_the_chart_fills_in(helm: Helm) -> None:
    objects = helm.render(
        sets={
            "isolation.hub_namespace": '"jhub"',
            "isolation.api_server_cidrs": '["10.100.0.1/32"]',
            "isolation.shared_gpu_replicas": "4",
        }
    )
    isolation = isolation_of(objects)
    assert isolation.hub_namespace == "jhub"
    assert isolation.api_server_cidrs == ("10.100.0.1/32",)
    assert isolation.shared_gpu_replicas == 4
    assert isolation.portal_service_account == "gpuportal"  # still filled in


def test_an_unknown_isolation_value_is_refused_by_the_chart_schema(helm: Helm) -> None:
    proc = helm.template(sets={"isolation.hub_namepsace": '"jhub"'})
    assert proc.returncode != 0
    assert "hub_namepsace" in proc.stderr


def test_the_chart_schema_knows_every_isolation_setting(helm: Helm) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    known = set(schema["properties"]["isolation"]["properties"])
    assert known == {f.name for f in dataclasses.fields(IsolationSettings)}


# --- RBAC ----------------------------------------------------------------------------------------


def test_portal_cluster_role_is_exactly_what_policies_isolation_says_the_portal_needs(
    helm: Helm,
) -> None:
    objects = helm.render()
    chart_role = named(objects, "ClusterRole", "gpuportal")
    wanted = portal_cluster_role(IsolationSettings())
    assert rule_set(chart_role["rules"]) == rule_set(wanted["rules"])
    # Same rules, same grouping: a rule widened on either side fails here too.
    assert sorted(map(json.dumps, chart_role["rules"])) == sorted(map(json.dumps, wanted["rules"]))
    binding = named(objects, "ClusterRoleBinding", "gpuportal")
    assert binding["roleRef"]["name"] == "gpuportal"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuportal", "namespace": "gpuportal"}
    ]
    portal = named(objects, "Deployment", "gpuportal")["spec"]["template"]["spec"]
    assert portal["serviceAccountName"] == "gpuportal"


def test_the_role_comparison_notices_a_widened_rule() -> None:
    wanted = portal_cluster_role(IsolationSettings())["rules"]
    widened = [dict(r) for r in wanted]
    widened[3] = {**widened[3], "verbs": [*widened[3]["verbs"], "update"]}  # pods: update
    assert rule_set(widened) != rule_set(wanted)


def test_agent_may_only_patch_nodes_and_list_pods(helm: Helm) -> None:
    objects = helm.render()
    role = named(objects, "ClusterRole", "gpuportal-agent")
    assert rule_set(role["rules"]) == {("", "nodes", "patch"), ("", "pods", "list")}
    policy = named(objects, "ValidatingAdmissionPolicy", "gpuportal-agent-own-node")
    (condition,) = policy["spec"]["matchConditions"]
    assert "system:serviceaccount:gpuportal:gpuportal-agent" in condition["expression"]


# --- pods: security context and placement -------------------------------------------------------


def test_every_pod_claims_the_restricted_security_context(helm: Helm) -> None:
    objects = helm.render(release="prod", namespace="gpu", values_files=[PRODUCTION_VALUES])
    templates = pod_templates(objects)
    assert set(templates) == {
        "prod-gpuportal",
        "prod-gpuportal-agent",
        "prod-gpuportal-dashboards",
        "prod-gpuportal-prometheus-source",
        "prod-gpuportal-migrate",
    }
    for name, template in templates.items():
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert c["resources"]["requests"], name
            assert c["image"] == "registry.example.org/platform/gpuportal:0.1.0", name
    # Only the agent departs from "restricted", and only by hostPID (process attribution).
    assert templates["prod-gpuportal-agent"]["spec"]["hostPID"] is True
    assert all("hostPID" not in t["spec"] for n, t in templates.items() if "agent" not in n)


def test_postgresql_is_migrated_by_a_pre_upgrade_job_with_the_new_image_before_the_portal(
    helm: Helm,
) -> None:
    objects = helm.render(release="prod", namespace="gpu", values_files=[PRODUCTION_VALUES])
    job = named(objects, "Job", "prod-gpuportal-migrate")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-upgrade"
    assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
    template = job["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert [*container["command"], *container["args"]] == ["gpuportal", "migrate"]
    portal = named(objects, "Deployment", "prod-gpuportal")["spec"]["template"]
    (serve,) = portal["spec"]["containers"]
    assert container["image"] == serve["image"]
    assert (
        env_of(template, "migrate")["GPUPORTAL_DATABASE_URL"]
        == env_of(portal, "portal")["GPUPORTAL_DATABASE_URL"]
    )
    assert template["spec"]["automountServiceAccountToken"] is False
    # It reaches the database and DNS, nothing else, and accepts nothing.
    policy = named(objects, "NetworkPolicy", "prod-gpuportal-migrate")["spec"]
    assert policy["podSelector"]["matchLabels"] == template["metadata"]["labels"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy
    ports = {p["port"] for rule in policy["egress"] for p in rule["ports"]}
    assert ports == {53, 5432}, ports

    # SQLite lives on the portal's volume and is migrated by the portal itself; the Job can
    # also be turned off.
    assert not [o for o in helm.render() if o["kind"] == "Job"]
    off = helm.render(values_files=[PRODUCTION_VALUES], sets={"portal.migrateJob.enabled": "false"})
    assert not [o for o in off if o["kind"] == "Job"]
    assert not [o for o in off if o["metadata"]["name"].endswith("-migrate")]


def test_agent_runs_on_gpu_nodes_through_the_nvidia_runtime_without_a_gpu(helm: Helm) -> None:
    objects = helm.render()
    daemonset = named(objects, "DaemonSet", "gpuportal-agent")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    (c,) = spec["containers"]
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    env = env_of(daemonset["spec"]["template"], "agent")
    assert env["GPUPORTAL_AGENT_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["GPUPORTAL_AGENT_PORTAL_URL"] == (
        "http://gpuportal.gpuportal.svc:8000/services/gpuportal"
    )
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    without = helm.render(sets={"agent.hostPID": "false"})
    assert (
        "hostPID" not in named(without, "DaemonSet", "gpuportal-agent")["spec"]["template"]["spec"]
    )


# --- values schema --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("portal.replicas", "2", "at '/portal/leaderElection/enabled': value must be true"),
        ("portal.replicas", "0", "at '/portal/replicas': minimum: got 0, want 1"),
        (
            "portal.settings.inventory",
            '"everything"',
            "at '/portal/settings/inventory': 'everything' does not match pattern",
        ),
        (
            "portal.settings.log_level",
            '"loud"',
            "at '/portal/settings/log_level': value must be one of 'debug', 'info', 'warning'",
        ),
        (
            "image.pullPolicy",
            '"Sometimes"',
            "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
        ),
        ("portal.replica", "1", "at '/portal': additional properties 'replica' not allowed"),
        (
            "portal.settings.placement_policy",
            '"firstfit"',
            "at '/portal/settings/placement_policy': value must be one of 'gpuportal', 'binpack'",
        ),
        ("agent.intervalSeconds", "0", "at '/agent/intervalSeconds': exclusiveMinimum"),
        (
            "networkPolicy.apiServerCIDRs",
            '["everywhere"]',
            "at '/networkPolicy/apiServerCIDRs/0': 'everywhere' does not match pattern",
        ),
        (
            "tokens.dashboardsCookieSecret",
            '"short"',
            "at '/tokens/dashboardsCookieSecret': 'short' does not match pattern",
        ),
        (
            "tokens.rayTokenKey",
            '"short"',
            "at '/tokens/rayTokenKey': 'short' does not match pattern",
        ),
        ("prometheusSource.enabled", "true", "at '/prometheusSource/url': minLength"),
    ],
)
def test_a_bad_value_is_refused_naming_where_it_is_and_what_is_valid(
    helm: Helm, key: str, value: str, message: str
) -> None:
    proc = helm.template(sets={key: value})
    assert proc.returncode != 0
    assert proc.stdout == ""  # nothing rendered
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_every_value_in_values_yaml_has_a_comment() -> None:
    """Keys of the first two levels each have a comment right above them; deeper keys are the
    members of a documented map (labels, resources) or list."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped or stripped.startswith(("#", "-")) or indent > 2:
            continue
        above = lines[i - 1].strip() if i else ""
        assert above.startswith("#"), f"values.yaml line {i + 1} has no comment: {line}"


# --- next to z2jh ---------------------------------------------------------------------------------


def test_z2jh_values_configure_the_spawner_services_and_the_hub_roles(helm: Helm) -> None:
    hub = load_yaml(Z2JH_VALUES)["hub"]
    config = Config()
    config.JupyterHub.load_roles = []
    exec(hub["extraConfig"]["gpuportal"], {"c": config})  # the chart's own example file

    assert config.JupyterHub.spawner_class == "gpuportal-kube"
    (spawner,) = entry_points(group="jupyterhub.spawners", name="gpuportal-kube")
    assert spawner.value == "spawner.kube:GPUKubeSpawner"

    spec = HubRolesSpec(("team-a", "team-b"), oauth_services=("gpuportal-dashboards",))
    assert render_config(spec) in hub["extraConfig"]["gpuportal"]  # pasted as printed
    assert config.JupyterHub.custom_scopes == custom_scopes()
    roles = config.JupyterHub.load_roles
    assert roles[: len(load_roles(spec))] == load_roles(spec)
    assert spawner_role() in roles
    agent_role = next(r for r in roles if r["name"] == "gpuportal-agent")
    assert agent_role["scopes"] == ["custom:gpuportal:telemetry:write"]
    assert set(hub["services"]) >= {r for role in roles for r in role.get("services", [])}

    # z2jh's own NetworkPolicies let tenant notebooks reach the hub API, and the proxy reach the
    # notebooks and the chart's Services, on the ports the chart and the isolation use.
    values = load_yaml(CHART / "values.yaml")
    (ingress,) = hub["networkPolicy"]["ingress"]
    tenants = {"matchLabels": values["networkPolicy"]["tenantNamespaceLabels"]}
    assert ingress["from"] == [{"namespaceSelector": tenants}]
    assert ingress["ports"] == [{"port": IsolationSettings().hub_api_port}]
    to_notebooks, to_chart = load_yaml(Z2JH_VALUES)["proxy"]["chp"]["networkPolicy"]["egress"]
    assert to_notebooks["to"] == [{"namespaceSelector": tenants}]
    assert to_notebooks["ports"] == [{"port": IsolationSettings().notebook_port}]
    assert to_chart["ports"] == [
        {"port": values["portal"]["port"]},
        {"port": values["dashboards"]["port"]},
    ]

    # The services point at the chart's Services (release "gpuportal", same namespace).
    objects = helm.render()
    for service_name, url in (
        ("gpuportal", hub["services"]["gpuportal"]["url"]),
        ("gpuportal-dashboards", hub["services"]["gpuportal-dashboards"]["url"]),
    ):
        service: Manifest = named(objects, "Service", service_name)
        assert url == f"http://{service_name}:{service['spec']['ports'][0]['port']}"


def test_the_ray_token_key_is_in_the_tokens_secret_and_reaches_the_portal(helm: Helm) -> None:
    key = "k" * 40
    given = helm.render(sets={"tokens.portal": '"p"', "tokens.rayTokenKey": json.dumps(key)})
    secret = named(given, "Secret", "gpuportal-tokens")
    assert secret["stringData"]["ray-token-key"] == key
    portal = named(given, "Deployment", "gpuportal")["spec"]["template"]
    assert env_of(portal, "portal")["GPUPORTAL_RAY_TOKEN_KEY"] == {
        "secretKeyRef": {"name": "gpuportal-tokens", "key": "ray-token-key", "optional": True}
    }
    # Not given: one generated (no release to keep it from under `helm template`).
    generated = helm.render(sets={"tokens.portal": '"p"'})
    made = named(generated, "Secret", "gpuportal-tokens")["stringData"]["ray-token-key"]
    assert len(made) == 64
