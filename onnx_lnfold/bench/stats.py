"""The statistics every timing reports: a median with a bootstrap 95% interval, over processes and
their rounds (`nested_ratio`: fresh processes, each running the variants in interleaved rounds),
over processes alone (`across_processes`: one figure per process), or over paired rounds
(`ratio_of_medians`: a round's timings were taken side by side and are resampled together)."""

from __future__ import annotations

import numpy as np

BOOTSTRAP = 4000


def across_processes(values: list[float], n_boot: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Median of per-process ratios, their range, and a bootstrap 95% interval of the median."""
    a = np.asarray(values, float)
    boot = np.median(np.random.default_rng(seed).choice(a, size=(n_boot, len(a))), axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"ratio": float(np.median(a)), "lo": float(lo), "hi": float(hi), "min": float(a.min()),
            "max": float(a.max()), "per_process": [float(x) for x in a]}


def nested_ratio(a, b, n_boot: int = BOOTSTRAP, seed: int = 0) -> dict:
    """The median over processes of each process's median(a) / median(b), with a two-level
    bootstrap 95% interval: processes resampled, and within each the paired rounds (a[p][i] and
    b[p][i] ran in one interleaved round), so the interval holds the spread between processes and
    the spread between rounds. `a`, `b`: [processes][rounds] wall times."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    processes, rounds = a.shape
    per_process = np.median(a, axis=1) / np.median(b, axis=1)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, processes, size=(n_boot, processes))
    rows = rng.integers(0, rounds, size=(n_boot, processes, rounds))
    ra = np.take_along_axis(a[pick], rows, axis=2)
    rb = np.take_along_axis(b[pick], rows, axis=2)
    boot = np.median(np.median(ra, axis=2) / np.median(rb, axis=2), axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"ratio": float(np.median(per_process)), "lo": float(lo), "hi": float(hi), "min": float(per_process.min()),
            "max": float(per_process.max()), "per_process": [float(x) for x in per_process]}


def ratio_of_medians(a, b, n_boot: int = BOOTSTRAP, seed: int = 0) -> dict:
    """median(a) / median(b) with a paired bootstrap 95% interval (rounds are resampled together:
    a[i] and b[i] were measured in the same interleaved round)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = len(a)
    point = float(np.median(a) / np.median(b))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    boot = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"ratio": point, "lo": float(lo), "hi": float(hi), "n": n}


def fmt_ratio(r: dict | None, digits: int = 3) -> str:
    if not r:
        return "-"
    return f"{r['ratio']:.{digits}f} [{r['lo']:.{digits}f}, {r['hi']:.{digits}f}]"


def fmt_across(r: dict) -> str:
    """A ratio over processes as the reports write it: x1.002 [0.984, 1.021] (processes 0.983-1.034)."""
    return f"x{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] (processes {r['min']:.3f}-{r['max']:.3f})"


def half_width(r: dict) -> float:
    """How far the interval reaches from the ratio, the larger side: the smallest change it resolves."""
    return max(r["hi"] - r["ratio"], r["ratio"] - r["lo"])
