"""Fits over measured points whose terms are physical times, so none can come out negative.

The rule check (`fit_rule`) explains each decode step's TPOT by the resources it spends:

    TPOT = overhead + weight bytes / bw_w + KV bytes / bw_kv + compute_s * k_c

with every coefficient >= 0 (non-negative least squares, scipy.optimize.nnls): `overhead` is a
time per step, `bw_w` and `bw_kv` effective bandwidths, `compute_s` each point's arithmetic at the
rates the device probe measured (k_c = 1 when the probe is right). A term whose regressor does not
vary across the points is not identifiable there and is left out (its time is in the others).
The one-term line a bytes-only rule draws (`bytes_only`) is kept beside it: where it needs a
negative intercept, the points are not bound by bytes alone, and `bound` names what they are.

The prefill fit (`fit_prefill`) splits TTFT over prompt lengths P as a + b*P + c*P^2 (all >= 0):
the linear part is the weights' matmuls, the quadratic part attention over the prompt; `crossover`
is the P where the quadratic part passes the linear one (b / c).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from quantkit.core.record_checks import RecordError, checked

# Regressors of the rule check, in the order they are tried (a later one joins only if it adds rank).
TERMS = ("overhead", "weight_bytes", "kv_bytes", "compute_s")
RANK_TOL = 1e-9  # relative singular value below which a term adds no information
GOOD_FIT = 0.15  # every point within this of the model: the rule check holds


def nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0; columns scaled to unit norm first (the terms'
    units differ by ten orders of magnitude)."""
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(x / scale, y)
    return coef / scale


def _independent(columns: list[np.ndarray]) -> list[int]:
    """Indices of the columns kept, in order, each adding rank to those before it."""
    kept: list[int] = []
    for i, col in enumerate(columns):
        trial = np.column_stack([columns[j] for j in kept] + [col])
        trial = trial / np.maximum(np.linalg.norm(trial, axis=0), 1e-300)
        s = np.linalg.svd(trial, compute_uv=False)
        if s[-1] > RANK_TOL * s[0] and s[-1] > 1e-6:
            kept.append(i)
    return kept


@dataclass(frozen=True)
class RuleFit:
    """The rule check over a run's points: non-negative terms (see the module docstring).

    `coef` maps each term that entered to its coefficient (overhead: seconds; weight_bytes and
    kv_bytes: seconds per byte; compute_s: dimensionless); terms absent did not vary across the
    points. `bytes_only_overhead_ms` is the intercept of an unconstrained line through
    (bytes per token, TPOT): negative where bytes alone cannot be the model. `bound` is the
    resource holding most of the points' modelled time."""

    points: int
    coef: dict
    r2: float | None
    measured_over_model: tuple[float, ...] = ()  # each point's TPOT over the model's, in the order fitted
    shares: dict | None = None  # each term's share of the modelled time, summed over the points
    bound: str | None = None  # bandwidth | compute | overhead
    bytes_only_overhead_ms: float | None = None
    bytes_only_gbps: float | None = None
    # terms that did not vary but took time at every point (one model's weight bytes at several depths):
    # the constant holds their time too, so it is not the overhead alone
    constant_holds: tuple[str, ...] = ()

    @property
    def overhead_ms(self) -> float | None:
        return self.coef["overhead"] * 1e3 if "overhead" in self.coef else None

    @property
    def effective_gbps(self) -> float | None:
        """What the weights' bytes stream at in the fit (1 / the weight-bytes coefficient)."""
        c = self.coef.get("weight_bytes")
        return 1.0 / c / 1e9 if c else None

    @property
    def kv_gbps(self) -> float | None:
        c = self.coef.get("kv_bytes")
        return 1.0 / c / 1e9 if c else None

    @property
    def worst_deviation(self) -> float | None:
        """The largest |measured / model - 1| over the points."""
        devs = [abs(m - 1.0) for m in self.measured_over_model if np.isfinite(m)]
        return max(devs) if devs else None

    @property
    def holds(self) -> bool | None:
        """Every point within GOOD_FIT of the model (None without a fit)."""
        worst = self.worst_deviation
        return None if worst is None else worst <= GOOD_FIT

    def model_s(self, x: dict) -> float | None:
        """The model's TPOT for one point's regressors (`x`: term -> value; None without a fit)."""
        if not self.coef:
            return None
        return sum(c * (1.0 if t == "overhead" else x.get(t, 0.0)) for t, c in self.coef.items())

    def to_json(self) -> dict:
        """The record, and for readers its derived figures (`from_json` recomputes them)."""
        return {
            **self.__dict__,
            "measured_over_model": list(self.measured_over_model),
            "constant_holds": list(self.constant_holds),
            **{k: getattr(self, k) for k in DERIVED},
        }

    @classmethod
    def from_json(cls, data: dict) -> "RuleFit":
        data = {k: v for k, v in data.items() if k not in DERIVED} if isinstance(data, dict) else data
        d = checked(cls, data, "rule-check fit")
        if not isinstance(d["coef"], dict) or any(
            t not in TERMS or not isinstance(v, (int, float)) or v < 0 or not np.isfinite(v)
            for t, v in d["coef"].items()
        ):
            raise RecordError(f"rule-check fit: coefficients must be finite and >= 0 per term of {TERMS}")
        return cls(
            **{
                **d,
                "measured_over_model": tuple(d["measured_over_model"]),
                "constant_holds": tuple(d["constant_holds"]),
            }
        )


