"""deploy/, validated as far as offline tools allow: every YAML parses, every object's kind and
apiVersion is one the Kubernetes, Gateway API, inference-extension and llm-d docs give, and the
pieces agree with each other and with the server (ports, labels, probe paths, the drain timing,
the EPP's metric mapping). Nothing here talks to a cluster (docs/fleet.md: what needs one)."""

import ipaddress
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml

from conftest import ROOT

DEPLOY = ROOT / "deploy"
# kind -> apiVersion, as documented (Kubernetes API reference; Gateway API v1; Gateway API
# inference extension v1 InferencePool; kustomize; the llm-d router's EndpointPickerConfig).
DOCUMENTED = {
    "Namespace": "v1", "Service": "v1", "ServiceAccount": "v1", "ConfigMap": "v1",
    "DaemonSet": "apps/v1", "Deployment": "apps/v1",
    "Role": "rbac.authorization.k8s.io/v1", "RoleBinding": "rbac.authorization.k8s.io/v1",
    "RuntimeClass": "node.k8s.io/v1",
    "InferencePool": "inference.networking.k8s.io/v1",
    "Gateway": "gateway.networking.k8s.io/v1", "HTTPRoute": "gateway.networking.k8s.io/v1",
    "Kustomization": "kustomize.config.k8s.io/v1beta1",
    "EndpointPickerConfig": "llm-d.ai/v1alpha1",
}
EDGELM_METRICS = {
    "queuedRequestsSpec": "edgelm_requests_waiting",
    "runningRequestsSpec": "edgelm_requests_running",
    "kvUsageSpec": "edgelm_kv_cache_usage_ratio",
    "cacheInfoSpec": "edgelm_cache_config_info",
    "loraSpec": "",
}


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def objects() -> dict[str, list[dict]]:
    out = {}
    for p in sorted(DEPLOY.rglob("*.y*ml")):
        for d in docs(p):
            out.setdefault(d.get("kind", "?"), []).append(d)
    return out


