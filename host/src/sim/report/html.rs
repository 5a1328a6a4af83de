//! `report.html`: a self-contained page with a summary table and inline SVG line charts.

use super::{PipelineReport, RunContext};
use std::fmt::Write as _;

const WIDTH: f64 = 1200.0;
const HEIGHT: f64 = 320.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 28.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 44.0;
const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
/// Dash patterns of the second, third, … of series with identical values, so each stays
/// visible over the ones drawn before it.
const DASHES: [&str; 4] = ["8 6", "2 5", "14 4 2 4", "4 3"];

/// One series of a chart: a line through `points`, or bars of `points`' y values.
struct Series<'a> {
    label: String,
    color: &'a str,
    points: Vec<(f64, f64)>,
    /// Empty for a solid line.
    dash: &'static str,
}

/// A value axis from 0: its end and its tick values.
struct Axis {
    end: f64,
    ticks: Vec<f64>,
    integer: bool,
}

impl Axis {
    /// Quarters of a round end at or above `max`.
    fn continuous(max: f64) -> Axis {
        let end = nice_ceiling(max);
        Axis {
            end,
            ticks: (0..=4).map(|i| end * f64::from(i) / 4.0).collect(),
            integer: false,
        }
    }

    /// Whole-number ticks for counts: a step of 1, 2 or 5 × 10^k giving at most 5 intervals.
    fn counts(max: f64) -> Axis {
        let max = if max.is_finite() { max.max(0.0) } else { 0.0 };
        let mut step = 1.0;
        'search: loop {
            for m in [1.0, 2.0, 5.0] {
                if max / (m * step) <= 5.0 {
                    step *= m;
                    break 'search;
                }
            }
            step *= 10.0;
        }
        let intervals = (max / step).ceil().max(1.0);
        Axis {
            end: intervals * step,
            ticks: (0..=intervals as u64).map(|i| i as f64 * step).collect(),
            integer: true,
        }
    }

    fn label(&self, v: f64) -> String {
        if self.integer {
            format!("{v:.0}")
        } else {
            tick(v)
        }
    }
}

