"""PNG plots from bench/out/results.json: time vs rows (log–log) per system, RMSE vs ε per system."""
from __future__ import annotations

from pathlib import Path

from systems import ALL, LABELS
from workloads import QUERIES

STYLE = {
    "plain": dict(color="0.4", marker="s", linestyle="--"),
    "dpch_sql": dict(color="tab:blue", marker="o"),
    "dpch_controller": dict(color="tab:cyan", marker="D"),
    "dpch_accel": dict(color="tab:purple", marker="*"),
    "smartnoise": dict(color="tab:red", marker="^"),
    "pipelinedp": dict(color="tab:orange", marker="v"),
    "opendp_polars": dict(color="tab:green", marker="P"),
}


def make_plots(data: dict, out_dir: Path) -> list[Path]:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    speed = [r for r in data.get("speed", []) if r.get("status") == "ok"]
    if speed:
        qids = [q for q in QUERIES if any(r["qid"] == q for r in speed)]
        fig, axes = plt.subplots(1, len(qids), figsize=(4.6 * len(qids), 4.2), squeeze=False)
        for ax, qid in zip(axes[0], qids):
            for system in ALL:
                pts = sorted((r["rows"], r["median_s"], r["min_s"], r["max_s"]) for r in speed
                             if r["qid"] == qid and r["system"] == system)
                if not pts:
                    continue
                x = [p[0] for p in pts]
                y = [p[1] for p in pts]
                err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
                ax.errorbar(x, y, yerr=err, label=LABELS[system], capsize=3, **STYLE[system])
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("rows")
            ax.set_ylabel("wall time per query (s), median, min–max")
            ax.set_title(f"({qid}) {QUERIES[qid].title}", fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / "time_vs_rows.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    acc = [r for r in data.get("accuracy", []) if r.get("status") == "ok"]
    panels = []
    for qid in QUERIES:
        for stat in QUERIES[qid].stats:
            eps_set = {r["eps"] for r in acc if r["qid"] == qid and stat in r.get("stats", {})}
            if len(eps_set) >= 2:
                panels.append((qid, stat))
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 4.2), squeeze=False)
        for ax, (qid, stat) in zip(axes[0], panels):
            for system in ALL:
                # like with like: the controller's count before its clamp at 0 (peers release unclamped)
                st = stat + "_unclamped" if system == "dpch_controller" and stat == "count" else stat
                pts = sorted((r["eps"], r["stats"][st]["rmse"]) for r in acc
                             if r["qid"] == qid and r["system"] == system and st in r.get("stats", {}))
                if pts:
                    label = LABELS[system] + (" (unclamped)" if st != stat else "")
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **STYLE[system])
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("ε per released statistic")
            ax.set_ylabel(f"RMSE of {stat}")
            ax.set_title(f"({qid}) {stat}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / "rmse_vs_epsilon.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
