"""HTML of the fleet pages: server-rendered, every value escaped, charts as inline SVG (no JavaScript build).

The only script is the pipeline page's Approve / Reject, which calls Airflow's own HITL endpoint with the
caller's Airflow session, so Airflow's permissions decide.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from trainpipe.fleet.outcome import OUTCOMES

DASH = "—"

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#1a202c;font-size:14px}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;width:100%} th,td{padding:6px 8px;border-bottom:1px solid #e2e8f0;text-align:left;
vertical-align:top} th{background:#f7fafc;font-weight:600;font-size:12px;text-transform:uppercase;color:#4a5568}
tr.attention td:first-child{border-left:4px solid #e53e3e} .muted{color:#718096;font-size:12px}
.badge{display:inline-block;padding:1px 6px;border-radius:8px;font-size:12px;font-weight:600}
.o-failed,.o-validation_failed{background:#fed7d7;color:#9b2c2c} .o-gates_failed{background:#feebc8;color:#9c4221}
.o-awaiting_approval{background:#fefcbf;color:#975a16} .o-rejected{background:#e9d8fd;color:#553c9a}
.o-promoted{background:#c6f6d5;color:#22543d} .o-running{background:#bee3f8;color:#2a4365}
.o-not_promoted,.o-never_run{background:#edf2f7;color:#4a5568}
a{color:#2b6cb0;text-decoration:none} a:hover{text-decoration:underline} .links a{margin-right:8px;white-space:nowrap}
form.filters{margin:8px 0 12px} form.filters select{margin-right:12px}
.num{text-align:right;font-variant-numeric:tabular-nums} code{font-size:12px}
.approval{border:1px solid #ecc94b;background:#fffff0;padding:12px;border-radius:6px}
button{padding:6px 14px;margin-right:8px;border-radius:4px;border:1px solid #a0aec0;cursor:pointer}
button.approve{background:#38a169;color:white;border-color:#2f855a} button.reject{background:#e53e3e;color:white}
pre{white-space:pre-wrap;background:#f7fafc;padding:8px} td.team{white-space:nowrap}
"""


def _e(value: Any) -> str:
    return escape(DASH if value is None or value == "" else str(value))


# Markdown's **bold** and `code` spans, read from text already escaped (so no markup of the text survives).
_EMPHASIS = re.compile(r"\*\*(?P<bold>[^*\n]+)\*\*|`(?P<code>[^`\n]+)`")


def markdown_emphasis(text: str) -> str:
    """An approval's Markdown body (Airflow's HITL renders it) as HTML for a <pre>: escaped, its bold and code
    spans shown as such rather than as asterisks and backticks; everything else stays as written."""
    return _EMPHASIS.sub(lambda m: f"<b>{m['bold']}</b>" if m["bold"] is not None else f"<code>{m['code']}</code>",
                         escape(text))