pub(super) fn page(run: &RunContext, reports: &[PipelineReport]) -> String {
    let mut out = String::new();
    out.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>switchyard simulation report</title>\n<style>\n\
         body{font-family:sans-serif;margin:24px;color:#222}\n\
         table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}\n\
         td:first-child,th:first-child{text-align:left}\n\
         table.run td{text-align:left;font-family:monospace}\n\
         svg.chart{display:block;width:100%;height:auto;margin:8px 0 4px}\n\
         p.note{color:#555;margin:2px 0 8px}\n\
         </style>\n</head>\n<body>\n<h1>switchyard simulation report</h1>\n",
    );
    run_table(&mut out, run);
    out.push_str("<h2>Summary</h2>\n");
    summary_table(&mut out, reports);

    let lines = per_pipeline(reports, |r| {
        r.ttft_cdf_ms
            .iter()
            .enumerate()
            .map(|(p, &ms)| (ms, p as f64))
            .collect()
    });
    if lines.iter().any(|l| !l.points.is_empty()) {
        out.push_str("<h2>Time to first token</h2>\n");
        let x = Axis::continuous(max_of(&lines, |p| p.0).max(1.0));
        line_chart(
            &mut out,
            "TTFT CDF",
            ("TTFT (ms)", "percentile"),
            (&x, &Axis::continuous(100.0)),
            &lines,
        );
    }
    serving_table(&mut out, reports);
    predictions_table(&mut out, reports);

    let steps = per_pipeline(reports, |r| {
        r.rl_steps
            .iter()
            .map(|s| (f64::from(s.step), s.duration_ms / 1000.0))
            .collect()
    });
    if steps.iter().any(|l| !l.points.is_empty()) {
        out.push_str("<h2>RL rollout steps</h2>\n");
        let y = Axis::continuous(max_of(&steps, |p| p.1));
        bar_chart(
            &mut out,
            "first arrival to last completion, per step",
            ("step", "duration (s)"),
            &y,
            &steps,
        );
    }
    type Values = fn(&PipelineReport) -> Vec<(f64, f64)>;
    // (heading, title, y label, values, whether the values are counts)
    let per_replica: [(&str, &str, &str, Values, bool); 3] = [
        (
            "Busy share per replica",
            "time in steps",
            "busy (%)",
            |r| indexed(&r.utilisation.busy, 100.0),
            false,
        ),
        (
            "KV blocks held per replica",
            "time-averaged",
            "KV usage (%)",
            |r| indexed(&r.utilisation.kv_usage, 100.0),
            false,
        ),
        (
            "Sequences in the batch per replica",
            "time-averaged",
            "sequences",
            |r| indexed(&r.utilisation.batch, 1.0),
            true,
        ),
    ];
    for (heading, title, y_label, values, counts) in per_replica {
        let series = per_pipeline(reports, values);
        if series.iter().all(|l| l.points.is_empty()) {
            continue;
        }
        let _ = writeln!(out, "<h2>{}</h2>", escape(heading));
        let max = max_of(&series, |p| p.1);
        let y = if counts {
            Axis::counts(max)
        } else {
            Axis::continuous(max)
        };
        bar_chart(&mut out, title, ("replica", y_label), &y, &series);
    }

    out.push_str(
        "<h2>Load per replica over time (running + waiting, peak per bucket)</h2>\n\
         <p class=\"note\">Every router on the same axes.</p>\n",
    );
    let x = Axis::continuous(
        reports
            .iter()
            .map(|r| r.makespan_ms)
            .fold(0.0, f64::max)
            .max(1.0),
    );
    let peak = reports
        .iter()
        .flat_map(|r| r.load_series.per_replica.iter().flatten())
        .copied()
        .max()
        .unwrap_or(0);
    let y = Axis::counts(f64::from(peak));
    for r in reports {
        let series = &r.load_series;
        let mut lines: Vec<Series> = series
            .per_replica
            .iter()
            .enumerate()
            .map(|(i, buckets)| Series {
                label: format!("replica {i}"),
                color: PALETTE[i % PALETTE.len()],
                points: steps_of(buckets, series.bucket_ms),
                dash: "",
            })
            .collect();
        mark_coinciding(&mut lines);
        let title = format!("{}: load over time", r.name);
        line_chart(
            &mut out,
            &title,
            ("time (ms)", "requests"),
            (&x, &y),
            &lines,
        );
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// The run's command line, workload, fleet, seed, configs and version.
fn run_table(out: &mut String, run: &RunContext) {
    let mut rows: Vec<(&str, String)> = vec![
        ("command line", run.command_line.join(" ")),
        ("switchyard", run.switchyard_version.clone()),
    ];
    let workload = match &run.trace {
        Some(trace) => format!("trace {trace}"),
        None => run.workload.clone(),
    };
    rows.push(("workload", format!("{workload}, {} requests", run.requests)));
    let parameters = match &run.workload_parameters {
        serde_json::Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    };
    rows.push(("workload parameters", parameters));
    let groups = run
        .profiles
        .iter()
        .map(|g| format!("{} × {}", g.replicas, g.profile))
        .collect::<Vec<_>>()
        .join(" + ");
    let fleet = match &run.fleet_file {
        Some(file) => format!("{file}: {} replicas ({groups})", run.replicas),
        None => format!("{} replicas ({groups})", run.replicas),
    };
    rows.push(("fleet", fleet));
    rows.push((
        "block size, scrape interval, KV-event delay",
        format!(
            "{} tokens, {} ms, {} ms",
            run.block_size_tokens, run.scrape_interval_ms, run.kv_event_delay_ms
        ),
    ));
    rows.push(("seed", run.seed.to_string()));
    if run.routers > 1 {
        rows.push((
            "routers",
            format!(
                "{} of each policy side by side, requests dealt to them in turn",
                run.routers
            ),
        ));
    }
    for config in &run.configs {
        let path = config.path.as_deref().unwrap_or("built in");
        rows.push((
            "config",
            format!("{}: {path} (sha256 {})", config.pipeline, config.sha256),
        ));
    }
    out.push_str("<h2>Run</h2>\n<table class=\"run\">\n");
    for (key, value) in rows {
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(key),
            escape(&value)
        );
    }
    out.push_str("</table>\n");
}

fn summary_table(out: &mut String, reports: &[PipelineReport]) {
    out.push_str(
        "<table>\n<tr><th>pipeline</th><th>completed</th><th>rejected by router</th>\
         <th>rejected by replica</th><th>unrouted</th>\
         <th>cache hit rate</th><th>prefill tokens</th><th>ideal (floor)</th>\
         <th>TTFT p50 / p90 / p99 / mean (ms)</th><th>E2E p50 / p99 / mean (ms)</th>\
         <th>router wait p50 / p99 (ms)</th><th>peak load max / mean</th>\
         <th>prefills per prompt per step</th></tr>\n",
    );
    for r in reports {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}%</td><td>{}</td>\
             <td>{}</td><td>{:.1} / {:.1} / {:.1} / {:.1}</td><td>{:.1} / {:.1} / {:.1}</td>\
             <td>{:.1} / {:.1}</td><td>{} / {:.1}</td><td>{}</td></tr>",
            escape(&r.name),
            r.completed,
            r.requests,
            r.rejected_by_router,
            r.rejected_by_replica,
            r.unrouted,
            r.cache_hit_rate * 100.0,
            r.prefill_tokens_computed,
            r.prefill_tokens_ideal,
            r.ttft_ms.p50,
            r.ttft_ms.p90,
            r.ttft_ms.p99,
            r.ttft_ms.mean,
            r.e2e_ms.p50,
            r.e2e_ms.p99,
            r.e2e_ms.mean,
            r.router_wait_ms.p50,
            r.router_wait_ms.p99,
            r.replica_load.max,
            r.replica_load.mean,
            r.prefills_per_prompt_per_step
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}")),
        );
    }
    out.push_str("</table>\n");
}

