"""Pipeline schedules: the order of forward/backward chunks each stage runs in one step."""

from __future__ import annotations

from typing import NamedTuple


class Chunk(NamedTuple):
    phase: str  # "F" or "B"
    micro: int
    vchunk: int  # virtual model chunk (interleaved schedule), 0 otherwise


def one_f_one_b(stage: int, stages: int, micro: int) -> list[Chunk]:
    """Non-interleaved 1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    warm = min(stages - stage - 1, micro)
    order: list[Chunk] = [Chunk("F", m, 0) for m in range(warm)]
    f, b = warm, 0
    while f < micro:
        order.append(Chunk("F", f, 0))
        f += 1
        order.append(Chunk("B", b, 0))
        b += 1
    order += [Chunk("B", m, 0) for m in range(b, micro)]
    return order


def interleaved(stage: int, stages: int, micro: int, vstages: int) -> list[Chunk]:
    """Megatron's interleaved 1F1B: each stage holds `vstages` model chunks (micro % stages == 0)."""
    total = micro * vstages

    def fwd(k: int) -> Chunk:
        return Chunk("F", (k // (stages * vstages)) * stages + k % stages, (k // stages) % vstages)

    def bwd(k: int) -> Chunk:
        return Chunk("B", (k // (stages * vstages)) * stages + k % stages, vstages - 1 - (k // stages) % vstages)

    warm = min((stages - stage - 1) * 2 + (vstages - 1) * stages, total)
    order = [fwd(k) for k in range(warm)]
    f, b = warm, 0
    while f < total:
        order.append(fwd(f))
        f += 1
        order.append(bwd(b))
        b += 1
    order += [bwd(k) for k in range(b, total)]
    return order


def stage_orders(stages: int, micro: int, vstages: int = 1) -> list[list[Chunk]]:
    if vstages > 1:
        return [interleaved(s, stages, micro, vstages) for s in range(stages)]
    return [one_f_one_b(s, stages, micro) for s in range(stages)]


def upstream(chunk: Chunk, stage: int, stages: int, vstages: int) -> tuple[int, Chunk] | None:
    """The (stage, chunk) whose output this chunk needs from another stage, if any."""
    if chunk.phase == "F":
        if stage > 0:
            return stage - 1, chunk
        if chunk.vchunk > 0:
            return stages - 1, Chunk("F", chunk.micro, chunk.vchunk - 1)
        return None
    if stage < stages - 1:
        return stage + 1, chunk
    if chunk.vchunk < vstages - 1:
        return 0, Chunk("B", chunk.micro, chunk.vchunk + 1)
    return None


def has_downstream(chunk: Chunk, stage: int, stages: int, vstages: int) -> int | None:
    """The stage this chunk sends its output to, if any."""
    if chunk.phase == "F":
        if stage < stages - 1:
            return stage + 1
        return 0 if chunk.vchunk < vstages - 1 else None
    if stage > 0:
        return stage - 1
    return stages - 1 if chunk.vchunk > 0 else None
