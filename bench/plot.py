#!/usr/bin/env python3
"""Decode and prefill tokens/s against depth, one line per KV mode (and --h2d-limit), from
`kvstream bench --json` files; the streaming bound max(T_gpu, S/B) as a dashed line where a run
streamed (S: bytes streamed per token, B: the host-to-device bandwidth measured in that run,
T_gpu: the resident decode time per token at that depth when the files hold a resident run,
else the run's own time less its waits for copies and the CPU), and for split runs
max(T_gpu, S/B, S_cpu/B_cpu) (S_cpu: bytes the CPU attended per token, B_cpu: its measured
rate). Writes PREFIX.png and PREFIX.svg.

    bench/plot.py bench/results/a.json [b.json ...] -o docs/stream-chart
"""
import argparse
import json
import os
import sys


def load(paths):
    runs, title = [], None
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        title = title or f"{os.path.basename(d['model'])} on {d['device']}"
        for r in d["runs"]:
            r = dict(r)
            r["kv"] = f"{r['cache_type_k']}/{r['cache_type_v']}"
            runs.append(r)
    return runs, title


def bound_tps(runs, r):
    """Tokens/s allowed by max(T_gpu, S/B) for a streaming run, or by max(T_gpu, S/B,
    S_cpu/B_cpu) for a split run (S_cpu: the bytes the CPU attended per token, B_cpu: its
    measured rate), or None."""
    s, b = r.get("streamed_bytes_per_token", 0), r.get("h2d_bytes_per_s", 0)
    if s <= 0 or b <= 0:
        return None
    res = [x for x in runs if x["mode"] == "resident" and x["depth"] == r["depth"] and x["kv"] == r["kv"]]
    if res:
        t_gpu = 1.0 / res[0]["tg_tokens_per_s"]
    else:
        t_gpu = (1.0 / r["tg_tokens_per_s"] - r.get("ready_wait_s_per_token", 0.0)
                 - r.get("cpu_wait_s_per_token", 0.0))
    t = max(t_gpu, s / b)
    if r.get("cpu_bytes_per_s", 0) > 0:
        t = max(t, r["cpu_bytes_per_token"] / r["cpu_bytes_per_s"])
    return 1.0 / t


def depth_label(d):
    return f"{d // 1024}K" if d >= 1024 and d % 1024 == 0 else str(d)


def series_label(mode, kv, limit):
    link = f", link limited to {limit / 1e9:.1f} GB/s" if limit else ""
    return f"{mode} ({kv}{link})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="files written by kvstream bench --json")
    ap.add_argument("-o", "--out", required=True, help="output prefix (PREFIX.png, PREFIX.svg)")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        sys.exit("bench/plot.py: needs matplotlib (.venv/bin/pip install matplotlib)")
    runs, title = load(a.json)
    if not runs:
        sys.exit("bench/plot.py: no runs in the files")
    panels = [("tg_tokens_per_s", "decode")]
    if any(r.get("pp_tokens_per_s") for r in runs):
        panels.append(("pp_tokens_per_s", "prefill"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    depths = sorted({r["depth"] for r in runs})
    for ax, (key, name) in zip(axes[0], panels):
        # A series per mode, cache types and --h2d-limit (0: the link as it is).
        series = sorted({(r["mode"], r["kv"], r.get("h2d_limit", 0)) for r in runs})
        for mode, kv, limit in series:
            mine = [r for r in runs if r["mode"] == mode and r["kv"] == kv and r.get("h2d_limit", 0) == limit]
            pts = sorted((r["depth"], r[key]) for r in mine if r.get(key))
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                           label=series_label(mode, kv, limit))
            if name == "decode" and mode in ("stream", "auto", "split"):
                b = sorted((r["depth"], bound_tps(runs, r)) for r in mine)
                b = [p for p in b if p[1] is not None]
                if b:
                    terms = "T_gpu, S/B, S_cpu/B_cpu" if mode == "split" else "T_gpu, S/B"
                    ax.plot([p[0] for p in b], [p[1] for p in b], "--", color=line[0].get_color(),
                            linewidth=1, label=f"bound max({terms}) ({mode})")
        ax.set_xscale("symlog", linthresh=1024)
        ax.set_xticks(depths)
        ax.set_xticklabels([depth_label(d) for d in depths])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_yscale("log")
        ax.set_xlabel("depth (tokens in the KV cache)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{name}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{a.out}.{ext}", dpi=120)
    print(f"wrote {a.out}.png and {a.out}.svg")


if __name__ == "__main__":
    main()