def one(kind: str, name: str | None = None) -> dict:
    found = [o for o in objects().get(kind, []) if name is None or o.get("metadata", {}).get("name") == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def test_every_yaml_parses_and_uses_the_documented_kinds_and_api_versions():
    files = sorted(DEPLOY.rglob("*.y*ml"))
    assert len(files) >= 12, files
    for p in files:
        for d in docs(p):
            if p.name in ("endpoints.yaml", "envoy.yaml", "prometheus.yml"):
                assert "kind" not in d, p  # configuration files, not API objects
                continue
            assert d.get("kind") in DOCUMENTED, f"{p}: kind {d.get('kind')!r}"
            assert d["apiVersion"] == DOCUMENTED[d["kind"]], f"{p}: {d['kind']} {d['apiVersion']}"
            if d["kind"] not in ("Kustomization", "EndpointPickerConfig"):
                assert d["metadata"]["name"], p


def test_kustomizations_list_files_that_exist():
    for k in DEPLOY.rglob("kustomization.yaml"):
        (kz,) = docs(k)
        for r in kz.get("resources", []):
            assert (k.parent / r).exists(), f"{k}: {r}"
        for g in kz.get("configMapGenerator", []):
            for f in g["files"]:
                assert (k.parent / f).exists(), f"{k}: {f}"


def container(obj: dict, name: str) -> dict:
    (c,) = [c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def arg(c: dict, flag: str) -> str:
    vals = [a.split("=", 1)[1] for a in c["args"] if a.startswith(flag + "=")]
    assert len(vals) == 1, (flag, c["args"])
    return vals[0]


def test_the_daemonset_probes_drain_timing_and_model_volume():
    ds = one("DaemonSet", "edgelm")
    spec = ds["spec"]["template"]["spec"]
    c = container(ds, "edgelm")
    assert c["args"][0] == "serve"
    port = c["ports"][0]["containerPort"]
    assert int(arg(c, "--port")) == port and arg(c, "--host") == "0.0.0.0"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    # Liveness is cheap and does not fail while the model loads or the box drains (/health is
    # 503 then): a TCP connect.
    assert "tcpSocket" in c["livenessProbe"] and "httpGet" not in c["livenessProbe"]
    # preStop delay + the server's drain + margin fits the grace period; the drain equals the
    # shipped profiles' server.drain_seconds.
    profile = tomllib.loads((ROOT / "firmware-configs" / "x86-cpu.toml").read_text())
    drain = int(arg(c, "--drain-seconds"))
    assert drain == profile["server"]["drain_seconds"]
    pre = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert 0 < pre and pre + drain + 5 <= spec["terminationGracePeriodSeconds"] <= pre + drain + 30
    # The model comes from the box (hostPath), mounted where the image's command reads it.
    vols = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == arg(c, "--model")]
    assert "hostPath" in vols[mount["name"]] and mount["readOnly"]
    assert arg(c, "--model") == "/models/model.gguf"  # = scripts/oci-image.py's CMD
    assert "runtimeClassName" not in spec  # only in the Jetson overlay


def test_the_jetson_overlay_adds_the_nvidia_runtime():
    (kz,) = docs(DEPLOY / "k3s" / "jetson" / "kustomization.yaml")
    assert ".." in kz["resources"]
    (p,) = kz["patches"]
    assert p["target"] == {"kind": "DaemonSet", "name": "edgelm"}
    ops = yaml.safe_load(p["patch"])
    assert {"op": "add", "path": "/spec/template/spec/runtimeClassName", "value": "nvidia"} in ops
    assert one("RuntimeClass", "nvidia")["handler"] == "nvidia"


def test_the_pool_service_and_epp_agree():
    ds = one("DaemonSet", "edgelm")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    port = container(ds, "edgelm")["ports"][0]["containerPort"]
    pool = one("InferencePool", "edgelm")["spec"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert [p["number"] for p in pool["targetPorts"]] == [port]
    svc = one("Service", "edgelm")["spec"]
    assert svc["selector"].items() <= labels.items()
    # The pool's endpointPickerRef is the EPP Service and its gRPC port.
    epp_svc = one("Service", pool["endpointPickerRef"]["name"])
    (grpc,) = [p for p in epp_svc["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc["port"] == pool["endpointPickerRef"]["port"]["number"]
    epp = one("Deployment", "edgelm-epp")
    e = container(epp, "epp")
    assert int(arg(e, "--grpc-port")) == grpc["port"]
    assert arg(e, "--pool-name") == "edgelm"
    # Its config file is the ConfigMap kustomize generates from epp-config.yaml.
    (kz,) = docs(DEPLOY / "k3s" / "kustomization.yaml")
    (gen,) = kz["configMapGenerator"]
    vols = {v["name"]: v for v in epp["spec"]["template"]["spec"]["volumes"]}
    (m,) = e["volumeMounts"]
    assert vols[m["name"]]["configMap"]["name"] == gen["name"]
    assert arg(e, "--config-file") == f"{m['mountPath']}/{gen['files'][0]}"
    # The route sends to the pool.
    route = one("HTTPRoute", "edgelm")
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "edgelm"}]
    # Pods carry the engine label the EPP's extractor keys on.
    cfg = epp_config(DEPLOY / "k3s" / "epp-config.yaml")
    ext = plugin(cfg, "core-metrics-extractor")["parameters"]
    assert labels[ext["engineLabelKey"]] == ext["defaultEngine"] == "edgelm"


def epp_config(path: Path) -> dict:
    (cfg,) = docs(path)
    assert cfg["kind"] == "EndpointPickerConfig"
    return cfg


def plugin(cfg: dict, type_: str) -> dict:
    (p,) = [p for p in cfg["plugins"] if p["type"] == type_]
    return p


def check_refs(cfg: dict):
    names = {p.get("name", p["type"]) for p in cfg["plugins"]}
    refs = [r["pluginRef"] for prof in cfg["schedulingProfiles"] for r in prof["plugins"]]
    dl = cfg.get("dataLayer", {})
    refs += [s["pluginRef"] for s in dl.get("sources", [])]
    refs += [x["pluginRef"] for s in dl.get("sources", []) for x in s.get("extractors", [])]
    if "discovery" in dl:
        refs.append(dl["discovery"]["pluginRef"])
    assert set(refs) <= names, set(refs) - names


def test_the_epp_maps_edgelms_metrics_the_same_with_and_without_kubernetes():
    k3s = epp_config(DEPLOY / "k3s" / "epp-config.yaml")
    alone = epp_config(DEPLOY / "standalone" / "epp-config.yaml")
    for cfg in (k3s, alone):
        check_refs(cfg)
        ext = plugin(cfg, "core-metrics-extractor")["parameters"]
        (eng,) = ext["engineConfigs"]
        assert eng == {"name": "edgelm", **EDGELM_METRICS}, eng
        assert plugin(cfg, "metrics-data-source")["parameters"] == {"scheme": "http", "path": "/metrics"}
        scorers = {r["pluginRef"] for r in cfg["schedulingProfiles"][0]["plugins"]}
        assert {"queue-scorer", "kv-cache-utilization-scorer", "max-score-picker"} <= scorers
    # Standalone = the k3s config plus file discovery.
    fd = plugin(alone, "file-discovery")
    assert alone["dataLayer"]["discovery"]["pluginRef"] == fd["name"]
    assert [p for p in alone["plugins"] if p["type"] != "file-discovery"] == k3s["plugins"]
    assert alone["schedulingProfiles"] == k3s["schedulingProfiles"]
    assert "discovery" not in k3s["dataLayer"]
    (eps,) = docs(DEPLOY / "standalone" / "endpoints.yaml")
    assert eps["endpoints"]
    for ep in eps["endpoints"]:
        ipaddress.IPv4Address(ep["address"])
        assert isinstance(ep["port"], str) and 0 < int(ep["port"]) < 65536
        assert ep["labels"]["llm-d.ai/engine-type"] == "edgelm"


def test_the_standalone_envoy_asks_the_epp_and_forwards_to_its_pick():
    (env,) = docs(DEPLOY / "standalone" / "envoy.yaml")
    clusters = {c["name"]: c for c in env["static_resources"]["clusters"]}
    (lst,) = env["static_resources"]["listeners"]
    hcm = lst["filter_chains"][0]["filters"][0]["typed_config"]
    filters = [f["name"] for f in hcm["http_filters"]]
    assert filters == ["envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    ext = hcm["http_filters"][0]["typed_config"]
    epp = clusters[ext["grpc_service"]["envoy_grpc"]["cluster_name"]]
    addr = epp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert addr["port_value"] == 9002 and "http2_protocol_options" in str(epp)
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    dst = clusters[route["cluster"]]
    assert dst["type"] == "ORIGINAL_DST" and dst["lb_policy"] == "CLUSTER_PROVIDED"
    assert dst["original_dst_lb_config"] == {"use_http_header": True,
                                             "http_header_name": "x-gateway-destination-endpoint"}
    # The EPP command line in the standalone config's header uses the same gRPC port.
    head = (DEPLOY / "standalone" / "epp-config.yaml").read_text()
    assert re.search(r"--grpc-port 9002\b", head)


def test_promtool_accepts_the_shipped_prometheus_config(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: .ci/run installs prometheus"
    shutil.copy(DEPLOY / "prometheus" / "prometheus.yml", tmp_path / "prometheus.yml")
    (tmp_path / "edgelm-targets.json").write_text('[{"targets": ["127.0.0.1:8080"]}]')
    r = subprocess.run([promtool, "check", "config", tmp_path / "prometheus.yml"], capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, r.stdout + r.stderr
