"""The 1F1B schedule of one pipeline, operation by operation (for timeline plots).

Stage s first runs min(P - s - 1, m) forwards (warm-up), then alternates one
forward and one backward, then drains the remaining backwards. A forward of
microbatch i on stage s starts after stage s-1 finished it and the activation
crossed (c); a backward after stage s+1's backward of i and the gradient
crossed. The iteration time the simulator reports comes from its closed form
(simulate.py); this list schedule is what a timeline shows.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    stage: int
    microbatch: int
    kind: str  # "F" or "B"
    start: float
    end: float


def one_f_one_b(fwd: list[float], bwd: list[float], comm: list[float], microbatches: int) -> list[Op]:
    """fwd[s], bwd[s]: seconds per microbatch on stage s; comm[s]: seconds across boundary s -> s+1."""
    P, m = len(fwd), microbatches
    order = []
    for s in range(P):
        warm = min(P - s - 1, m)
        seq = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < m:
            if f < m:
                seq.append(("F", f))
                f += 1
            seq.append(("B", b))
            b += 1
        order.append(seq)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * P
    pos = [0] * P
    ops: list[Op] = []
    remaining = sum(len(seq) for seq in order)
    while remaining:
        progressed = False
        for s in range(P):
            if pos[s] == len(order[s]):
                continue
            kind, i = order[s][pos[s]]
            if kind == "F":
                dep = 0.0 if s == 0 else done.get(("F", s - 1, i))
                ready = None if dep is None else dep + (comm[s - 1] if s else 0.0)
            else:
                dep = done.get(("F", s, i)) if s == P - 1 else done.get(("B", s + 1, i))
                ready = None if dep is None else dep + (comm[s] if s < P - 1 else 0.0)
            if ready is None:
                continue
            start = max(ready, free[s])
            end = start + (fwd[s] if kind == "F" else bwd[s])
            ops.append(Op(s, i, kind, start, end))
            done[(kind, s, i)] = end
            free[s] = end
            pos[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:  # cannot happen for a valid 1F1B order; guards an infinite loop
            raise RuntimeError("1F1B schedule deadlocked")
    return ops
