"""explain.story: the first line localize, explain and report share, from the verdict alone."""

from __future__ import annotations

from explain.story import Story, tie_words
from localize.verdict import Candidate, Verdict

GPU = Candidate("gpu", 0.93, ["e"], rank=12, host="node-3", gpu=4)


def test_irregular_uses_the_verdicts_onset() -> None:
    v = Verdict("run7", "irregular", [412, 413], 1.97, [GPU], onset_step=412)
    s = Story.of(v)
    assert s.status_line() == "run7: IRREGULAR since step 412 (2 slow steps, 1.97x their normal time)"
    assert s.headline().endswith("; top candidate gpu rank 12 (node-3 gpu 4) (score 0.93)")
    assert s.to_dict()["onset_step"] == 412 and s.to_dict()["top_candidate"] == "gpu rank 12 (node-3 gpu 4)"


def test_onset_is_never_recomputed() -> None:
    """Without the verdict's onset the story names none, rather than guessing from irregular_steps."""
    s = Story.of(Verdict("run7", "irregular", [412, 413], 1.97, [GPU]))
    assert s.onset_step is None and "since" not in s.status_line()


def test_slow_from_the_start_is_worded_as_such() -> None:
    s = Story.of(Verdict("run7", "irregular", [], 1.3, [GPU], {"persistent": True}, onset_step=0))
    assert s.from_start
    assert s.status_line() == "run7: SLOW from the first step (step 0) (~1.30x), no normal iteration to compare with"
    assert "irregular since" not in s.headline().lower() and "0 slow steps" not in s.headline()


def test_healthy_and_hang() -> None:
    assert Story.of(Verdict("ok", "healthy")).headline() == "ok: healthy — no irregular iteration, nothing to blame"
    hang = Story.of(Verdict("j", "hang", [], 1.0, [GPU]))
    assert hang.status_line() == "j: STUCK — a collective never completed" and hang.top == GPU.device()


def test_a_tie_is_part_of_the_headline() -> None:
    """Devices the evidence cannot tell apart are said to be tied, with how many, never hidden behind the first."""
    tied = [Candidate("nic", 0.6, ["e"], host=f"node-{i}", source="commops", tie=4) for i in range(4)]
    s = Story.of(Verdict("run7", "irregular", [5, 6], 1.5, tied, onset_step=5))
    assert s.top_tie == 4 and s.to_dict()["top_tie"] == 4
    assert s.headline().endswith("top candidate nic node-0 (score 0.60) (tie of 4: CommOps cannot tell these apart)")
    assert Story.of(Verdict("run7", "irregular", [5], 1.5, [GPU], onset_step=5)).tie_text == ""


def test_a_tie_names_every_source_that_could_not_break_it() -> None:
    c = Candidate("link", 1.0, ["e"], hosts=["node-2", "node-3"], source="commops+flows", tie=18)
    assert tie_words(c) == "(tie of 18: CommOps and the flows cannot tell these apart)"
    assert "(1 slow step," in Story.of(Verdict("run7", "irregular", [21], 1.2, [GPU], onset_step=21)).status_line()
