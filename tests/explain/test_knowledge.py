from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from collector.inputs.errors import UserError
from explain.knowledge import CATEGORIES, ENV_PATH, load_kb, parse_entry, search_path

GOOD = {
    "id": "site-fan-failure", "title": "Chassis fan failure", "category": "gpu",
    "signature": {"pattern": "compute-slow-rank", "verdict_kinds": ["gpu"], "keywords": ["fan", "rpm"]},
    "cause": "A chassis fan stopped and the GPUs behind it overheat.", "probes": ["gpu_clocks"],
    "confirmed_by": ["gpu.thermal"], "remediation": [{"action": "drain_slurm", "why": "replace the fan"}],
    "references": ["Site runbook: fans"],
}


@pytest.fixture(scope="module")
def shipped():
    return load_kb()


def test_shipped_kb_is_clean_and_large() -> None:
    kb = load_kb(strict=True)
    assert len(kb) >= 60
    assert {e.category for e in kb} >= set(CATEGORIES)


@pytest.mark.parametrize("eid", [
    "gpu-thermal-throttle", "gpu-power-cap", "gpu-clocks-locked", "gpu-ecc-uncorrectable", "gpu-fallen-off-bus",
    "pcie-width-downgrade", "nvlink-errors", "nic-link-flap", "roce-pfc-storm", "switch-buffer-misconfig",
    "ib-symbol-errors", "switch-congestion", "switch-ecmp-collision", "host-cpu-contention", "host-numa-misbinding",
    "host-dataloader-stall", "host-gc-pause", "storage-checkpoint-stall", "config-pipeline-stage-imbalance",
    "data-seqlen-imbalance", "config-nccl-ib-disabled",
])
def test_required_causes_are_covered(eid: str, shipped) -> None:
    assert eid in shipped.entries


def test_every_entry_has_probes_remediation_and_references() -> None:
    for e in load_kb():
        assert e.remediation and e.references
        assert bool(e.probes) == bool(e.confirmed_by), e.id


def test_user_directory_extends_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    override = dict(GOOD, id="gpu-thermal-throttle", title="Site wording for thermal throttling")
    (tmp_path / "site.yaml").write_text(yaml.safe_dump([GOOD, override]))
    monkeypatch.setenv(ENV_PATH, str(tmp_path))
    assert search_path()[-1] == tmp_path
    kb = load_kb(strict=True)
    assert kb.entries["site-fan-failure"].source == "site.yaml"
    assert kb.entries["gpu-thermal-throttle"].title == "Site wording for thermal throttling"


@pytest.mark.parametrize("change, problem", [
    ({"probes": ["rm_rf"]}, "unknown probe 'rm_rf'"),
    ({"category": "cosmic-rays"}, "category 'cosmic-rays'"),
    ({"confirmed_by": ["gpu"]}, "not area.name"),
    ({"remediation": [{"action": "reboot_everything", "why": "x"}]}, "unknown remediation action"),
    ({"signature": {"pattern": "hang", "verdict_kinds": ["gpu"], "keywords": ["x"], "log_patterns": ["(unclosed"]}}, "does not compile"),
    ({"surprise": 1}, "unknown key 'surprise'"),
])
def test_bad_entries_are_reported(change: dict, problem: str) -> None:
    from explain.actions.probes import CATALOG, FINDING_TAGS
    from explain.actions.remediation import ACTIONS

    entry, problems = parse_entry(dict(GOOD, **change), "x.yaml", tuple(CATALOG), tuple(ACTIONS), FINDING_TAGS)
    assert entry is None
    assert any(problem in p for p in problems), problems


def test_lint_flags_duplicates_and_orphan_findings(tmp_path: Path) -> None:
    orphan = dict(GOOD, id="site-orphan", confirmed_by=["nic.flapping"])  # gpu_clocks never reports it
    (tmp_path / "a.yaml").write_text(yaml.safe_dump([GOOD, GOOD, orphan]))
    kb = load_kb([tmp_path])
    assert any("duplicate id" in p for p in kb.problems)
    assert any("site-orphan" in p and "nic.flapping" in p for p in kb.problems)
    with pytest.raises(UserError):
        load_kb([tmp_path], strict=True)


def test_kb_cli(cli, tmp_path: Path) -> None:
    out = cli("kb", "list", "--category", "switch")
    assert out.returncode == 0 and "switch-congestion" in out.stdout and "gpu-power-cap" not in out.stdout
    show = cli("kb", "show", "pcie-width-downgrade")
    assert "gpu_pcie" in show.stdout and "references:" in show.stdout
    (tmp_path / "bad.yaml").write_text("- id: Bad Id\n")
    bad = cli("kb", "lint", env={ENV_PATH: str(tmp_path)})
    assert bad.returncode == 2 and "bad.yaml" in bad.stderr
