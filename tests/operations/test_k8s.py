"""Kubernetes manifests (k8s/): render every kustomization, validate it strictly against
pinned Kubernetes schemas (offline), and check the invariants that keep the pods wired
together: probes, security, resources, selectors, ports and the settings the binaries read.

Rendering needs ``kubectl`` (``kubectl kustomize``). Without it the overlays are skipped and
the base is checked from its YAML files, with the ConfigMap generator expanded here.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import kubernetes_validate.utils as kv_utils
import pytest
import yaml

from actorlearner import config as cfg
from actorlearner.algorithms import resolve
from actorlearner.learner.distributed import World, resolve_world

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUBECTL = shutil.which("kubectl")
# The oldest Kubernetes the manifests support and the newest schema kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")

# What each test renders: a kustomization directory, plus components layered on top of it
# in a temporary kustomization (the combinations users are told to build).
TARGETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "base": ("base", ()),
    "dev": ("overlays/dev", ()),
    "gpu": ("overlays/gpu", ()),
    "remote-env": ("overlays/remote-env", ()),
    "relays": ("overlays/relays", ()),
    "data-parallel": ("overlays/data-parallel", ()),
    "dev+tls": ("overlays/dev", ("components/tls",)),
    "gpu+remote-env+tls": ("overlays/gpu", ("components/remote-env", "components/tls")),
    "relays+tls": ("overlays/relays", ("components/tls",)),
    "dev+relay+remote-env": ("overlays/dev", ("components/relay", "components/remote-env")),
    "data-parallel+remote-env+tls": ("overlays/data-parallel", ("components/remote-env", "components/tls")),
}

METRICS_PORT = 9100
ACTOR_HEALTH_PORT = 50052
AUTH_SECRET = "actorlearner-auth"
TLS_SECRET = "actorlearner-tls"
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"}
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"


CONFIG_CLASSES = {"learner": cfg.LearnerConfig, "actor": cfg.ActorConfig, "run": cfg.RunConfig,
                  "env-server": cfg.EnvServerConfig, "relay": cfg.RelayConfig}


# ---------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------

def _kustomize(directory: Path) -> list[dict]:
    proc = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@functools.lru_cache(maxsize=None)
def _render(name: str) -> tuple[dict, ...]:
    directory, components = TARGETS[name]
    if not components:
        return tuple(_kustomize(K8S / directory))
    with tempfile.TemporaryDirectory() as tmp:
        # kustomize takes only relative paths to other kustomizations.
        rel = lambda p: os.path.relpath(K8S / p, tmp)  # noqa: E731
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [rel(directory)], "components": [rel(c) for c in components]}))
        return tuple(_kustomize(Path(tmp)))


@functools.lru_cache(maxsize=None)
def _base_from_files() -> tuple[dict, ...]:
    """The base without kubectl: its resource files plus the generated ConfigMap (no hash)."""
    base = K8S / "base"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    docs = []
    for resource in kustomization.get("resources", []):
        docs += [d for d in yaml.safe_load_all((base / resource).read_text()) if d]
    for gen in kustomization.get("configMapGenerator", []):
        data = {}
        for entry in gen.get("files", []):
            key, _, path = entry.rpartition("=") if "=" in entry else (Path(entry).name, "", entry)
            data[key] = (base / path).read_text()
        for literal in gen.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    return tuple(docs)


def manifests(name: str) -> list[dict]:
    if KUBECTL:
        return list(_render(name))
    if name == "base":
        return list(_base_from_files())
    pytest.skip(f"kubectl not on PATH: {name} not rendered (install kubectl to check the overlays; "
                "the base is checked from its YAML files)")


@pytest.fixture(params=list(TARGETS))
def docs(request) -> list[dict]:
    return manifests(request.param)


@pytest.fixture
def target(docs, request) -> str:
    return request.node.callspec.params["docs"]


def test_every_overlay_and_component_is_checked():
    overlays = {f"overlays/{p.name}" for p in (K8S / "overlays").iterdir() if p.is_dir()}
    components = {f"components/{p.name}" for p in (K8S / "components").iterdir() if p.is_dir()}
    checked_dirs = {d for d, _ in TARGETS.values()}
    checked_components = {c for _, cs in TARGETS.values() for c in cs}
    assert overlays <= checked_dirs, f"overlays not in TARGETS: {sorted(overlays - checked_dirs)}"
    assert components <= checked_components | checked_dirs, (
        f"components not in TARGETS: {sorted(components - checked_components)}")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not on PATH: cannot render kustomizations")
@pytest.mark.parametrize("name", list(TARGETS))
def test_renders(name):
    docs = manifests(name)
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Deployment", "Service", "ConfigMap", "NetworkPolicy", "PodDisruptionBudget"} <= kinds


# ---------------------------------------------------------------------------------------
# Strict schema validation (kubernetes-validate ships the schemas: no network)
# ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _validator():
    # validate() rereads the 1.3 MB definitions file for every resource; read each file once.
    if not hasattr(kv_utils.schema_contents, "cache_info"):
        kv_utils.schema_contents = functools.lru_cache(maxsize=None)(kv_utils.schema_contents)
    return kv


def _strict_errors(kv, doc: dict, version: str) -> str | None:
    try:
        kv.validate(doc, version, strict=True)
    except kv.ValidationError as exc:
        return f"{doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc.message}"
    except kv.SchemaNotFoundError as exc:  # the CLI only warns about these; here they fail
        return exc.message
    return None


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_strict_schema(docs, version):
    kv = _validator()
    errors = [e for e in (_strict_errors(kv, d, version) for d in docs) if e]
    assert not errors, f"against Kubernetes {version}:\n" + "\n".join(errors)


def test_strict_schema_rejects_unknown_fields():
    kv = _validator()
    statefulset = next(d for d in manifests("base") if d["kind"] == "StatefulSet")
    bad = yaml.safe_load(yaml.safe_dump(statefulset))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {"port": 1}}
    assert _strict_errors(kv, bad, KUBERNETES_VERSIONS[0]) is not None


# ---------------------------------------------------------------------------------------
# Helpers over rendered manifests
# ---------------------------------------------------------------------------------------

def workloads(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] in WORKLOAD_KINDS]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"].get("labels", {})


def containers(workload: dict) -> list[dict]:
    spec = pod_spec(workload)
    return spec.get("initContainers", []) + spec["containers"]


def component(doc: dict) -> str:
    return doc["metadata"]["labels"][LABEL_COMPONENT]


def by_component(docs: list[dict], name: str) -> list[dict]:
    return [w for w in workloads(docs) if component(w) == name]


def the(docs: list[dict], name: str) -> dict:
    found = by_component(docs, name)
    assert len(found) == 1, f"expected one {name} workload, found {len(found)}"
    return found[0]


def selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels / matchExpressions, or a plain Service map) matches labels."""
    match = selector.get("matchLabels", {}) if ("matchLabels" in selector or "matchExpressions" in selector) else selector
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for expr in selector.get("matchExpressions", []) if "matchExpressions" in selector else []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def container_ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def configmap(docs: list[dict], name: str) -> dict:
    found = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    assert found, f"ConfigMap {name} is referenced but not rendered"
    return found[0]


