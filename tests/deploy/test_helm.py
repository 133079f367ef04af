"""The Helm chart, rendered and checked without helm (not installed here): a renderer for the
few template forms the chart uses ({{ .Values.x }}, {{ .Release.Name }}, {{ .Chart.AppVersion }},
`| quote`, `{{- if X }}...{{- end }}`, Helm's whitespace trimming) refuses any other form, so
the chart cannot grow past what this test checks; the output is validated against the
Kubernetes schemas, strictly, and its flags against `laggard serve`'s parser."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (pip install -e .[dev])")
CHART = REPO / "deploy" / "helm" / "laggard"
VERSION = "1.30.0"
TOKEN = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


def _lookup(expr: str, ctx: dict[str, Any]) -> Any:
    if not re.fullmatch(r"(\.[A-Za-z][A-Za-z0-9]*)+", expr):
        raise ValueError(f"template form this test cannot check: {{{{ {expr} }}}}")
    v: Any = ctx
    for part in expr[1:].split("."):
        if not isinstance(v, dict) or part not in v:
            raise KeyError(f"{expr}: no {part}")
        v = v[part]
    return v


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def render(template: str, values: dict[str, Any], release: str = "laggard") -> str:
    ctx = {"Values": values, "Release": {"Name": release},
           "Chart": {"AppVersion": yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]}}
    out, shown, pos, trim_next = "", [True], 0, False
    for m in TOKEN.finditer(template):
        text = template[pos:m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        if all(shown):  # text under a false condition is dropped
            out += text
        action = m.group(2)
        if action.startswith("if "):
            shown.append(bool(_lookup(action[3:].strip(), ctx)))
        elif action == "end":
            if len(shown) == 1:
                raise ValueError("{{ end }} without {{ if }}")
            shown.pop()
        elif all(shown):
            expr, _, pipe = action.partition("|")
            v = _lookup(expr.strip(), ctx)
            if pipe.strip() == "quote":
                out += json.dumps(_text(v))
            elif pipe.strip():
                raise ValueError(f"template function this test cannot check: {pipe.strip()}")
            else:
                out += _text(v)
        trim_next, pos = bool(m.group(3)), m.end()
    if len(shown) != 1:
        raise ValueError("{{ if }} without {{ end }}")
    tail = template[pos:]
    return out + (tail.lstrip() if trim_next else tail)


def manifests(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    docs = {}
    for t in sorted((CHART / "templates").glob("*.yaml")):
        for d in yaml.safe_load_all(render(t.read_text(), values)):
            if d:
                docs[d["kind"]] = d
    return docs


def _defaults() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def _serve_args(dep: dict[str, Any]) -> Any:
    from laggard.cli import build_parser

    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return build_parser("serve").parse_args(args)


def test_default_values_render_valid_kubernetes_objects_that_fit_together() -> None:
    docs = manifests(_defaults())
    assert set(docs) == {"Deployment", "Service", "PersistentVolumeClaim"}
    for d in docs.values():
        kv.validate(d, VERSION, strict=True)
    dep, svc, pvc = docs["Deployment"], docs["Service"], docs["PersistentVolumeClaim"]
    pod = dep["spec"]["template"]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == str(pod["spec"]["containers"][0]["ports"][0][
        "containerPort"])
    a = _serve_args(dep)  # every flag the chart passes exists and parses
    assert (a.port, a.retention, a.workers, a.confirm_rounds, a.notify) == (8750, "7d", 2, 2, None)
    assert a.db.startswith(pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"])


def test_postgres_without_a_volume_and_alerts_on() -> None:
    v = _defaults()
    v.update(db="postgresql://laggard@pg/laggard", replicas=3, notify="http://am:9093/api/v2/alerts",
             externalUrl="http://laggard.example:8750", persistence={"enabled": False, "size": "1Gi"})
    docs = manifests(v)
    assert set(docs) == {"Deployment", "Service"}
    for d in docs.values():
        kv.validate(d, VERSION, strict=True)
    spec = docs["Deployment"]["spec"]
    assert spec["replicas"] == 3 and "volumes" not in spec["template"]["spec"]
    a = _serve_args(docs["Deployment"])
    assert a.notify == "http://am:9093/api/v2/alerts" and a.external_url == "http://laggard.example:8750"


def test_the_check_can_fail() -> None:
    with pytest.raises(ValueError, match="cannot check"):
        render('{{ include "x" . }}', _defaults())
    with pytest.raises(KeyError):
        render("{{ .Values.nope }}", _defaults())
    bad = copy.deepcopy(manifests(_defaults())["Deployment"])
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, VERSION, strict=True)


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    assert Path(CHART / "templates").is_dir()
