"""The deploy files parse, agree with each other, and point at files that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy.promql_sources import (
    DASHBOARDS,
    DEPLOY,
    EXPECTED_METRICS,
    REPO,
    dashboard_panels,
    load_dashboard,
    metric_names,
    sample_name_labels,
)

pytestmark = pytest.mark.unit

COMPOSE_DIR = DEPLOY / "compose"
K8S_DIR = DEPLOY / "kubernetes"
YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml"))
DASHBOARD = DASHBOARDS / "gateway.json"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = _yaml(COMPOSE_DIR / "docker-compose.yml")
    return data


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", YAML_FILES, ids=[_rel(p) for p in YAML_FILES])
def test_yaml_parses(path: Path) -> None:
    docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    assert docs and all(isinstance(d, dict) for d in docs)


# ---- Grafana ------------------------------------------------------------------------------------


def test_dashboard_is_grafana_json() -> None:
    dash = load_dashboard(DASHBOARD)
    assert dash["schemaVersion"] >= 39
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dashboard_panels(DASHBOARD)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_dashboard_variables() -> None:
    variables = {v["name"]: v for v in load_dashboard(DASHBOARD)["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("route", "pool"):
        var = variables[name]
        assert var["type"] == "query" and var["multi"] and var["includeAll"]
        assert var["allValue"] == ".*"
        assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert var["query"]["query"].startswith("label_values(")


def test_every_panel_has_a_datasource_and_queries() -> None:
    panels = [p for p in dashboard_panels(DASHBOARD) if p["type"] != "row"]
    assert len(panels) >= 20
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            assert target["expr"].strip(), panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_dashboard_panels_filter_by_the_variables() -> None:
    """Every panel follows the route or pool picked, but for one of a client key's own (a budget) or
    of the process (its event loop's lag): its metrics carry neither label."""
    series = sample_name_labels(EXPECTED_METRICS) | {name: spec.labels for name, spec in EXPECTED_METRICS.items()}
    for panel in dashboard_panels(DASHBOARD):
        for target in panel.get("targets", []):
            names = metric_names(target["expr"])
            if names <= series.keys() and not any(series[m] & {"route", "pool"} for m in names):
                continue
            assert "$route" in target["expr"] or "$pool" in target["expr"], panel["title"]


def test_dashboard_grid_has_no_overlaps() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard_panels(DASHBOARD):
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_first_row_puts_the_two_lenses_side_by_side() -> None:
    panels = dashboard_panels(DASHBOARD)
    rows = [p for p in panels if p["type"] == "row"]
    first, second = rows[0]["gridPos"]["y"], rows[1]["gridPos"]["y"]
    top = [p for p in panels if p["type"] != "row" and first < p["gridPos"]["y"] < second]
    left = {p["title"] for p in top if p["gridPos"]["x"] == 0}
    right = {p["title"] for p in top if p["gridPos"]["x"] == 12}
    assert left and all(t.startswith("Your answer") for t in left)
    assert right and all(t.startswith("The machine") for t in right)
    exprs = " ".join(t["expr"] for p in top for t in p["targets"])
    for metric in (
        "gateway_time_to_first_token_seconds_bucket",
        "gateway_inter_token_latency_seconds_bucket",
        "gateway_request_output_tokens_per_second_bucket",
        "gateway_output_tokens_total",
        "gateway_requests_in_flight",
        "gateway_requests_total",
    ):
        assert metric in exprs
    assert [r["title"] for r in rows[1:]] == [
        "Routing",
        "Context caps",
        "Backends",
        "Gateway overhead",
        "Errors & disconnects",
    ]


def test_grafana_provisioning_points_at_the_dashboards() -> None:
    ds = _yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"]
    assert [d["type"] for d in ds] == ["prometheus"]
    providers = _yaml(DEPLOY / "grafana/provisioning/dashboards/gateway.yml")["providers"]
    path = providers[0]["options"]["path"]
    mounts = _compose()["services"]["grafana"]["volumes"]
    assert f"../grafana/dashboards:{path}:ro" in mounts
    json.loads(DASHBOARD.read_text(encoding="utf-8"))


# ---- compose ------------------------------------------------------------------------------------


def test_compose_references_files_that_exist() -> None:
    compose = _compose()
    named_volumes = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        build = service.get("build")
        if build:
            context = (COMPOSE_DIR / build["context"]).resolve()
            assert context.is_dir(), name
            assert (context / build["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (COMPOSE_DIR / source).exists(), f"{name}: {source}"
            else:
                assert source in named_volumes, f"{name}: undeclared volume {source}"
        for dep in service.get("depends_on", []):
            assert dep in compose["services"], f"{name} depends on unknown {dep}"


def test_compose_engines_match_gateway_config_and_prometheus() -> None:
    services = _compose()["services"]
    sims = {}
    for name, service in services.items():
        command = service.get("command", [])
        if command[:1] == ["sim"]:
            sims[name] = int(command[command.index("--port") + 1])
            assert command[command.index("--flavour") + 1] == name
            assert command[command.index("--host") + 1] == "0.0.0.0"
    assert set(sims) == {"vllm", "sglang", "llamacpp"}
    assert sims == {"vllm": 8000, "sglang": 30000, "llamacpp": 8080}

    config = _yaml(COMPOSE_DIR / "gateway.yaml")
    backends = {urlsplit(b["url"]).netloc for pool in config["pools"].values() for b in pool["backends"]}
    assert backends == {f"{name}:{port}" for name, port in sims.items()}

    prom = _yaml(DEPLOY / "prometheus/prometheus.yml")
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == backends | {"gateway:4000"}
    assert services["gateway"]["ports"] == ["4000:4000"]
    assert config["server"]["host"] == "0.0.0.0" and config["server"]["port"] == 4000


def test_compose_gateway_mounts_its_config() -> None:
    gateway = _compose()["services"]["gateway"]
    config_path = gateway["command"][gateway["command"].index("--config") + 1]
    assert f"./gateway.yaml:{config_path}:ro" in gateway["volumes"]


def test_compose_keeps_real_engine_alternatives() -> None:
    text = (COMPOSE_DIR / "docker-compose.yml").read_text(encoding="utf-8")
    for image in ("vllm/vllm-openai", "lmsysorg/sglang", "ghcr.io/ggml-org/llama.cpp:server"):
        assert re.search(rf"^\s*#\s*image: {re.escape(image)}", text, flags=re.M), image


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim AS build$", text, flags=re.M)
    assert re.search(r"^ARG COMPILE=1$", text, flags=re.M)  # the compiled build by default
    assert re.search(r"^COPY pyproject.toml setup.py README\* \./$", text, flags=re.M)
    assert re.search(r'^ARG EXTRAS=""$', text, flags=re.M)  # in both stages: --build-arg EXTRAS=epp
    assert len(re.findall(r'^ARG EXTRAS=""$', text, flags=re.M)) == 2
    # the dependencies (with the extras' when asked), for mypyc
    assert 'pip wheel -w /wheels ".${EXTRAS:+[$EXTRAS]}" && rm /wheels/llm_gateway-*.whl' in text
    assert 'GATEWAY_COMPILE="$COMPILE" pip wheel --no-build-isolation --no-deps -w /wheels .' in text
    assert re.search(r"^COPY --from=build /wheels /wheels$", text, flags=re.M)
    assert (
        'RUN pip install --no-index --find-links /wheels "$(ls /wheels/llm_gateway-*.whl)${EXTRAS:+[$EXTRAS]}"' in text
    )
    assert 'ENTRYPOINT ["gateway"]' in text
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    assert {"!pyproject.toml", "!setup.py", "!gateway/", "!engines/"} <= set(ignore)


EPP_DIR = DEPLOY / "kubernetes-epp"


@pytest.mark.parametrize(
    "path", [COMPOSE_DIR / "gateway.yaml", K8S_DIR / "gateway.yaml", EPP_DIR / "gateway.yaml"], ids=_rel
)
def test_shipped_gateway_configs_validate(path: Path) -> None:
    config = pytest.importorskip("gateway.config_loader")
    loaded = config.load_config(path, env={})
    assert {r.label for r in loaded.routes} == {"chat", "small"}


def test_cli_accepts_the_arguments_deploy_uses() -> None:
    pytest.importorskip("gateway.cli")
    cases = ((["serve", "--help"], ["--config"]), (["sim", "--help"], ["--flavour", "--port", "--host"]))
    for argv, flags in cases:
        code = f"import sys; from gateway.cli import main; sys.argv = ['gateway', *{argv!r}]; main()"
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
        )
        for flag in flags:
            assert flag in out.stdout + out.stderr, f"gateway {' '.join(argv)}: no {flag}"


# ---- Kubernetes ---------------------------------------------------------------------------------


def test_kustomization_lists_exactly_the_manifests() -> None:
    kustomization = _yaml(K8S_DIR / "kustomization.yaml")
    resources = set(kustomization["resources"])
    generated = {f for gen in kustomization.get("configMapGenerator", []) for f in gen["files"]}
    for name in resources | generated:
        assert (K8S_DIR / name).is_file(), name
    on_disk = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == resources | generated


def _manifests() -> dict[tuple[str, str], dict[str, Any]]:
    kustomization = _yaml(K8S_DIR / "kustomization.yaml")
    out = {}
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S_DIR / name).read_text(encoding="utf-8")):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_kubernetes_deployment() -> None:
    manifests = _manifests()
    deploy = manifests[("Deployment", "llm-gateway")]
    spec = deploy["spec"]["template"]["spec"]
    assert deploy["spec"]["replicas"] == 2
    (container,) = spec["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]
    assert container["lifecycle"]["preStop"]
    annotations = deploy["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(container["ports"][0]["containerPort"])

    config = _yaml(K8S_DIR / "gateway.yaml")
    assert container["ports"][0]["containerPort"] == config["server"]["port"]
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + config["server"]["drain_timeout_s"]
    config_path = container["args"][container["args"].index("--config") + 1]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert config_path == f"{mount['mountPath']}/gateway.yaml"

    pdb = manifests[("PodDisruptionBudget", "llm-gateway")]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = manifests[("Service", "llm-gateway")]
    assert service["spec"]["selector"].items() <= labels.items()


def test_kubernetes_backends_resolve_through_headless_services() -> None:
    manifests = _manifests()
    headless = {
        name: doc
        for (kind, name), doc in manifests.items()
        if kind == "Service" and doc["spec"].get("clusterIP") == "None"
    }
    assert set(headless) == {"vllm", "sglang", "llamacpp"}
    config = _yaml(K8S_DIR / "gateway.yaml")
    for pool in config["pools"].values():
        for backend in pool["backends"]:
            url = urlsplit(backend["url"])
            if backend.get("discover"):  # the headless Service's own name: one address per pod
                service = url.hostname
            else:  # a fixed pod: <pod>.<headless service>
                pod, service = url.hostname.split(".", 1)
                assert re.fullmatch(rf"{service}-\d+", pod), backend["url"]
            assert service in headless, backend["url"]
            assert url.port in {p["port"] for p in headless[service]["spec"]["ports"]}, backend["url"]


def test_kustomize_build() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S_DIR)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    docs = list(yaml.safe_load_all(out))
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "Service", "Service", "Service"]
    (configmap,) = (d for d in docs if d["kind"] == "ConfigMap")
    assert configmap["data"]["gateway.yaml"] == (K8S_DIR / "gateway.yaml").read_text(encoding="utf-8")
    (deployment,) = (d for d in docs if d["kind"] == "Deployment")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert any(v.get("configMap", {}).get("name") == configmap["metadata"]["name"] for v in volumes)