def env_values(docs: list[dict], workload: dict, container: dict) -> dict[str, str]:
    """The container's env vars as the pod sees them (ConfigMap refs resolved, field refs named)."""
    out = {}
    for var in container.get("env", []):
        if "value" in var:
            out[var["name"]] = str(var["value"])
        elif "configMapKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["configMapKeyRef"]
            data = configmap(docs, ref["name"]).get("data", {})
            assert ref["key"] in data, f"{var['name']}: key {ref['key']} not in ConfigMap {ref['name']}"
            out[var["name"]] = data[ref["key"]]
        elif "fieldRef" in var.get("valueFrom", {}):
            out[var["name"]] = f"<{var['valueFrom']['fieldRef']['fieldPath']}>"
    return out


def mounted_file(docs: list[dict], workload: dict, container: dict, path: str) -> tuple[dict, str]:
    """The volume and key behind a file path in the container (the longest matching mount)."""
    mounts = sorted(container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
    for mount in mounts:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
            volume = volumes.get(mount["name"])
            assert volume is not None or mount["name"] in claim_templates(workload), (
                f"mount {mount['name']} has no volume")
            return volume or {"persistentVolumeClaim": {"claimName": mount["name"]}}, path[len(prefix):]
    raise AssertionError(f"{path} is not on any volume of container {container['name']}")


def claim_templates(workload: dict) -> set[str]:
    return {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}


def subcommand(container: dict) -> str:
    """The actorlearner subcommand: the first argument to the image's entry point."""
    assert "command" not in container, f"{container['name']}: keep the image's entry point, pass args"
    return container["args"][0]


def config_class(container: dict):
    return CONFIG_CLASSES[subcommand(container)]


_configs: dict[int, tuple[dict, Any]] = {}


def effective_config(docs: list[dict], workload: dict, container: dict):
    """The config object the binary would build from this container's args, env and --config file."""
    cached = _configs.get(id(container))
    if cached is None or cached[0] is not container:
        cached = _configs[id(container)] = (container, _build_config(docs, workload, container))
    return cached[1]


def _build_config(docs: list[dict], workload: dict, container: dict):
    cls = config_class(container)
    if cls is None:
        return None
    args = container.get("args", [])[1:]
    environ = env_values(docs, workload, container)
    algorithm = resolve(cfg.algorithm_name(args, environ))
    parser = argparse.ArgumentParser()
    cfg.add_arguments(parser, cls, algorithm)
    known, _ = parser.parse_known_args(args)
    with tempfile.TemporaryDirectory() as tmp:
        if known.config:
            volume, key = mounted_file(docs, workload, container, known.config)
            assert "configMap" in volume, f"--config {known.config} is not on a ConfigMap volume"
            items = {i["path"]: i["key"] for i in volume["configMap"].get("items", [])}
            data = configmap(docs, volume["configMap"]["name"])["data"]
            key = items.get(key, key)
            assert key in data, f"--config {known.config}: no key {key} in ConfigMap {volume['configMap']['name']}"
            local = Path(tmp) / "config.toml"
            local.write_text(data[key])
            known.config = str(local)
        return cfg.build(cls, known, environ, algorithm)


def raw_setting(docs: list[dict], workload: dict, container: dict, name: str) -> str | None:
    """An option's value from a --flag in args or an ACTORLEARNER_ env var (flags win)."""
    flag = "--" + name.replace("_", "-")
    args = container.get("args", [])
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return env_values(docs, workload, container).get(cfg.ENV_PREFIX + name.upper())


def setting(docs: list[dict], workload: dict, container: dict, name: str):
    """An option's effective value: through the real config code when the option exists there."""
    config = effective_config(docs, workload, container)
    if config is not None and hasattr(config, name):
        return getattr(config, name)
    raw = raw_setting(docs, workload, container, name)
    if raw is None and name == "port" and subcommand(container) == "env-server":
        return cfg.EnvServerConfig().port
    return int(raw) if raw is not None and name.endswith("port") else raw


def main_container(workload: dict) -> dict:
    return pod_spec(workload)["containers"][0]


def uses_tls(docs: list[dict], workload: dict, container: dict) -> bool:
    return raw_setting(docs, workload, container, "tls_cert") is not None


def learner_world(docs: list[dict], ordinal: int = 0) -> World:
    """The data-parallel world the learner pod with this ordinal resolves (the learner's own code)."""
    learner = the(docs, "learner")
    c = main_container(learner)
    config = effective_config(docs, learner, c)
    environ = env_values(docs, learner, c) | {"HOSTNAME": f"{learner['metadata']['name']}-{ordinal}"}
    return resolve_world(config.world_size, config.rank, config.dist_address, environ)


def resolve_address(docs: list[dict], address: str) -> tuple[dict, int | None]:
    """The workload a HOST:PORT gRPC address reaches, and the StatefulSet ordinal when it names one
    pod (POD.HEADLESS-SERVICE); the port must be the Service's and the pod's "grpc" port."""
    host, _, port = address.rpartition(":")
    labels = host.split(".")
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    ordinal = None
    if labels[0] in services:
        svc = services[labels[0]]
    else:
        assert len(labels) > 1 and labels[1] in services, f"{host} names no Service, nor a pod of one"
        svc = services[labels[1]]
        assert svc["spec"].get("clusterIP") == "None", f"{host}: pod names need a headless Service"
        governed = [w for w in workloads(docs)
                    if w["kind"] == "StatefulSet" and w["spec"].get("serviceName") == labels[1]]
        assert governed, f"{host}: Service {labels[1]} governs no StatefulSet, so its pods have no names"
        match = re.fullmatch(re.escape(governed[0]["metadata"]["name"]) + r"-(\d+)", labels[0])
        assert match, f"{host} names no pod of StatefulSet {governed[0]['metadata']['name']}"
        ordinal = int(match.group(1))
        assert ordinal < governed[0]["spec"]["replicas"], f"{host}: no such pod"
    targets = [w for w in workloads(docs) if selects(svc["spec"]["selector"], pod_labels(w))]
    assert len(targets) == 1, f"{host}: Service {svc['metadata']['name']} selects {len(targets)} workloads"
    grpc = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc and int(port) == grpc[0] == container_ports(main_container(targets[0]))["grpc"], (
        f"{address}: not the gRPC port of Service {svc['metadata']['name']} and its pods")
    return targets[0], ordinal


def upstream_address(docs: list[dict], workload: dict) -> str:
    """Where an actor streams to (its learner setting) or a relay (its upstream)."""
    c = main_container(workload)
    return setting(docs, workload, c, {"actor": "learner", "relay": "upstream"}[subcommand(c)])


def dial_chain(docs: list[dict], workload: dict) -> list[tuple[dict, int | None]]:
    """The hops from an actor (or relay) to the learner: relays, then the learner and its ordinal."""
    hops = []
    while not hops or component(hops[-1][0]) == "relay":
        assert len(hops) < 8, "relays dial each other in a loop"
        hops.append(resolve_address(docs, upstream_address(docs, hops[-1][0] if hops else workload)))
    return hops


def peers_for(docs: list[dict], workload: dict, port_name: str) -> list[dict | None]:
    """The 'from' peers that may reach a workload's named port; None entries mean anyone."""
    number = container_ports(main_container(workload))[port_name]
    out = []
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        if not selects(policy["spec"]["podSelector"], pod_labels(workload)):
            continue
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is None or any(p.get("port") in (port_name, number) for p in ports):
                out += rule.get("from") or [None]
    return out


# ---------------------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------------------

def test_components_and_labels(docs):
    assert {component(w) for w in workloads(docs)} >= {"learner", "actor"}
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        if doc["kind"] == "ConfigMap":
            continue
        assert labels.get(LABEL_NAME) == "actorlearner", f"{doc['kind']}/{doc['metadata']['name']}"
        assert labels.get(LABEL_COMPONENT), f"{doc['kind']}/{doc['metadata']['name']} has no component label"
    for w in workloads(docs):
        assert selects(w["spec"]["selector"], pod_labels(w))
        assert pod_labels(w).get(LABEL_COMPONENT) == component(w)
        assert pod_labels(w).get(LABEL_NAME) == "actorlearner"
        # two controllers selecting the same pods fight over them
        others = [o for o in workloads(docs) if o is not w and selects(o["spec"]["selector"], pod_labels(w))]
        assert not others, f"{w['metadata']['name']}'s pods are selected by {others[0]['metadata']['name']} too"


def test_images_carry_the_base_tag(docs):
    """The base's `images` entry tags only the base's resources: what components and overlays add
    must carry the same tag (the CUDA build of it for a GPU learner)."""
    tag = next(i["newTag"] for i in yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())["images"]
               if i["name"] == "actorlearner")
    for w in workloads(docs):
        for c in containers(w):
            name, _, found = c["image"].rpartition(":")
            assert name and found in (tag, f"{tag}-cuda"), f"{w['metadata']['name']}: image {c['image']}, not tag {tag}"


