"""``scrapekit report``: one self-contained HTML page of a run, drawn from its stats history
(work/<name>/stats/*.jsonl) and stats.json. Inline CSS and SVG drawn here: viewing it fetches
nothing, and every piece of text from the run is HTML-escaped."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from .state import running_pid
from .stats import TOP_DOMAINS, read_json, read_snapshots
from .units import format_size

Point = tuple[float, float]
Format = Callable[[float], str]

WIDTH, HEIGHT = 640, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 30, 40  # room for tick labels, title and axis label
DAY = 86_400.0
TOTALS = ("done", "failed", "buried", "items", "bytes", "retries")
_NUMERIC = ' class="n"'

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:60em}
h1{margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd}
.state{color:#555} .running{color:#1a7f37;font-weight:bold}
table{border-collapse:collapse;margin:.5em 0} td,th{padding:.2em .8em;border-bottom:1px solid #eee}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
svg.chart{display:block;margin:.8em 0;background:#fcfcfc;border:1px solid #eee}
svg .axis{stroke:#555;stroke-width:1} svg .tick{stroke:#555} svg text{font-size:11px;fill:#333}
svg .title{font-size:13px;font-weight:bold} svg .series{fill:none;stroke:#0969da;stroke-width:1.5}
svg .dot{fill:#0969da} svg .bar{fill:#54aeff} svg .limit{stroke:#cf222e;stroke-dasharray:4 3}
svg .nodata{fill:#888;font-size:13px}
"""


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a finite JSON number (not a bool), else None: snapshots may lack keys."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sum(snapshot: Mapping[str, Any], keys: Sequence[str]) -> float | None:
    values = [_number(snapshot.get(key)) for key in keys]
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _increase(before: float, after: float) -> float:
    """How much a counter grew; a counter that went down was reset, so it grew by its new value."""
    return after - before if after >= before else max(after, 0.0)


def _format_number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def _format_size(value: float) -> str:
    return format_size(int(value))


def _utc(t: float, fmt: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    return time.strftime(fmt, time.gmtime(t))


def _time_format(points: Sequence[Point]) -> Format:
    """Hours and minutes (UTC) for a chart spanning up to a day, dates past that."""
    span = max(p[0] for p in points) - min(p[0] for p in points) if points else 0.0
    fmt = "%Y-%m-%d" if span > DAY else "%H:%M"
    return lambda t: _utc(t, fmt)


# -- SVG --------------------------------------------------------------------------------------

def _frame(chart_id: str, title: str, y_label: str, x_label: str) -> list[str]:
    bottom, right = HEIGHT - _BOTTOM, WIDTH - _RIGHT
    return [
        f'<svg class="chart" id="chart-{escape(chart_id)}" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text class="title" x="{_LEFT}" y="18">{escape(title)}</text>',
        f'<line class="axis" x1="{_LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}"/>',
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}"/>',
        f'<text x="{(_LEFT + right) / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle">{escape(x_label)}</text>',
        f'<text x="14" y="{(_TOP + bottom) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(_TOP + bottom) / 2:.0f})">{escape(y_label)}</text>',
    ]


def _y_ticks(low: float, high: float, fmt: Format) -> list[str]:
    """Tick marks and labels at the minimum (bottom) and maximum (top) of the y axis."""
    out = []
    for value, y in ((low, HEIGHT - _BOTTOM), (high, _TOP)):
        out.append(f'<line class="tick" x1="{_LEFT - 4}" y1="{y}" x2="{_LEFT}" y2="{y}"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4}" text-anchor="end">{escape(fmt(value))}</text>')
    return out


def _no_data(parts: list[str]) -> str:
    parts.append(f'<text class="nodata" x="{WIDTH / 2:.0f}" y="{HEIGHT / 2:.0f}" text-anchor="middle">no data</text>')
    return "\n".join(parts + ["</svg>"])


