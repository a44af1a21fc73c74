"""The audit report: text, JSON and PNG plots (matplotlib, Agg backend)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .analysis import Analysis


@dataclass
class AuditReport:
    """Everything one audit found. `epsilon_lb` holds at confidence `confidence`: if the mechanism
    is (epsilon, delta)-DP, `verdict == "VIOLATION"` happens with probability ≤ 1 − confidence."""

    target: str                 # the SQL audited, or a description of the Python mechanism
    mode: str                   # "sql", "controller", "callable", "samples"
    epsilon: float
    delta: float
    confidence: float
    neighbour_kind: str
    neighbour: str              # description of the chosen D′ (no data values)
    samples: int                # per side
    analysis: Analysis
    candidates: list[tuple[str, float]] = field(default_factory=list)  # (description, pilot score)
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    outputs_d: np.ndarray | None = field(default=None, repr=False)
    outputs_dprime: np.ndarray | None = field(default=None, repr=False)
    files: dict[str, str] = field(default_factory=dict)

    # -- headline ------------------------------------------------------------------------------
    @property
    def epsilon_lb(self) -> float:
        return self.analysis.epsilon_lb

    @property
    def violation(self) -> bool:
        return self.analysis.violation

    @property
    def verdict(self) -> str:
        return "VIOLATION" if self.violation else "consistent"

    # -- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        a = self.analysis
        best = a.best
        mi = a.membership
        return {
            "target": self.target,
            "mode": self.mode,
            "claimed": {"epsilon": self.epsilon, "delta": self.delta},
            "confidence": self.confidence,
            "neighbour": {"relation": self.neighbour_kind, "chosen": self.neighbour,
                          "candidates": [{"description": d, "pilot_epsilon": _num(s)}
                                         for d, s in self.candidates]},
            "samples_per_side": self.samples,
            "coordinates": a.names,
            "epsilon_lower_bound": _num(self.epsilon_lb),
            "verdict": self.verdict,
            "best": best.method if best else None,
            "certificates": [{
                "method": c.method, "event": c.event, "numerator": c.favours,
                "held_out_d": {"n": c.n_d, "in_event": c.k_d},
                "held_out_dprime": {"n": c.n_dprime, "in_event": c.k_dprime},
                "p_numerator_lower": _num(c.p_num_lower), "p_denominator_upper": _num(c.p_den_upper),
                "epsilon_lower_bound": _num(c.epsilon_lb), "alpha": c.alpha,
                "selection_epsilon": _num(c.selection_score),
            } for c in a.certificates],
            "membership_inference": None if mi is None else {
                "method": mi.method, "event": mi.event, "accuracy": _num(mi.accuracy),
                "accuracy_lower": _num(mi.accuracy_lower), "advantage": _num(mi.advantage),
                "bound": _num(mi.bound), "exceeds_bound": mi.exceeds_bound},
            "epsilon_lb_vs_samples": {"certification_samples": a.curve_sizes,
                                      "by_method": {k: [_num(v) for v in vs] for k, vs in a.curves.items()}},
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
            "notes": self.notes,
            "files": self.files,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def text(self) -> str:
        a = self.analysis
        lines = [
            f"DPCH audit — {self.mode}: {self.target}",
            f"  claimed       ε = {self.epsilon:g}, δ = {self.delta:g}",
            f"  neighbours    {self.neighbour_kind}: {self.neighbour}",
            f"  samples       {self.samples:,} per side (half selects events, half certifies)",
            f"  confidence    {self.confidence:.10g}",
            "",
            f"  {'method':<28} {'event':<44} {'ε_LB':>7}",
        ]
        for c in a.certificates:
            event = c.event if c.favours == "D" else f"{c.event}  [favours D′]"
            lines.append(f"  {c.method:<28} {_clip(event, 44):<44} {c.epsilon_lb:7.3f}")
        lines += ["", f"  empirical ε lower bound: {self.epsilon_lb:.3f} (claimed {self.epsilon:g}) "
                      f"at confidence {self.confidence:.10g}"]
        mi = a.membership
        if mi is not None:
            lines.append(f"  membership inference: accuracy {mi.accuracy:.4f} (lower bound "
                         f"{mi.accuracy_lower:.4f}) vs bound (e^ε+δ)/(1+e^ε) = {mi.bound:.4f}"
                         + ("  EXCEEDED" if mi.exceeds_bound else ""))
        if self.candidates and len(self.candidates) > 1:
            lines.append(f"  worst-case search: {len(self.candidates)} candidate neighbours piloted")
        for note in self.notes:
            lines.append(f"  note: {note}")
        if self.timings:
            lines.append("  time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.timings.items()))
        for kind, path in self.files.items():
            lines.append(f"  {kind}: {path}")
        lines += ["", f"  verdict: {self.verdict}"
                  + (f" (ε_LB {self.epsilon_lb:.3f} > claimed ε {self.epsilon:g})" if self.violation else "")]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    # -- files ---------------------------------------------------------------------------------
    def save(self, report_dir: str | Path) -> dict[str, str]:
        """Write report.txt, report.json, histograms.png and epsilon_vs_samples.png."""
        out = Path(report_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {"json": str(out / "report.json"), "text": str(out / "report.txt")}
        if self.outputs_d is not None and self.outputs_dprime is not None:
            files["histograms"] = str(out / "histograms.png")
            plot_histograms(self.outputs_d, self.outputs_dprime, self.analysis.names, files["histograms"])
        files["epsilon_vs_samples"] = str(out / "epsilon_vs_samples.png")
        plot_curve(self.analysis, files["epsilon_vs_samples"])
        self.files = files
        Path(files["json"]).write_text(self.to_json())
        Path(files["text"]).write_text(self.text() + "\n")
        return files


def _num(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _clip(s: str, width: int) -> str:
    return s if len(s) <= width else s[: width - 1] + "…"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_histograms(out_d: np.ndarray, out_dp: np.ndarray, names: list[str], path: str,
                    max_panels: int = 6) -> None:
    plt = _pyplot()
    d = np.asarray(out_d, dtype=float).reshape(len(out_d), -1)
    dp = np.asarray(out_dp, dtype=float).reshape(len(out_dp), -1)
    k = min(d.shape[1], max_panels)
    fig, axes = plt.subplots(1, max(k, 1), figsize=(5 * max(k, 1), 3.6), squeeze=False)
    for j in range(k):
        ax = axes[0, j]
        a, b = d[:, j], dp[:, j]
        a, b = a[np.isfinite(a)], b[np.isfinite(b)]
        pooled = np.concatenate([a, b])
        if pooled.size == 0:
            ax.set_title(f"{names[j]} (no finite outputs)")
            continue
        lo, hi = np.quantile(pooled, [0.001, 0.999])
        uniq = np.unique(pooled[(pooled >= lo) & (pooled <= hi)])
        if uniq.size <= 80 and np.all(uniq == np.round(uniq)):
            bins = np.arange(uniq.min() - 0.5, uniq.max() + 1.5)
        else:
            bins = np.linspace(lo, hi, 60) if hi > lo else 30
        ax.hist(a, bins=bins, alpha=0.55, label="D", density=True, color="tab:blue")
        ax.hist(b, bins=bins, alpha=0.55, label="D′", density=True, color="tab:orange")
        ax.set_title(_clip(names[j], 40))
        ax.legend()
    fig.suptitle("Mechanism outputs on D and D′")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curve(analysis: Analysis, path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for method, values in analysis.curves.items():
        ax.plot(analysis.curve_sizes, values, marker="o", label=method)
    ax.axhline(analysis.epsilon, color="red", linestyle="--", label=f"claimed ε = {analysis.epsilon:g}")
    ax.set_xscale("log")
    ax.set_xlabel("held-out samples per side used for certification")
    ax.set_ylabel(f"ε lower bound (confidence {analysis.confidence:.6g})")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