def test_probes_are_grpc_on_the_grpc_or_health_port(docs):
    for w in workloads(docs):
        for c in pod_spec(w)["containers"]:
            ports = container_ports(c)
            probe_port = ports.get("health", ports.get("grpc"))
            assert probe_port, f"{c['name']}: no grpc or health containerPort to probe"
            plaintext = "health" in ports or not uses_tls(docs, w, c)
            for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
                probe = c.get(kind)
                if kind == "startupProbe" and probe is None:
                    continue
                assert probe, f"{c['name']} has no {kind}"
                if plaintext:
                    # native gRPC health checking (grpc.health.v1); ports are numbers only
                    assert "grpc" in probe, f"{c['name']} {kind} is not a grpc probe: {probe}"
                    assert probe["grpc"]["port"] == probe_port, f"{c['name']} {kind} port"
                else:
                    # the kubelet's gRPC probe cannot speak TLS
                    assert probe.get("tcpSocket", {}).get("port") == probe_port, f"{c['name']} {kind}: {probe}"


def test_security_context(docs):
    for w in workloads(docs):
        spec = pod_spec(w)
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True
        assert isinstance(pod.get("runAsUser"), int) and pod["runAsUser"] > 0
        assert pod.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        assert spec.get("automountServiceAccountToken") is False, "pods need no API credentials"
        # Service links inject ACTORLEARNER_*_PORT=tcp://... variables: the settings' own prefix.
        assert spec.get("enableServiceLinks") is False
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in containers(w):
            sc = c.get("securityContext", {})
            assert sc.get("runAsNonRoot") is True, c["name"]
            assert sc.get("runAsUser", pod["runAsUser"]) > 0, c["name"]
            assert sc.get("allowPrivilegeEscalation") is False, c["name"]
            assert sc.get("readOnlyRootFilesystem") is True, c["name"]
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], c["name"]
            assert not sc.get("capabilities", {}).get("add"), c["name"]
            assert sc.get("privileged") in (None, False), c["name"]
            assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", c["name"]
            tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{c['name']}: /tmp must be a writable emptyDir"