DERIVED = ("overhead_ms", "effective_gbps", "kv_gbps", "worst_deviation", "holds")


def describe_fit(fit: RuleFit) -> str | None:
    """The rule check in one line: its terms, how well it holds, the resource that binds the points,
    and where a bytes-only line would have needed a negative time per step. None without a fit."""
    if not fit.coef:
        return None
    terms = []
    if "overhead" in fit.coef:
        held = " and ".join(t.replace("_", " ") for t in fit.constant_holds)
        terms.append(f"{fit.overhead_ms:.2f} ms" + (f" (fixed, with the {held}' time)" if held else ""))
    if fit.effective_gbps:
        terms.append(f"weight bytes / {fit.effective_gbps:.1f} GB/s")
    if fit.kv_gbps:
        terms.append(f"KV bytes / {fit.kv_gbps:.1f} GB/s")
    if fit.coef.get("compute_s"):
        terms.append(f"{fit.coef['compute_s']:.2f} x the measured arithmetic")
    absent = [t for t in TERMS if t not in fit.coef and t not in fit.constant_holds]
    line = (
        f"rule check over {fit.points} points (non-negative terms): TPOT = {' + '.join(terms) or '0'}; "
        f"R² {fit.r2:.3f}, every point within {fit.worst_deviation:.0%} of the model"
    )
    if fit.shares and fit.bound:
        line += f"; bound by {fit.bound} ({by_resource(fit.shares)[fit.bound]:.0%} of the modelled time)"
    if fit.constant_holds:
        line += (
            f"; {', '.join(fit.constant_holds)} did not vary across the points, so the constant holds their time and "
            "no resource is named: bench several variants to separate them"
        )
    if absent:
        line += f"; {', '.join(absent)} did not vary across the points (or moved with another term)"
    if fit.bytes_only_overhead_ms is not None and fit.bytes_only_overhead_ms < 0:
        line += (
            f"; a bytes-only line would need {fit.bytes_only_overhead_ms:.2f} ms per step, which no step can take: "
            f"the points are not bound by bytes alone"
        )
    if fit.holds is False:
        line += f" (!) a point lies {fit.worst_deviation:.0%} from the model: something no term models took time there"
    return line


def _bytes_only(bytes_per_token: np.ndarray, y: np.ndarray) -> tuple[float | None, float | None]:
    if len(y) < 2 or np.ptp(bytes_per_token) == 0:
        return None, None
    slope, intercept = np.polyfit(bytes_per_token, y, 1)
    return float(intercept) * 1e3, (1.0 / slope / 1e9 if slope > 0 else None)


