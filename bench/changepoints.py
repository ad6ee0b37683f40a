"""``failslow bench changepoints``: our change-point methods on the Turing Change Point
Dataset (TCPD; van den Burg & Williams, "An Evaluation of Change Point Detection
Algorithms", 2020, arXiv:2003.06222), scored as in that paper and printed beside the
published BOCPD results (issue 3, item 2; Greyhound §4.2's detector on any series).

Metrics (van den Burg & Williams 2020, section "Evaluation Metrics", implemented here from
the definitions):

* **F1 with a margin** (:func:`f_measure`): the index 0 is added to the predictions ``X`` and
  to every annotator's set ``T_k``. A true change point is found when a prediction lies
  within ``margin`` (5) points, each prediction used at most once
  (:func:`true_positives`). Precision counts the matches against the union of all
  annotations, ``P = |TP(T*, X)| / |X|``; recall is averaged over the annotators,
  ``R = 1/K sum_k |TP(T_k, X)| / |T_k|``; ``F1 = 2 P R / (P + R)``.
* **Cover** (:func:`covering`): the segmentation covering of each annotator's partition
  ``A`` by the predicted partition ``A'`` (Arbelaez et al. 2011, eq. 8),
  ``C(A', A) = 1/T sum_{R in A} |R| max_{R' in A'} |R n R'| / |R u R'|``, averaged over the
  annotators.

Data (``--data DIR``): the TCPD files as the dataset repository lays them out
(``datasets/<name>/<name>.json``) or exported flat (``<name>.json``), with
``annotations.json`` (dataset -> annotator -> 0-based indices) in ``DIR`` or above the
dataset files. The data are not part of failslow (their licenses vary); series that need a
download are simply absent and reported as such. Without ``--data`` the benchmark runs on a
small synthetic suite with known change points, so it always has something to measure.

Published figures (:data:`PUBLISHED`): BOCPD's per-dataset F1 and cover in the *default*
experiment (one run with the package defaults) and the *oracle* experiment (the best of a
grid of settings per dataset, an upper bound no fixed setting reaches), copied from the
TCPDBench repository (alan-turing-institute/TCPDBench, ``analysis/output/tables/
{default,best}_{f1,cover}_{uni,multi}_full.json``). Their univariate means (default: 35
datasets where every method ran; oracle: 37) reproduce the paper's aggregate table
(``aggregate_table_wide.tex``): default cover 0.636, F1 0.611; oracle cover 0.789, F1
0.831. ``None``: BOCPD failed on that series (``uk_coal_employ`` has missing values).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from failslow.detectors.changepoints import SERIES_METHODS, segment
from failslow.settings import get_settings

#: The margin (in points) within which a predicted change point matches a true one.
MARGIN = 5

# --------------------------------------------------------------------------------------------
# published BOCPD results (TCPDBench, analysis/output/tables/*_full.json; see module docstring)

_UNI = ("bank", "bitcoin", "brent_spot", "businv", "centralia", "children_per_woman",
        "co2_canada", "construction", "debt_ireland", "gdp_argentina", "gdp_croatia",
        "gdp_iran", "gdp_japan", "global_co2", "homeruns", "iceland_tourism",
        "jfk_passengers", "lga_passengers", "measles", "nile", "ozone", "quality_control_1",
        "quality_control_2", "quality_control_3", "quality_control_4", "quality_control_5",
        "rail_lines", "ratner_stock", "robocalls", "scanline_126007", "scanline_42049",
        "seatbelts", "shanghai_license", "uk_coal_employ", "unemployment_nl",
        "us_population", "usd_isk", "well_log")
_MULTI = ("apple", "bee_waggle_6", "occupancy", "run_log")

# (default F1, default cover, oracle F1, oracle cover), in the order of _UNI then _MULTI
_FIGURES: tuple[tuple[float | None, float | None, float | None, float | None], ...] = (
    (0.0465, 0.0482, 1.0000, 1.0000),  # bank
    (0.5496, 0.7174, 0.6303, 0.8219),  # bitcoin
    (0.3866, 0.5859, 0.6087, 0.6670),  # brent_spot
    (0.2703, 0.4631, 0.5882, 0.6935),  # businv
    (0.6250, 0.6119, 0.7629, 0.7533),  # centralia
    (0.5253, 0.7583, 0.6203, 0.8013),  # children_per_woman
    (0.6193, 0.7164, 0.8926, 0.7729),  # co2_canada
    (0.4815, 0.3953, 0.6957, 0.5855),  # construction
    (0.7603, 0.5845, 0.9583, 0.6875),  # debt_ireland
    (0.9474, 0.6303, 0.9474, 0.7371),  # gdp_argentina
    (1.0000, 0.6417, 1.0000, 0.7083),  # gdp_croatia
    (0.4242, 0.5202, 0.7304, 0.5826),  # gdp_iran
    (0.8000, 0.5780, 1.0000, 0.8021),  # gdp_japan
    (0.4815, 0.6396, 0.8462, 0.7583),  # global_co2
    (0.3696, 0.5260, 0.6592, 0.6938),  # homeruns
    (0.4865, 0.5949, 0.9474, 0.9460),  # iceland_tourism
    (0.2639, 0.5412, 0.7234, 0.8369),  # jfk_passengers
    (0.3993, 0.4962, 0.5348, 0.5474),  # lga_passengers
    (0.0687, 0.0809, 0.9474, 0.9512),  # measles
    (1.0000, 0.8880, 1.0000, 0.8880),  # nile
    (0.6496, 0.6016, 0.8571, 0.6016),  # ozone
    (0.8000, 0.8869, 1.0000, 0.9962),  # quality_control_1
    (1.0000, 0.9272, 1.0000, 0.9272),  # quality_control_2
    (1.0000, 0.9967, 1.0000, 0.9967),  # quality_control_3
    (0.3967, 0.5114, 0.7805, 0.6727),  # quality_control_4
    (1.0000, 1.0000, 1.0000, 1.0000),  # quality_control_5
    (0.8462, 0.7665, 0.8462, 0.7683),  # rail_lines
    (0.5257, 0.7957, 0.7755, 0.9064),  # ratner_stock
    (0.9655, 0.8077, 0.9655, 0.8077),  # robocalls
    (0.2196, 0.3461, 0.6444, 0.6312),  # scanline_126007
    (0.9623, 0.8921, 0.9623, 0.8921),  # scanline_42049
    (0.5833, 0.7565, 0.6829, 0.8001),  # seatbelts
    (0.4646, 0.8558, 0.6364, 0.9197),  # shanghai_license
    (None, None, None, None),  # uk_coal_employ: BOCPD failed (missing values)
    (0.6104, 0.4951, 0.8764, 0.6693),  # unemployment_nl
    (0.2162, 0.2191, 1.0000, 0.7373),  # us_population
    (0.6094, 0.6717, 0.7854, 0.8528),  # usd_isk
    (0.7965, 0.7763, 0.8321, 0.7927),  # well_log
    (0.5131, 0.3653, 0.9157, 0.8461),  # apple
    (0.1207, 0.0894, 0.9286, 0.8911),  # bee_waggle_6
    (0.8074, 0.5490, 0.9186, 0.6450),  # occupancy
    (1.0000, 0.8154, 1.0000, 0.8236),  # run_log
)

#: ``PUBLISHED[dataset]`` = {"default_f1", "default_cover", "oracle_f1", "oracle_cover"} of
#: BOCPD on TCPD (None: failed).
PUBLISHED: dict[str, dict[str, float | None]] = {
    name: dict(zip(("default_f1", "default_cover", "oracle_f1", "oracle_cover"), figs,
                   strict=True))
    for name, figs in zip(_UNI + _MULTI, _FIGURES, strict=True)}

#: Datasets left out of the paper's *default* means because some method failed on them.
DEFAULT_MEAN_EXCLUDED = ("bitcoin", "scanline_126007", "uk_coal_employ")

#: The paper's aggregate BOCPD figures (aggregate_table_wide.tex; the multivariate F1 of the
#: final version, 0.188 default / 0.718 oracle, differs from the per-dataset multivariate
#: tables above, whose means are 0.610 / 0.941: we compare per dataset).
PUBLISHED_MEANS = {"univariate": {"default_cover": 0.636, "default_f1": 0.611,
                                  "oracle_cover": 0.789, "oracle_f1": 0.831},
                   "multivariate": {"default_cover": 0.455, "default_f1": 0.188,
                                    "oracle_cover": 0.801, "oracle_f1": 0.718}}


# --------------------------------------------------------------------------------------------
# metrics


def true_positives(truth: Iterable[int], pred: Iterable[int], margin: int = MARGIN
                   ) -> set[int]:
    """The true change points found by ``pred``: each true point (ascending) takes the
    nearest unused prediction within ``margin`` (ties: the earlier one); a prediction
    matches at most one true point."""
    free = sorted(set(int(x) for x in pred))
    found: set[int] = set()
    for tau in sorted(set(int(t) for t in truth)):
        if not free:
            break
        arr = np.asarray(free)
        dist = np.abs(arr - tau)
        j = int(np.argmin(dist))  # argmin takes the first (smaller x) on ties
        if dist[j] <= margin:
            found.add(tau)
            del free[j]
    return found


def f_measure(annotations: Mapping[str, Sequence[int]], pred: Iterable[int],
              margin: int = MARGIN) -> tuple[float, float, float]:
    """(F1, precision, recall) of ``pred`` against several annotators (van den Burg &
    Williams, "Evaluation Metrics"): 0 is a change point of every set; precision against
    the union of the annotations, recall averaged over the annotators."""
    tks = [set(int(c) for c in cps) | {0} for cps in annotations.values()]
    if not tks:
        raise ValueError("no annotations")
    x = set(int(c) for c in pred) | {0}
    union = set().union(*tks)
    p = len(true_positives(union, x, margin)) / len(x)
    r = float(np.mean([len(true_positives(t, x, margin)) / len(t) for t in tks]))
    f = 0.0 if p + r == 0 else 2 * p * r / (p + r)
    return f, p, r


def _bounds(cps: Iterable[int], n: int) -> np.ndarray:
    """Segment boundaries ``[0, c1, ..., n]`` of the change points inside ``(0, n)``."""
    inner = sorted({int(c) for c in cps if 0 < int(c) < n})
    return np.array([0, *inner, n], dtype=np.int64)


def cover_single(truth_cps: Iterable[int], pred_cps: Iterable[int], n: int) -> float:
    """Covering of the partition of ``range(n)`` given by ``truth_cps`` by the one of
    ``pred_cps``: ``1/n sum_R |R| max_R' J(R, R')`` (J the Jaccard index of two segments),
    vectorized over all segment pairs (segments are intervals)."""
    a = _bounds(truth_cps, n)
    b = _bounds(pred_cps, n)
    a0, a1 = a[:-1, None], a[1:, None]
    b0, b1 = b[None, :-1], b[None, 1:]
    inter = np.clip(np.minimum(a1, b1) - np.maximum(a0, b0), 0, None)
    union = (a1 - a0) + (b1 - b0) - inter
    best = (inter / union).max(axis=1)
    return float(np.sum((a[1:] - a[:-1]) * best) / n)


def covering(annotations: Mapping[str, Sequence[int]], pred: Iterable[int], n: int) -> float:
    """Segmentation covering of the prediction, averaged over the annotators."""
    if not annotations:
        raise ValueError("no annotations")
    p = list(pred)
    return float(np.mean([cover_single(cps, p, n) for cps in annotations.values()]))


# --------------------------------------------------------------------------------------------
# data


@dataclass
class Dataset:
    """One TCPD series: ``values`` is ``(n, d)`` with NaN for missing values."""

    name: str
    values: np.ndarray
    annotations: dict[str, list[int]]

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    @property
    def dims(self) -> int:
        return int(self.values.shape[1])


def parse_tcpd(doc: dict[str, Any]) -> np.ndarray:
    """The ``(n_obs, n_dim)`` float array of a TCPD JSON document (``null``: NaN)."""
    series = doc.get("series")
    if not isinstance(series, list) or not series:
        raise ValueError(f"{doc.get('name', '?')}: no 'series'")
    cols = [np.array([math.nan if v is None else float(v) for v in s["raw"]],
                     dtype=np.float64) for s in series]
    n = len(cols[0])
    if any(len(c) != n for c in cols):
        raise ValueError(f"{doc.get('name', '?')}: series of different lengths")
    return np.stack(cols, axis=1)


def _find_annotations(data: Path) -> Path | None:
    for cand in (data / "annotations.json", data.parent / "annotations.json",
                 data / "analysis" / "annotations" / "annotations.json"):
        if cand.is_file():
            return cand
    return None


def load_tcpd(data: str | Path, names: Sequence[str] | None = None) -> list[Dataset]:
    """The TCPD datasets found under ``data`` that have annotations (sorted by name)."""
    root = Path(data)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory")
    ann_path = _find_annotations(root)
    if ann_path is None:
        raise FileNotFoundError(f"{root}: no annotations.json")
    annotations: dict[str, dict[str, list[int]]] = json.loads(ann_path.read_text())
    out = []
    for path in sorted(root.rglob("*.json")):
        name = path.stem
        if name not in annotations or (names and name not in names):
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or "series" not in doc:
            continue
        ann = {str(k): [int(c) for c in v] for k, v in annotations[name].items()}
        out.append(Dataset(name, parse_tcpd(doc), ann))
    seen: set[str] = set()
    unique = []
    for ds in out:
        if ds.name not in seen:
            seen.add(ds.name)
            unique.append(ds)
    return sorted(unique, key=lambda d: d.name)


def synthetic_suite(seed: int = 0) -> list[Dataset]:
    """Small series with known change points (level, variance, trend, multivariate, gaps,
    outliers, constant and very short), each "annotated" by two annotators who agree up to a
    point, for a run without the TCPD files."""
    rng = np.random.default_rng(seed)
    out: list[Dataset] = []

    def add(name: str, x: np.ndarray, cps: list[int]) -> None:
        x2 = x if x.ndim == 2 else x[:, None]
        out.append(Dataset(name, x2, {"a": cps, "b": [c + 1 for c in cps]}))

    add("level", np.concatenate([rng.normal(0, 1, 120), rng.normal(3, 1, 100),
                                 rng.normal(1, 1, 80)]), [120, 220])
    add("variance", np.concatenate([rng.normal(5, 0.5, 150), rng.normal(5, 3, 150)]), [150])
    add("trend_break", np.concatenate([np.arange(100) * 0.1, 10 - np.arange(100) * 0.1])
        + rng.normal(0, 0.3, 200), [100])
    spikes = rng.normal(10, 1, 250)
    spikes[[40, 90, 160]] += 15
    add("outliers_no_change", spikes, [])
    m = rng.normal(0, 1, (240, 3))
    m[80:, 1] += 3
    m[170:, 2] -= 3
    add("multivariate", m, [80, 170])
    g = np.concatenate([rng.normal(100, 5, 90), rng.normal(130, 5, 90)])
    g[[10, 11, 50, 120]] = np.nan
    add("missing", g, [90])
    add("constant", np.full(60, 7.0), [])
    add("short", np.array([1.0, 1.2, 0.9, 5.1, 5.0, 5.2]), [3])
    return out


# --------------------------------------------------------------------------------------------
# the benchmark


def evaluate(datasets: Sequence[Dataset], methods: Sequence[str] = SERIES_METHODS
             ) -> dict[str, Any]:
    """Scores of every method on every dataset, the published BOCPD figures beside them,
    and the means (over all datasets, and over those with a published default)."""
    rows: list[dict[str, Any]] = []
    for ds in datasets:
        row: dict[str, Any] = {"dataset": ds.name, "n": ds.n, "dims": ds.dims}
        for method in methods:
            t0 = time.perf_counter()
            cps = segment(ds.values, method)
            secs = time.perf_counter() - t0
            f1, _, _ = f_measure(ds.annotations, cps)
            row[method] = {"f1": round(f1, 4), "cover": round(covering(ds.annotations, cps,
                                                                       ds.n), 4),
                           "changepoints": cps, "seconds": round(secs, 3)}
        if ds.name in PUBLISHED:
            row["published_bocpd"] = PUBLISHED[ds.name]
        rows.append(row)
    means: dict[str, Any] = {}
    groups = {"all": [r for r in rows],
              "univariate": [r for r in rows if r["dims"] == 1],
              "multivariate": [r for r in rows if r["dims"] > 1]}
    for gname, grp in groups.items():
        if not grp:
            continue
        g: dict[str, Any] = {"datasets": len(grp)}
        for method in methods:
            g[method] = {k: round(float(np.mean([r[method][k] for r in grp])), 4)
                         for k in ("f1", "cover")}
        # head to head with the published default, on the datasets where it exists
        comp = [r for r in grp if r.get("published_bocpd", {}).get("default_f1") is not None]
        if comp:
            h: dict[str, Any] = {"datasets": len(comp)}
            for key in ("default_f1", "default_cover", "oracle_f1", "oracle_cover"):
                vals = [r["published_bocpd"][key] for r in comp
                        if r["published_bocpd"][key] is not None]
                h[f"bocpd_{key}"] = round(float(np.mean(vals)), 4) if vals else None
            for method in methods:
                h[method] = {k: round(float(np.mean([r[method][k] for r in comp])), 4)
                             for k in ("f1", "cover")}
                h[method]["wins_f1"] = sum(
                    r[method]["f1"] >= r["published_bocpd"]["default_f1"] - 1e-9
                    for r in comp)
            g["vs_published"] = h
        means[gname] = g
    names = {r["dataset"] for r in rows}
    missing = sorted(set(PUBLISHED) - names) if names & set(PUBLISHED) else []
    return {"datasets": rows, "means": means, "missing_published_datasets": missing,
            "margin": MARGIN, "methods": list(methods)}


def _table(res: dict[str, Any]) -> str:
    methods = res["methods"]
    head = f"{'dataset':<20}{'n':>5}{'d':>3}" + "".join(
        f"{m + ' F1':>11}{'cover':>7}" for m in methods) + f"{'BOCPD F1':>10}{'cover':>7}" \
        f"{'oracle':>8}{'cover':>7}"
    lines = [head]

    def fmt(v: float | None, w: int) -> str:
        return f"{'-':>{w}}" if v is None else f"{v:>{w}.3f}"

    for r in res["datasets"]:
        pub = r.get("published_bocpd", {})
        line = f"{r['dataset']:<20}{r['n']:>5}{r['dims']:>3}" + "".join(
            fmt(r[m]["f1"], 11) + fmt(r[m]["cover"], 7) for m in methods)
        line += fmt(pub.get("default_f1"), 10) + fmt(pub.get("default_cover"), 7)
        line += fmt(pub.get("oracle_f1"), 8) + fmt(pub.get("oracle_cover"), 7)
        lines.append(line)
    for gname, g in res["means"].items():
        lines.append(f"mean {gname} ({g['datasets']} datasets): " + ", ".join(
            f"{m} F1 {g[m]['f1']:.3f} cover {g[m]['cover']:.3f}" for m in methods))
        h = g.get("vs_published")
        if h:
            lines.append(
                f"  vs published BOCPD on {h['datasets']} datasets: default F1 "
                f"{h['bocpd_default_f1']:.3f} cover {h['bocpd_default_cover']:.3f}; oracle F1 "
                f"{h['bocpd_oracle_f1']:.3f} cover {h['bocpd_oracle_cover']:.3f}; ours: "
                + ", ".join(f"{m} F1 {h[m]['f1']:.3f} cover {h[m]['cover']:.3f} "
                            f"(F1 >= BOCPD on {h[m]['wins_f1']})" for m in methods))
    if res["missing_published_datasets"]:
        lines.append("not in --data: " + " ".join(res["missing_published_datasets"]))
    return "\n".join(lines)


def run(data: str | None) -> dict[str, Any]:
    """The benchmark over ``data`` (a TCPD directory) or, without it, the synthetic suite
    (``$FAILSLOW_TCPD`` names a default directory)."""
    tcpd = get_settings().bench.tcpd
    data = data or (str(tcpd) if tcpd else None)
    if data:
        datasets = load_tcpd(data)
        if not datasets:
            raise FileNotFoundError(f"{data}: no annotated TCPD series found")
        source = str(data)
    else:
        datasets = synthetic_suite()
        source = "synthetic"
    res = evaluate(datasets)
    res["source"] = source
    return res


def bench_changepoints(args: argparse.Namespace) -> dict[str, Any]:
    """``failslow bench changepoints [--data DIR] [--json]``: per-dataset rows and means."""
    try:
        res = run(getattr(args, "data", None))
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    if not getattr(args, "json", False):
        # the per-dataset table on stderr; the figures (one line per group) on stdout
        print(_table(res), file=sys.stderr)
        flat: dict[str, Any] = {"source": res["source"], "margin": res["margin"]}
        for gname, g in res["means"].items():
            h = g.get("vs_published")
            flat[f"{gname} ({g['datasets']})"] = ", ".join(
                f"{m} F1 {g[m]['f1']:.3f} cover {g[m]['cover']:.3f}" for m in res["methods"])
            if h:
                flat[f"{gname} published BOCPD ({h['datasets']})"] = (
                    f"default F1 {h['bocpd_default_f1']:.3f} cover "
                    f"{h['bocpd_default_cover']:.3f}, oracle F1 {h['bocpd_oracle_f1']:.3f} "
                    f"cover {h['bocpd_oracle_cover']:.3f}; ours there: " + ", ".join(
                        f"{m} F1 {h[m]['f1']:.3f} cover {h[m]['cover']:.3f}"
                        for m in res["methods"]))
        return flat
    out: dict[str, Any] = {"source": res["source"], "margin": res["margin"],
                           "means": res["means"],
                           "missing_published_datasets": res["missing_published_datasets"]}
    out["datasets"] = {r["dataset"]: {k: v for k, v in r.items() if k != "dataset"}
                       for r in res["datasets"]}
    return out


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "changepoints": bench_changepoints,
}
