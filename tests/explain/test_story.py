"""explain.story: the first line localize, explain and report share, from the verdict alone."""

from __future__ import annotations

from explain.story import Story
from localize.verdict import Candidate, Verdict

GPU = Candidate("gpu", 0.93, ["e"], rank=12, host="node-3", gpu=4)


def test_irregular_uses_the_verdicts_onset() -> None:
    v = Verdict("run7", "irregular", [412, 413], 1.97, [GPU], {"onset_step": 412})
    s = Story.of(v)
    assert s.status_line() == "run7: IRREGULAR since step 412 (2 slow steps, 1.97x their normal time)"
    assert s.headline().endswith("; top candidate gpu rank 12 (node-3 gpu 4) (score 0.93)")
    assert s.to_dict()["onset_step"] == 412 and s.to_dict()["top_candidate"] == "gpu rank 12 (node-3 gpu 4)"


def test_onset_is_never_recomputed() -> None:
    """Without the verdict's onset the story names none, rather than guessing from irregular_steps."""
    s = Story.of(Verdict("run7", "irregular", [412, 413], 1.97, [GPU]))
    assert s.onset_step is None and "since" not in s.status_line()


def test_slow_from_the_start_is_worded_as_such() -> None:
    s = Story.of(Verdict("run7", "irregular", [], 1.3, [GPU], {"onset_step": 0, "persistent": True}))
    assert s.from_start
    assert s.status_line() == "run7: SLOW from the first step (step 0) (~1.30x), no normal iteration to compare with"
    assert "irregular since" not in s.headline().lower() and "0 slow steps" not in s.headline()


def test_healthy_and_hang() -> None:
    assert Story.of(Verdict("ok", "healthy")).headline() == "ok: healthy — no irregular iteration, nothing to blame"
    hang = Story.of(Verdict("j", "hang", [], 1.0, [GPU]))
    assert hang.status_line() == "j: STUCK — a collective never completed" and hang.top == GPU.device()
