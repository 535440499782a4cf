"""Physical bounds of the analytic constants, the bounded search space, and Nelder-Mead.

Every continuous constant is searched in an unconstrained variable z that a scaled sigmoid
maps into its bounds (on a log scale where the bounds span decades), so no optimizer step
can leave the physical range. FlashAttention efficiencies are bounded by the published
fwd+bwd range for the GPU's architecture, not just by (0, 1].

    box = bounds_for("a100_80gb")["flash2_efficiency"]    # Bound(lo=0.5, hi=0.73)
    best, value = nelder_mead(loss, np.zeros(3))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from layoutsearch.costs.constants import DISCRETE_VALUES


@dataclass(frozen=True, kw_only=True, slots=True)
class Bound:
    """A constant's physical range; `log` searches it on a log scale."""

    lo: float
    hi: float
    log: bool = False

    def clip(self, value: float) -> float:
        return float(min(max(value, self.lo), self.hi))

    def to_free(self, value: float) -> float:
        """z with from_free(z) = value (values on a bound map just inside it)."""
        lo, hi, x = self._scale(self.lo), self._scale(self.hi), self._scale(self.clip(value))
        u = min(max((x - lo) / (hi - lo), 1e-6), 1 - 1e-6)
        return float(np.log(u / (1 - u)))

    def from_free(self, z: float) -> float:
        lo, hi = self._scale(self.lo), self._scale(self.hi)
        x = lo + (hi - lo) / (1 + np.exp(-z))
        return self.clip(float(np.exp(x)) if self.log else float(x))

    def _scale(self, value: float) -> float:
        return float(np.log(value)) if self.log else value


FRACTION = Bound(lo=0.01, hi=1.0)
"""Efficiencies: a fraction of a datasheet rate, above 1 % (below it a run would not finish)."""

PHYSICAL: dict[str, Bound] = {
    "gemm_efficiency": FRACTION,
    "flash1_efficiency": FRACTION,
    "flash2_efficiency": FRACTION,
    "flash3_efficiency": FRACTION,
    "memory_bandwidth_efficiency": FRACTION,
    "nvlink_efficiency": FRACTION,
    "network_efficiency": Bound(lo=0.01, hi=1.0, log=True),
    # 0.1 µs to 1 ms per kernel launch (PyTorch eager dispatch is ~5-20 µs).
    "kernel_overhead_s": Bound(lo=1e-7, hi=1e-3, log=True),
    # A share of what the model leaves exposed; ~1 % would be all but the last bucket hidden.
    "dp_comm_exposed": Bound(lo=0.01, hi=1.0),
    # CUDA context alone is ~0.5 GiB; more than 16 GiB outside the tensors is not overhead.
    "memory_overhead_gib": Bound(lo=0.0, hi=16.0),
    # The counted tensors are a floor up to a few unfused copies; 0.5 leaves room for
    # tensors memory.py counts that a kernel frees early.
    "activation_memory_factor": Bound(lo=0.5, hi=4.0, log=True),
    # At least the bf16 logits (2 bytes); at most bf16 + fp32 copies, softmax and gradient.
    "logit_bytes": Bound(lo=2.0, hi=32.0, log=True),
}
"""Bounds of every continuous constant of `AnalyticConstants`."""

DISCRETE = DISCRETE_VALUES
"""Constants that take one of a few values."""

# FlashAttention fwd+bwd (head dim 128, causal) as a fraction of the dense bf16 peak.
# Ampere: FA-1 25-40 %, FA-2 50-73 % (Dao 2023, "FlashAttention-2", figs. 4-6).
# Hopper: FA-1 ~20-30 %, FA-2 35-45 %, FA-3 50-75 % (Shah et al. 2024, "FlashAttention-3",
# figs. 5-7).
_AMPERE = {"flash1_efficiency": Bound(lo=0.25, hi=0.40),
           "flash2_efficiency": Bound(lo=0.50, hi=0.73)}
_HOPPER = {"flash1_efficiency": Bound(lo=0.20, hi=0.30),
           "flash2_efficiency": Bound(lo=0.35, hi=0.45),
           "flash3_efficiency": Bound(lo=0.50, hi=0.75)}
PUBLISHED: dict[str, dict[str, Bound]] = {
    "a100_80gb": _AMPERE, "a100_40gb": _AMPERE, "h100_sxm": _HOPPER, "h200": _HOPPER,
}
"""Published ranges that narrow the physical bounds, per GPU kind of the catalog."""


def bounds_for(gpu: str) -> dict[str, Bound]:
    """The bounds of every continuous constant for one GPU kind."""
    return {**PHYSICAL, **PUBLISHED.get(gpu, {})}


def coordinate_scan(f: Callable[[np.ndarray], float], x0: np.ndarray, *, points: int = 13,
                    sweeps: int = 2) -> tuple[np.ndarray, float]:
    """Minimize f one coordinate at a time over a grid spanning each bound (z in [-3.5, 3.5],
    3 % to 97 % of the range): a global start for Nelder-Mead, which alone stays in the basin
    of its start (e.g. a network efficiency of 0.8 where the measured cluster gives 0.05).
    """
    best, value = x0.copy(), f(x0)
    grid = np.linspace(-3.5, 3.5, points)
    for _ in range(sweeps):
        for i in range(len(best)):
            for z in grid:
                trial = best.copy()
                trial[i] = z
                trial_value = f(trial)
                if trial_value < value:
                    best, value = trial, trial_value
    return best, value


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, *, max_evals: int = 600,
                step: float = 0.3, tol: float = 1e-7) -> tuple[np.ndarray, float]:
    """Minimize f from x0 (standard coefficients: reflect 1, expand 2, contract ½, shrink ½).

    Written here in numpy: a dozen parameters need no more, and layoutsearch does not take
    on scipy for one optimizer.
    """
    n = len(x0)
    simplex = np.vstack([x0] + [x0 + step * np.eye(n)[i] for i in range(n)])
    values = np.array([f(x) for x in simplex])
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] < tol:
            break
        centroid = simplex[:-1].mean(axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        evals += 1
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            evals += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            evals += 1
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [f(x) for x in simplex[1:]]
                evals += n
    best = int(np.argmin(values))
    return simplex[best], float(values[best])
