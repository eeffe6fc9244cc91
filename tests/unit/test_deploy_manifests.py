"""deploy/ without a cluster or a Docker engine: every Kubernetes manifest against the Kubernetes
API's schemas (kubernetes-validate's offline copies, strict: an unknown field fails), the custom
resources (KServe, Prometheus operator) against the schemas in deploy/schemas, yamllint, the
references between the manifests (Services to pods, the autoscaler to the adapter's rule to a
metric inferd writes, the collector to the endpoint inferd is given), and every `inferd` command
line that the Dockerfiles and the manifests run against inferd's own parser."""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from yamllint import linter
from yamllint.config import YamlLintConfig

from inferd import cli
from inferd.observability.tracing import tracing_requested
from inferd.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# The resources (each kustomization's own files, and prometheus-adapter.yaml, applied as it is); the
# kustomizations themselves are checked by test_deploy_kustomize.py.
MANIFESTS = sorted(
    p for p in (DEPLOY / "kubernetes").rglob("*.yaml") if p.name != "kustomization.yaml"
)
COLLECTOR = DEPLOY / "otel-collector.yaml"
DOCKERFILES = (DEPLOY / "Dockerfile", DEPLOY / "Dockerfile.gpu")
# The oldest Kubernetes the manifests are written for (native sidecar containers: 1.29) and the
# newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
CUSTOM_SCHEMAS = {
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
}
# A Pod spec's fields that a ServingRuntime's spec carries over (checked as a Pod's).
SERVING_RUNTIME_POD_FIELDS = ("containers", "volumes")
# The image name the manifests give every inferd container: the kustomizations' image component
# (deploy/kubernetes/image) replaces it with the image to run.
IMAGE_NAME = "inferd"
# KServe's own Triton runtime's container args (config/runtimes/kserve-tritonserver.yaml in
# KServe's repository), which kserve.yaml's runtime passes unchanged.
KSERVE_TRITON_ARGS = [
    "tritonserver",
    "--model-store=/mnt/models",
    "--grpc-port=9000",
    "--http-port=8080",
    "--allow-grpc=true",
    "--allow-http=true",
]


def manifest(name: str) -> Path:
    """The manifest called ``name`` (fleet.yaml: deploy/kubernetes/fleet/fleet.yaml)."""
    (path,) = [p for p in MANIFESTS if p.name == name]
    return path


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def all_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in MANIFESTS:
        for doc in documents(path):
            yield path, doc