def line_chart(points: Sequence[Point], *, chart_id: str, title: str, y_label: str, x_label: str = "time (UTC)",
               x_format: Format = _format_number, y_format: Format = _format_number) -> str:
    """An inline SVG line chart of ``points`` (x, y), x ascending; y from 0 (or below, if a value
    is) up to the largest value. Ticks with labels at the ends of both axes; "no data" if empty."""
    parts = _frame(chart_id, title, y_label, x_label)
    if not points:
        return _no_data(parts)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_low, x_high = min(xs), max(xs)
    y_low, y_high = min(0.0, min(ys)), max(ys)
    if y_high <= y_low:
        y_high = y_low + 1.0
    left, right, top, bottom = _LEFT, WIDTH - _RIGHT, _TOP, HEIGHT - _BOTTOM

    def sx(x: float) -> float:
        return (left + right) / 2 if x_high == x_low else left + (x - x_low) / (x_high - x_low) * (right - left)

    def sy(y: float) -> float:
        return bottom - (y - y_low) / (y_high - y_low) * (bottom - top)

    parts += _y_ticks(y_low, y_high, y_format)
    ends = ((x_low, left, "start"), (x_high, right, "end")) if x_high > x_low else ((x_low, sx(x_low), "middle"),)
    for x, px, anchor in ends:
        parts.append(f'<line class="tick" x1="{px:.1f}" y1="{bottom}" x2="{px:.1f}" y2="{bottom + 4}"/>')
        parts.append(f'<text x="{px:.1f}" y="{bottom + 15}" text-anchor="{anchor}">{escape(x_format(x))}</text>')
    parts.append('<polyline class="series" points="' + " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points) + '"/>')
    if len(points) == 1:  # a polyline of one point draws nothing
        parts.append(f'<circle class="dot" cx="{sx(xs[0]):.1f}" cy="{sy(ys[0]):.1f}" r="3"/>')
    return "\n".join(parts + ["</svg>"])


def bar_chart(bars: Sequence[tuple[str, float]], *, chart_id: str, title: str, y_label: str, x_label: str = "",
              limit: float | None = None, y_format: Format = _format_number) -> str:
    """An inline SVG bar chart, one labelled bar per (label, value); ``limit``, when set, is drawn
    as a dashed line across, and the y axis reaches up to it."""
    parts = _frame(chart_id, title, y_label, x_label)
    if not bars:
        return _no_data(parts)
    left, right, top, bottom = _LEFT, WIDTH - _RIGHT, _TOP, HEIGHT - _BOTTOM
    y_high = max([value for _, value in bars] + [limit or 0.0]) or 1.0
    parts += _y_ticks(0.0, y_high, y_format)
    slot = (right - left) / len(bars)
    width = min(40.0, slot * 0.7)
    for i, (label, value) in enumerate(bars):
        height = max(value, 0.0) / y_high * (bottom - top)
        x = left + i * slot + (slot - width) / 2
        parts.append(f'<rect class="bar" x="{x:.1f}" y="{bottom - height:.1f}" width="{width:.1f}" '
                     f'height="{height:.1f}"><title>{escape(label)}: {escape(y_format(value))}</title></rect>')
        if len(bars) <= 8 or i in (0, len(bars) - 1):
            parts.append(f'<text x="{x + width / 2:.1f}" y="{bottom + 15}" text-anchor="middle">{escape(label)}</text>')
    if limit:
        y = bottom - limit / y_high * (bottom - top)
        parts.append(f'<line class="limit" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
        parts.append(f'<text x="{right}" y="{y - 4:.1f}" text-anchor="end">limit {escape(y_format(limit))}</text>')
    return "\n".join(parts + ["</svg>"])


# -- series from the snapshots ---------------------------------------------------------------

def _timed(snapshots: Sequence[Mapping[str, Any]]) -> list[tuple[float, Mapping[str, Any]]]:
    """The snapshots that say when they were taken, oldest first."""
    timed = [(t, s) for s in snapshots if (t := _number(s.get("updated_at"))) is not None]
    return sorted(timed, key=lambda ts: ts[0])


def _rate_points(timed: Sequence[tuple[float, Mapping[str, Any]]]) -> list[Point]:
    """Pages done per second: the growth of ``done`` over the time between snapshots (exact),
    or the snapshot's own ``rate`` where that cannot be had."""
    points = []
    if len(timed) == 1 and (rate := _number(timed[0][1].get("rate"))) is not None:
        points.append((timed[0][0], max(rate, 0.0)))
    for (t0, a), (t1, b) in zip(timed, timed[1:]):
        d0, d1 = _number(a.get("done")), _number(b.get("done"))
        if t1 > t0 and d0 is not None and d1 is not None:
            points.append((t1, _increase(d0, d1) / (t1 - t0)))
        elif (rate := _number(b.get("rate"))) is not None:
            points.append((t1, max(rate, 0.0)))
    return points


def _error_points(timed: Sequence[tuple[float, Mapping[str, Any]]]) -> list[Point]:
    """Requests that failed or were buried in each interval between snapshots."""
    points = []
    for (_, a), (t1, b) in zip(timed, timed[1:]):
        e0, e1 = _sum(a, ("failed", "buried")), _sum(b, ("failed", "buried"))
        if e0 is not None and e1 is not None:
            points.append((t1, _increase(e0, e1)))
    return points


def _queue_points(timed: Sequence[tuple[float, Mapping[str, Any]]]) -> list[Point]:
    points = []
    for t, s in timed:
        size = _sum(_mapping(s.get("queue")), ("ready", "delayed", "reserved"))
        if size is not None:
            points.append((t, size))
    return points


def _daily_bytes(timed: Sequence[tuple[float, Mapping[str, Any]]]) -> list[tuple[str, float]]:
    """Body bytes per UTC day: the largest ``bandwidth.day_bytes`` seen that day, so a count lost
    by a restart does not hide what was fetched before it."""
    days: dict[str, float] = {}
    for t, s in timed:
        bandwidth = _mapping(s.get("bandwidth"))
        day_bytes = _number(bandwidth.get("day_bytes"))
        if day_bytes is not None:
            day = bandwidth.get("day")
            day = day if isinstance(day, str) and day else _utc(t, "%Y-%m-%d")
            days[day] = max(days.get(day, 0.0), day_bytes)
    return sorted(days.items())


# -- the page ---------------------------------------------------------------------------------

def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[bool]) -> str:
    def cells(tag: str, values: Sequence[object]) -> str:
        return "".join(f"<{tag}{_NUMERIC if n else ''}>{escape(str(v))}</{tag}>" for v, n in zip(values, numeric))

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return f"<table><thead><tr>{cells('th', headers)}</tr></thead><tbody>{body}</tbody></table>"


def _breakdown(title: str, what: str, counts: Mapping[str, Any]) -> str:
    """A table of ``counts`` (largest first) with each one's share of their sum."""
    numbers = {str(k): n for k, v in counts.items() if (n := _number(v)) is not None}
    if not numbers:
        return f"<h2>{escape(title)}</h2><p>None recorded.</p>"
    total = sum(numbers.values()) or 1.0
    rows = [(k, _format_number(n), f"{100 * n / total:.1f}%")
            for k, n in sorted(numbers.items(), key=lambda kv: (-kv[1], kv[0]))]
    return f"<h2>{escape(title)}</h2>" + _table((what, "count", "share"), rows, (False, True, True))


def _header(latest: Mapping[str, Any]) -> str:
    if latest.get("running") is True:
        state = f'<span class="running">running</span> (pid {escape(str(latest.get("pid", "?")))})'
    else:
        reason = latest.get("stop_reason")
        state = "not running" + (f" (last stop: {escape(str(reason))})" if reason else "")
    updated = _number(latest.get("updated_at"))
    when = _utc(updated) if updated is not None else "never"
    totals = [(key, format_size(int(n)) if key == "bytes" else _format_number(n))
              for key in TOTALS if (n := _number(latest.get(key))) is not None]
    return (f'<p class="state">{state}; last update {escape(when)}</p>'
            + _table([k for k, _ in totals], [[v for _, v in totals]], [True] * len(totals)))


def _charts(timed: Sequence[tuple[float, Mapping[str, Any]]], latest: Mapping[str, Any]) -> str:
    rates, errors, queue = _rate_points(timed), _error_points(timed), _queue_points(timed)
    limits = [_number(_mapping(s.get("bandwidth")).get("daily_limit")) for _, s in timed] + [
        _number(_mapping(latest.get("bandwidth")).get("daily_limit"))]
    limit = next((n for n in reversed(limits) if n), None)
    return "\n".join([
        "<h2>Over time</h2>",
        line_chart(rates, chart_id="rate", title="Pages per second", y_label="pages/s", x_format=_time_format(rates)),
        line_chart(errors, chart_id="errors", title="Errors per interval (failed + buried)", y_label="errors",
                   x_format=_time_format(errors)),
        line_chart(queue, chart_id="queue", title="Queue size (ready + delayed + reserved)", y_label="jobs",
                   x_format=_time_format(queue)),
        bar_chart(_daily_bytes(timed), chart_id="bandwidth", title="Bytes per day", y_label="bytes",
                  x_label="day (UTC)", limit=limit, y_format=_format_size),
    ])


def _sections(latest: Mapping[str, Any]) -> str:
    out = [_breakdown("Status codes", "status", _mapping(latest.get("statuses"))),
           _breakdown("Errors", "kind", _mapping(latest.get("errors")))]
    domains = {str(k): n for k, v in _mapping(latest.get("domains")).items() if (n := _number(v)) is not None}
    if domains:
        top = sorted(domains.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_DOMAINS]
        out.append("<h2>Top domains</h2>" + _table(("domain", "requests"), [(d, _format_number(n)) for d, n in top],
                                                     (False, True)))
    links = {str(k): n for k, v in _mapping(latest.get("links")).items() if (n := _number(v)) is not None}
    if links:
        out.append("<h2>Links</h2>" + _table(("links", "count"), [(k, _format_number(n)) for k, n in sorted(links.items())],
                                             (False, True)))
    next_due = latest.get("next_due")
    due = [(str(d.get("key", "")), _utc(at)) for d in (next_due if isinstance(next_due, list) else [])
           if isinstance(d, Mapping) and (at := _number(d.get("at"))) is not None]
    if due:
        out.append("<h2>Next due</h2>" + _table(("key", "due at"), due, (False, False)))
    return "\n".join(out)


def render(name: str, snapshots: list[dict[str, Any]], latest: dict[str, Any] | None) -> str:
    """The report page of recipe ``name``: a header from ``latest`` (stats.json; the newest
    snapshot when None), charts from ``snapshots`` (oldest first), tables of the latest counts.
    Keys a snapshot lacks are left out, never an error; with no snapshots the page says so."""
    timed = _timed(snapshots)
    state: Mapping[str, Any] = latest if latest is not None else (timed[-1][1] if timed else {})
    body = [f"<h1>scrapekit report: {escape(name)}</h1>"]
    if not state:
        body.append(f"<p>No stats yet: {escape(name)} has not run (no snapshots in work/{escape(name)}/stats/).</p>")
    else:
        body.append(_header(state))
        body.append(_charts(timed, state) if timed else
                    "<h2>Over time</h2><p>No snapshots yet: the charts need the run's stats history.</p>")
        body.append(_sections(state))
    return ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>scrapekit report: {escape(name)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


_ADDED = (*TOTALS, "cache_hits", "cache_misses", "skipped")
_MERGED = ("statuses", "errors", "links", "domains")


def merge(snapshots: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One snapshot for many workers at one moment: totals, queues and breakdowns added up,
    running if any runs, the latest update time."""
    merged: dict[str, Any] = {key: 0 for key in _ADDED}
    merged.update({key: {} for key in (*_MERGED, "queue")})
    bandwidth: dict[str, Any] = {}
    for snap in snapshots:
        for key in _ADDED:
            merged[key] += _number(snap.get(key)) or 0
        for key in (*_MERGED, "queue"):
            for k, v in _mapping(snap.get(key)).items():
                merged[key][k] = merged[key].get(k, 0) + (_number(v) or 0)
        for k, v in _mapping(snap.get("bandwidth")).items():
            bandwidth[k] = bandwidth.get(k, 0) + v if k.endswith(("_bytes", "_limit")) and _number(v) is not None else v
    merged["domains"] = dict(sorted(merged["domains"].items(), key=lambda kv: -kv[1])[:TOP_DOMAINS])
    merged["bandwidth"] = bandwidth
    merged["rate"] = sum(_number(snap.get("rate")) or 0 for snap in snapshots)
    merged["updated_at"] = max((_number(snap.get("updated_at")) or 0 for snap in snapshots), default=0)
    merged["running"] = any(snap.get("running") is True for snap in snapshots)
    reasons = sorted({str(snap["stop_reason"]) for snap in snapshots if snap.get("stop_reason")})
    merged["stop_reason"] = ", ".join(reasons) or None
    merged["pid"] = ", ".join(str(snap["pid"]) for snap in snapshots if snap.get("running") is True and snap.get("pid"))
    return merged


def merge_histories(histories: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The workers' stats histories as one: at each moment any worker took a snapshot, the sum
    of every worker's latest snapshot so far."""
    timed = [_timed(history) for history in histories]
    moments = sorted({t for history in timed for t, _ in history})
    merged = []
    position = [0] * len(timed)
    for moment in moments:
        current = []
        for i, history in enumerate(timed):
            while position[i] < len(history) and history[position[i]][0] <= moment:
                position[i] += 1
            if position[i]:
                current.append(history[position[i] - 1][1])
        merged.append({**merge(current), "updated_at": moment})
    return merged


def _latest(run_dir: Path) -> dict[str, Any] | None:
    """stats.json, with running judged by the run's lock (stats.json says so also after kill -9)."""
    latest = read_json(run_dir / "stats.json")
    if latest is not None:
        pid = running_pid(run_dir / "run.pid")
        latest["running"] = pid is not None
        latest["pid"] = pid if pid is not None else latest.get("pid")
    return latest


def write_report(run_dir: Path, name: str, worker_dirs: Sequence[Path] = ()) -> Path:
    """Write ``run_dir/report.html`` from the run's stats history and stats.json (or, given
    ``worker_dirs``, from all of its workers' added up); return its path."""
    if worker_dirs:
        latests = [latest for d in worker_dirs if (latest := _latest(d)) is not None]
        latest = merge(latests) if latests else None
        snapshots = merge_histories([read_snapshots(d / "stats") for d in worker_dirs])
    else:
        latest, snapshots = _latest(run_dir), read_snapshots(run_dir / "stats")
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "report.html"
    path.write_text(render(name, snapshots, latest), encoding="utf-8")
    return path