/// Each prefix producer's predictions against what the replicas had cached, one row per
/// pipeline and producer; nothing when no pipeline predicts.
fn predictions_table(out: &mut String, reports: &[PipelineReport]) {
    if reports.iter().all(|r| r.prefix_predictions.is_empty()) {
        return;
    }
    out.push_str(
        "<h2>Prefix predictions</h2>\n<table>\n<tr><th>pipeline</th><th>producer</th>\
         <th>checked requests</th><th>predicted tokens</th><th>cached tokens</th>\
         <th>correct tokens</th><th>precision</th><th>recall</th></tr>\n",
    );
    let share =
        |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{:.1}%", v * 100.0));
    for r in reports {
        for p in &r.prefix_predictions {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td></tr>",
                escape(&r.name),
                escape(&p.producer),
                p.checked_requests,
                p.predicted_tokens,
                p.cached_tokens,
                p.correct_tokens,
                share(p.precision),
                share(p.recall),
            );
        }
    }
    out.push_str(
        "</table>\n<p class=\"note\">Per request, the prompt tokens the producer expected the \
         chosen replica to hold against those it found cached when the prefill was scheduled; \
         correct tokens are the smaller of the two. Precision = correct / predicted, recall = \
         correct / cached.</p>\n",
    );
}

/// Throughput, goodput and where the time went, one row per pipeline.
fn serving_table(out: &mut String, reports: &[PipelineReport]) {
    out.push_str(
        "<h2>Serving</h2>\n<table>\n<tr><th>pipeline</th><th>requests/s</th>\
         <th>output tokens/s</th><th>goodput (requests/s, share)</th>\
         <th>queue wait p50 / p99 (ms)</th><th>prefill p50 / p99 (ms)</th>\
         <th>TPOT p50 / p99 (ms)</th><th>preemptions</th><th>evictions</th>\
         <th>recomputed tokens</th><th>RL steps total (s)</th></tr>\n",
    );
    for r in reports {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{:.2}</td><td>{:.0}</td><td>{:.2}, {:.1}%</td>\
             <td>{:.1} / {:.1}</td><td>{:.1} / {:.1}</td><td>{:.1} / {:.1}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.name),
            r.throughput.requests_per_s,
            r.throughput.output_tokens_per_s,
            r.goodput.requests_per_s,
            r.goodput.share * 100.0,
            r.queue_wait_ms.p50,
            r.queue_wait_ms.p99,
            r.prefill_ms.p50,
            r.prefill_ms.p99,
            r.tpot_ms.p50,
            r.tpot_ms.p99,
            r.preemptions,
            r.evictions,
            r.recomputed_tokens,
            r.rl_step_total_ms
                .map_or_else(|| "-".to_string(), |v| format!("{:.1}", v / 1000.0)),
        );
    }
    let objectives = reports.first().map(|r| r.goodput);
    if let Some(g) = objectives {
        let _ = writeln!(
            out,
            "</table>\n<p>Goodput counts completed requests with TTFT ≤ {} ms and time per \
             output token ≤ {} ms.</p>",
            g.ttft_objective_ms, g.tpot_objective_ms
        );
    } else {
        out.push_str("</table>\n");
    }
}