def _when(value: Any) -> str:
    """A stored ISO time (the registry's tags keep milliseconds and an offset) as a reader wants it:
    ``2026-11-27 11:53 UTC``; a value that is not such a time is shown as it is."""
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return _e(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return escape(moment.strftime("%Y-%m-%d %H:%M UTC" if moment.tzinfo is not None else "%Y-%m-%d %H:%M"))


def _num(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def sparkline(values: list[float], *, width: int = 90, height: int = 22) -> str:
    """A polyline of ``values`` (oldest first), the last point marked."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = width / max(1, len(values) - 1)
    points = [(i * step, height - 2 - (v - low) / span * (height - 4)) for i, v in enumerate(values)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    x, y = points[-1]
    return (f"<svg class='spark' width='{width + 4}' height='{height}' viewBox='-2 0 {width + 4} {height}' "
            f"role='img' aria-label='last {len(values)} versions'><polyline fill='none' stroke='#3182ce' "
            f"stroke-width='1.5' points='{line}'/><circle cx='{x:.1f}' cy='{y:.1f}' r='2.2' fill='#2c5282'/></svg>")


def line_chart(series: dict[str, list[tuple[int, float]]], *, width: int = 420, height: int = 170,
               backtests: frozenset[int] = frozenset()) -> str:
    """Metric history: one line per metric over version numbers, with axes and a legend. Versions in
    ``backtests`` (runs for a past window) are hollow points off the line: they never held production."""
    points = [p for values in series.values() for p in values]
    if not points:
        return "<p class='muted'>No versions with metrics yet.</p>"
    left, right, top, bottom = 48, 70, 10, 28
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y0 == y1:
        y0, y1 = y0 - 0.5, y1 + 0.5
    x1 = x1 if x1 > x0 else x0 + 1

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * (height - top - bottom)

    colours = ["#3182ce", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#319795"]
    parts = [f"<svg class='metric-history' width='{width}' height='{height}' role='img' aria-label='metric history'>",
             f"<line x1='{left}' y1='{height - bottom}' x2='{width - right}' y2='{height - bottom}' stroke='#a0aec0'/>",
             f"<line x1='{left}' y1='{top}' x2='{left}' y2='{height - bottom}' stroke='#a0aec0'/>"]
    for value in (y0, (y0 + y1) / 2, y1):
        parts.append(f"<text x='{left - 4}' y='{sy(value) + 4:.1f}' font-size='10' text-anchor='end'>{value:.3g}</text>")
    for value in sorted({x0, x1, (x0 + x1) // 2}):
        parts.append(f"<text x='{sx(value):.1f}' y='{height - bottom + 14}' font-size='10' "
                     f"text-anchor='middle'>v{value}</text>")
    for i, (name, values) in enumerate(sorted(series.items())):
        colour = colours[i % len(colours)]
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(values) if x not in backtests)
        parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.8' points='{line}'/>")
        parts += [f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2.5' fill='{colour}'><title>{escape(name)} "
                  f"v{x}: {y:.4f}</title></circle>" if x not in backtests else
                  f"<circle class='backtest' cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='3' fill='#fff' stroke='{colour}' "
                  f"stroke-width='1.5'><title>{escape(name)} v{x}: {y:.4f} (backtest)</title></circle>"
                  for x, y in values]
        parts.append(f"<text x='{width - right + 8}' y='{top + 12 + 14 * i}' font-size='11' fill='{colour}'>"
                     f"{escape(name)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _drift_colour(psi: float | None) -> str:
    if psi is None:
        return "#f7fafc"
    if psi >= 0.25:
        return "#fc8181"
    if psi >= 0.1:
        return "#fbd38d"
    return "#c6f6d5" if psi >= 0.02 else "#f0fff4"


def heatmap(rows: list[dict[str, Any]]) -> str:
    """Per-feature PSI per dataset version (a row per version, newest first)."""
    features = sorted({f for r in rows for f in r["psi"]})
    if not features:
        return "<p class='muted'>No drift measured yet (the first accepted version is the baseline).</p>"
    head = "".join(f"<th>{escape(f)}</th>" for f in features)
    body = []
    for r in rows:
        cells = "".join(
            f"<td class='num' style='background:{_drift_colour(r['psi'].get(f))}'>{_num(r['psi'].get(f), 3)}</td>"
            for f in features)
        body.append(f"<tr><td><code>{_e((r.get('digest') or '')[:12])}</code><div class='muted'>{_when(r.get('when'))}"
                    f"</div></td><td>{_e(r.get('verdict'))}</td>{cells}</tr>")
    return (f"<table id='drift-heatmap'><tr><th>dataset version</th><th>drift</th>{head}</tr>{''.join(body)}</table>"
            "<p class='muted'>PSI per feature vs the baseline: green &lt; 0.1, orange &lt; 0.25, red &ge; 0.25.</p>")


def _links(links: dict[str, str | None]) -> str:
    shown = [f"<a href='{escape(url, quote=True)}' target='_top'>{escape(name)}</a>" if name == "DAG"
             else f"<a href='{escape(url, quote=True)}' target='_blank' rel='noopener'>{escape(name)}</a>"
             for name, url in links.items() if url]
    return "".join(shown) or DASH


def fleet_page(rows: list[dict[str, Any]], *, teams: list[str], team: str | None, outcome: str | None,
               base: str) -> str:
    options_team = "".join(f"<option value='{escape(t, quote=True)}'{' selected' if t == team else ''}>{escape(t)}"
                           "</option>" for t in teams)
    options_outcome = "".join(f"<option value='{o}'{' selected' if o == outcome else ''}>{o.replace('_', ' ')}"
                              "</option>" for o in ("needs_attention", *OUTCOMES))
    refreshing = sum(1 for r in rows if r.get("refreshing"))
    behind = (f" MLflow is being read for {refreshing} of them (their champion and cost may be from before their "
              "last run); reload in a moment." if refreshing else "")
    body = [f"<h1>Training pipelines</h1><p class='muted'>{len(rows)} pipelines; needs attention first.{behind}</p>",
            f"<form class='filters' method='get' action='{escape(base, quote=True)}/'>"
            f"<label>Team <select name='team' onchange='this.form.submit()'><option value=''>all</option>"
            f"{options_team}</select></label><label>Outcome <select name='outcome' onchange='this.form.submit()'>"
            f"<option value=''>all</option>{options_outcome}</select></label><noscript><button>Filter</button>"
            "</noscript></form>",
            "<table id='pipelines'><tr><th>pipeline</th><th>team / owner</th><th>schedule</th><th>last run</th>"
            "<th>champion</th><th>dataset</th><th class='num'>GPU h (30&nbsp;d)</th><th class='num'>cost (30&nbsp;d)</th>"
            "<th>links</th></tr>"]
    for r in rows:
        run = r["last_run"] or {}
        champion = r["champion"]
        if champion:
            metric = champion["main_metric"]
            value = champion["metrics"].get(metric) if metric else None
            shown = f"{metric} {value:.4f}" if value is not None else ""
            spark = sparkline([p["value"] for p in r["sparkline"] if p["value"] is not None])
            champ = (f"v{champion['version']} <span class='muted'>{_age(champion['age_days'])} old</span><br>"
                     f"<span class='muted'>{escape(shown)}</span> {spark}")
        else:
            champ = "<span class='muted'>reading MLflow…</span>" if r.get("refreshing") else DASH
        dataset = r.get("accepted_dataset") or {}
        data = (f"<code>{_e((dataset.get('digest') or '')[:12])}</code><div class='muted'>{_num(dataset.get('rows'), 0)}"
                " rows</div>") if dataset else DASH
        cost = r["cost_30d"]
        pipeline_url = f"{base}/pipelines/{quote(r['pipeline_id'], safe='')}"
        body.append(
            f"<tr class='{'attention' if r['needs_attention'] else ''}' data-pipeline='{escape(r['pipeline_id'], quote=True)}'"
            f" data-outcome='{r['outcome']}'><td><a href='{escape(pipeline_url, quote=True)}'><b>{escape(r['pipeline_id'])}"
            f"</b></a>{' <span class=muted>(paused)</span>' if r['is_paused'] else ''}</td>"
            f"<td class='team'>{_e(r['team'])}<div class='muted'>{_e(r['owner'])}</div></td><td>{_e(r['schedule'])}</td>"
            f"<td><span class='badge o-{r['outcome']}'>{r['outcome'].replace('_', ' ')}</span>"
            f"<div class='reason'>{_e(run.get('reason'))}</div>{_study(r.get('study'))}"
            f"<div class='muted'>{_when(run.get('logical_date'))}</div></td>"
            f"<td>{champ}</td><td>{data}</td><td class='num'>{_num(cost['gpu_hours'])}{_capacity_split(cost)}</td>"
            f"<td class='num'>{_num(cost['cost'], 2)}</td><td class='links'>{_links(r['links'])}</td></tr>")
    body.append("</table>")
    return page("Training pipelines", "".join(body))


def study_words(study: dict[str, Any]) -> str:
    """The last run's search in words: trials done of n_trials, pruned, running, the best value so far."""
    done, total = study.get("trials_done"), study.get("n_trials")
    words = f"tuning: {done or 0:.0f}{f' of {total}' if total else ''} trials done"
    words += f" ({study.get('trials_pruned') or 0:.0f} pruned), {study.get('trials_running') or 0:.0f} running"
    if study.get("best_value") is not None:
        words += f"; best {study.get('metric') or 'value'} {study['best_value']:.4g}"
    return words


def _study(study: dict[str, Any] | None) -> str:
    return f"<div class='muted study'>{escape(study_words(study))}</div>" if study else ""


def _age(days: float | None) -> str:
    if days is None:
        return DASH
    return f"{days * 24:.0f} h" if days < 2 else f"{days:.0f} d"


def _capacity_split(cost: dict[str, Any]) -> str:
    """Under the GPU-hours: how many ran on spot and how many on demand, when any ran on spot."""
    spot = cost.get("spot_gpu_hours")
    if not spot:
        return ""
    # "of which": runs off Kubernetes capacity (local trainers) count in the total and in neither part.
    return (f"<div class='muted'>of which {_num(spot)} spot, {_num(cost.get('on_demand_gpu_hours') or 0.0)} on "
            "demand</div>")


def pipeline_page(detail: dict[str, Any], *, base: str, airflow_api: str) -> str:
    row = detail["pipeline"]
    run = row["last_run"] or {}
    parts = [f"<p><a href='{escape(base, quote=True)}/'>&larr; Training pipelines</a></p>",
             f"<h1>{escape(row['pipeline_id'])}</h1>",
             f"<p>{_e(row['team'])} / {_e(row['owner'])} &middot; schedule {_e(row['schedule'])} &middot; "
             f"<span class='badge o-{row['outcome']}'>{row['outcome'].replace('_', ' ')}</span> "
             f"<span class='reason'>{_e(run.get('reason'))}</span></p>",
             f"<p class='links'>{_links(row['links'])}</p>"]
    approval = detail.get("pending_approval")
    if approval:
        url = (f"{airflow_api}/dags/{quote(row['pipeline_id'], safe='')}/dagRuns/{quote(approval['run_id'], safe='')}"
               f"/taskInstances/{quote(approval['task_id'], safe='')}/{approval['map_index']}/hitlDetails")
        buttons = "".join(f"<button class='{'approve' if o == 'Approve' else 'reject' if o == 'Reject' else ''}' "
                          f"data-option='{escape(o, quote=True)}'>{escape(o)}</button>" for o in approval["options"])
        parts.append(
            f"<h2>Pending approval</h2><div class='approval' id='approval' data-url='{escape(url, quote=True)}'>"
            f"<b>{_e(approval['subject'])}</b><div class='muted'>waiting since {_when(approval['created_at'])} "
            f"(run {_e(approval['run_id'])})</div><pre>{markdown_emphasis(approval['body'] or '')}</pre>{buttons}"
            "<div id='approval-result' class='muted'></div></div>" + APPROVAL_SCRIPT)
    history = detail["metric_history"]
    series: dict[str, list[tuple[int, float]]] = {}
    for point in history:
        for name, value in point["metrics"].items():
            series.setdefault(name, []).append((point["version"], value))
    backtests = frozenset(point["version"] for point in history if point.get("backtest"))
    # One chart per metric, each on its own scale (auc and log_loss on one axis would flatten both).
    charts = "".join(f"<div>{line_chart({name: values}, backtests=backtests)}</div>"
                     for name, values in sorted(series.items()))
    shown = f", {len(backtests)} backtests as hollow points" if backtests else ""
    parts.append(f"<h2>Metric history ({len(history)} versions{shown})</h2>"
                 f"<div style='display:flex;flex-wrap:wrap;gap:16px'>{charts or line_chart({})}</div>")
    parts.append(f"<h2>Drift per feature</h2>{heatmap(detail['drift_history'])}")
    log_rows = "".join(f"<tr><td>v{_e(e.get('version'))}</td><td>{_when(e.get('at'))}</td><td>{_e(e.get('by'))}</td>"
                       f"<td>{_e(e.get('reason'))}</td><td>{_e(e.get('replaced_version'))}</td></tr>"
                       for e in detail["promotion_log"])
    parts.append("<h2>Promotion log</h2>" + (
        f"<table id='promotion-log'><tr><th>version</th><th>when</th><th>who</th><th>why</th><th>replaced</th></tr>"
        f"{log_rows}</table>" if log_rows else "<p class='muted'>No promotion yet.</p>"))
    versions = "".join(
        f"<tr><td><code>{_e(v['digest'][:12])}</code></td><td>{_when(v.get('created_at'))}</td><td class='num'>"
        f"{_num(v.get('rows'), 0)}</td><td>{'accepted ' + _when(v['accepted_at']) if v.get('accepted_at') else 'not accepted'}"
        f"</td><td><code>{_e((v.get('schema_hash') or '')[:12])}</code></td></tr>" for v in detail["dataset_versions"])
    parts.append("<h2>Dataset versions</h2>" + (
        f"<table id='dataset-versions'><tr><th>version</th><th>created</th><th class='num'>rows</th><th>validation</th>"
        f"<th>schema</th></tr>{versions}</table>" if versions else "<p class='muted'>No dataset version stored.</p>"))
    return page(f"{row['pipeline_id']}: training pipeline", "".join(parts))


# Calls Airflow's public HITL endpoint with the page's own Airflow session (same origin, cookie), so Airflow
# checks the caller's permission to answer; the page reloads to show the outcome.
APPROVAL_SCRIPT = """<script>
document.querySelectorAll('#approval button').forEach(function (button) {
  button.addEventListener('click', function () {
    var box = document.getElementById('approval');
    var out = document.getElementById('approval-result');
    box.querySelectorAll('button').forEach(function (b) { b.disabled = true; });
    fetch(box.dataset.url, {method: 'PATCH', credentials: 'same-origin',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({chosen_options: [button.dataset.option], params_input: {}})})
    .then(function (r) {
      if (r.ok) { out.textContent = button.dataset.option + ': sent to Airflow.'; return; }
      return r.text().then(function (t) {
        out.textContent = 'Airflow refused (' + r.status + '): ' + t;
        box.querySelectorAll('button').forEach(function (b) { b.disabled = false; });
      });
    });
  });
});
</script>"""


def filter_query(team: str | None, outcome: str | None) -> str:
    query = {k: v for k, v in (("team", team), ("outcome", outcome)) if v}
    return ("?" + urlencode(query)) if query else ""
