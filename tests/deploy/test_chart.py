"""The Helm chart renders, lints clean with Helm's own engine, and every manifest is valid Kubernetes.

helm-python-sdk embeds Helm's Go engine (no helm binary, no cluster); kubernetes-validate checks
each rendered object against the Kubernetes OpenAPI schemas it bundles (offline), in strict
mode so a misspelled field fails. Both come with the ``deploy`` extra (.ci/run installs it).
Where what the pod would start with matters, its rendered config file and environment go through
the gateway's own settings loader, so a chart that renders is one the gateway accepts.
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "context-gateway"
FULL_VALUES = CHART / "ci" / "full-values.yaml"
DASHBOARD = CHART / "dashboards" / "context-gateway.json"
# The oldest Kubernetes the chart claims (Chart.yaml kubeVersion) and a recent one.
KUBE_VERSIONS = ("1.25.0", "1.33.0")


def _require(module: str) -> Any:
    """The deploy extra's tools: skipped without them, except under CI=true (.ci/run installs them)."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason="install the deploy extra: pip install -e '.[deploy]'")


helm = _require("helm_python")
kubernetes_validate = _require("kubernetes_validate")


def _render(values: dict[str, Any], release: str = "gw", namespace: str = "platform") -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        rendered: dict[str, str] = chart.render(values, name=release, namespace=namespace, is_install=True)
    objects = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def _full_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(FULL_VALUES.read_text())
    return values


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in objects if obj["kind"] != "ConfigMap"}


def _pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = _by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
    return pod


def _env(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (container,) = _pod(objects)["containers"]
    return {entry["name"]: entry for entry in container["env"]}


def _refusal(values: dict[str, Any]) -> str:
    """The message of the chart's refusal to render ``values``."""
    with pytest.raises(helm.HelmError) as refused:
        _render(values)
    return str(refused.value)


def _gateway_settings(objects: list[dict[str, Any]], tmp_path: Path) -> Any:
    """What the gateway in the rendered pod starts with: its config file, its environment (secrets
    read from the chart's Secret) and its --host/--port, through the gateway's own loader, which
    raises ConfigError where the real process would exit."""
    from gateway.settings import load_settings

    config_map = next(o for o in objects if o["kind"] == "ConfigMap" and "gateway.yaml" in o["data"])
    config_file = tmp_path / "gateway.yaml"
    config_file.write_text(config_map["data"]["gateway.yaml"])
    secret = _by_kind(objects).get("Secret", {"metadata": {"name": None}})
    secret_data = secret.get("data") or {}
    (container,) = _pod(objects)["containers"]
    environ = {}
    for entry in container["env"]:
        if "value" in entry:
            environ[entry["name"]] = entry["value"]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"], (
            f"{entry['name']} is read from a Secret not rendered"
        )
        environ[entry["name"]] = base64.b64decode(secret_data[ref["key"]]).decode()
    environ["GATEWAY_CONFIG"] = str(config_file)
    args = container["args"]
    overrides = {"host": args[args.index("--host") + 1], "port": int(args[args.index("--port") + 1])}
    return load_settings(None, environ, server_overrides=overrides)


def _readme_yaml_block_after(marker: str) -> Any:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", readme[readme.index(marker) :], re.DOTALL)
    assert block is not None, f"no yaml block after {marker!r} in README.md"
    return yaml.safe_load(block.group(1))


@pytest.mark.parametrize("values_name", ["default", "full"])
def test_chart_lints_clean(values_name: str) -> None:
    values = {} if values_name == "default" else _full_values()
    for kube_version in KUBE_VERSIONS:
        report = helm.lint(CHART, values, strict=True, kube_version=f"v{kube_version}")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("values_name", ["default", "full"])
def test_every_rendered_manifest_is_valid_kubernetes(values_name: str) -> None:
    objects = _render({} if values_name == "default" else _full_values())
    kinds = sorted(obj["kind"] for obj in objects)
    expected = ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Secret"]
    expected += ["Service", "ServiceAccount"]
    if values_name == "full":
        expected += ["ConfigMap", "Ingress", "ServiceMonitor"]
    assert kinds == sorted(expected)
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            continue  # a CRD, not in the Kubernetes schemas: checked against the Service below
        for kube_version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, kube_version, strict=True)