/// `values` scaled by `scale` as points at x = 0, 1, 2, …
fn indexed(values: &[f64], scale: f64) -> Vec<(f64, f64)> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| (i as f64, v * scale))
        .collect()
}

/// A series per pipeline, in report order, identical ones marked.
fn per_pipeline<'a>(
    reports: &[PipelineReport],
    points: impl Fn(&PipelineReport) -> Vec<(f64, f64)>,
) -> Vec<Series<'a>> {
    let mut series: Vec<Series> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| Series {
            label: r.name.clone(),
            color: PALETTE[i % PALETTE.len()],
            points: points(r),
            dash: "",
        })
        .collect();
    mark_coinciding(&mut series);
    series
}

/// Gives every series equal to an earlier one the next dash pattern of its group.
fn mark_coinciding(series: &mut [Series]) {
    for i in 0..series.len() {
        if series[i].points.is_empty() {
            continue;
        }
        let before = (0..i)
            .filter(|&j| series[j].points == series[i].points)
            .count();
        if before > 0 {
            series[i].dash = DASHES[(before - 1) % DASHES.len()];
        }
    }
}

/// A note naming each group of series with identical values, if any.
fn coinciding_note(out: &mut String, series: &[Series], bars: bool) {
    let mut groups: Vec<Vec<&str>> = Vec::new();
    let mut seen = vec![false; series.len()];
    for i in 0..series.len() {
        if seen[i] || series[i].points.is_empty() {
            continue;
        }
        let group: Vec<usize> = (i..series.len())
            .filter(|&j| series[j].points == series[i].points)
            .collect();
        if group.len() > 1 {
            for &j in &group {
                seen[j] = true;
            }
            groups.push(group.iter().map(|&j| series[j].label.as_str()).collect());
        }
    }
    if groups.is_empty() {
        return;
    }
    let text = groups
        .iter()
        .map(|g| g.join(" = "))
        .collect::<Vec<_>>()
        .join("; ");
    let how = if bars {
        "bars of equal height"
    } else {
        "each drawn dashed over the one before"
    };
    let _ = writeln!(
        out,
        "<p class=\"note\">Identical values: {} ({how}).</p>",
        escape(&text)
    );
}

fn max_of(series: &[Series], f: fn(&(f64, f64)) -> f64) -> f64 {
    series
        .iter()
        .flat_map(|l| l.points.iter().map(f))
        .fold(0.0, f64::max)
}

