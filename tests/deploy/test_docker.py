"""The Dockerfile: what it copies exists, what it runs is a valid laggard command line.
(Building the image needs a container runtime, which CI here does not have.)"""

from __future__ import annotations

import json
import re
import tomllib

from tests.conftest import REPO

DOCKERFILE = REPO / "deploy" / "Dockerfile"


def test_dockerfile_copies_what_exists_and_runs_a_valid_command() -> None:
    from laggard.cli import build_parser

    text = DOCKERFILE.read_text()
    for src in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for name in src.split():
            assert (REPO / name).exists(), name
    packages = {p.rstrip("*") for p in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]}
    copied = set(re.findall(r"^COPY (\w+) \1$", text, re.M))
    assert packages <= copied, packages - copied  # every package the wheel needs is in the build context
    extras = set(re.findall(r'pip install "\.\[(\w+)\]"', text))
    assert extras <= set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert entry == ["laggard"]
    args = build_parser().parse_args(cmd)
    assert args.host == "0.0.0.0" and args.db.startswith("/var/lib/laggard/")
