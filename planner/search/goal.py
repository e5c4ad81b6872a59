"""What the user optimizes, and the limits every returned plan must respect."""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import SailorError

OBJECTIVES = ("throughput", "cost", "cost-per-token")


@dataclass(frozen=True)
class Outcome:
    """The numbers a goal looks at, for one candidate plan."""

    iteration_time_s: float
    cost_per_iteration_usd: float
    gpus: int
    zone_gpus: tuple[tuple[str, int], ...] = ()

    @property
    def throughput(self) -> float:
        return 1.0 / self.iteration_time_s

    @property
    def cost_per_hour_usd(self) -> float:
        return self.cost_per_iteration_usd * 3600.0 / self.iteration_time_s


@dataclass(frozen=True)
class Goal:
    """What the search optimizes (objective) and the limits a plan must keep."""

    objective: str = "throughput"
    max_cost_per_iteration: float | None = None  # USD
    max_cost_per_hour: float | None = None  # USD
    min_throughput: float | None = None  # iterations/s
    max_gpus: int | None = None

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise SailorError(f"unknown objective {self.objective!r}: use one of {', '.join(OBJECTIVES)}")
        for name, flag in (("max_cost_per_iteration", "--max-cost-per-iter"), ("min_throughput", "--min-throughput"),
                           ("max_cost_per_hour", "--max-cost-per-hour"), ("max_gpus", "--max-gpus")):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):  # NaN compares false to everything
                raise SailorError(f"{flag} must be a positive number, not {v}")

    def score(self, o: Outcome) -> float:
        """Lower is better. Cost per token ranks like cost per iteration (the batch is fixed)."""
        if self.objective == "throughput":
            return o.iteration_time_s
        return o.cost_per_iteration_usd

    def score_estimate(self, est) -> float:
        """score() of a simulator Estimate."""
        return self.score(Outcome(est.iteration_time_s, est.cost_per_iteration_usd, 0))

    def admits(self, o: Outcome) -> bool:
        return not (
            (self.max_gpus is not None and o.gpus > self.max_gpus)
            or (self.min_throughput is not None and o.throughput < self.min_throughput * (1 - 1e-12))
            or (self.max_cost_per_iteration is not None and o.cost_per_iteration_usd > self.max_cost_per_iteration)
            or (self.max_cost_per_hour is not None and o.cost_per_hour_usd > self.max_cost_per_hour)
        )


NEAR = 0.005  # plans within 0.5 % on both time and cost are the same choice to a user


def shortlist(ranked: list) -> list:
    """The ranked (plan, estimate) pairs worth showing: each beats every better-ranked one on time or on
    cost by more than NEAR; a plan a better-ranked one matches or beats on both is left out."""
    out: list = []
    for plan, est in ranked:
        if not any(e.iteration_time_s <= est.iteration_time_s * (1 + NEAR) and
                   e.cost_per_iteration_usd <= est.cost_per_iteration_usd * (1 + NEAR) for _, e in out):
            out.append((plan, est))
    return out
