"""The Kubernetes manifests, validated against the Kubernetes OpenAPI schemas (kubernetes-validate,
offline), strictly: an unknown field is an error, as `kubectl apply --validate=strict` would say."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (pip install -e .[dev])")
K8S = REPO / "deploy" / "kubernetes"
VERSION = "1.30.0"  # the oldest Kubernetes release still supported upstream when this was written


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("name", sorted(p.name for p in K8S.glob("*.yaml")))
def test_manifests_follow_the_kubernetes_schemas(name: str) -> None:
    for doc in docs(K8S / name):
        kv.validate(doc, VERSION, strict=True)


def test_a_typo_is_caught() -> None:
    """The check can fail: a misspelt field and a wrong type are refused."""
    deployment = next(d for d in docs(K8S / "laggard.yaml") if d["kind"] == "Deployment")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kv.ValidationError):
        kv.validate(typo, VERSION, strict=True)
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["replicas"] = "one"
    with pytest.raises(kv.ValidationError):
        kv.validate(wrong, VERSION, strict=True)


def test_the_pieces_fit_together() -> None:
    """Names the manifests share agree: the volume claim, the service's selector, the agent's URL,
    the port Prometheus is told to scrape, and the CLI flags they pass exist."""
    from laggard.cli import build_parser

    by_kind = {d["kind"]: d for d in docs(K8S / "laggard.yaml")}
    dep, svc, pvc = by_kind["Deployment"], by_kind["Service"], by_kind["PersistentVolumeClaim"]
    pod = dep["spec"]["template"]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == str(pod["spec"]["containers"][0]["ports"][0]["containerPort"])
    job = docs(K8S / "training-job.yaml")[0]
    trainer, agent = job["spec"]["template"]["spec"]["containers"]
    assert job["spec"]["template"]["spec"]["shareProcessNamespace"] is True
    assert f"http://{svc['metadata']['name']}." in " ".join(agent["args"])
    commops_dir = next(e["value"] for e in trainer["env"] if e["name"] == "LAGGARD_COMMOPS_DIR")
    assert commops_dir in agent["args"]
    parser = build_parser()
    for args in (pod["spec"]["containers"][0]["args"], agent["args"]):
        parser.parse_args(args)  # SystemExit on an unknown flag
