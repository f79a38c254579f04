"""Robust fit of `time_us = alpha_us + bytes / (1000 * bw_GBps)` over a message-size sweep.

Probe samples span five or more decades of time (a 1 KB copy takes microseconds, a 256 MB copy takes
milliseconds), so residuals are taken *relative* to the measured time: every sample weighs the same whatever
its size, and the small sizes, which carry the latency, are not drowned by the large ones.

Outliers (a context switch, a clock boost, another tenant on the link) are handled twice: the starting
point is a Theil-Sen line through the per-size medians, and the final fit minimises a soft-L1 loss
(`scipy.optimize.least_squares`) whose scale comes from the median absolute deviation of the residuals, then a Cauchy loss refines it
(slowdowns are one-sided, and a Cauchy loss all but ignores samples far above the line).
Samples further than `OUTLIER_SIGMAS` scales from the line are counted as outliers and left out of the
error estimate.

A fit is `ok` unless the samples do not follow a line at all; the reason is then in `problem` and the
numbers are still reported (they are the best line, just not a trustworthy one).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

OUTLIER_SIGMAS = 4.0
MIN_SCALE = 0.01  # 1 %: below this the noise estimate is not trusted
BAD_MEDIAN_RESIDUAL = 0.10  # median |relative residual| above this: not a line
MIN_INLIER_FRACTION = 0.6


@dataclass
class Fit:
    alpha_us: float
    bw_GBps: float
    alpha_stderr_us: float
    bw_stderr_GBps: float
    n_samples: int
    n_sizes: int
    n_outliers: int
    rel_residual_median: float
    rel_residual_p95: float
    ok: bool
    problem: str | None = None
    method: str = "least squares on relative residuals: Theil-Sen start, soft-L1 then Cauchy loss"

    def as_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 6) if math.isfinite(v) else None
        return d

    def time_us(self, nbytes: float) -> float:
        return self.alpha_us + nbytes / (1000.0 * self.bw_GBps)


def _failed(problem: str, n: int, n_sizes: int) -> Fit:
    nan = float("nan")
    return Fit(nan, nan, nan, nan, n, n_sizes, 0, nan, nan, False, problem)


def _theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Intercept and slope of the Theil-Sen line (median of pairwise slopes)."""
    from scipy.stats import theilslopes

    slope, intercept, _, _ = theilslopes(y, x)
    return float(intercept), float(slope)


def fit_alpha_bw(sizes, times_us) -> Fit:
    """Fit alpha (us) and bandwidth (GB/s) to samples `(sizes[i] bytes, times_us[i])`.

    >>> f = fit_alpha_bw([1e3, 1e6, 1e7, 1e3, 1e6, 1e7], [1.04, 41.0, 401.0, 1.04, 41.0, 401.0])
    >>> round(f.alpha_us, 3), round(f.bw_GBps, 3), f.ok
    (1.0, 25.0, True)
    """
    from scipy.optimize import least_squares

    x = np.asarray(sizes, dtype=float).ravel()
    t = np.asarray(times_us, dtype=float).ravel()
    if x.shape != t.shape:
        return _failed("sizes and times have different lengths", int(t.size), 0)
    good = np.isfinite(x) & np.isfinite(t) & (t > 0) & (x >= 0)
    x, t = x[good], t[good]
    uniq = np.unique(x)
    if x.size < 3 or uniq.size < 2:
        return _failed(f"too few samples to fit a line ({x.size} samples at {uniq.size} sizes; need 3 at 2 sizes)",
                       int(x.size), int(uniq.size))

    med = np.array([np.median(t[x == u]) for u in uniq])
    a0, b0 = _theil_sen(uniq, med)
    b0 = max(b0, 1e-12)
    a0 = max(a0, 0.0)
    r0 = (a0 + b0 * x - t) / t
    scale = max(MIN_SCALE, 1.4826 * float(np.median(np.abs(r0 - np.median(r0)))))

    # Parameters are scaled to order one: alpha in units of the smallest median time, the inverse bandwidth
    # in units of (largest median time / largest size).
    sa = max(float(med.min()), 1e-9)
    sb = max(float(med.max() / uniq.max()), 1e-15)

    def resid(p):
        return (p[0] * sa + p[1] * sb * x - t) / t

    res = least_squares(resid, x0=[a0 / sa, max(b0 / sb, 1e-9)], bounds=([0.0, 1e-12], [np.inf, np.inf]),
                        loss="soft_l1", f_scale=scale, x_scale="jac")
    # Refine with a Cauchy loss, which all but ignores samples far from the line (slowdowns are one-sided,
    # so many of them bias a soft-L1 fit); its scale is the noise of the soft-L1 residuals.
    scale = max(MIN_SCALE, 1.4826 * float(np.median(np.abs(resid(res.x)))))
    res = least_squares(resid, x0=res.x, bounds=([0.0, 1e-12], [np.inf, np.inf]), loss="cauchy",
                        f_scale=scale, x_scale="jac")
    alpha, beta = float(res.x[0] * sa), float(res.x[1] * sb)
    r = resid(res.x)
    absr = np.abs(r)
    # Noise scale of the final residuals, and outliers against it.
    scale = max(MIN_SCALE, 1.4826 * float(np.median(absr)))
    inl = absr <= OUTLIER_SIGMAS * scale
    n_out = int((~inl).sum())

    # Standard errors from the Jacobian of the inliers (plain least squares around the robust solution).
    J = np.column_stack([np.full(x.size, sa) / t, sb * x / t])[inl]
    dof = max(1, int(inl.sum()) - 2)
    s2 = float((r[inl] ** 2).sum()) / dof
    try:
        cov = np.linalg.pinv(J.T @ J) * s2
        a_err = math.sqrt(max(cov[0, 0], 0.0)) * sa
        b_err = math.sqrt(max(cov[1, 1], 0.0)) * sb
    except np.linalg.LinAlgError:  # pragma: no cover - pinv does not raise in practice
        a_err = b_err = float("nan")
    bw = 1.0 / (1000.0 * beta)
    bw_err = bw * (b_err / beta) if beta > 0 else float("nan")

    problem = None
    med_r = float(np.median(absr))
    if med_r > BAD_MEDIAN_RESIDUAL:
        problem = (f"samples do not fit time = alpha + bytes/bw: median relative residual {med_r:.0%} "
                   f"(limit {BAD_MEDIAN_RESIDUAL:.0%})")
    elif inl.mean() < MIN_INLIER_FRACTION:
        problem = f"{n_out} of {x.size} samples are outliers; the line is not trustworthy"
    elif uniq.size < 3:
        problem = "only two message sizes: alpha and bandwidth are not over-determined"
    return Fit(alpha, bw, a_err, bw_err, int(x.size), int(uniq.size), n_out, med_r,
               float(np.percentile(absr, 95)), problem is None, problem)


def robust_ratio(values) -> float:
    """Median of finite values, NaN when there are none."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    return float(np.median(v)) if v.size else float("nan")
