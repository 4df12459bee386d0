#!/usr/bin/env python3
"""Offline checks of deploy/: run by deploy/validate, which provides the
packages (kubernetes-validate, jsonschema, PyYAML) in a virtualenv.

What it checks, in order (deploy/README.md, "Validation", says the same):

1. Every Kubernetes object in deploy/kubernetes/*.yaml against the schema of
   a pinned Kubernetes version, strictly (an unknown field fails), with
   kubernetes-validate; the KEDA objects against deploy/checks/keda.schema.json
   (written here) and their HPA behaviour against Kubernetes' own schema.
2. kustomization.yaml: lists every manifest but the Secret example, and builds
   (with `kubectl kustomize`, where kubectl is installed).
3. What a schema cannot see: every environment variable a container or a
   compose service sets is one its program reads (taken from the `env = "…"`
   attributes of the config sources, so a renamed setting fails here);
   secrets come from the Secret and only placeholders are committed; probes
   hit /healthz and /readyz on the port the program listens on, without a
   token; the internal listener off loopback has INTERNAL_TOKEN; grace periods
   outlast the shutdown timeouts; selectors match; a migration step exists;
   the KEDA trigger watches `<QUEUE_PREFIX>.deliveries`.
4. deploy/compose.yaml: the same consistency checks, healthchecks, restart
   policies, the one-shot services, no required `${VAR:?}`.
5. The compose helper scripts, run for real: init-secrets.sh (generate, keep,
   take from the environment, refuse production without values),
   with-secrets.sh, and probe.sh against a local HTTP server.
6. That the checks above do catch mistakes: a few broken copies of the
   manifests must fail.
"""

from __future__ import annotations

import argparse
import copy
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose.yaml"
KEDA_SCHEMA = DEPLOY / "checks" / "keda.schema.json"
SECRET_EXAMPLE = "secret.example.yaml"
SECRET_NAME = "webhooks"
PLACEHOLDER = "REPLACE-ME"

# Where each program's settings are declared (clap `env = "…"` attributes).
COMMON_SOURCES = ["shared/config/src/lib.rs"]
PROGRAMS = {
    "webhooks-api serve": COMMON_SOURCES + ["api/src/config.rs", "shared/listener/src/lib.rs"],
    "webhooks-api migrate": COMMON_SOURCES,
    "webhooks-api keys": COMMON_SOURCES,
    "webhooks-dispatcher": COMMON_SOURCES + ["dispatcher/src/config.rs", "shared/listener/src/lib.rs"],
}
# Variables read by a library rather than a clap attribute, each allowed only
# while the code that makes the library read it is still there.
LIBRARY_SETTINGS = {
    "RUST_LOG": [("shared/config/src/telemetry.rs", "from_default_env")],
    "TOKIO_WORKER_THREADS": [("api/cli/src/main.rs", "#[tokio::main]"), ("dispatcher/src/main.rs", "#[tokio::main]")],
}
# Settings that carry secrets: never a literal value in a manifest.
SECRET_SETTINGS = {"DATABASE_URL", "AMQP_URL", "KEY_ENCRYPTION_KEY", "INTERNAL_TOKEN"}

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
ENV_ATTR = re.compile(r'env\s*=\s*"([A-Z][A-Z0-9_]*)"')
DEFAULT_ATTR = re.compile(r'default_value(?:_t)?\s*=\s*(?:"([^"]*)"|([^,)\]]+))')


class Failed(Exception):
    pass


class Report:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def section(self, title: str) -> None:
        print(f"\n== {title}")

    def ok(self, message: str) -> None:
        self.passed += 1
        print(f"ok    {message}")

    def fail(self, message: str) -> None:
        self.failed += 1
        print(f"FAIL  {message}")

    def check(self, label: str, errors: list[str]) -> None:
        if errors:
            for error in errors:
                self.fail(f"{label}: {error}")
        else:
            self.ok(label)


# ---------------------------------------------------------------- sources


def source_text(relative: str) -> str:
    path = ROOT / relative
    if not path.is_file():
        raise Failed(f"{relative} is missing: update PROGRAMS / LIBRARY_SETTINGS in deploy/checks/validate.py")
    return path.read_text()


def settings_of(sources: list[str]) -> dict[str, str | None]:
    """Setting name -> its default (as written in the source), or None."""
    settings: dict[str, str | None] = {}
    for relative in sources:
        for line in source_text(relative).splitlines():
            for name in ENV_ATTR.findall(line):
                default = DEFAULT_ATTR.search(line)
                settings[name] = (default.group(1) or default.group(2).strip()) if default else None
    return settings


def program_settings() -> dict[str, dict[str, str | None]]:
    programs = {program: settings_of(sources) for program, sources in PROGRAMS.items()}
    for program, settings in programs.items():
        if not settings:
            raise Failed(f"no `env = \"…\"` settings found for {program} in {PROGRAMS[program]}")
    library = {}
    for name, readers in LIBRARY_SETTINGS.items():
        if all(marker in source_text(path) for path, marker in readers):
            library[name] = None
    for settings in programs.values():
        settings.update(library)
    return programs


