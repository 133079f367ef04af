"""One story everywhere: report, timeline, localize and explain agree on status, onset step, slowdown
and top candidate, on every shipped trace and the README's examples.

Each surface is run as a user runs it (the CLI, JSON output). Two pairs are compared:
- `localize` (all evidence), `explain` and `report`: they share one verdict, so everything must match;
- `timeline` and `localize --commops`: the same evidence (CommOps), so status, onset and slowdown must match.
Slowdowns are compared as printed (two decimals), the precision every surface shows.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from laggard.cli import main

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (REPO / "traces").iterdir() if (p / "meta.json").exists())
#: README examples small enough for a test (the 2,048-GPU one is exercised by bench.simulator), and a job
#: slow from its first step (the case where the surfaces used to contradict each other most)
README = {"readme-link-slow": ["--scenario", "link-slow", "--flows", "--logs", "--seed", "3"],
          "slow-from-start": ["--gpus", "16", "--tp", "4", "--steps", "12", "--fault", "gpu:rank=3,factor=1.6,steps=0:11"]}

pytestmark = pytest.mark.slow


def _run(*argv: str | Path) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue()


def _json(*argv: str | Path) -> dict[str, Any]:
    rc, text = _run(*argv)
    assert rc in (0, 1), f"laggard {' '.join(map(str, argv))} -> {rc}"
    return json.loads(text)  # type: ignore[no-any-return]


def _device(c: dict[str, Any] | None) -> str | None:
    if not c:
        return None
    from localize.verdict import Candidate

    fields = set(Candidate.__dataclass_fields__)
    return Candidate(**{k: v for k, v in c.items() if k in fields}).device()


def _surfaces(trace: Path, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"loc": _json("localize", trace, "--format", "json")}
    if (trace / "commops.parquet").exists() or (trace / "commops").exists():
        out["loc_commops"] = _json("localize", trace, "--commops", "--format", "json")
        out["timeline"] = _json("timeline", trace, "--format", "json")
    out["explain"] = _json("explain", trace, "--format", "json", "--no-llm", "--audit", tmp / "audit.jsonl")
    rc, _ = _run("report", trace, "--out", tmp / "r.json")
    assert rc == 0
    out["report"] = json.loads((tmp / "r.json").read_text())
    out["loc_text"] = _run("localize", trace)[1].splitlines()[0]
    out["explain_text"] = _run("explain", trace, "--no-llm", "--dot", "none", "--audit", tmp / "audit.jsonl")[1]
    return out


def contradictions(s: dict[str, Any]) -> list[str]:
    """Every disagreement between the surfaces, in words (empty: one story)."""
    bad: list[str] = []
    loc, exp, rep = s["loc"], s["explain"], s["report"]
    story = exp["story"]

    def same(what: str, **vals: Any) -> None:
        if len({json.dumps(v) for v in vals.values()}) > 1:
            bad.append(f"{what}: " + ", ".join(f"{k}={v!r}" for k, v in vals.items()))

    same("status", localize=loc["status"], explain=exp["status"], report=rep["status"])
    onset = loc.get("onset_step")
    same("onset step", localize=onset, explain=story["onset_step"], report=rep["onset_step"])
    same("slowdown", localize=round(loc["slowdown"], 2), explain=round(story["slowdown"], 2),
         report=round(rep["slowdown"], 2))
    top = _device(loc["candidates"][0]) if loc["candidates"] else None
    same("top candidate", localize=top, explain=exp["device"], report=(rep["root_cause"] or {}).get("device"))
    same("first line", localize=s["loc_text"], explain=s["explain_text"].splitlines()[0].split("   [engine")[0])
    if loc["status"] != "healthy" and not loc["irregular_steps"] and "slow" not in s["loc_text"].lower():
        bad.append(f"slow from the start but worded otherwise: {s['loc_text']!r}")
    if "?" in loc.get("sources", []):
        bad.append(f"sources not named: {loc['sources']}")
    evidence = [tuple(c.get("evidence", [])) for c in loc["candidates"]]
    if len(set(evidence)) < len(evidence):
        bad.append("two candidates carry the same evidence")
    if "timeline" in s:
        tl, lc = s["timeline"], s["loc_commops"]
        same("timeline vs localize --commops status", timeline=tl["status"], localize=lc["status"])
        same("timeline vs localize --commops onset", timeline=tl["since_step"], localize=lc.get("onset_step"))
        same("timeline vs localize --commops slowdown", timeline=round(tl["slowdown"], 2),
             localize=round(lc["slowdown"], 2))
    return bad


@pytest.fixture(scope="module")
def readme_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme")
    for name, args in README.items():
        rc, _ = _run("simulate", *args, "--out", root / name)
        assert rc == 0
    return root


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_trace_tells_one_story(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAGGARD_LLM_BASE_URL", "")
    trace = tmp_path / name
    shutil.copytree(REPO / "traces" / name, trace)
    found = contradictions(_surfaces(trace, tmp_path))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", sorted(README))
def test_readme_example_tells_one_story(name: str, readme_traces: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAGGARD_LLM_BASE_URL", "")
    found = contradictions(_surfaces(readme_traces / name, tmp_path))
    assert not found, "\n".join(found)


def test_contradictions_are_found() -> None:
    """The checker itself: a report that upgrades a healthy verdict, or a different top device, is caught."""
    cand = {"kind": "gpu", "rank": 3, "host": "node-0", "gpu": 3, "score": 1.0, "evidence": ["a"]}
    loc = {"status": "irregular", "onset_step": 8, "slowdown": 1.5, "irregular_steps": [8, 9],
           "candidates": [cand], "sources": ["commops"]}
    story = {"onset_step": 8, "slowdown": 1.5}
    good = {"loc": loc, "explain": {"status": "irregular", "device": "gpu rank 3 (node-0 gpu 3)", "story": story},
            "report": {"status": "irregular", "onset_step": 8, "slowdown": 1.5,
                       "root_cause": {"device": "gpu rank 3 (node-0 gpu 3)"}},
            "loc_text": "j: IRREGULAR since step 8", "explain_text": "j: IRREGULAR since step 8   [engine x]"}
    assert contradictions(good) == []
    bad = json.loads(json.dumps(good))
    bad["report"]["status"] = "healthy"
    bad["explain"]["device"] = "host node-0"
    bad["loc"]["sources"] = ["commops", "?"]
    found = contradictions(bad)
    assert any(f.startswith("status") for f in found) and any(f.startswith("top candidate") for f in found)
    assert any(f.startswith("sources") for f in found)
