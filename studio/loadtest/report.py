"""The report as people read it: a line per level, a table (text or Markdown) and a PNG."""

from __future__ import annotations

from typing import Any

from engine.stream_stats import format_summary


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def format_level(level: dict[str, Any]) -> str:
    line = f"{level['clients']} clients: {format_summary(level)}"
    if level.get("whole_file_s"):
        w = level["whole_file_s"]
        line += f"; whole files p50 {w['p50']:.3f} s, p95 {w['p95']:.3f} s"
    return line


TABLE_COLUMNS = ("clients", "requests", "ok", "errors", "first chunk p50 / p95 / p99 (s)",
                 "stream speed min / p50 (x real time)", "audio s/s (vs 1 client)", "server RSS peak (MB)",
                 "client host load (1 min)")


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    base = next((lv["audio_s_per_s"] for lv in report["levels"] if lv["clients"] == 1), 0.0)
    for lv in report["levels"]:
        fc, sp, mem = lv["first_chunk_s"] or {}, lv["stream_speed"] or {}, lv["server_memory"]
        errors = ", ".join(f"{k}: {v}" for k, v in lv["errors"].items()) or "0"
        rows.append([str(lv["clients"]), str(lv["requests"]), str(lv["completed"]), errors,
                     " / ".join(_fmt(fc.get(p), ".2f") for p in ("p50", "p95", "p99")),
                     " / ".join(_fmt(sp.get(p), ".2f") for p in ("min", "p50")),
                     f"{lv['audio_s_per_s']:.2f}" + (f" ({lv['audio_s_per_s'] / base:.2f}x)" if base else ""),
                     f"{mem['rss_mb']['peak']:.0f}" if isinstance(mem, dict) else "n/a",
                     _fmt(lv.get("client_host_load_1m"), ".1f")])
    return rows


MIX_COLUMNS = ("clients", "ok / sent", "errors", "stream first chunk p50 / p95 (s)",
               "slowest stream (x real time)", "streams below real time", "whole file p50 / p95 (s)", "audio s/s")
BREAKDOWN_COLUMNS = ("clients", "mode / language", "ok / sent", "errors", "first chunk p50 / p95 (s)",
                     "speed min / p50 (x real time)", "latency p50 / p95 (s)", "audio s/s")


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in errors.items()) or "0"


def _pair(spread: dict[str, Any] | None, a: str = "p50", b: str = "p95", spec: str = ".2f") -> str:
    spread = spread or {}
    return f"{_fmt(spread.get(a), spec)} / {_fmt(spread.get(b), spec)}"


def mix_rows(levels: list[dict[str, Any]]) -> list[list[str]]:
    """One row per level of a mixed run (first chunk and speed over the streams only)."""
    rows = []
    for lv in levels:
        sp = lv.get("stream_speed") or {}
        streams = lv.get("stream_requests") or {}
        below = sp.get("below_real_time")
        rows.append([str(lv["clients"]), f"{lv['completed']} / {lv['requests']}", _errors(lv["errors"]),
                     _pair(lv.get("first_chunk_s")), _fmt(sp.get("min"), ".2f"),
                     "-" if below is None else f"{below} of {streams.get('completed', '?')}",
                     _pair(lv.get("whole_file_s")), f"{lv['audio_s_per_s']:.1f}"])
    return rows


def breakdown_rows(levels: list[dict[str, Any]], group: str = "by_mode_language") -> list[list[str]]:
    """One row per level and (mode, language) of a mixed run."""
    rows = []
    for lv in levels:
        for key, s in (lv.get(group) or {}).items():
            rows.append([str(lv["clients"]), key, f"{s['completed']} / {s['requests']}", _errors(s["errors"]),
                         _pair(s.get("first_chunk_s")), _pair(s.get("stream_speed"), "min", "p50"),
                         _pair(s.get("latency_s")), f"{s['audio_s_per_s']:.1f}"])
    return rows


def render_table(columns: tuple[str, ...] | list[str], rows: list[list[str]], markdown: bool = False) -> list[str]:
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        return lines + ["| " + " | ".join(r) + " |" for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*columns).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


def format_table(report: dict[str, Any], markdown: bool = False) -> str:
    """The levels as a text table (or a Markdown one, for docs/benchmarks.md); a mixed run adds its
    breakdown per mode and language."""
    if "mix" in report.get("workload", {}):
        lines = render_table(MIX_COLUMNS, mix_rows(report["levels"]), markdown)
        lines += ["", "per mode and language:"]
        lines += render_table(BREAKDOWN_COLUMNS, breakdown_rows(report["levels"]), markdown)
    else:
        lines = render_table(TABLE_COLUMNS, table_rows(report), markdown)
    note = report.get("server_memory_source", "")
    if note.startswith("n/a"):
        lines.append(f"server memory {note}")
    return "\n".join(lines)


def draw_png(report: dict[str, Any], path: str) -> str:
    """First-chunk latency and total throughput against clients, as a PNG (needs matplotlib: the
    ``plot`` extra). Returns what was done, for the user."""
    try:
        from matplotlib.figure import Figure  # the object API: no pyplot, no global backend switch
    except ImportError:
        return (f"no PNG written to {path}: drawing needs matplotlib (pip install 'sovits-studio[plot]'); "
                f"the JSON and the table hold the same figures")
    levels = [lv for lv in report["levels"] if lv["first_chunk_s"]]
    clients = [lv["clients"] for lv in report["levels"]]
    fig = Figure(figsize=(10, 4), dpi=100)
    ax1, ax2 = fig.subplots(1, 2)
    for key, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
        ax1.plot([lv["clients"] for lv in levels], [lv["first_chunk_s"][key] for lv in levels], style, label=key)
    ax1.set(xlabel="concurrent clients", ylabel="first chunk (s)", title="First-chunk latency")
    ax1.legend()
    ax2.plot(clients, [lv["audio_s_per_s"] for lv in report["levels"]], "o-", label="all streams together")
    ax2.plot(clients, clients, color="grey", lw=0.8, ls=":", label="every client at real time")
    ax2.set(xlabel="concurrent clients", ylabel="audio seconds per second", title="Total throughput")
    ax2.legend()
    for ax in (ax1, ax2):  # log-log: latencies and rates span decades between 1 and many clients
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.grid(alpha=0.3)
    fig.suptitle(f"{report['endpoint']} at {report['url']} ({report['mode']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return f"wrote {path}"