def all_settings(programs: dict[str, dict[str, str | None]]) -> set[str]:
    return set().union(*programs.values())


def program_of(argv: list[str]) -> str | None:
    words = [Path(word).name if i == 0 else word for i, word in enumerate(argv)]
    if words[:1] == ["webhooks-dispatcher"]:
        return "webhooks-dispatcher"
    if words[:1] == ["webhooks-api"] and len(words) > 1 and f"webhooks-api {words[1]}" in PROGRAMS:
        return f"webhooks-api {words[1]}"
    return None


UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(duration: str) -> float:
    parts = re.findall(r"(\d+)\s*(ms|s|m|h|d)", duration)
    if not parts or re.sub(r"\d+\s*(ms|s|m|h|d)|\s", "", duration):
        raise Failed(f"cannot read the duration {duration!r}")
    return sum(int(n) * UNITS[unit] for n, unit in parts)


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def host_of(addr: str) -> str:
    return addr.rsplit(":", 1)[0].strip("[]")


def loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.") or host.startswith("::ffff:127.")


# ---------------------------------------------------------------- kubernetes


def load_docs(path: Path) -> list[dict]:
    with path.open() as f:
        docs = [doc for doc in yaml.load_all(f, Loader=LOADER) if doc is not None]
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise Failed(f"{path.name}: a document without apiVersion and kind")
    return docs


def kn(doc: dict) -> str:
    return f"{doc['kind']}/{doc.get('metadata', {}).get('name', '?')}"


def schema_errors(doc: dict, version: str, keda_schema: dict) -> list[str]:
    if doc["apiVersion"].startswith("keda.sh/"):
        definition = keda_schema["$defs"].get(doc["kind"])
        if definition is None:
            return [f"{kn(doc)}: no schema for KEDA kind {doc['kind']} in {KEDA_SCHEMA.name}"]
        schema = {**definition, "$defs": keda_schema["$defs"]}
        validator = jsonschema.Draft202012Validator(schema)
        errors = [
            f"{kn(doc)}: {'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
        ]
        behavior = doc.get("spec", {}).get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
        if behavior is not None and not errors:
            hpa = {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "keda-behavior"},
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                    "maxReplicas": 1,
                    "behavior": behavior,
                },
            }
            errors += [f"{kn(doc)}: advanced.horizontalPodAutoscalerConfig.{e}" for e in k8s_errors(hpa, version)]
        return errors
    return [f"{kn(doc)}: {e}" for e in k8s_errors(doc, version)]


def k8s_errors(doc: dict, version: str) -> list[str]:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
        return []
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(map(str, e.path)) or '(top)'}: {e.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.utils.VersionNotSupportedError) as e:
        return [e.message]


def secret_keys(docs: list[dict]) -> tuple[set[str], list[str]]:
    errors = []
    secrets = [d for d in docs if d["kind"] == "Secret"]
    if len(secrets) != 1 or secrets[0]["metadata"]["name"] != SECRET_NAME:
        return set(), [f"{SECRET_EXAMPLE} must hold exactly the Secret {SECRET_NAME!r}"]
    secret = secrets[0]
    if secret.get("data"):
        errors.append(f"{SECRET_EXAMPLE}: use stringData with {PLACEHOLDER!r} values, not data")
    values = secret.get("stringData") or {}
    for key, value in values.items():
        if value != PLACEHOLDER:
            errors.append(f"{SECRET_EXAMPLE}: {key} is not the placeholder {PLACEHOLDER!r}: never commit secret values")
    return set(values), errors


def containers_of(deployment: dict) -> list[tuple[str, dict]]:
    spec = deployment["spec"]["template"]["spec"]
    return [("initContainer", c) for c in spec.get("initContainers", [])] + [
        ("container", c) for c in spec.get("containers", [])
    ]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def literal(env: dict[str, dict], name: str, default: str | None) -> str | None:
    entry = env.get(name)
    if entry is None:
        return default
    return entry.get("value")