def test_resources_requests_and_limits(docs):
    for w in workloads(docs):
        for c in containers(w):
            res = c.get("resources", {})
            for key in ("cpu", "memory"):
                assert key in res.get("requests", {}), f"{c['name']}: no {key} request"
                assert key in res.get("limits", {}), f"{c['name']}: no {key} limit"
            for key, amount in res.get("limits", {}).items():
                if "/" in key:  # extended resources (GPUs) need requests == limits
                    assert res["requests"].get(key, amount) == amount, f"{c['name']}: {key}"


def test_services_select_pods_and_target_their_ports(docs):
    services = [d for d in docs if d["kind"] == "Service"]
    assert services
    for svc in services:
        targets = [w for w in workloads(docs) if selects(svc["spec"]["selector"], pod_labels(w))]
        assert len(targets) == 1, f"Service {svc['metadata']['name']} selects {len(targets)} workloads"
        ports = container_ports(main_container(targets[0]))
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            number = ports.get(target) if isinstance(target, str) else target
            assert number in ports.values(), f"{svc['metadata']['name']}:{port['name']} -> {target} not a containerPort"
            assert ports.get(port["name"]) == number, f"{svc['metadata']['name']}: port name {port['name']} vs target"
            assert port["port"] == number, f"{svc['metadata']['name']}: {port['name']} port differs from the pod's"


