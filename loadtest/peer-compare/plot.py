#!/usr/bin/env python3
"""Draws peer-compare's results.json as one PNG: follow-up hit rate per router at 1 and N
replicas (keep-alive), TTFT p50/p99 per router (1 replica, keep-alive), and the router's added
latency over going direct to a pod, keep-alive and fresh connections. matplotlib (pinned in
requirements.txt, installed by run.sh into the bench venv) because the Rust plotter in
loadtest/src/plot.rs draws one fixed chart of policies.

Usage: plot.py results.json out.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABEL = {"direct": "direct\n(pinned)", "kvindex": "kvindex-\nrouter", "kvindex-own": "kvindex-\nrouter,\nown counts",
         "vllm": "vllm-router\n0.1.17", "sglang": "sglang-router\n0.3.2"}
ORDER = ["direct", "kvindex", "kvindex-own", "vllm", "sglang"]


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src) as f:
        data = json.load(f)
    runs, meta = data["summary"], data["meta"]
    find = {(r["router"], r["replicas"], r["variant"]): r for r in runs}
    routers = [r for r in ORDER if any(k[0] == r for k in find)]
    peers = [r for r in routers if r != "direct"]
    counts = sorted({r["replicas"] for r in runs if r["router"] != "direct"})

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    # Hit rate: grouped by router, one bar per replica count (and the kill variant hatched).
    ax = axes[0]
    width = 0.8 / max(1, 2 * len(counts))
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    for i, n in enumerate(counts):
        for j, variant in enumerate(("keepalive", "kill")):
            values = [(find.get((r, n, variant)) or {}).get("follow_up_hit_rate") or 0 for r in peers]
            pos = [x + (2 * i + j - (2 * len(counts) - 1) / 2) * width for x in range(len(peers))]
            spread = [[v - min(h), max(h) - v] if (h := [x for x in (find.get((r, n, variant)) or {}).get("hit_rates", []) if x is not None]) else [0, 0]
                      for r, v in zip(peers, values)]
            ax.bar(pos, values, width, color=colors[i % 4], alpha=1.0 if variant == "keepalive" else 0.45,
                   yerr=list(zip(*spread)) if any(a or b for a, b in spread) else None, capsize=2, ecolor="#444",
                   hatch=None if variant == "keepalive" else "//",
                   label=f"{n} replica{'s' if n > 1 else ''}" + ("" if variant == "keepalive" else ", pod killed"))
            for x, v in zip(pos, values):
                if v:
                    ax.text(x, 0.03, f"{v:.2f}", ha="center", fontsize=7, rotation=90, color="black")
    direct = find.get(("direct", 1, "keepalive"))
    if direct and direct.get("follow_up_hit_rate"):
        ax.axhline(direct["follow_up_hit_rate"], color="grey", ls="--", lw=1, label="direct, pinned")
    ax.set_xticks(range(len(peers)), [LABEL[r] for r in peers], fontsize=8)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("follow-up hit rate (engine cached / prompt tokens)")
    ax.set_title("Cache hits on follow-up turns (median, min–max)")
    ax.legend(fontsize=7, loc="upper center", ncol=3)

    # TTFT p50 and p99 per router, keep-alive and fresh, 1 replica.
    ax = axes[1]
    for j, variant in enumerate(("keepalive", "fresh")):
        p50 = [((find.get((r, 1, variant)) or {}).get("ttft_p50") or 0) * 1000 for r in routers]
        p99 = [((find.get((r, 1, variant)) or {}).get("ttft_p99") or 0) * 1000 for r in routers]
        pos = [x + (j - 0.5) * 0.4 for x in range(len(routers))]
        ax.bar(pos, p99, 0.38, color=colors[j], alpha=0.35, label=f"p99, {variant}")
        ax.bar(pos, p50, 0.38, color=colors[j], label=f"p50, {variant}")
    ax.set_xticks(range(len(routers)), [LABEL[r] for r in routers], fontsize=8)
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("TTFT, 1 replica")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.2)
    ax.legend(fontsize=7, loc="upper center", ncol=2)

    # Overhead over direct, from the probe.
    ax = axes[2]
    probed = [r for r in peers if (find.get((r, 1, "keepalive")) or {}).get("probe")]
    for j, mode in enumerate(("keepalive", "fresh")):
        values = [find[(r, 1, "keepalive")]["probe"][mode]["overhead_p50"] * 1000 for r in probed]
        pos = [x + (j - 0.5) * 0.4 for x in range(len(probed))]
        ax.bar(pos, values, 0.38, color=colors[j], label=f"{mode} connections")
        for x, v in zip(pos, values):
            ax.annotate(f"{v:.1f}", (x, max(v, 0)), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8)
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xticks(range(len(probed)), [LABEL[r] for r in probed], fontsize=8)
    ax.set_ylabel("TTFT via router − direct, p50 (ms)")
    ax.set_title("Router overhead (sequential probe)")
    ax.set_ylim(min(0, ax.get_ylim()[0]), ax.get_ylim()[1] * 1.3)
    ax.legend(fontsize=7, loc="upper center", ncol=2)

    fig.suptitle(f"peer-compare: {meta['args']['pods']} simulated pods, {meta['args']['conversations']} conversations × "
                 f"{meta['args']['turns']} turns, {meta['args']['tenants']} tenants — {meta['date']}, {meta['commit']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=90)


if __name__ == "__main__":
    main()