def resolve_port(container: dict, port) -> int | None:
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    return None


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_container(where: str, container: dict, programs, keys: set[str]) -> tuple[str | None, list[str]]:
    errors = []
    argv = (container.get("command") or []) + (container.get("args") or [])
    program = program_of(argv)
    if program is None:
        return None, [f"{where}: runs {argv!r}, not a program deploy/validate knows"]
    known = programs[program]
    env = env_of(container)
    for name, entry in env.items():
        if name not in known:
            errors.append(f"{where}: sets {name}, which `{program}` does not read")
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            if ref.get("name") != SECRET_NAME:
                errors.append(f"{where}: {name} from Secret {ref.get('name')!r}, not {SECRET_NAME!r}")
            if ref.get("key") not in keys:
                errors.append(f"{where}: {name} from key {ref.get('key')!r}, not in {SECRET_EXAMPLE}")
        elif name in SECRET_SETTINGS:
            errors.append(f"{where}: {name} must come from the Secret (secretKeyRef), not a literal value")
    if container.get("envFrom"):
        errors.append(f"{where}: envFrom hides which variables are set; list them under env")
    resources = container.get("resources", {})
    for kind in ("requests", "limits"):
        for resource in ("cpu", "memory"):
            if resource not in resources.get(kind, {}):
                errors.append(f"{where}: no resources.{kind}.{resource}")
    if literal(env, "PLATFORM_ENVIRONMENT", known.get("PLATFORM_ENVIRONMENT")) == "production" and program != (
        "webhooks-api migrate"
    ):
        if "KEY_ENCRYPTION_KEY" not in env:
            errors.append(f"{where}: PLATFORM_ENVIRONMENT=production needs KEY_ENCRYPTION_KEY")
    return program, errors


def check_probes(where: str, container: dict, listen: str) -> list[str]:
    errors = []
    port = port_of(listen)
    if loopback(host_of(listen)):
        errors.append(f"{where}: listens on {listen}; the kubelet's probes cannot reach loopback")
    expected = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in expected.items():
        spec = container.get(probe)
        if spec is None:
            errors.append(f"{where}: no {probe}")
            continue
        get = spec.get("httpGet")
        if not get:
            errors.append(f"{where}: {probe} is not an httpGet")
            continue
        if get.get("path") != path:
            errors.append(f"{where}: {probe} asks {get.get('path')!r}, expected {path}")
        if resolve_port(container, get.get("port")) != port:
            errors.append(f"{where}: {probe} port {get.get('port')!r} is not the listener's port {port}")
        if get.get("httpHeaders"):
            errors.append(
                f"{where}: {probe} sends headers; the probes need no token (and $(VAR) is not expanded there)"
            )
    return errors