def test_kustomize_build_of_the_epp_overlay() -> None:
    """deploy/kubernetes-epp: the base's config and engines, no `gateway serve` objects, and the
    EPP wired to the InferencePool and the HTTPRoute by the names and ports each one declares."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "kubernetes-epp")], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    docs = list(yaml.safe_load_all(out))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    assert sorted(by_kind) == [
        "ConfigMap",
        "Deployment",
        "HTTPRoute",
        "InferencePool",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    assert "llm-gateway" not in {d["metadata"]["name"] for d in docs}  # the serve Deployment and Service
    (configmap,) = by_kind["ConfigMap"]
    assert configmap["data"]["gateway.yaml"] == (EPP_DIR / "gateway.yaml").read_text(encoding="utf-8")
    (deployment,) = by_kind["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "llm-gateway:0.1.0-epp"
    args = container["args"]
    assert args[0] == "epp" and args[args.index("--config") + 1] == "/etc/gateway/gateway.yaml"
    grpc_port = int(args[args.index("--port") + 1])
    assert container["readinessProbe"]["grpc"] == {"port": grpc_port, "service": "readiness"}
    assert any(v.get("configMap", {}).get("name") == configmap["metadata"]["name"] for v in pod["volumes"])
    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    (pool,) = by_kind["InferencePool"]
    picker = pool["spec"]["endpointPickerRef"]
    epp_service = services[picker["name"]]
    assert epp_service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert picker["port"]["number"] == epp_service["spec"]["ports"][0]["port"]
    assert picker["failureMode"] == "FailClose"
    # The pool's pods are the ones gateway.yaml's vllm backends name: the same selector and port.
    engines = services[pool["metadata"]["name"]]
    assert pool["spec"]["selector"]["matchLabels"] == engines["spec"]["selector"]
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [p["port"] for p in engines["spec"]["ports"]]
    # gateway.yaml's vllm pool takes its members from that InferencePool, in the EPP's namespace.
    config = yaml.safe_load(configmap["data"]["gateway.yaml"])
    (entry,) = config["pools"]["vllm"]["backends"]
    assert entry["inference_pool"] == {"name": pool["metadata"]["name"]}
    (env,) = container["env"]
    assert env == {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    # RBAC: the Deployment's service account may get, list and watch the pool and its pods.
    (account,) = by_kind["ServiceAccount"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    (role,) = by_kind["Role"]
    (binding,) = by_kind["RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"]}]
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    for group, resource in (("", "pods"), ("inference.networking.k8s.io", "inferencepools")):
        for verb in ("get", "list", "watch"):
            assert (group, resource, verb) in granted, (group, resource, verb)
    assert {v for _, _, v in granted} == {"get", "list", "watch"}  # read only
    (route,) = by_kind["HTTPRoute"]
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        pool["metadata"]["name"],
    )
