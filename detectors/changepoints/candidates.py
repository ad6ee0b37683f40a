"""Change-point candidates over iteration times (Greyhound §4.2, "Slow iteration detection",
step 1): Bayesian online change-point detection (Adams & MacKay 2007) with a Normal-Gamma
prior and a Student-t predictive on ``log(iteration time)``, and the sliding-window baseline
detector. Both only propose candidates; :mod:`.tracker` verifies them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The relative change below which a level shift is jitter (Greyhound §4.2: 10%).
DEFAULT_THRESHOLD = 0.10


@dataclass
class BOCDConfig:
    """Hyper-parameters of :class:`BOCD` (values on the log scale)."""

    hazard: float = 1.0 / 100.0  # constant hazard H = 1/lambda
    max_run: int = 128  # truncation of the run-length posterior
    kappa0: float = 0.05  # prior pseudo-count of the mean
    alpha0: float = 2.0  # Gamma shape of the precision
    sigma0: float = 0.03  # prior noise scale (3% in log-time)
    cp_mass: float = 0.9  # posterior mass on short runs that makes a candidate (Greyhound: 0.9)
    short_run: int = 4  # "short" run lengths: r <= short_run


class BOCD:
    """Adams & MacKay's run-length posterior over a univariate stream (Greyhound §4.2, 1)).

    ``update(x)`` returns the index of a change-point candidate, or None. A candidate is
    reported when the posterior mass on run lengths ``<= short_run`` exceeds ``cp_mass``;
    its index is the start of the most probable short run. Each change is reported once.
    """

    def __init__(self, config: BOCDConfig | None = None) -> None:
        self.config = config or BOCDConfig()
        self.t = 0  # observations seen
        self.mu0 = math.nan  # prior mean, set from the first observation
        self.log_r = np.zeros(1)  # log P(r_t = r | x_1:t), r = 0..len-1
        self.mu = np.zeros(1)
        self.kappa = np.zeros(1)
        self.alpha = np.zeros(1)
        self.beta = np.zeros(1)
        self.last_cp = 0  # index of the last reported change (start of the current run)
        a = self.config.alpha0 + 0.5 * np.arange(self.config.max_run + 1)
        self._lgamma_ratio = np.array([math.lgamma(v + 0.5) - math.lgamma(v) for v in a])

    def _prior(self) -> tuple[float, float, float, float]:
        c = self.config
        return self.mu0, c.kappa0, c.alpha0, c.alpha0 * c.sigma0 ** 2

    def update(self, x: float) -> int | None:
        c = self.config
        if self.t == 0:
            self.mu0 = float(x)
            mu, kappa, alpha, beta = self._prior()
            # r_1 = 1: the first observation opens the first run
            self.mu = np.array([mu, (kappa * mu + x) / (kappa + 1)])
            self.kappa = np.array([kappa, kappa + 1])
            self.alpha = np.array([alpha, alpha + 0.5])
            self.beta = np.array([beta, beta])
            self.log_r = np.array([-np.inf, 0.0])
            self.t = 1
            return None
        # Student-t predictive of x under every run length (vectorized over r); alpha at
        # index r is alpha0 + r/2, so the Gamma-function terms come from a fixed table
        scale2 = self.beta * (self.kappa + 1) / (self.alpha * self.kappa)
        nu = 2 * self.alpha
        z = (x - self.mu) ** 2 / (nu * scale2)
        log_pred = (self._lgamma_ratio[:len(nu)] - 0.5 * np.log(nu * np.pi * scale2)
                    - (nu + 1) / 2 * np.log1p(z))
        log_joint = self.log_r + log_pred
        log_growth = log_joint + math.log1p(-c.hazard)
        log_cp = np.logaddexp.reduce(log_joint) + math.log(c.hazard)
        # r_t = 0 is "a run starts after x_t"; r_t = r + 1 grows the run containing x_t
        new_log_r = np.concatenate(([log_cp], log_growth))
        mu, kappa, alpha, beta = self._prior()
        new_mu = np.concatenate(([mu], (self.kappa * self.mu + x) / (self.kappa + 1)))
        new_beta = np.concatenate(([beta], self.beta + self.kappa * (x - self.mu) ** 2
                                   / (2 * (self.kappa + 1))))
        new_kappa = np.concatenate(([kappa], self.kappa + 1))
        new_alpha = np.concatenate(([alpha], self.alpha + 0.5))
        if len(new_log_r) > c.max_run:
            # truncation: fold the tail into the longest kept run length
            tail = np.logaddexp.reduce(new_log_r[c.max_run - 1:])
            new_log_r = new_log_r[:c.max_run]
            new_log_r[-1] = tail
            new_mu, new_beta = new_mu[:c.max_run], new_beta[:c.max_run]
            new_kappa, new_alpha = new_kappa[:c.max_run], new_alpha[:c.max_run]
        new_log_r -= np.logaddexp.reduce(new_log_r)
        self.log_r, self.mu, self.beta = new_log_r, new_mu, new_beta
        self.kappa, self.alpha = new_kappa, new_alpha
        self.t += 1
        short = np.exp(new_log_r[1:c.short_run + 1])
        if short.sum() < c.cp_mass:
            return None
        run = 1 + int(np.argmax(short))  # observations in the most probable short run
        start = self.t - run
        if start <= self.last_cp:
            return None
        self.last_cp = start
        return start

    def run_length_posterior(self) -> np.ndarray:
        return np.exp(self.log_r)

    def snapshot(self) -> dict[str, Any]:
        return {"t": self.t, "mu0": None if math.isnan(self.mu0) else self.mu0,
                "log_r": _floats(self.log_r), "mu": _floats(self.mu),
                "kappa": _floats(self.kappa), "alpha": _floats(self.alpha),
                "beta": _floats(self.beta), "last_cp": self.last_cp}

    def restore(self, state: dict[str, Any]) -> None:
        self.t = int(state["t"])
        self.mu0 = math.nan if state["mu0"] is None else float(state["mu0"])
        for name in ("log_r", "mu", "kappa", "alpha", "beta"):
            setattr(self, name, _array(state[name]))
        self.last_cp = int(state["last_cp"])


def _floats(a: np.ndarray) -> list[float | str]:
    """JSON-safe floats (``-inf`` is kept as a string)."""
    return [float(v) if math.isfinite(v) else str(float(v)) for v in a]


def _array(values: list[Any]) -> np.ndarray:
    return np.array([float(v) for v in values], dtype=np.float64)


def bocd_candidates(series: np.ndarray, config: BOCDConfig | None = None) -> list[int]:
    """Unverified BOCD change-point candidates of ``series`` (positive values, log scale)."""
    detector = BOCD(config)
    out = []
    for x in np.log(np.asarray(series, dtype=np.float64)):
        cp = detector.update(float(x))
        if cp is not None:
            out.append(cp)
    return out


def window_candidates(series: np.ndarray, w: int = 3, big_w: int = 10,
                      threshold: float = DEFAULT_THRESHOLD) -> list[int]:
    """Sliding-window baseline detector: index ``i`` is a candidate when the median of
    ``series[i:i+w]`` and ``series[i]`` itself differ from the median of ``series[i-W:i]``
    by more than ``threshold``; a run of such indices yields its first index."""
    x = np.asarray(series, dtype=np.float64)
    n = len(x)
    if n < w + 2:
        return []
    idx = np.arange(1, n - w + 1)
    before = np.array([np.median(x[max(0, i - big_w):i]) for i in idx])
    after = np.array([np.median(x[i:i + w]) for i in idx])
    first = x[idx]
    hit = (np.abs(after / before - 1.0) > threshold) & (np.abs(first / before - 1.0) > threshold)
    starts = idx[hit & ~np.concatenate(([False], hit[:-1]))]
    return [int(i) for i in starts]