def check_kubernetes_consistency(docs: list[dict], programs, keys: set[str], report: Report) -> None:
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    services = [d for d in docs if d["kind"] == "Service"]
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    jobs = [d for d in docs if d["kind"] == "Job"]
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    auths = {d["metadata"]["name"]: d for d in docs if d["kind"] == "TriggerAuthentication"}

    env_errors: list[str] = []
    selector_errors: list[str] = []
    env_count = 0
    by_program: dict[str, tuple[dict, dict]] = {}
    migrations = []
    for deployment in deployments + jobs:
        name = kn(deployment)
        template = deployment["spec"]["template"]
        labels = template.get("metadata", {}).get("labels", {})
        if deployment["kind"] == "Deployment" and not selects(
            deployment["spec"]["selector"].get("matchLabels", {}), labels
        ):
            selector_errors.append(f"{name}: selector does not match its pod labels")
        for role, container in containers_of(deployment):
            where = f"{name} {role} {container['name']}"
            program, errors = check_container(where, container, programs, keys)
            env_errors += errors
            env_count += len(container.get("env", []))
            if program == "webhooks-api migrate":
                migrations.append(where)
            elif program and role == "container":
                by_program[program] = (deployment, container)
            elif program:
                env_errors.append(f"{where}: `{program}` as an {role}")

    report.check(f"env: the {env_count} variables set in {len(deployments + jobs)} workloads are settings their programs read; secrets come from Secret {SECRET_NAME!r}", env_errors)
    report.check(
        f"migration step: {', '.join(migrations) or 'none'} runs `webhooks-api migrate`",
        [] if migrations else ["no initContainer or Job runs `webhooks-api migrate`"],
    )

    api = by_program.get("webhooks-api serve")
    dispatcher = by_program.get("webhooks-dispatcher")
    if api is None or dispatcher is None:
        report.fail("no Deployment runs `webhooks-api serve` and/or `webhooks-dispatcher`")
        return
    settings_api = programs["webhooks-api serve"]
    settings_disp = programs["webhooks-dispatcher"]

    # API: internal listener, probes, token, public Service, grace period.
    deployment, container = api
    env = env_of(container)
    internal = literal(env, "INTERNAL_LISTEN_ADDR", settings_api["INTERNAL_LISTEN_ADDR"])
    public = literal(env, "API_LISTEN_ADDR", settings_api["API_LISTEN_ADDR"])
    where = f"{kn(deployment)} container {container['name']}"
    errors = check_probes(where, container, internal)
    if not loopback(host_of(internal)):
        token = env.get("INTERNAL_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef")
        if not token:
            errors.append(f"{where}: INTERNAL_LISTEN_ADDR {internal} is off loopback: INTERNAL_TOKEN must come from the Secret")
    report.check(
        f"API probes: /healthz and /readyz on the internal listener {internal}, no token; INTERNAL_TOKEN from the Secret",
        errors,
    )

    # Dispatcher probes.
    d_deployment, d_container = dispatcher
    d_env = env_of(d_container)
    listen = literal(d_env, "DISPATCHER_LISTEN_ADDR", settings_disp["DISPATCHER_LISTEN_ADDR"])
    errors = check_probes(f"{kn(d_deployment)} container {d_container['name']}", d_container, listen)
    report.check(f"dispatcher probes: /healthz and /readyz on {listen}", errors)

    # Grace periods.
    errors = []
    grace = deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep = float(pre_stop[1]) if pre_stop[:1] == ["sleep"] and len(pre_stop) == 2 else 0
    drain = seconds(literal(env, "REQUEST_TIMEOUT", settings_api["REQUEST_TIMEOUT"])) + seconds(
        literal(env, "HEADER_READ_TIMEOUT", settings_api["HEADER_READ_TIMEOUT"])
    )
    if grace <= sleep + drain:
        errors.append(f"{kn(deployment)}: terminationGracePeriodSeconds {grace} <= preStop {sleep:g}s + drain {drain:g}s")
    d_grace = d_deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    shutdown = seconds(literal(d_env, "SHUTDOWN_TIMEOUT", settings_disp["SHUTDOWN_TIMEOUT"]))
    if d_grace <= shutdown:
        errors.append(f"{kn(d_deployment)}: terminationGracePeriodSeconds {d_grace} <= SHUTDOWN_TIMEOUT {shutdown:g}s")
    report.check(
        f"grace periods: API {grace}s > preStop {sleep:g}s + REQUEST_TIMEOUT + HEADER_READ_TIMEOUT ({drain:g}s); "
        f"dispatcher {d_grace}s > SHUTDOWN_TIMEOUT ({shutdown:g}s)",
        errors,
    )

    # Services and PDBs select the right pods.
    for service in services:
        selector = service["spec"].get("selector", {})
        targets = [d for d in deployments if selects(selector, d["spec"]["template"]["metadata"]["labels"])]
        if targets != [deployment]:
            selector_errors.append(f"{kn(service)}: selects {[kn(t) for t in targets]}, expected only {kn(deployment)}")
        for port in service["spec"]["ports"]:
            resolved = resolve_port(container, port.get("targetPort", port["port"]))
            if resolved not in (port_of(public), port_of(internal)):
                selector_errors.append(f"{kn(service)}: port {port.get('name')} targets no listener of the API")
    for workload in deployments:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covering = [p for p in pdbs if selects(p["spec"]["selector"].get("matchLabels", {}), labels)]
        if len(covering) != 1:
            selector_errors.append(f"{kn(workload)}: {len(covering)} PodDisruptionBudgets select it, expected 1")
        elif workload is deployment and covering[0]["spec"].get("minAvailable", 0) >= workload["spec"].get("replicas", 1):
            selector_errors.append(f"{kn(covering[0])}: minAvailable leaves no disruption allowed")
    report.check(
        f"selectors: Deployments match their pods; {len(services)} Services select the API; one PodDisruptionBudget per Deployment",
        selector_errors,
    )

    # KEDA: the dispatcher Deployment, the work queue, the Secret's AMQP URL.
    errors = []
    if len(scaled) != 1:
        errors.append(f"{len(scaled)} ScaledObjects, expected 1")
    for so in scaled:
        spec = so["spec"]
        if spec["scaleTargetRef"]["name"] != d_deployment["metadata"]["name"]:
            errors.append(f"{kn(so)}: scales {spec['scaleTargetRef']['name']!r}, not the dispatcher Deployment")
        if "replicas" in d_deployment["spec"]:
            errors.append(f"{kn(d_deployment)}: sets replicas, which KEDA owns (a re-apply would reset them)")
        if spec["minReplicaCount"] > spec["maxReplicaCount"]:
            errors.append(f"{kn(so)}: minReplicaCount > maxReplicaCount")
        prefix = literal(d_env, "QUEUE_PREFIX", settings_disp["QUEUE_PREFIX"])
        for trigger in spec["triggers"]:
            queue = trigger["metadata"]["queueName"]
            if queue != f"{prefix}.deliveries":
                errors.append(f"{kn(so)}: watches {queue!r}, but the dispatchers consume {prefix}.deliveries")
            auth = auths.get(trigger.get("authenticationRef", {}).get("name"))
            if auth is None:
                errors.append(f"{kn(so)}: authenticationRef names no TriggerAuthentication in the manifests")
                continue
            refs = {r["parameter"]: r for r in auth["spec"].get("secretTargetRef", [])}
            host = refs.get("host")
            if host is None or host["name"] != SECRET_NAME or host["key"] not in keys or host["key"] != "AMQP_URL":
                errors.append(f"{kn(auth)}: parameter host must come from Secret {SECRET_NAME!r} key AMQP_URL")
        pool = lambda e, s: int(literal(e, "DATABASE_MAX_CONNECTIONS", s["DATABASE_MAX_CONNECTIONS"]))  # noqa: E731
        api_pods = deployment["spec"].get("replicas", 1) + 1  # one surge pod during a rollout
        total = api_pods * pool(env, settings_api) + spec["maxReplicaCount"] * pool(d_env, settings_disp)
        print(
            f"info  PostgreSQL connections at full scale: {api_pods} API pods (with a surge) and "
            f"{spec['maxReplicaCount']} dispatchers, {total} in all (PostgreSQL's default max_connections is 100)"
        )
        report.check(
            f"KEDA: {kn(so)} scales {spec['scaleTargetRef']['name']} {spec['minReplicaCount']}..{spec['maxReplicaCount']} "
            f"on {prefix}.deliveries, AMQP URL from Secret {SECRET_NAME!r}",
            errors,
        )


