"""Robust alpha-beta fit: recovers alpha and bandwidth within 5 % from noisy samples with outliers."""
import random

import pytest

from taccl.profiler.fit import fit_alpha_bw

SIZES = [1 << k for k in range(10, 29)]


def noisy(alpha, bw, seed, sigma=0.02, outliers=0.08, reps=5):
    rng = random.Random(seed)
    xs, ts = [], []
    for s in SIZES:
        for _ in range(reps):
            t = (alpha + s / (bw * 1000.0)) * (1 + rng.gauss(0, sigma))
            if rng.random() < outliers:
                t *= rng.uniform(1.5, 5.0)
            xs.append(s)
            ts.append(t)
    return xs, ts


@pytest.mark.parametrize("alpha,bw", [(0.3, 21.7), (0.3, 43.5), (8.0, 11.5), (2.0, 380.0), (2.6, 9.5), (1.5, 25.0)])
@pytest.mark.parametrize("seed", [1, 2])
def test_recovers_alpha_and_bw_within_5_percent(alpha, bw, seed):
    f = fit_alpha_bw(*noisy(alpha, bw, seed))
    assert f.ok, f.problem
    assert abs(f.alpha_us / alpha - 1) < 0.05
    assert abs(f.bw_GBps / bw - 1) < 0.05
    assert f.n_outliers > 0  # the injected outliers are seen and reported
    assert f.alpha_stderr_us < 0.05 * alpha and f.bw_stderr_GBps < 0.05 * bw


def test_heavy_outliers_still_fit():
    f = fit_alpha_bw(*noisy(1.0, 50.0, 7, outliers=0.3))
    assert abs(f.alpha_us - 1.0) < 0.05 and abs(f.bw_GBps / 50 - 1) < 0.05


def test_exact_line():
    xs = [1e3, 1e6, 1e8] * 2
    f = fit_alpha_bw(xs, [5 + x / 25e3 for x in xs])
    assert f.ok and abs(f.alpha_us - 5) < 1e-6 and abs(f.bw_GBps - 25) < 1e-6


def test_samples_that_do_not_fit_a_line_are_flagged():
    # Time grows with the square of the size: no alpha + bytes/bw describes it.
    xs = [s for s in SIZES for _ in range(3)]
    f = fit_alpha_bw(xs, [1 + (x / 1e6) ** 2 for x in xs])
    assert not f.ok and "do not fit" in f.problem


@pytest.mark.parametrize("xs,ts", [([], []), ([1000], [1.0]), ([1000, 1000, 1000], [1.0, 1.1, 0.9]),
                                   ([1e3, 1e6, 1e7], [float("nan"), -1.0, 0.0])])
def test_too_few_samples_is_not_a_crash(xs, ts):
    f = fit_alpha_bw(xs, ts)
    assert not f.ok and "too few" in f.problem
    assert f.as_dict()["alpha_us"] is None  # NaN becomes null in JSON


def test_bad_samples_are_dropped():
    xs = [1e3, 1e6, 1e7, 1e3, 1e6, 1e7, 1e5]
    ts = [1.04, 41.0, 401.0, 1.04, 41.0, 401.0, float("inf")]
    f = fit_alpha_bw(xs, ts)
    assert f.ok and f.n_samples == 6
