//! `report.html`: a self-contained page with a summary table and inline SVG line charts.

use super::PipelineReport;
use std::fmt::Write as _;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 28.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 44.0;
const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// One line of a chart.
struct Line<'a> {
    label: String,
    color: &'a str,
    points: Vec<(f64, f64)>,
}

pub(super) fn page(reports: &[PipelineReport]) -> String {
    let mut out = String::new();
    out.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>switchyard simulation report</title>\n<style>\n\
         body{font-family:sans-serif;margin:24px;color:#222}\n\
         table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}\n\
         td:first-child,th:first-child{text-align:left}\n\
         svg{display:block;margin:8px 0 24px}\n\
         </style>\n</head>\n<body>\n<h1>switchyard simulation report</h1>\n",
    );
    summary_table(&mut out, reports);

    per_pipeline_chart(
        &mut out,
        reports,
        ("Time to first token", "TTFT CDF"),
        ("TTFT (ms)", "percentile"),
        |r| {
            r.ttft_cdf_ms
                .iter()
                .enumerate()
                .map(|(p, &ms)| (ms, p as f64))
                .collect()
        },
    );
    serving_table(&mut out, reports);
    per_pipeline_chart(
        &mut out,
        reports,
        (
            "RL rollout steps",
            "first arrival to last completion, per step",
        ),
        ("step", "duration (s)"),
        |r| {
            r.rl_steps
                .iter()
                .map(|s| (f64::from(s.step), s.duration_ms / 1000.0))
                .collect()
        },
    );
    per_pipeline_chart(
        &mut out,
        reports,
        ("Busy share per replica", "time in steps"),
        ("replica", "busy (%)"),
        |r| indexed(&r.utilisation.busy, 100.0),
    );
    per_pipeline_chart(
        &mut out,
        reports,
        ("KV blocks held per replica", "time-averaged"),
        ("replica", "KV usage (%)"),
        |r| indexed(&r.utilisation.kv_usage, 100.0),
    );
    per_pipeline_chart(
        &mut out,
        reports,
        ("Sequences in the batch per replica", "time-averaged"),
        ("replica", "sequences"),
        |r| indexed(&r.utilisation.batch, 1.0),
    );

    out.push_str("<h2>Load per replica over time (running + waiting, peak per bucket)</h2>\n");
    for r in reports {
        let series = &r.load_series;
        let y_max = series
            .per_replica
            .iter()
            .flatten()
            .copied()
            .max()
            .unwrap_or(0);
        let lines: Vec<Line> = series
            .per_replica
            .iter()
            .enumerate()
            .map(|(i, buckets)| Line {
                label: format!("replica {i}"),
                color: PALETTE[i % PALETTE.len()],
                points: steps(buckets, series.bucket_ms),
            })
            .collect();
        let title = format!("{}: load over time", r.name);
        chart(
            &mut out,
            &title,
            "time (ms)",
            "requests",
            r.makespan_ms,
            f64::from(y_max),
            &lines,
        );
    }
    out.push_str("</body>\n</html>\n");
    out
}

fn summary_table(out: &mut String, reports: &[PipelineReport]) {
    out.push_str(
        "<table>\n<tr><th>pipeline</th><th>completed</th><th>rejected by router</th>\
         <th>rejected by replica</th><th>unrouted</th>\
         <th>cache hit rate</th><th>prefill tokens</th><th>ideal</th>\
         <th>TTFT p50 / p99 / mean (ms)</th><th>E2E p50 / p99 / mean (ms)</th>\
         <th>router wait p50 / p99 (ms)</th><th>peak load max / mean</th>\
         <th>prefills per prompt per step</th></tr>\n",
    );
    for r in reports {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}%</td><td>{}</td>\
             <td>{}</td><td>{:.1} / {:.1} / {:.1}</td><td>{:.1} / {:.1} / {:.1}</td>\
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

/// One chart under a `(heading, title)` with `(x, y)` axis labels and a line per pipeline,
/// skipped when no pipeline has a point.
fn per_pipeline_chart(
    out: &mut String,
    reports: &[PipelineReport],
    (heading, title): (&str, &str),
    (x_label, y_label): (&str, &str),
    points: impl Fn(&PipelineReport) -> Vec<(f64, f64)>,
) {
    let lines: Vec<Line> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| Line {
            label: r.name.clone(),
            color: PALETTE[i % PALETTE.len()],
            points: points(r),
        })
        .collect();
    if lines.iter().all(|l| l.points.is_empty()) {
        return;
    }
    let max = |f: fn(&(f64, f64)) -> f64| {
        lines
            .iter()
            .flat_map(|l| l.points.iter().map(f))
            .fold(0.0, f64::max)
    };
    let _ = writeln!(out, "<h2>{}</h2>", escape(heading));
    chart(
        out,
        title,
        x_label,
        y_label,
        max(|p| p.0).max(1.0),
        max(|p| p.1),
        &lines,
    );
    legend(out, &lines);
}

/// Bucket values as a step line: flat across each bucket.
fn steps(buckets: &[u32], bucket_ms: f64) -> Vec<(f64, f64)> {
    let mut points = Vec::with_capacity(buckets.len() * 2);
    for (b, &v) in buckets.iter().enumerate() {
        points.push((b as f64 * bucket_ms, f64::from(v)));
        points.push(((b + 1) as f64 * bucket_ms, f64::from(v)));
    }
    points
}

fn legend(out: &mut String, lines: &[Line]) {
    out.push_str("<p>");
    for line in lines {
        let _ = write!(
            out,
            "<span style=\"color:{}\">&#9632;</span> {} &nbsp; ",
            line.color,
            escape(&line.label)
        );
    }
    out.push_str("</p>\n");
}

fn chart(
    out: &mut String,
    title: &str,
    x_label: &str,
    y_label: &str,
    x_max: f64,
    y_max: f64,
    lines: &[Line],
) {
    let x_max = nice_ceiling(x_max);
    let y_max = nice_ceiling(y_max);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let sx = |x: f64| LEFT + x / x_max * plot_w;
    let sy = |y: f64| TOP + plot_h - y / y_max * plot_h;
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-size=\"11\">"
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
    for i in 0..=4 {
        let f = f64::from(i) / 4.0;
        let (x, y) = (sx(f * x_max), sy(f * y_max));
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\
             <line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            TOP + plot_h,
            TOP + plot_h + 14.0,
            tick(f * x_max),
            LEFT + plot_w,
            LEFT - 4.0,
            y + 4.0,
            tick(f * y_max),
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
    for line in lines {
        if line.points.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"",
            line.color
        );
        for &(x, y) in &line.points {
            let _ = write!(out, "{:.1},{:.1} ", sx(x), sy(y));
        }
        let _ = writeln!(out, "\"><title>{}</title></polyline>", escape(&line.label));
    }
    out.push_str("</svg>\n");
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
    fn step_line_is_flat_per_bucket() {
        assert_eq!(
            steps(&[2, 0], 10.0),
            vec![(0.0, 2.0), (10.0, 2.0), (10.0, 0.0), (20.0, 0.0)]
        );
    }
}