def check_kubernetes(version: str, programs, report: Report) -> list[dict]:
    report.section(f"Kubernetes manifests (deploy/kubernetes; Kubernetes {version} schema, strict; KEDA: {KEDA_SCHEMA.relative_to(ROOT)})")
    keda_schema = json.loads(KEDA_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(keda_schema)
    files = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    files += sorted(K8S.glob("*.yml"))
    all_docs: list[dict] = []
    deployed: list[dict] = []
    keys: set[str] = set()
    for path in files:
        try:
            docs = load_docs(path)
        except (yaml.YAMLError, Failed) as e:
            report.fail(f"{path.name}: {e}")
            continue
        errors = []
        for doc in docs:
            errors += schema_errors(doc, version, keda_schema)
        report.check(f"{path.name}: {', '.join(kn(d) for d in docs)}", errors)
        all_docs += docs
        if path.name == SECRET_EXAMPLE:
            keys, errors = secret_keys(docs)
            report.check(f"{SECRET_EXAMPLE}: keys {', '.join(sorted(keys))}, placeholders only", errors)
        else:
            deployed += docs

    # kustomization.yaml
    errors = []
    kustomization = K8S / "kustomization.yaml"
    listed: list[str] = []
    if kustomization.exists():
        data = yaml.safe_load(kustomization.read_text())
        listed = data.get("resources", [])
        for resource in listed:
            if not (K8S / resource).is_file():
                errors.append(f"lists {resource}, which does not exist")
        for path in files:
            if path.name != SECRET_EXAMPLE and path.name not in listed:
                errors.append(f"does not list {path.name}")
        if SECRET_EXAMPLE in listed:
            errors.append(f"lists {SECRET_EXAMPLE}: applying it would overwrite the real Secret with placeholders")
        kubectl = shutil.which("kubectl")
        if kubectl and not errors:
            built = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True)
            if built.returncode != 0:
                errors.append(f"`kubectl kustomize` failed: {built.stderr.strip()}")
            else:
                names = sorted(kn(d) for d in yaml.safe_load_all(built.stdout) if d)
                expected = sorted(kn(d) for d in deployed)
                if names != expected:
                    errors.append(f"`kubectl kustomize` builds {names}, expected {expected}")
        how = "built with `kubectl kustomize`" if kubectl else "not built: kubectl is not installed"
        report.check(f"kustomization.yaml: lists {', '.join(listed)} ({how})", errors)
    else:
        report.fail("deploy/kubernetes/kustomization.yaml is missing")

    report.section("Kubernetes consistency with the programs (settings from the config sources)")
    try:
        check_kubernetes_consistency(deployed, programs, keys, report)
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as e:
        report.fail(f"the consistency checks could not read the manifests ({type(e).__name__}: {e}); fix the errors above")
    return all_docs


# ---------------------------------------------------------------- compose


def compose_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: ("" if v is None else str(v)) for k, v in env.items()}