/// Bucket values as a step line: flat across each bucket.
fn steps_of(buckets: &[u32], bucket_ms: f64) -> Vec<(f64, f64)> {
    let mut points = Vec::with_capacity(buckets.len() * 2);
    for (b, &v) in buckets.iter().enumerate() {
        points.push((b as f64 * bucket_ms, f64::from(v)));
        points.push(((b + 1) as f64 * bucket_ms, f64::from(v)));
    }
    points
}

fn legend(out: &mut String, series: &[Series], bars: bool) {
    out.push_str("<p>");
    for s in series {
        let sample = if bars {
            format!(
                "<rect x=\"4\" y=\"1\" width=\"20\" height=\"10\" fill=\"{}\"/>",
                s.color
            )
        } else {
            format!(
                "<line x1=\"0\" y1=\"6\" x2=\"28\" y2=\"6\" stroke=\"{}\" stroke-width=\"2.5\" \
                 stroke-dasharray=\"{}\"/>",
                s.color, s.dash
            )
        };
        let _ = write!(
            out,
            "<svg width=\"28\" height=\"12\">{sample}</svg> {} &nbsp; ",
            escape(&s.label)
        );
    }
    out.push_str("</p>\n");
}

/// The frame, title, grid, ticks and axis labels of a chart; returns the plot's width and
/// height.
fn frame(
    out: &mut String,
    title: &str,
    (x_label, y_label): (&str, &str),
    x_ticks: &[(f64, String)],
    y: &Axis,
) -> (f64, f64) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let _ = writeln!(
        out,
        "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         font-size=\"11\">"
    );
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"16\" font-size=\"13\" font-weight=\"bold\">{}</text>",
        escape(title)
    );
    let _ = writeln!(
        out,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w}\" height=\"{plot_h}\" fill=\"none\" stroke=\"#999\"/>"
    );
    for &v in &y.ticks {
        let py = TOP + plot_h - v / y.end * plot_h;
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{py:.1}\" x2=\"{:.1}\" y2=\"{py:.1}\" stroke=\"#eee\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT + plot_w,
            LEFT - 4.0,
            py + 4.0,
            y.label(v),
        );
    }
    for (px, text) in x_ticks {
        let _ = writeln!(
            out,
            "<line x1=\"{px:.1}\" y1=\"{TOP}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\
             <text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            TOP + plot_h,
            TOP + plot_h + 14.0,
            escape(text),
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\
         <text x=\"12\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 12 {:.1})\">{}</text>",
        LEFT + plot_w / 2.0,
        HEIGHT - 8.0,
        escape(x_label),
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0,
        escape(y_label)
    );
    (plot_w, plot_h)
}

/// A chart with a line per series over a continuous x axis, its legend and a note on series
/// that coincide.
fn line_chart(
    out: &mut String,
    title: &str,
    labels: (&str, &str),
    (x, y): (&Axis, &Axis),
    series: &[Series],
) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let sx = |v: f64| LEFT + v / x.end * plot_w;
    let x_ticks: Vec<(f64, String)> = x.ticks.iter().map(|&v| (sx(v), x.label(v))).collect();
    let (_, plot_h) = frame(out, title, labels, &x_ticks, y);
    let sy = |v: f64| TOP + plot_h - v / y.end * plot_h;
    for s in series {
        if s.points.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"{}\" points=\"",
            s.color, s.dash
        );
        for &(px, py) in &s.points {
            let _ = write!(out, "{:.1},{:.1} ", sx(px), sy(py));
        }
        let _ = writeln!(out, "\"><title>{}</title></polyline>", escape(&s.label));
    }
    out.push_str("</svg>\n");
    legend(out, series, false);
    coinciding_note(out, series, false);
}