def test_values_outside_the_schema_are_refused() -> None:
    for bad in (
        {"gateway": {"logFormat": "xml"}},
        {"gateway": {"workers": "many"}},
        {"replicaCount": "two"},
        {"gatway": {}},  # a typo of a top-level key
        {"secrets": {"redisUrl": "http://not-redis"}},
        {"resources": {"limit": {"cpu": "1"}}},  # typos in closed objects
        {"resources": {"limits": {"cpus": "1"}}},
        {"resources": {"requests": {"memory": "lots"}}},
        {"ingress": {"tls": [{"hosts": ["gw.example.com"], "secretname": "tls"}]}},
        {"serviceMonitor": {"interval": "30 s"}},
        {"grafanaDashboard": {"uid": "x" * 41}},  # Grafana's uid limit
    ):
        with pytest.raises(helm.HelmError):
            _render(bad)


def test_resources_accept_extended_and_hugepage_names() -> None:
    limits = {"cpu": "2", "memory": "1Gi", "hugepages-2Mi": "64Mi", "example.com/accelerator": 1}
    (container,) = _pod(_render({"resources": {"limits": limits}}))["containers"]
    assert container["resources"]["limits"] == limits


def test_workers_bounds_are_the_gateway_own() -> None:
    from gateway.settings import MAX_WORKERS

    for workers in (1, MAX_WORKERS, str(MAX_WORKERS), "7"):
        assert _env(_render({"gateway": {"workers": workers}}))["GATEWAY_SERVER_WORKERS"]["value"] == str(
            workers
        )
    for workers in (MAX_WORKERS + 1, str(MAX_WORKERS + 1), "999", -1, "Auto", "2.5"):
        with pytest.raises(helm.HelmError):
            _render({"gateway": {"workers": workers}})


def test_workers_auto_needs_a_cpu_limit_to_count() -> None:
    for workers in ("auto", 0, "0"):
        assert "resources.limits.cpu" in _refusal({"gateway": {"workers": workers}})
        with_limit = {"gateway": {"workers": workers}, "resources": {"limits": {"cpu": "2"}}}
        assert _env(_render(with_limit))["GATEWAY_SERVER_WORKERS"]["value"] == str(workers)