def interpolate(value: str) -> str:
    """The value Compose gives ${VAR:-default} with VAR unset."""
    return re.sub(r"\$\{[A-Z0-9_]+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def compose_argv(service: dict) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else list(command)


def check_compose(programs, report: Report) -> None:
    report.section("deploy/compose.yaml (structure and settings; `docker compose config` runs in deploy/validate)")
    text = COMPOSE.read_text()
    try:
        compose = yaml.safe_load(text)
    except yaml.YAMLError as e:
        report.fail(f"compose.yaml does not parse: {e}")
        return
    services: dict[str, dict] = compose.get("services", {})
    known_any = all_settings(programs)
    errors = []
    if re.search(r"\$\{[A-Za-z0-9_]+:?\?", text):
        errors.append("a required ${VAR:?…}: `docker compose up` must work without any variable set")
    ours = {}
    for name, service in services.items():
        build = service.get("build")
        if build:
            dockerfile = (COMPOSE.parent / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).resolve()
            if not dockerfile.is_file():
                errors.append(f"{name}: build names {dockerfile}, which does not exist")
            if not service.get("image"):
                errors.append(f"{name}: builds without an image name; services sharing the image need one")
            ours[name] = service
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith("."):
                if not (COMPOSE.parent / source).exists():
                    errors.append(f"{name}: mounts {source}, which does not exist")
            elif source and source not in (compose.get("volumes") or {}):
                errors.append(f"{name}: mounts the volume {source!r}, not declared under volumes")
        for dependency in service.get("depends_on", {}) or {}:
            if dependency not in services:
                errors.append(f"{name}: depends on {dependency!r}, no such service")
    report.check(f"services {', '.join(services)}; build, mounts and dependencies resolve; no required variables", errors)

    # Settings: every variable our services set is read by their program.
    errors, count, roles = [], 0, {}
    for name, service in ours.items():
        entrypoint = service.get("entrypoint") or []
        argv = compose_argv(service)
        program = program_of(argv)
        env = compose_env(service)
        count += len(env)
        if program:
            known = programs[program]
            roles[program] = (name, service)
        elif any(str(part).endswith("init-secrets.sh") for part in entrypoint):
            known = known_any
            roles["init-secrets"] = (name, service)
        else:
            errors.append(f"{name}: runs {entrypoint + argv!r}, not a program deploy/validate knows")
            continue
        for variable in env:
            if variable not in known:
                errors.append(f"{name}: sets {variable}, which `{program or 'the programs'}` does not read")
    report.check(f"env: the {count} variables set on {', '.join(ours)} are settings their programs read", errors)

    # Roles: one-shot init and migration, long-running API and dispatchers.
    errors = []
    for role in ("init-secrets", "webhooks-api migrate", "webhooks-api serve", "webhooks-dispatcher"):
        if role not in roles:
            errors.append(f"no service runs {role}")
    if errors:
        report.check("roles", errors)
        return
    init_name, _ = roles["init-secrets"]
    migrate_name, _ = roles["webhooks-api migrate"]
    # Optional one-shot: the first API key, printed for a newcomer.
    one_shots = {init_name, migrate_name} | ({roles["webhooks-api keys"][0]} if "webhooks-api keys" in roles else set())
    for name, service in services.items():
        restart = service.get("restart")
        if restart is None:
            errors.append(f"{name}: no restart policy")
        one_shot = name in one_shots
        if one_shot and restart != "no":
            errors.append(f"{name}: a one-shot service needs restart \"no\" (others wait for it to complete)")
        if not one_shot and not service.get("healthcheck"):
            errors.append(f"{name}: no healthcheck")
        for dependency, spec in (service.get("depends_on") or {}).items():
            condition = spec.get("condition") if isinstance(spec, dict) else None
            if condition == "service_healthy" and not services[dependency].get("healthcheck"):
                errors.append(f"{name}: waits for {dependency} to be healthy, which has no healthcheck")
            if condition == "service_completed_successfully" and dependency not in one_shots:
                errors.append(f"{name}: waits for {dependency} to complete, which keeps running")
    for role in ("webhooks-api serve", "webhooks-dispatcher"):
        name, service = roles[role]
        needs = service.get("depends_on") or {}
        for one_shot in (init_name, migrate_name):
            if (needs.get(one_shot) or {}).get("condition") != "service_completed_successfully":
                errors.append(f"{name}: does not wait for {one_shot} to complete")
    report.check(
        f"lifecycle: {init_name} and {migrate_name} run once before the API and the dispatchers; "
        "restart policies and healthchecks everywhere else",
        errors,
    )

    # Probes and grace periods against the listeners.
    errors = []
    for role, setting in (("webhooks-api serve", "INTERNAL_LISTEN_ADDR"), ("webhooks-dispatcher", "DISPATCHER_LISTEN_ADDR")):
        name, service = roles[role]
        env = compose_env(service)
        listen = interpolate(env.get(setting) or programs[role][setting] or "")
        test = [str(word) for word in service["healthcheck"].get("test", [])]
        if not (len(test) >= 4 and test[2].endswith("probe.sh") and test[3] == str(port_of(listen))):
            errors.append(f"{name}: healthcheck {test!r} does not probe the port of {setting} {listen}")
        if "/readyz" not in test:
            errors.append(f"{name}: healthcheck does not ask /readyz")
        if role == "webhooks-api serve" and not loopback(host_of(listen)):
            entry = service.get("entrypoint") or []
            if not any(str(part).endswith("with-secrets.sh") for part in entry):
                errors.append(f"{name}: {setting} {listen} is off loopback but INTERNAL_TOKEN is not provided")
    name, service = roles["webhooks-dispatcher"]
    shutdown = seconds(interpolate(compose_env(service).get("SHUTDOWN_TIMEOUT") or programs["webhooks-dispatcher"]["SHUTDOWN_TIMEOUT"]))
    grace = seconds(str(service.get("stop_grace_period", "10s")))
    if grace <= shutdown:
        errors.append(f"{name}: stop_grace_period {grace:g}s <= SHUTDOWN_TIMEOUT {shutdown:g}s")
    report.check(f"healthchecks probe /readyz on each program's listener; dispatcher stop_grace_period {grace:g}s > SHUTDOWN_TIMEOUT {shutdown:g}s", errors)

    # The image's own ENV.
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    names = []
    for line in dockerfile.splitlines():
        if line.startswith("ENV "):
            names += re.findall(r"([A-Z][A-Z0-9_]*)=", line)
    unknown = [n for n in names if n not in known_any]
    report.check(f"Dockerfile ENV {', '.join(names)} are settings the programs read", [f"{n} is read by no program" for n in unknown])


# ---------------------------------------------------------------- scripts


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, env=full, timeout=30)