def test_learner_statefulset_service_and_pdb(docs):
    learner = the(docs, "learner")
    # one pod per data-parallel rank (one learner unless WORLD_SIZE says otherwise)
    assert learner["kind"] == "StatefulSet" and learner["spec"]["replicas"] == learner_world(docs).size
    governing = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == learner["spec"]["serviceName"]]
    assert governing and selects(governing[0]["spec"]["selector"], pod_labels(learner))
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert any(selects(p["spec"]["selector"], pod_labels(learner)) for p in pdbs), "no PDB for the learner"
    # room for draining the streams and writing the final checkpoint
    assert pod_spec(learner)["terminationGracePeriodSeconds"] >= 60
    for w in by_component(docs, "actor") + by_component(docs, "relay"):
        assert pod_spec(w)["terminationGracePeriodSeconds"] >= 10


def test_learner_ports_and_settings(docs):
    learner = the(docs, "learner")
    c = main_container(learner)
    ports = container_ports(c)
    assert subcommand(c) == "learner"
    assert setting(docs, learner, c, "host") == "0.0.0.0"
    assert setting(docs, learner, c, "port") == ports["grpc"] == cfg.LearnerConfig().port
    assert setting(docs, learner, c, "metrics_port") == ports["metrics"] == METRICS_PORT


def test_learner_checkpoints_on_its_volume(docs):
    learner = the(docs, "learner")
    c = main_container(learner)
    for name in ("checkpoint_dir", "logdir"):
        path = setting(docs, learner, c, name)
        assert path, f"{name} is not set"
        volume, _ = mounted_file(docs, learner, c, path.rstrip("/") + "/x")
        assert volume.get("persistentVolumeClaim", {}).get("claimName") in claim_templates(learner), (
            f"{name}={path} is not on the learner's PersistentVolumeClaim")


def test_actor_ports_and_settings(docs):
    assert by_component(docs, "actor")
    for actor in by_component(docs, "actor"):
        c = main_container(actor)
        ports = container_ports(c)
        assert subcommand(c) == "actor"
        assert "grpc" not in ports
        assert setting(docs, actor, c, "health_port") == ports["health"] == ACTOR_HEALTH_PORT
        assert setting(docs, actor, c, "metrics_port") == ports["metrics"] == METRICS_PORT
        assert setting(docs, actor, c, "actor_id") == "<metadata.name>", "actor id should be the pod name"