def test_inconsistent_scaling_and_scrape_settings_are_refused() -> None:
    assert "maxReplicas" in _refusal({"autoscaling": {"minReplicas": 5, "maxReplicas": 3}})
    # The HPA is off: its bounds are not used.
    _render({"autoscaling": {"enabled": False, "minReplicas": 5, "maxReplicas": 3}})
    monitor = {"enabled": True, "interval": "1m", "scrapeTimeout": "1m0s500ms"}
    assert "scrapeTimeout" in _refusal({"serviceMonitor": monitor})
    # Compound durations count in full: 1m30s is 90s, and 90s is not longer than it.
    monitor = {"enabled": True, "interval": "1m30s", "scrapeTimeout": "90s"}
    (endpoint,) = _by_kind(_render({"serviceMonitor": monitor}))["ServiceMonitor"]["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("1m30s", "90s")


def test_pods_run_locked_down_and_drain_before_they_are_killed() -> None:
    values = _full_values()
    deployment = _by_kind(_render(values))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # The kubelet waits for preStop plus the gateway's own drain before it kills.
    env = {e["name"]: e for e in container["env"]}
    grace = int(env["GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS"]["value"])
    assert grace == values["gateway"]["shutdownGraceSeconds"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "sleep",
        str(values["preStopSleepSeconds"]),
    ]
    assert pod["terminationGracePeriodSeconds"] > grace + values["preStopSleepSeconds"]
    # The HPA owns the replica count; the scratch dir is the only writable mount.
    assert "replicas" not in deployment["spec"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts.keys() == {"/etc/context-gateway", "/tmp"} | {
        m["mountPath"] for m in values["extraVolumeMounts"]
    }
    assert all(m.get("readOnly") for path, m in mounts.items() if path != "/tmp")
    assert {v["name"] for v in pod["volumes"]} == {"config", "tmp"} | {
        v["name"] for v in values["extraVolumes"]
    }
    assert pod["priorityClassName"] == values["priorityClassName"]


def test_security_contexts_can_be_replaced_and_default_to_locked_down() -> None:
    default_pod = _pod(_render({}))
    assert default_pod["securityContext"]["runAsUser"] == 10001
    assert default_pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # Helm merges these with the defaults: a key set to null is dropped.
    pod_context = {"runAsUser": 20002, "fsGroup": None}
    container_context = {"readOnlyRootFilesystem": False}
    pod = _pod(_render({"podSecurityContext": pod_context, "securityContext": container_context}))
    assert pod["securityContext"]["runAsUser"] == 20002 and "fsGroup" not in pod["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    assert pod["containers"][0]["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_secrets_reach_the_gateway_by_environment_never_through_the_config_map() -> None:
    values = _full_values()
    objects = _render(values)
    config_map = next(o for o in objects if o["kind"] == "ConfigMap" and "gateway.yaml" in o["data"])
    assert yaml.safe_load(config_map["data"]["gateway.yaml"]) == values["gateway"]["config"]
    rendered_text = json.dumps(objects)
    secret = _by_kind(objects)["Secret"]
    assert values["secrets"]["upstreamApiKey"] not in rendered_text  # only base64 in the Secret
    env = {
        e["name"]: e
        for e in _by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    expected = {
        "GATEWAY_UPSTREAM_API_KEY": "upstream-api-key",
        "GATEWAY_UPSTREAM_ANTHROPIC_API_KEY": "anthropic-api-key",
        "GATEWAY_COMPRESSION_SUMMARIZER_API_KEY": "summarizer-api-key",
        "GATEWAY_REDIS_URL": "redis-url",
        "GATEWAY_TEAMS": "teams",
    }
    refs = {name: e["valueFrom"]["secretKeyRef"] for name, e in env.items() if "valueFrom" in e}
    assert {name: ref["key"] for name, ref in refs.items()} == expected
    # Each key the pod reads is one the Secret holds, and required.
    assert secret["data"].keys() == set(expected.values())
    for ref in refs.values():
        assert (ref["name"], ref["optional"]) == (secret["metadata"]["name"], False)


def test_the_pod_reads_only_the_secret_keys_the_chart_wrote(tmp_path: Path) -> None:
    objects = _render({})
    assert not _by_kind(objects)["Secret"].get("data")
    assert not [e for e in _env(objects).values() if "valueFrom" in e]
    settings = _gateway_settings(objects, tmp_path)
    assert (settings.upstream.api_key, settings.redis_url, settings.teams) == (None, None, {})

    full = _gateway_settings(_render(_full_values()), tmp_path)
    secrets = _full_values()["secrets"]
    assert full.upstream.api_key == secrets["upstreamApiKey"]
    assert full.upstream.anthropic_api_key == secrets["anthropicApiKey"]
    assert full.compression.summarizer.api_key == secrets["summarizerApiKey"]
    assert full.redis_url == secrets["redisUrl"]
    assert full.teams.keys() == secrets["teams"].keys()


def test_secrets_in_the_config_map_are_refused_naming_the_secret_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    config_schema = schema["properties"]["gateway"]["properties"]["config"]
    for path, secret_value in (
        (("upstream", "api_key"), "secrets.upstreamApiKey"),
        (("upstream", "anthropic_api_key"), "secrets.anthropicApiKey"),
        (("compression", "summarizer", "api_key"), "secrets.summarizerApiKey"),
        (("teams",), "secrets.teams"),
        (("redis_url",), "secrets.redisUrl"),
    ):
        config: Any = {"a-team": {"keys": []}} if path == ("teams",) else "sk-or-url"
        for key in reversed(path):
            config = {key: config}
        with pytest.raises(helm.HelmError, match="/gateway/config/" + "/".join(path)):
            _render({"gateway": {"config": config}})
        refusal = config_schema
        for key in path:
            refusal = refusal["properties"][key]
        assert secret_value in refusal["description"]


def test_redis_url_can_come_from_another_secret(tmp_path: Path) -> None:
    objects = _render({"secrets": {"redisUrlSecretRef": {"name": "redis-auth", "key": "url"}}})
    ref = _env(objects)["GATEWAY_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "redis-auth", "key": "url", "optional": False}
    both = {"redisUrl": "redis://r:6379/0", "redisUrlSecretRef": {"name": "redis-auth", "key": "url"}}
    assert "redisUrlSecretRef" in _refusal({"secrets": both})
    with pytest.raises(helm.HelmError):
        _render({"secrets": {"redisUrlSecretRef": {"name": "redis-auth"}}})


def test_an_existing_secret_replaces_the_chart_secret_and_its_keys_are_required() -> None:
    objects = _render({"secrets": {"existingSecret": "platform-llm-keys"}})
    assert "Secret" not in _by_kind(objects)
    refs = {name: e["valueFrom"]["secretKeyRef"] for name, e in _env(objects).items() if "valueFrom" in e}
    assert refs.keys() == {"GATEWAY_UPSTREAM_API_KEY", "GATEWAY_REDIS_URL", "GATEWAY_TEAMS"}
    # A misspelled Secret or a missing teams key stops the pod rather than start it unauthenticated.
    assert {(ref["name"], ref["optional"]) for ref in refs.values()} == {("platform-llm-keys", False)}

    listed = {"existingSecret": "platform-llm-keys", "existingSecretKeys": ["teams", "summarizerApiKey"]}
    refs = {
        name: e["valueFrom"]["secretKeyRef"]
        for name, e in _env(_render({"secrets": listed})).items()
        if "valueFrom" in e
    }
    assert {name: ref["key"] for name, ref in refs.items()} == {
        "GATEWAY_TEAMS": "teams",
        "GATEWAY_COMPRESSION_SUMMARIZER_API_KEY": "summarizer-api-key",
    }
    with pytest.raises(helm.HelmError):
        _render({"secrets": {"existingSecret": "keys", "existingSecretKeys": ["upstreamKey"]}})


def test_inline_secrets_beside_an_existing_secret_are_refused_not_dropped() -> None:
    for entry, value in (
        ("upstreamApiKey", "sk-x"),
        ("anthropicApiKey", "sk-ant-x"),
        ("summarizerApiKey", "sk-x"),
        ("redisUrl", "redis://r:6379/0"),
        ("teams", {"a": {"keys": ["sha256:" + "1" * 64]}}),
    ):
        refusal = _refusal({"secrets": {"existingSecret": "platform-llm-keys", entry: value}})
        assert f"secrets.{entry}" in refusal and "existingSecret" in refusal


def test_service_monitor_scrapes_the_service_metrics_port() -> None:
    objects = _by_kind(_render(_full_values()))
    monitor, service = objects["ServiceMonitor"], objects["Service"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


def _dashboard_from_config_map(objects: list[dict[str, Any]]) -> Any:
    dashboard_map = next(
        o for o in objects if o["kind"] == "ConfigMap" and "context-gateway.json" in o["data"]
    )
    assert dashboard_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    return json.loads(dashboard_map["data"]["context-gateway.json"])


def test_dashboard_config_map_carries_the_dashboard_file_for_the_grafana_sidecar() -> None:
    shipped = _dashboard_from_config_map(_render(_full_values()))
    dashboard = json.loads(DASHBOARD.read_text())
    assert {k: v for k, v in shipped.items() if k not in ("uid", "title")} == {
        k: v for k, v in dashboard.items() if k not in ("uid", "title")
    }


def test_each_release_ships_its_own_dashboard_uid_and_title() -> None:
    values = {"grafanaDashboard": {"enabled": True}}
    dashboards = [
        _dashboard_from_config_map(_render(values, release=release, namespace=namespace))
        for release, namespace in (("gw", "platform"), ("gw-canary", "platform"), ("gw", "staging"))
    ]
    # Grafana keys dashboards by uid (at most 40 characters) and refuses a title twice in a folder.
    assert len({d["uid"] for d in dashboards}) == len({d["title"] for d in dashboards}) == 3
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,40}", d["uid"]) for d in dashboards)
    long_name = _dashboard_from_config_map(_render(values, release="r" * 53))
    assert len(long_name["uid"]) <= 40
    chosen = _dashboard_from_config_map(
        _render({"grafanaDashboard": {"enabled": True, "uid": "llm-gateway"}})
    )
    assert chosen["uid"] == "llm-gateway"


# Labels Prometheus gives every series from the scrape target (the ServiceMonitor's among them).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}


def _panels(panels: list[dict[str, Any]]) -> Any:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def test_dashboard_queries_only_metrics_and_labels_the_gateway_exports() -> None:
    from prometheus_client.metrics import MetricWrapperBase

    import gateway.metrics

    # Declared label names, known before any series exists (a scrape shows only labels in use).
    label_names = {
        metric._name: set(metric._labelnames)
        for metric in vars(gateway.metrics).values()
        if isinstance(metric, MetricWrapperBase)
    }
    dashboard = json.loads(DASHBOARD.read_text())
    targets = [t for p in _panels(dashboard["panels"]) for t in p.get("targets", [])]
    targets += [{"expr": v["definition"]} for v in dashboard["templating"]["list"] if "definition" in v]
    assert targets
    for target in targets:
        expr = target["expr"]
        series = re.findall(r"gateway_\w+", expr)
        assert series, expr
        grouped = {
            name.strip() for group in re.findall(r"\bby \(([^)]*)\)", expr) for name in group.split(",")
        }
        matched = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        for name in series:
            family = re.sub(r"_(bucket|count|sum|total)$", "", name)
            assert family in label_names, f"{name} is not a metric the gateway exports"
            known = label_names[family] | TARGET_LABELS | ({"le"} if name.endswith("_bucket") else set())
            assert grouped | matched <= known, (expr, (grouped | matched) - known)
        # After an aggregation only its by-labels are left for the legend to show.
        if re.search(r"\b(sum|avg|min|max|count)\b", expr):
            assert legend <= grouped, (expr, legend - grouped)


# A copy of README's "minimal values file", checked equal to it below: the file users start from.
README_MINIMAL_VALUES = """
gateway:
  config:
    upstream:
      base_url: https://llm.internal.example.com/v1
secrets:
  upstreamApiKey: sk-...
  redisUrl: redis://redis-master.platform.svc:6379/0
  teams:
    platform:
      keys: ["sha256:d13a8a46df0f12ac1e3b3f2d09e8a01252bf1624a036bb7c39e64c42940ef698"]
serviceMonitor:
  enabled: true
"""


def test_readme_minimal_values_render_a_pod_the_gateway_starts_in(tmp_path: Path) -> None:
    values = yaml.safe_load(README_MINIMAL_VALUES)
    assert _readme_yaml_block_after("values file:") == values
    objects = _render(values)
    for obj in objects:
        if obj["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(obj, KUBE_VERSIONS[-1], strict=True)
    settings = _gateway_settings(objects, tmp_path)  # raises ConfigError where the gateway would exit
    assert (
        settings.server.host == "0.0.0.0" and settings.upstream.api_key == values["secrets"]["upstreamApiKey"]
    )
    assert settings.teams.keys() == {"platform"}


def test_an_upstream_key_without_gateway_keys_is_refused_at_render_as_the_gateway_would(
    tmp_path: Path,
) -> None:
    from gateway.settings import ConfigError

    for key_entry in ("upstreamApiKey", "anthropicApiKey"):
        open_relay: dict[str, Any] = {"secrets": {key_entry: "sk-x"}}
        assert "secrets.teams" in _refusal(open_relay)
        # What the chart stops is what the gateway refuses: the same pod with the check taken out.
        allowed = {**open_relay, "gateway": {"config": {"server": {"allow_unauthenticated": True}}}}
        objects = _render(allowed)
        assert _gateway_settings(objects, tmp_path).server.allow_unauthenticated is True
        config_map = next(o for o in objects if o["kind"] == "ConfigMap" and "gateway.yaml" in o["data"])
        config_map["data"]["gateway.yaml"] = "{}"
        with pytest.raises(ConfigError, match="open relay"):
            _gateway_settings(objects, tmp_path)
    # Gateway keys from an existing Secret, or from extraEnv, count as teams.
    _render({"secrets": {"existingSecret": "keys", "existingSecretKeys": ["upstreamApiKey", "teams"]}})
    assert "teams" in _refusal(
        {"secrets": {"existingSecret": "keys", "existingSecretKeys": ["upstreamApiKey"]}}
    )
    teams_env = {"name": "GATEWAY_TEAMS", "valueFrom": {"secretKeyRef": {"name": "teams", "key": "json"}}}
    _render({"secrets": {"upstreamApiKey": "sk-x"}, "gateway": {"extraEnv": [teams_env]}})


def test_extra_env_replaces_the_chart_entry_and_the_termination_grace_follows_it() -> None:
    values = _full_values()
    baseline = _pod(_render(values))
    margin = baseline["terminationGracePeriodSeconds"] - values["preStopSleepSeconds"]
    margin -= values["gateway"]["shutdownGraceSeconds"]
    redis_from_elsewhere = {
        "name": "GATEWAY_REDIS_URL",
        "valueFrom": {"secretKeyRef": {"name": "r", "key": "u"}},
    }
    grace = {"name": "GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS", "value": "120.5"}
    values["gateway"]["extraEnv"] += [redis_from_elsewhere, grace]
    pod = _pod(_render(values))
    names = [e["name"] for e in pod["containers"][0]["env"]]
    assert len(names) == len(set(names)), names  # a name twice breaks helm upgrade's merge
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["GATEWAY_REDIS_URL"] == redis_from_elsewhere
    assert env["GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS"] == grace
    assert pod["terminationGracePeriodSeconds"] == values["preStopSleepSeconds"] + math.ceil(120.5) + margin
    # A grace the chart cannot read leaves it no termination grace to compute.
    values["gateway"]["extraEnv"][-1] = {
        "name": "GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS",
        "valueFrom": {"configMapKeyRef": {"name": "c", "key": "grace"}},
    }
    assert "gateway.shutdownGraceSeconds" in _refusal(values)


def test_server_keys_the_chart_sets_are_refused_in_the_config_naming_the_value_to_use() -> None:
    for key, instead in (
        ("workers", "gateway.workers"),
        ("log_format", "gateway.logFormat"),
        ("shutdown_grace_seconds", "gateway.shutdownGraceSeconds"),
        ("keep_alive_timeout", "gateway.keepAliveTimeoutSeconds"),
        ("host", "0.0.0.0"),
        ("port", "service.port"),
    ):
        refusal = _refusal({"gateway": {"config": {"server": {key: "1"}}}})
        assert f"gateway.config.server.{key}" in refusal and instead in refusal
    # Other server keys are the config file's to set.
    _render({"gateway": {"config": {"server": {"log_level": "debug", "max_body_bytes": 1048576}}}})


def test_every_variable_the_chart_sets_is_one_the_gateway_reads() -> None:
    from gateway.settings import CONFIG_ENV, environment_names

    known = {*environment_names(), CONFIG_ENV}
    for values in ({}, _full_values(), {"secrets": {"existingSecret": "keys"}}):
        extra_names = {e["name"] for e in values.get("gateway", {}).get("extraEnv", [])}
        chart_names = set(_env(_render(values))) - extra_names
        assert chart_names <= known, chart_names - known


def test_idle_connections_outlast_the_load_balancer_idle_timeout(tmp_path: Path) -> None:
    # ingress-nginx's upstream keep-alive and AWS ALB's idle timeout are both 60 s by default: the
    # gateway must not close a connection they still mean to reuse.
    settings = _gateway_settings(_render({}), tmp_path)
    assert settings.server.keep_alive_timeout > 60
    full = _gateway_settings(_render(_full_values()), tmp_path)
    assert full.server.keep_alive_timeout == _full_values()["gateway"]["keepAliveTimeoutSeconds"]
    with pytest.raises(helm.HelmError):
        _render({"gateway": {"keepAliveTimeoutSeconds": 0}})


def test_ingress_example_passes_whole_bodies_and_streams_unbuffered() -> None:
    from gateway.settings import ServerSettings

    annotations = _by_kind(_render(_full_values()))["Ingress"]["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert annotations[prefix + "proxy-buffering"] == "off"
    assert annotations[prefix + "proxy-request-buffering"] == "off"
    size = re.fullmatch(r"([0-9]+)([kmg]?)", annotations[prefix + "proxy-body-size"])
    assert size is not None
    body_bytes = int(size.group(1)) * 1024 ** " kmg".index(size.group(2) or " ")
    assert body_bytes >= ServerSettings().max_body_bytes


def test_notes_tell_how_to_roll_pods_after_an_existing_secret_changes() -> None:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render({"secrets": {"existingSecret": "keys"}}, name="gw", namespace="platform")
    notes = next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    assert "kubectl -n platform rollout restart deployment/gw-context-gateway" in notes


def test_notes_warn_that_team_limits_multiply_without_redis() -> None:
    """Without Redis each worker of each pod holds a team's whole budget (two workers admitted
    6 requests a minute for a limit of 3): the install notes say so, and stop saying it once a
    Redis URL is given."""
    teams = {"platform": {"keys": ["sha256:" + "ab" * 32], "limits": {"requests_per_minute": 3}}}
    with helm.Chart.load(CHART) as chart:
        alone = chart.render({"secrets": {"teams": teams}}, name="gw", namespace="platform")
        shared = chart.render(
            {"secrets": {"teams": teams, "redisUrl": "redis://redis:6379/0"}}, name="gw", namespace="platform"
        )
    notes = [
        next(text for path, text in out.items() if path.endswith("NOTES.txt")) for out in (alone, shared)
    ]
    assert "team budgets" in notes[0] and "once per worker and once per pod" in notes[0]
    assert "team budgets" not in notes[1]
