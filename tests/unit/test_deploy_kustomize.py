"""deploy/kubernetes's kustomizations, built by kubectl's kustomize (offline, no cluster): each one
builds its manifest unchanged but for the image; the image is named in one place (the image
component) and reaches every inferd container; the fleet's ports and probes are those
docs/deploy.md gives, and its one documented edit (the http-readiness component) turns readiness
and startup into HTTP GETs of /v2/health/ready; and the images' entrypoint runs what
test_deploy_manifests.served_argv says it does."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_deploy_manifests import (
    DEPLOY,
    DOCKERFILES,
    IMAGE_NAME,
    KSERVE_TRITON_ARGS,
    _arg,
    _containers,
    _exec_form,
    dockerfile_instructions,
    documents,
    manifest,
    manifest_problems,
    served_argv,
)

KUBERNETES = DEPLOY / "kubernetes"
KUSTOMIZATIONS = ("fleet", "sidecar", "kserve")
HTTP_READINESS_LINE = "# - ../http-readiness"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None,
    reason="kubectl is not installed: the kustomizations cannot be built here",
)


def kustomize(directory: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    built = subprocess.run(
        [KUBECTL, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d is not None]


def _image_component(root: Path = KUBERNETES) -> dict[str, Any]:
    component: dict[str, Any] = yaml.safe_load((root / "image" / "kustomization.yaml").read_text())
    return component


def _key(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _with_images(doc: dict[str, Any], image: str, to: str) -> dict[str, Any]:
    """``doc`` with every container that runs ``image`` running ``to`` instead."""
    doc = copy.deepcopy(doc)
    for container in _containers(doc):
        if container["image"] == image:
            container["image"] = to
    return doc


def _container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (container,) = [c for c in _containers(doc) if c["name"] == name]
    return container


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if _key(d) == (kind, name)]
    return doc


@needs_kubectl
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_each_kustomization_builds_its_manifest(name: str) -> None:
    images = _image_component()["images"]
    (image,) = images
    shipped = f"{image['newName']}:{image['newTag']}"
    raw = documents(manifest(f"{name}.yaml"))
    built = kustomize(KUBERNETES / name)
    assert sorted(map(_key, built)) == sorted(map(_key, raw))
    for doc in raw:
        (same,) = [d for d in built if _key(d) == _key(doc)]
        assert same == _with_images(doc, IMAGE_NAME, shipped), _key(doc)
        assert manifest_problems(same) == [], _key(doc)


def test_every_kustomization_takes_the_image_component() -> None:
    for name in KUSTOMIZATIONS:
        kustomization = yaml.safe_load((KUBERNETES / name / "kustomization.yaml").read_text())
        assert kustomization["resources"] == [f"{name}.yaml"]
        assert "../image" in kustomization["components"]
    (image,) = _image_component()["images"]
    assert image["name"] == IMAGE_NAME
    # The manifests name no image of inferd's but the placeholder the component replaces.
    for path in KUBERNETES.rglob("*.yaml"):
        for doc in documents(path):
            for container in _containers(doc):
                if container["image"].split(":")[0].split("/")[-1] == IMAGE_NAME:
                    assert container["image"] == IMAGE_NAME, f"{path.name}: {container['name']}"


@needs_kubectl
def test_the_image_is_edited_in_one_place(tmp_path: Path) -> None:
    root = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, root)
    component_path = root / "image" / "kustomization.yaml"
    component = _image_component(root)
    component["images"] = [
        {"name": IMAGE_NAME, "newName": "registry.example.com/team/inferd", "newTag": "1.2.3"}
    ]
    component_path.write_text(yaml.safe_dump(component))
    for name in KUSTOMIZATIONS:
        raw_images = [
            c["image"] for d in documents(manifest(f"{name}.yaml")) for c in _containers(d)
        ]
        built_images = [c["image"] for d in kustomize(root / name) for c in _containers(d)]
        assert IMAGE_NAME in raw_images, name
        assert sorted(built_images) == sorted(
            "registry.example.com/team/inferd:1.2.3" if i == IMAGE_NAME else i for i in raw_images
        )


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


@needs_kubectl
def test_fleet_ports_and_probes() -> None:
    built = kustomize(KUBERNETES / "fleet")
    inferd = _container(_one(built, "Deployment", "inferd"), "inferd")
    args = inferd["args"]
    ports = _ports(inferd)
    assert ports == {
        "http": int(_arg(args, "--http-port")),
        "grpc": int(_arg(args, "--grpc-port")),
        "metrics": int(_arg(args, "--metrics-port")),
    }
    assert ports["http"] == 8000 and ports["grpc"] == 8001  # Triton's ports
    health = {"port": ports["grpc"], "service": "inference.GRPCInferenceService"}
    assert inferd["startupProbe"]["grpc"] == health
    assert inferd["readinessProbe"]["grpc"] == health
    # An answer, not a TCP connect: a listener that no longer accepts still completes handshakes.
    assert inferd["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "tcpSocket" not in inferd[probe], probe
    service = _one(built, "Service", "inferd")
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert by_name["http"]["port"] == ports["http"]
    assert by_name["http"]["targetPort"] == "http"


@needs_kubectl
def test_http_readiness_is_one_documented_edit(tmp_path: Path) -> None:
    root = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, root)
    kustomization = root / "fleet" / "kustomization.yaml"
    text = kustomization.read_text()
    assert text.count(HTTP_READINESS_LINE) == 1
    kustomization.write_text(text.replace(HTTP_READINESS_LINE, "- ../http-readiness"))
    before = _one(kustomize(KUBERNETES / "fleet"), "Deployment", "inferd")
    after = _one(kustomize(root / "fleet"), "Deployment", "inferd")
    assert manifest_problems(after) == []
    inferd, was = _container(after, "inferd"), _container(before, "inferd")
    for probe in ("startupProbe", "readinessProbe"):
        assert inferd[probe]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
        assert "grpc" not in inferd[probe]
        # Only the handler changes: periods and thresholds stay.
        assert {k: v for k, v in inferd[probe].items() if k != "httpGet"} == {
            k: v for k, v in was[probe].items() if k != "grpc"
        }
    assert "http" in _ports(inferd)
    # Nothing else in the Deployment changes.
    for probe in ("startupProbe", "readinessProbe"):
        inferd[probe] = was[probe]
    assert after == before


def test_entrypoint_runs_what_served_argv_says(tmp_path: Path) -> None:
    """deploy/entrypoint.sh with an `inferd` on PATH that prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "inferd"
    stub.write_text(
        "#!/bin/sh\nexec python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n"
    )
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    (cmd,) = {dockerfile_instructions(p)["CMD"][-1] for p in DOCKERFILES}
    cases = [KSERVE_TRITON_ARGS, _exec_form(cmd), [], ["tritonserver"], ["--help", "tritonserver"]]
    for args in cases:
        ran = subprocess.run(
            ["sh", str(DEPLOY / "entrypoint.sh"), *args],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        assert ["inferd", *json.loads(ran.stdout)] == served_argv(args), args
    assert served_argv(KSERVE_TRITON_ARGS)[:3] == ["inferd", "serve", "--model-store=/mnt/models"]