def fit_rule(points: list[dict], tpot_s: list[float]) -> RuleFit:
    """The rule check over points (`points[i]`: term -> regressor, for weight_bytes, kv_bytes and
    compute_s) and their measured TPOTs in seconds. Fewer than two points: no fit."""
    y = np.asarray(tpot_s, dtype=float)
    n = len(y)
    if n < 2:
        return RuleFit(points=n, coef={}, r2=None)
    cols = [np.ones(n)] + [np.asarray([p.get(t, 0.0) for p in points], float) for t in TERMS[1:]]
    kept = _independent(cols)
    held = tuple(
        TERMS[i]
        for i in range(1, len(TERMS))
        if i not in kept and np.abs(cols[i]).max() > 0 and np.ptp(cols[i]) <= 1e-9 * np.abs(cols[i]).max()
    )
    x = np.column_stack([cols[i] for i in kept])
    beta = nonneg_lstsq(x, y)
    model = x @ beta
    ss_res, ss_tot = float(((y - model) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    coef = {TERMS[i]: float(b) for i, b in zip(kept, beta)}
    parts = {TERMS[i]: float((x[:, j] * beta[j]).sum()) for j, i in enumerate(kept)}
    total = sum(parts.values())
    shares = {t: v / total for t, v in parts.items()} if total > 0 else None
    w = np.asarray([p.get("weight_bytes", 0.0) for p in points]) + np.asarray([p.get("kv_bytes", 0.0) for p in points])
    only_overhead, only_gbps = _bytes_only(w, y)
    return RuleFit(
        points=n,
        coef=coef,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        measured_over_model=tuple(float(m / p) if p > 0 else float("nan") for m, p in zip(y, model)),
        shares=shares,
        bound=resource_of(shares) if shares and not held else None,
        bytes_only_overhead_ms=only_overhead,
        bytes_only_gbps=only_gbps,
        constant_holds=held,
    )


def by_resource(shares: dict) -> dict:
    """Term shares summed by resource: bandwidth (weight and KV bytes), compute, overhead."""
    return {
        "bandwidth": shares.get("weight_bytes", 0.0) + shares.get("kv_bytes", 0.0),
        "compute": shares.get("compute_s", 0.0),
        "overhead": shares.get("overhead", 0.0),
    }


def resource_of(shares: dict) -> str:
    """The resource with the largest share."""
    by = by_resource(shares)
    return max(by, key=by.get)


@dataclass(frozen=True)
class PrefillFit:
    """TTFT = a + b*P + c*P^2 over a prompt sweep, each term >= 0 (ms, ms per token, ms per token²);
    `excluded` the prompt lengths kept out of it (their prefills were disturbed)."""

    fixed_ms: float
    per_token_ms: float
    per_token2_ms: float
    points: int
    r2: float | None
    crossover_tokens: float | None  # P where c*P^2 passes b*P (None: no quadratic part measured)
    measured_over_model: tuple[float, ...] = ()
    excluded: tuple[int, ...] = ()

    def model_ms(self, prompt_len: float) -> float:
        return self.fixed_ms + self.per_token_ms * prompt_len + self.per_token2_ms * prompt_len**2

    def to_json(self) -> dict:
        return {**self.__dict__, "measured_over_model": list(self.measured_over_model), "excluded": list(self.excluded)}

    @classmethod
    def from_json(cls, data: dict) -> "PrefillFit":
        d = checked(cls, {"excluded": [], **data} if isinstance(data, dict) else data, "prefill fit")
        return cls(**{**d, "measured_over_model": tuple(d["measured_over_model"]), "excluded": tuple(d["excluded"])})


def fit_prefill(prompt_lens: list[int], ttft_ms: list[float], disturbed: list[bool] | None = None) -> PrefillFit | None:
    """The prefill split over at least three distinct undisturbed prompt lengths (None with fewer).
    Each point weighs by its relative error: a sweep spans two or three orders of magnitude, and an
    absolute fit would let the longest prompt decide the fixed part of the shortest."""
    bad = list(disturbed or [False] * len(prompt_lens))
    kept = [i for i, b in enumerate(bad) if not b]
    if len({prompt_lens[i] for i in kept}) < 3:
        return None
    p = np.asarray([prompt_lens[i] for i in kept], float)
    y = np.asarray([ttft_ms[i] for i in kept], float)
    x = np.column_stack([np.ones_like(p), p, p**2])
    a, b, c = nonneg_lstsq(x / y[:, None], np.ones_like(y))
    model = x @ np.array([a, b, c])
    ss_res, ss_tot = float(((y - model) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    return PrefillFit(
        fixed_ms=float(a),
        per_token_ms=float(b),
        per_token2_ms=float(c),
        points=len(y),
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        crossover_tokens=float(b / c) if c > 0 else None,
        measured_over_model=tuple(float(m / q) if q > 0 else float("nan") for m, q in zip(y, model)),
        excluded=tuple(int(prompt_lens[i]) for i, b in enumerate(bad) if b),
    )