def manifest_problems(doc: dict[str, Any]) -> list[str]:
    """Why ``doc`` is not a valid resource: one line per problem, none when it is."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CUSTOM_SCHEMAS:
        schema = json.loads((DEPLOY / "schemas" / CUSTOM_SCHEMAS[key]).read_text())
        validator = jsonschema.Draft202012Validator(schema)
        problems = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)
        ]
        if doc["kind"] == "ServingRuntime" and not problems:
            pod_spec = {f: doc["spec"][f] for f in SERVING_RUNTIME_POD_FIELDS if f in doc["spec"]}
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": pod_spec}
            problems += manifest_problems(pod)
        return problems
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(map(str, e.absolute_path))
            problems.append(f"Kubernetes {version}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            problems.append(f"Kubernetes {version}: {e.message}")
    return problems


def test_deploy_has_the_manifests() -> None:
    names = {p.relative_to(DEPLOY / "kubernetes").as_posix() for p in MANIFESTS}
    assert {
        "sidecar/sidecar.yaml",
        "fleet/fleet.yaml",
        "kserve/kserve.yaml",
        "prometheus-adapter.yaml",
    } <= names
    assert not (DEPLOY / "kubernetes.yaml").exists()


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(path: Path) -> None:
    for doc in documents(path):
        assert manifest_problems(doc) == [], f"{path.name}: {doc['kind']} {doc['metadata']['name']}"


def _resource(path: str, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in documents(manifest(path)) if d["kind"] == kind]
    return copy.deepcopy(doc)


@pytest.mark.parametrize(
    ("path", "kind", "where", "field", "misspelt"),
    [
        (
            "fleet.yaml",
            "Deployment",
            ("spec", "template", "spec", "containers", 0),
            "readinessProbe",
            "readinesProbe",
        ),
        (
            "sidecar.yaml",
            "Deployment",
            ("spec", "template", "spec"),
            "terminationGracePeriodSeconds",
            "terminationGracePeriod",
        ),
        ("fleet.yaml", "HorizontalPodAutoscaler", ("spec",), "minReplicas", "minReplica"),
        ("kserve.yaml", "ServingRuntime", ("spec",), "multiModel", "multiModal"),
        (
            "kserve.yaml",
            "ServingRuntime",
            ("spec", "containers", 0),
            "readinessProbe",
            "readinesProbe",
        ),
        (
            "kserve.yaml",
            "InferenceService",
            ("spec", "predictor", "model"),
            "storageUri",
            "storageURI",
        ),
        ("fleet.yaml", "ServiceMonitor", ("spec", "endpoints", 0), "interval", "intervall"),
    ],
)
def test_a_misspelt_field_fails_validation(
    path: str, kind: str, where: tuple[str | int, ...], field: str, misspelt: str
) -> None:
    doc = _resource(path, kind)
    assert manifest_problems(doc) == []
    node: Any = doc
    for step in where:
        node = node[step]
    node[misspelt] = node.pop(field)
    assert manifest_problems(doc), f"{kind}: {misspelt} passed"


def test_a_wrong_value_fails_validation() -> None:
    doc = _resource("kserve.yaml", "ServingRuntime")
    doc["spec"]["protocolVersions"] = ["grpc-v3"]
    assert manifest_problems(doc)
    doc = _resource("fleet.yaml", "Deployment")
    doc["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8001"
    assert manifest_problems(doc)


@pytest.mark.parametrize(
    "path",
    [*MANIFESTS, *sorted(DEPLOY.rglob("kustomization.yaml")), COLLECTOR, ROOT / ".yamllint"],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_yamllint_clean(path: Path) -> None:
    config = YamlLintConfig(file=str(ROOT / ".yamllint"))
    problems = list(linter.run(path.read_text(), config, str(path)))
    assert [f"{path.name}:{p.line}:{p.column}: {p.message}" for p in problems] == []


@pytest.mark.parametrize(
    "text", ["---\nenabled: yes\n", "---\na: 1\na: 2\n", "---\na:\n    - 1\n  b: 2\n"]
)
def test_yamllint_config_refuses(text: str) -> None:
    config = YamlLintConfig(file=str(ROOT / ".yamllint"))
    assert list(linter.run(text, config))


# --- inferd's command lines ----------------------------------------------------------------------


def check_inferd_command(argv: list[str]) -> argparse.Namespace:
    """``argv`` (``inferd COMMAND ...``) is a command line inferd's own parser accepts: a real
    command, flags it knows (Triton's included, translated as ``inferd serve`` translates them)
    and values it takes, none dropped as an ignored Triton flag. Returns what it parsed; nothing
    runs."""
    assert argv[0] == "inferd", argv
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="inferd")
    assert script.value == "inferd.cli:main"  # the `inferd` the images' PATH has
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            args, ignored = cli._arguments(argv[1:])
        except SystemExit as refused:
            raise AssertionError(f"inferd {argv[1:]} refused: {err.getvalue()}") from refused
    assert ignored == [], f"inferd {argv[1:]} ignores {ignored}"
    return args


def served_argv(args: list[str]) -> list[str]:
    """The command deploy/entrypoint.sh (the images' entrypoint) runs for the container's ``args``:
    ``inferd serve`` with them, less a first ``tritonserver`` (test_deploy_kustomize.py runs the
    script itself to check this)."""
    return ["inferd", "serve", *(args[1:] if args[:1] == ["tritonserver"] else args)]


def dockerfile_instructions(path: Path) -> dict[str, list[str]]:
    """Instruction -> its arguments (the last of each, as Docker uses it), lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    instructions: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            instructions.setdefault(keyword.upper(), []).append(rest.strip())
    return instructions


def _exec_form(text: str) -> list[str]:
    argv = json.loads(text)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), text
    return argv


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_commands_are_inferds(path: Path) -> None:
    instructions = dockerfile_instructions(path)
    entrypoint = _exec_form(instructions["ENTRYPOINT"][-1])
    cmd = _exec_form(instructions["CMD"][-1])
    assert entrypoint == ["inferd-entrypoint"]
    entrypoint_copy = "--chmod=0755 deploy/entrypoint.sh /usr/local/bin/inferd-entrypoint"
    assert entrypoint_copy in instructions["COPY"]
    check_inferd_command(served_argv(cmd))

    (healthcheck,) = instructions["HEALTHCHECK"]
    options, _, command = healthcheck.partition("CMD ")
    assert re.search(r"--start-period=\d+s", options)
    probe = _exec_form(command)
    assert probe[:2] == ["inferd", "health"]
    check_inferd_command(probe)
    # The call's deadline leaves the process time to start within Docker's timeout.
    timeout = re.search(r"--timeout=(\d+)s", options)
    assert timeout is not None
    assert float(_arg(probe, "--timeout-secs")) < float(timeout.group(1))

    # The health check asks the port the server listens on; every port is exposed.
    http_port = cmd[cmd.index("--http-port") + 1]
    grpc_port = cmd[cmd.index("--grpc-port") + 1]
    metrics_port = cmd[cmd.index("--metrics-port") + 1]
    assert probe[probe.index("--address") + 1] == f"127.0.0.1:{grpc_port}"
    assert set(instructions["EXPOSE"][-1].split()) == {http_port, grpc_port, metrics_port}
    user = instructions["USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    assert len(instructions["FROM"]) >= 2, "a builder stage and a run stage"
    # The build and install steps are deploy/install.sh's, the script CI runs.
    runs = " ".join(instructions["RUN"])
    assert re.search(r"\bsh deploy/install\.sh wheel /wheels\b", runs)
    assert re.search(r"\bsh /install\.sh install \"\$\(ls /wheels/inferd-\*\.whl\)\"", runs)
    assert "source=deploy/install.sh" in runs


def test_dockerfile_checker_refuses_a_wrong_flag() -> None:
    with pytest.raises(AssertionError, match="unrecognized flag --unix-socket"):
        check_inferd_command(["inferd", "health", "--unix-socket", "/sock/inferd.sock"])
    with pytest.raises(AssertionError):
        check_inferd_command(["inferd", "serve", "--grpc-port", "eighty"])


def _containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if doc["kind"] not in ("Deployment", "ServingRuntime"):
        return
    spec = doc["spec"]
    pod = spec["template"]["spec"] if doc["kind"] == "Deployment" else spec
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


def _inferd_commands(container: dict[str, Any]) -> Iterator[list[str]]:
    if container["image"] != IMAGE_NAME:
        return
    if "command" in container:
        yield container["command"] + container.get("args", [])
    else:  # the image's entrypoint
        yield served_argv(container.get("args", []))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = container.get(probe, {}).get("exec", {}).get("command", [])
        if command[:1] == ["inferd"]:
            yield command


def test_manifest_commands_are_inferds() -> None:
    commands = [
        argv
        for _, doc in all_documents()
        for container in _containers(doc)
        for argv in _inferd_commands(container)
    ]
    # make-examples and serve in sidecar.yaml and fleet.yaml, health twice in the sidecar, and
    # serve in kserve.yaml.
    assert len(commands) == 7
    for argv in commands:
        check_inferd_command(argv)


# --- references between the manifests ---------------------------------------------------------


def _arg(args: list[str], flag: str) -> str:
    for i, a in enumerate(args):
        if a == flag:
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"no {flag} in {args}")


def _inferd_container(doc: dict[str, Any]) -> dict[str, Any]:
    pod = doc["spec"]["template"]["spec"]
    (container,) = [
        c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == "inferd"
    ]
    return container


@pytest.mark.parametrize("path", ["sidecar.yaml", "fleet.yaml"])
def test_grace_period_covers_the_drain(path: str) -> None:
    deployment = _resource(path, "Deployment")
    container = _inferd_container(deployment)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    exit_timeout = float(_arg(container["args"], "--exit-timeout-secs"))
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(pre_stop[1]) + exit_timeout + cli.EXIT_MARGIN_S


def test_sidecar_socket_is_shared_by_group() -> None:
    deployment = _resource("sidecar.yaml", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    inferd = _inferd_container(deployment)
    args = inferd["args"]
    assert int(_arg(args, "--grpc-port")) < 0  # no TCP listener
    socket = Path(_arg(args, "--grpc-unix-socket"))
    assert _arg(args, "--grpc-unix-socket-mode") == "0660"
    assert int(_arg(args, "--grpc-unix-socket-group")) == pod["securityContext"]["fsGroup"]
    (app,) = pod["containers"]
    assert app["securityContext"]["runAsUser"] != inferd["securityContext"]["runAsUser"]
    for container in (inferd, app):
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts[str(socket.parent)] == "sock"
    for probe in ("startupProbe", "readinessProbe"):
        command = inferd[probe]["exec"]["command"]
        assert _arg(command, "--address") == f"unix:{socket}"
        assert float(_arg(command, "--timeout-secs")) < inferd[probe]["timeoutSeconds"]
    assert inferd["restartPolicy"] == "Always"  # a native sidecar: started before the app


def test_restricted_security_context() -> None:
    for path in ("sidecar.yaml", "fleet.yaml"):
        pod = _resource(path, "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in pod.get("initContainers", []) + pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"] and container["resources"]["limits"]


def test_fleet_services_autoscaler_and_monitor_point_at_the_pods() -> None:
    docs = documents(manifest("fleet.yaml"))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in _inferd_container(deployment)["ports"]}
    services = [d for d in docs if d["kind"] == "Service"]
    assert sorted(s["spec"].get("clusterIP", "") for s in services) == ["", "None"]
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    # Scraped once: only one Service the monitor selects has the port it scrapes.
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    scraped = [
        s
        for s in services
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        and endpoint["port"] in {p["name"] for p in s["spec"]["ports"]}
    ]
    assert len(scraped) == 1
    metrics_port = int(_arg(_inferd_container(deployment)["args"], "--metrics-port"))
    (port,) = [p for p in scraped[0]["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["port"] == metrics_port


def test_autoscaler_metric_comes_from_inferds_queue_gauge() -> None:
    (hpa,) = [
        d for d in documents(manifest("fleet.yaml")) if d["kind"] == "HorizontalPodAutoscaler"
    ]
    (metric,) = hpa["spec"]["metrics"]
    (config_map,) = documents(manifest("prometheus-adapter.yaml"))
    (rule,) = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"]
    series_name = re.match(r"[a-z_]+", rule["seriesQuery"].strip("'\""))
    assert series_name is not None, rule["seriesQuery"]
    series = series_name.group()
    assert re.fullmatch(rule["name"]["matches"], series)
    metrics_source = (ROOT / "python/inferd/observability/core_metrics.py").read_text()
    assert f'"{series}"' in metrics_source, f"inferd writes no {series}"


def test_collector_receives_what_inferd_is_pointed_at() -> None:
    (collector,) = documents(COLLECTOR)
    pipelines = collector["service"]["pipelines"]
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(kind, [])) <= set(collector[kind]), kind
    receiver_port = collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].split(":")[-1]
    container = _inferd_container(_resource("fleet.yaml", "Deployment"))
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    assert tracing_requested({}, env)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].rsplit(":", 1)[1] == receiver_port
    (job,) = collector["receivers"]["prometheus"]["config"]["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert "prometheus" in pipelines["metrics"]["receivers"]


def test_kserve_runtime_passes_tritons_args() -> None:
    """The runtime's args are KServe's Triton runtime's, word for word; the image's entrypoint
    makes them an `inferd serve` command line that inferd's parser accepts, with REST on the
    runtime's one declared port (KServe's default, 8080) and the probes there."""
    runtime = _resource("kserve.yaml", "ServingRuntime")
    (container,) = runtime["spec"]["containers"]
    assert "command" not in container  # the image's entrypoint runs the args
    assert container["args"] == KSERVE_TRITON_ARGS
    parsed = check_inferd_command(served_argv(container["args"]))
    # Taken as Triton means them, not only accepted.
    assert str(parsed.model_repository) == "/mnt/models"
    assert (parsed.grpc_port, parsed.http_port) == (9000, 8080)
    assert parsed.allow_grpc is True and parsed.allow_http is True
    (port,) = container["ports"]
    assert port["name"] == "http1"  # HTTP/1.1, as KServe and Knative name it
    assert port["containerPort"] == int(_arg(container["args"], "--http-port")) == 8080
    assert container["readinessProbe"]["httpGet"] == {
        "path": "/v2/health/ready",
        "port": port["containerPort"],
    }
    assert container["livenessProbe"]["httpGet"] == {
        "path": "/v2/health/live",
        "port": port["containerPort"],
    }
    assert runtime["spec"]["protocolVersions"] == ["v2", "grpc-v2"]
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == str(
        ServerSettings().metrics_port  # the port inferd serves /metrics on by default
    )
    assert {f["name"] for f in runtime["spec"]["supportedModelFormats"]} == {"onnx", "tensorrt"}
    service = _resource("kserve.yaml", "InferenceService")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