def test_actors_reach_the_learner(docs):
    """Actors dial the learner's Service (or one rank's pod by name), or a relay Service whose
    relays dial the learner in turn."""
    learner = the(docs, "learner")
    size = learner_world(docs).size
    for w in by_component(docs, "actor") + by_component(docs, "relay"):
        hops = dial_chain(docs, w)
        assert hops[-1][0] is learner, f"{w['metadata']['name']} does not reach the learner"
        assert all(component(h) == "relay" for h, _ in hops[:-1])
        if size > 1:  # the headless Service would resolve to any rank
            assert hops[-1][1] is not None, f"{w['metadata']['name']}: with {size} ranks, dial one rank's pod"


def service_named(docs: list[dict], host: str) -> dict:
    """The Service a cluster DNS name (short, namespaced or fully qualified) points to."""
    name = host.split(".")[0]
    found = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == name]
    assert found, f"{host} names no Service"
    return found[0]


def test_learner_and_actors_run_the_same_env(docs):
    learner = the(docs, "learner")
    for actor in by_component(docs, "actor"):
        assert setting(docs, learner, main_container(learner), "env") == setting(docs, actor, main_container(actor), "env")


def test_num_actors_matches_actor_replicas(docs):
    """Every rank gives exploration indices to the actors that reach it, through relays too."""
    learner = the(docs, "learner")
    size = learner_world(docs).size
    per_rank = [0] * size
    for actor in by_component(docs, "actor"):
        per_rank[dial_chain(docs, actor)[-1][1] or 0] += actor["spec"]["replicas"]
    assert per_rank == [setting(docs, learner, main_container(learner), "num_actors")] * size


def test_settings_are_known_options(docs):
    """Unknown env vars and TOML keys are ignored by the binaries: catch typos here."""
    for w in workloads(docs):
        for c in pod_spec(w)["containers"]:
            cls = config_class(c)
            options = cfg.all_options(cls, resolve("dqn")) if cls is not None else []  # the manifests run dqn
            known = {o.env_var for o in options}
            for var in c.get("env", []):
                if var["name"].startswith(cfg.ENV_PREFIX):
                    assert var["name"] in known, f"{c['name']}: {var['name']} is no option"
            config = effective_config(docs, w, c)  # parses the TOML and every value
            args = c.get("args", [])
            if "--config" in args:
                volume, key = mounted_file(docs, w, c, args[args.index("--config") + 1])
                table = tomllib.loads(configmap(docs, volume["configMap"]["name"])["data"][key])
                paths = {o.path for o in options}
                for path in _toml_paths(table):
                    assert path in paths, f"{c['name']}: TOML key {'.'.join(path)} is no option"
            assert config is not None