def check_scripts(report: Report) -> None:
    report.section("compose helper scripts (deploy/compose/*.sh), run for real")
    scripts = DEPLOY / "compose"
    sh = shutil.which("sh") or "/bin/sh"
    bash = shutil.which("bash") or "/bin/bash"
    errors = []
    for script in sorted(scripts.glob("*.sh")):
        shell = bash if script.read_text().startswith("#!/usr/bin/env bash") else sh
        result = run([shell, "-n", str(script)])
        if result.returncode != 0:
            errors.append(f"{script.name}: {result.stderr.strip()}")
    report.check(f"syntax of {', '.join(p.name for p in sorted(scripts.glob('*.sh')))}", errors)

    init = str(scripts / "init-secrets.sh")
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        base = {
            "SECRETS_DIR": f"{tmp}/s",
            "SECRETS_OWNER": f"{os.getuid()}:{os.getgid()}",
            "PLATFORM_ENVIRONMENT": "",
            "KEY_ENCRYPTION_KEY": "",
            "INTERNAL_TOKEN": "",
        }
        first = run([sh, init], base)
        kek_path, token_path = Path(tmp, "s", "key_encryption_key"), Path(tmp, "s", "internal_token")
        if first.returncode != 0:
            errors.append(f"first start failed: {first.stderr.strip()}")
        else:
            kek, token = kek_path.read_text(), token_path.read_text()
            if not re.fullmatch(r"[0-9a-f]{64}", kek):
                errors.append(f"generated KEY_ENCRYPTION_KEY is not 64 hex digits (32 bytes): {len(kek)} characters")
            if len(token.strip()) < 32:
                errors.append("generated INTERNAL_TOKEN is shorter than 32 characters")
            if oct(kek_path.stat().st_mode & 0o777) != "0o400":
                errors.append(f"key file mode {oct(kek_path.stat().st_mode & 0o777)}, expected 0o400")
            again = run([sh, init], base)
            if again.returncode != 0 or kek_path.read_text() != kek or token_path.read_text() != token:
                errors.append("a second start did not keep the values of the first")
            given = run([sh, init], {**base, "INTERNAL_TOKEN": "from-the-shell"})
            if given.returncode != 0 or token_path.read_text() != "from-the-shell" or kek_path.read_text() != kek:
                errors.append("INTERNAL_TOKEN from the environment was not taken (or the key changed)")
            wrapped = run([sh, str(scripts / "with-secrets.sh"), "sh", "-c", 'printf "%s %s" "$KEY_ENCRYPTION_KEY" "${INTERNAL_TOKEN-unset}"'], {"SECRETS_DIR": f"{tmp}/s", "INTERNAL_TOKEN": ""})
            if wrapped.returncode != 0 or wrapped.stdout != f"{kek} ":
                errors.append(f"with-secrets.sh did not export the key (and only the key) to a non-API program: {wrapped.stdout!r} {wrapped.stderr.strip()}")
        production = run([sh, init], {**base, "SECRETS_DIR": f"{tmp}/p", "PLATFORM_ENVIRONMENT": "production"})
        if production.returncode == 0:
            errors.append("PLATFORM_ENVIRONMENT=production without values generated development secrets")
        produced = run(
            [sh, init],
            {**base, "SECRETS_DIR": f"{tmp}/q", "PLATFORM_ENVIRONMENT": "production", "KEY_ENCRYPTION_KEY": "a" * 64, "INTERNAL_TOKEN": "t" * 40},
        )
        if produced.returncode != 0 or Path(tmp, "q", "key_encryption_key").read_text() != "a" * 64:
            errors.append(f"PLATFORM_ENVIRONMENT=production with values from the environment failed: {produced.stderr.strip()}")
    report.check(
        "init-secrets.sh: generates 32-byte hex key and token once, keeps them, takes values from the environment, "
        "refuses production without them; with-secrets.sh exports them",
        errors,
    )

    errors = []
    probe = str(scripts / "probe.sh")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            status = 200 if self.path in ("/readyz", "/healthz") and not self.headers.get("Authorization") else 503
            try:
                self.send_response(status)
                self.send_header("Content-Length", "3")
                self.end_headers()
                self.wfile.write(b"ok\n")
            except OSError:
                pass  # probe.sh hangs up after the status line

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.handle_error = lambda *args: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        port = str(server.server_address[1])
        if run([bash, probe, port, "/readyz"]).returncode != 0:
            errors.append("probe.sh failed on a 200")
        if run([bash, probe, port, "/broken"]).returncode == 0:
            errors.append("probe.sh passed on a 503")
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = str(s.getsockname()[1])
    if run([bash, probe, closed, "/readyz"]).returncode == 0:
        errors.append("probe.sh passed on a closed port")
    report.check("probe.sh: passes on 200, fails on 503 and on a closed port (no token sent)", errors)