/// A chart with a group of bars per category (the x values of the points, whole numbers
/// from 0) and a bar per series in each, its legend and a note on series that coincide.
fn bar_chart(out: &mut String, title: &str, labels: (&str, &str), y: &Axis, series: &[Series]) {
    let categories = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0 as usize + 1))
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = WIDTH - LEFT - RIGHT;
    let slot = plot_w / categories as f64;
    let x_ticks: Vec<(f64, String)> = (0..categories)
        .map(|c| (LEFT + (c as f64 + 0.5) * slot, c.to_string()))
        .collect();
    let (_, plot_h) = frame(out, title, labels, &x_ticks, y);
    let bar = slot * 0.8 / series.len().max(1) as f64;
    for (k, s) in series.iter().enumerate() {
        for &(c, v) in &s.points {
            let height = v / y.end * plot_h;
            let _ = writeln!(
                out,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\">\
                 <title>{}: {}</title></rect>",
                LEFT + c * slot + slot * 0.1 + k as f64 * bar,
                TOP + plot_h - height,
                bar,
                height,
                s.color,
                escape(&s.label),
                tick(v)
            );
        }
    }
    out.push_str("</svg>\n");
    legend(out, series, true);
    coinciding_note(out, series, true);
}

/// The smallest "round" axis end at or above `v` whose quarters are round too (1 when `v` is
/// not a positive finite number).
fn nice_ceiling(v: f64) -> f64 {
    if !(v > 0.0 && v.is_finite()) {
        return 1.0;
    }
    let scale = 10f64.powf(v.log10().floor());
    [1.0, 1.2, 1.6, 2.0, 2.4, 3.0, 4.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * scale)
        .find(|&end| end >= v)
        .unwrap_or(10.0 * scale)
}

/// A tick label: integers as such, small values with up to two decimals.
fn tick(v: f64) -> String {
    if v.fract() == 0.0 || v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_in_names() {
        assert_eq!(escape("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
    }

    #[test]
    fn axis_ends_are_round() {
        assert_eq!(nice_ceiling(5421.0), 6000.0);
        assert_eq!(nice_ceiling(15393.0), 16000.0);
        assert_eq!(nice_ceiling(64.0), 80.0);
        assert_eq!(nice_ceiling(100.0), 100.0);
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(f64::NAN), 1.0);
    }

    #[test]
    fn count_axes_tick_at_whole_numbers() {
        let ticks = |max: f64| Axis::counts(max).ticks;
        assert_eq!(ticks(0.0), vec![0.0, 1.0]);
        assert_eq!(ticks(3.0), vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(ticks(2.5), vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(ticks(7.0), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
        assert_eq!(ticks(64.0), vec![0.0, 20.0, 40.0, 60.0, 80.0]);
        assert_eq!(ticks(96.0), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        for max in [0.3, 1.0, 2.5, 9.0, 13.0, 77.0, 1234.0] {
            let axis = Axis::counts(max);
            assert!(axis.end >= max);
            assert!(axis.ticks.iter().all(|t| t.fract() == 0.0), "{max}");
            assert!(axis.ticks.len() <= 6, "{max}");
            assert!(axis.ticks.iter().all(|&t| !axis.label(t).contains('.')));
        }
    }

    #[test]
    fn only_later_copies_of_a_series_are_dashed() {
        let series = |points: Vec<(f64, f64)>| Series {
            label: String::new(),
            color: "#000",
            points,
            dash: "",
        };
        let mut all = vec![
            series(vec![(0.0, 1.0)]),
            series(vec![(0.0, 2.0)]),
            series(vec![(0.0, 1.0)]),
            series(vec![(0.0, 1.0)]),
        ];
        mark_coinciding(&mut all);
        let dashes: Vec<&str> = all.iter().map(|s| s.dash).collect();
        assert_eq!(dashes, ["", "", DASHES[0], DASHES[1]]);
    }

    #[test]
    fn step_line_is_flat_per_bucket() {
        assert_eq!(
            steps_of(&[2, 0], 10.0),
            vec![(0.0, 2.0), (10.0, 2.0), (10.0, 0.0), (20.0, 0.0)]
        );
    }
}