def _toml_paths(table: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in table.items():
        out += _toml_paths(value, prefix + (key,)) if isinstance(value, dict) else [prefix + (key,)]
    return out


def test_metrics_port_and_scrape_annotations(docs):
    for w in workloads(docs):
        c = main_container(w)
        assert container_ports(c).get("metrics") == METRICS_PORT
        assert setting(docs, w, c, "metrics_port") == METRICS_PORT
        notes = w["spec"]["template"]["metadata"].get("annotations", {})
        assert notes.get("prometheus.io/scrape") == "true"
        assert int(notes.get("prometheus.io/port")) == METRICS_PORT


def test_network_policies(docs):
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for policy in policies:
        chosen = [w for w in workloads(docs) if selects(policy["spec"]["podSelector"], pod_labels(w))]
        assert chosen, f"NetworkPolicy {policy['metadata']['name']} selects no pods"
        for rule in policy["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if "podSelector" in peer and peer["podSelector"] and "namespaceSelector" not in peer:
                    assert any(selects(peer["podSelector"], pod_labels(w)) for w in workloads(docs)), (
                        f"{policy['metadata']['name']}: a from.podSelector matches no pods")

    # who dials whose gRPC port: actors and relays their upstreams, the ranks of a data-parallel
    # learner each other, actors and the learner (evaluation) the env servers of a grpc:// env
    clients: dict[str, set[str]] = {}
    for w in by_component(docs, "actor") + by_component(docs, "relay"):
        clients.setdefault(component(resolve_address(docs, upstream_address(docs, w))[0]), set()).add(component(w))
    if learner_world(docs).size > 1:
        clients["learner"].add("learner")
    if by_component(docs, "env-server"):
        clients["env-server"] = {"actor", "learner"}
    for w in workloads(docs):
        if "grpc" not in container_ports(main_container(w)):
            continue
        peers = peers_for(docs, w, "grpc")
        assert peers, f"{component(w)}: no NetworkPolicy lets anything reach its gRPC port"
        allowed = [o for o in workloads(docs) if component(o) in clients.get(component(w), set())]
        for peer in peers:
            assert peer is not None and set(peer) == {"podSelector"}, f"{component(w)} gRPC open too wide: {peer}"
            reached = [o for o in workloads(docs) if selects(peer["podSelector"], pod_labels(o))]
            assert reached, f"{component(w)}: a peer selects no pods"
            assert all(any(o is a for a in allowed) for o in reached), (
                f"{component(w)} gRPC open to {[component(o) for o in reached]}, dialed by {clients.get(component(w))}")
        for client in allowed:
            assert any(selects(p["podSelector"], pod_labels(client)) for p in peers), (
                f"{client['metadata']['name']} cannot reach {component(w)}")
    # the actors' own ports are closed but for metrics
    for actor in by_component(docs, "actor"):
        assert not peers_for(docs, actor, "health"), "the actor health port is for the kubelet only"
        assert peers_for(docs, actor, "metrics")


def test_secrets_referenced_not_committed(docs):
    committed = [d for d in docs if d["kind"] == "Secret"]
    assert not committed, f"Secrets must be created in the cluster, not committed: {committed[0]['metadata']}"
    for w in workloads(docs):
        c = main_container(w)
        token = setting(docs, w, c, "auth_token_file")
        assert token, f"{component(w)}: no auth token file"
        volume, key = mounted_file(docs, w, c, token)
        secret = volume.get("secret", {})
        assert secret.get("secretName") == AUTH_SECRET, f"{component(w)}: token not from Secret {AUTH_SECRET}"
        assert not secret.get("optional"), "without the token the learner would take any client"
        items = {i["path"]: i["key"] for i in secret.get("items", [])}
        assert items.get(key, key) == "token"
        assert secret.get("defaultMode", 0o644) & 0o007 == 0, "secret files must not be world-readable"
        tls = [setting(docs, w, c, n) for n in ("tls_cert", "tls_key", "tls_ca")]
        assert all(tls) or not any(tls), f"{component(w)}: TLS needs cert, key and CA together"
        for path in filter(None, tls):
            volume, _ = mounted_file(docs, w, c, path)
            assert volume.get("secret", {}).get("secretName") == TLS_SECRET
            assert not volume["secret"].get("optional")


def test_gpu_overlay(target, docs):
    learner = the(docs, "learner")
    c = main_container(learner)
    gpus = c["resources"]["limits"].get("nvidia.com/gpu")
    if not target.startswith("gpu"):
        assert gpus is None
        assert setting(docs, learner, c, "device") in ("auto", "cpu")
        return
    assert int(gpus) == 1 and int(c["resources"]["requests"]["nvidia.com/gpu"]) == 1
    assert setting(docs, learner, c, "device") == "cuda"
    spec = pod_spec(learner)
    assert any(t.get("key") == "nvidia.com/gpu" and t.get("effect") == "NoSchedule" for t in spec.get("tolerations", []))
    assert spec.get("nodeSelector"), "a GPU learner needs a nodeSelector for GPU nodes"
    assert c["image"].endswith("-cuda"), "the GPU learner runs the CUDA build of the image"
    for actor in by_component(docs, "actor"):  # actors stay on CPU
        assert "nvidia.com/gpu" not in main_container(actor)["resources"]["limits"]


def test_remote_env(target, docs):
    servers = by_component(docs, "env-server")
    learner, actor = the(docs, "learner"), by_component(docs, "actor")[0]  # actors agree: see above
    env = setting(docs, actor, main_container(actor), "env")
    if "remote-env" not in target:
        assert not servers and not env.startswith("grpc://")
        return
    assert len(servers) == 1
    server = servers[0]
    c = main_container(server)
    ports = container_ports(c)
    assert subcommand(c) == "env-server"
    assert setting(docs, server, c, "host") == "0.0.0.0"
    assert setting(docs, server, c, "port") == ports["grpc"] == cfg.EnvServerConfig().port
    served = setting(docs, server, c, "env")
    assert served and not served.startswith("grpc://"), "an env server serves a local environment"
    # actors and the learner (evaluation) name a grpc:// env that is the env server Service
    assert env.startswith("grpc://")
    assert setting(docs, learner, main_container(learner), "env") == env
    host, _, port = env[len("grpc://"):].rpartition(":")
    svc = service_named(docs, host)
    assert selects(svc["spec"]["selector"], pod_labels(server))
    svc_port = [p for p in svc["spec"]["ports"] if p["port"] == int(port)]
    assert svc_port and svc_port[0]["name"] == "grpc" and int(port) == ports["grpc"]


def test_relays(target, docs):
    relays = by_component(docs, "relay")
    actors, learner = by_component(docs, "actor"), the(docs, "learner")
    if "relay" not in target:
        assert not relays
        return
    assert len(relays) == 1
    relay = relays[0]
    c = main_container(relay)
    ports = container_ports(c)
    assert subcommand(c) == "relay"
    assert setting(docs, relay, c, "host") == "0.0.0.0"
    assert setting(docs, relay, c, "port") == ports["grpc"] == cfg.RelayConfig().port
    assert setting(docs, relay, c, "relay_id") == "<metadata.name>", "relay id should be the pod name"
    # the relay streams to the learner's Service; the actors dial the relay Service, a virtual
    # IP that spreads their streams over the relay pods
    assert resolve_address(docs, setting(docs, relay, c, "upstream"))[0] is learner
    for actor in actors:
        address = setting(docs, actor, main_container(actor), "learner")
        assert resolve_address(docs, address)[0] is relay
        svc = service_named(docs, address.rpartition(":")[0])
        assert selects(svc["spec"]["selector"], pod_labels(relay)) and svc["spec"].get("clusterIP") != "None"
    # the learner's gRPC port takes the relays, no longer the actors
    peers = peers_for(docs, learner, "grpc")
    assert any(selects(p["podSelector"], pod_labels(relay)) for p in peers)
    assert not any(selects(p["podSelector"], pod_labels(a)) for p in peers for a in actors)


def test_data_parallel(target, docs):
    learner = the(docs, "learner")
    c = main_container(learner)
    world = learner_world(docs)
    if "data-parallel" not in target:
        assert world.size == 1 and learner["spec"]["replicas"] == 1
        return
    replicas = learner["spec"]["replicas"]
    assert replicas == world.size > 1
    # the ranks block until all have joined: start them together
    assert learner["spec"].get("podManagementPolicy") == "Parallel"
    # each pod's rank is its ordinal, from HOSTNAME: no rank set for the whole StatefulSet
    assert "RANK" not in env_values(docs, learner, c) and raw_setting(docs, learner, c, "rank") is None
    assert [learner_world(docs, r).rank for r in range(replicas)] == list(range(replicas))
    # rank 0's pod by name on the headless governing Service, at a port the Service and pod expose
    headless = service_named(docs, learner["spec"]["serviceName"])
    assert headless["spec"].get("clusterIP") == "None" and selects(headless["spec"]["selector"], pod_labels(learner))
    host, _, port = world.address.rpartition(":")
    assert host.split(".")[:2] == [f"{learner['metadata']['name']}-0", headless["metadata"]["name"]]
    dist = [p for p in headless["spec"]["ports"] if p["port"] == int(port)]
    assert dist and dist[0]["name"] == "dist" and container_ports(c)["dist"] == int(port)
    # ranks reach each other on the rendezvous port and on the ports gloo/NCCL pick (any port)
    peers = peers_for(docs, learner, "dist")
    assert any(p is not None and selects(p["podSelector"], pod_labels(learner)) for p in peers)
    assert any(rule.get("ports") is None and any(selects(p.get("podSelector", {"x": "x"}), pod_labels(learner))
                                                 for p in rule.get("from", []))
               for d in docs if d["kind"] == "NetworkPolicy" and selects(d["spec"]["podSelector"], pod_labels(learner))
               for rule in d["spec"].get("ingress", [])), "gloo/NCCL connect on ephemeral ports between ranks"
    # every rank has actors of its own
    ranks = {dial_chain(docs, actor)[-1][1] for actor in by_component(docs, "actor")}
    assert ranks == set(range(replicas))


def test_docs_cover_the_overlays():
    text = (ROOT / "docs" / "deploy-kubernetes.md").read_text()
    for path in [*(f"overlays/{p.name}" for p in (K8S / "overlays").iterdir()),
                 *(f"components/{p.name}" for p in (K8S / "components").iterdir())]:
        assert path in text, f"docs/deploy-kubernetes.md does not mention k8s/{path}"
    for secret in (AUTH_SECRET, TLS_SECRET):
        assert f"create secret generic {secret}" in text