# ---------------------------------------------------------------- self-check


def check_the_checks(docs: list[dict], version: str, programs, report: Report) -> None:
    """Broken copies of the manifests must fail, or the checks above prove nothing."""
    report.section("the checks catch mistakes (broken copies of the manifests must fail)")
    keda_schema = json.loads(KEDA_SCHEMA.read_text())
    deployed = [d for d in docs if d["kind"] != "Secret"]
    keys = {"DATABASE_URL", "AMQP_URL", "KEY_ENCRYPTION_KEY", "INTERNAL_TOKEN"}

    def first(kind: str, pick=lambda d: True) -> tuple[list[dict], dict]:
        copied = copy.deepcopy(deployed)
        return copied, next(d for d in copied if d["kind"] == kind and pick(d))

    def api(d: dict) -> bool:
        return d["metadata"]["name"].endswith("api")

    def consistency_fails(copied: list[dict]) -> bool:
        quiet = Report()
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            check_kubernetes_consistency(copied, programs, keys, quiet)
        return quiet.failed > 0

    cases = []
    copied, deployment = first("Deployment", api)
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["pathh"] = "/healthz"
    cases.append(("an unknown field in a probe", bool(schema_errors(deployment, version, keda_schema))))
    copied, deployment = first("Deployment", api)
    deployment["spec"]["replicas"] = "two"
    cases.append(("a string where Kubernetes wants an integer", bool(schema_errors(deployment, version, keda_schema))))
    copied, scaled = first("ScaledObject")
    scaled["spec"]["triggers"][0]["metadata"]["value"] = 1000
    cases.append(("an unquoted number in KEDA trigger metadata", bool(schema_errors(scaled, version, keda_schema))))
    copied, scaled = first("ScaledObject")
    scaled["spec"]["minReplicas"] = 2
    cases.append(("an unknown ScaledObject field", bool(schema_errors(scaled, version, keda_schema))))
    copied, deployment = first("Deployment", api)
    deployment["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "INTERNAL_LISTEN_ADDRESS", "value": "0.0.0.0:8081"})
    cases.append(("a setting no program reads", consistency_fails(copied)))
    copied, deployment = first("Deployment", api)
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    probe["port"] = "public"
    cases.append(("a readiness probe on the public port", consistency_fails(copied)))
    copied, scaled = first("ScaledObject")
    scaled["spec"]["triggers"][0]["metadata"]["queueName"] = "webhooks.dead"
    cases.append(("KEDA watching another queue", consistency_fails(copied)))
    copied, deployment = first("Deployment", lambda d: not api(d))
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    cases.append(("a dispatcher grace period no longer than SHUTDOWN_TIMEOUT", consistency_fails(copied)))
    for what, caught in cases:
        report.check(f"caught: {what}", [] if caught else ["NOT caught: the check is broken"])


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubernetes-version", required=True)
    parser.add_argument("--docker-compose", default="skipped: not run", help="outcome of `docker compose config -q`")
    args = parser.parse_args()
    report = Report()
    try:
        programs = program_settings()
        print(
            "settings read by the programs (from "
            + ", ".join(sorted({s for sources in PROGRAMS.values() for s in sources}))
            + "): "
            + ", ".join(f"{program} {len(settings)}" for program, settings in programs.items())
        )
        docs = check_kubernetes(args.kubernetes_version, programs, report)
        try:
            check_compose(programs, report)
        except (KeyError, TypeError, IndexError, ValueError, AttributeError) as e:
            report.fail(f"the compose checks could not read deploy/compose.yaml ({type(e).__name__}: {e})")
        outcome = args.docker_compose
        if outcome == "passed":
            report.ok("`docker compose -f deploy/compose.yaml config -q` (no variables set)")
        elif outcome.startswith("skipped"):
            print(f"skip  `docker compose -f deploy/compose.yaml config -q`: {outcome.split(': ', 1)[-1]}")
        else:
            report.fail(f"`docker compose -f deploy/compose.yaml config -q`: {outcome.split(': ', 1)[-1]}")
        check_scripts(report)
        if report.failed:
            print("\nskip  the self-check (broken copies must fail): the manifests themselves fail above")
        else:
            check_the_checks(docs, args.kubernetes_version, programs, report)
    except Failed as e:
        report.fail(str(e))
    print(f"\ndeploy/validate: {report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
