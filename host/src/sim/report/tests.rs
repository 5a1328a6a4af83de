use super::*;
use crate::sim::config::FleetConfig;
use crate::sim::engine::run;
use crate::sim::router::{LeastInFlight, RoundRobin, SimRequest};

#[test]
fn nearest_rank_percentiles() {
    let v = [15.0, 20.0, 35.0, 40.0, 50.0];
    assert_eq!(percentile(&v, 0.0), 15.0);
    assert_eq!(percentile(&v, 5.0), 15.0);
    assert_eq!(percentile(&v, 30.0), 20.0);
    assert_eq!(percentile(&v, 40.0), 20.0);
    assert_eq!(percentile(&v, 50.0), 35.0);
    assert_eq!(percentile(&v, 100.0), 50.0);
    assert_eq!(percentile(&[], 50.0), 0.0);
    let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(percentile(&hundred, 99.0), 99.0);
    let mut unsorted = [3.0, 1.0, 2.0, 10.0];
    assert_eq!(
        Summary::of(&mut unsorted),
        Summary {
            count: 4,
            mean: 4.0,
            p50: 2.0,
            p90: 10.0,
            p99: 10.0
        }
    );
}

fn workload() -> Vec<SimRequest> {
    (0..6)
        .map(|i| SimRequest {
            id: i,
            arrival_ms: 100.0 * i as f64,
            model: "m".into(),
            cache_salt: String::new(),
            tokens: (0..320)
                .map(|t| t + 1000 * (i as u32 % 2))
                .collect::<Vec<u32>>()
                .into(),
            output_tokens: 11,
            group: i % 2,
            step: Some(0),
        })
        .collect()
}

fn fleet() -> FleetConfig {
    FleetConfig {
        replicas: 2,
        max_running_sequences: 1,
        ..FleetConfig::default()
    }
}

fn reports() -> Vec<PipelineReport> {
    let w = workload();
    vec![
        run(&w, fleet(), &mut RoundRobin::new(), &mut |_, _| {}),
        run(&w, fleet(), &mut LeastInFlight::new(), &mut |_, _| {}),
    ]
}

fn run_context() -> RunContext {
    RunContext {
        command_line: ["switchyard", "simulate", "--set", "samples=4"]
            .map(String::from)
            .to_vec(),
        switchyard_version: "9.9.9".into(),
        workload: "rl-rollout".into(),
        trace: None,
        workload_parameters: serde_json::json!({"samples": 4, "prompts": 2}),
        requests: 6,
        fleet_file: None,
        replicas: 2,
        profiles: vec![ProfileGroup {
            replicas: 2,
            profile: "fixed-rate".into(),
        }],
        block_size_tokens: 16,
        scrape_interval_ms: 0.0,
        kv_event_delay_ms: 10.0,
        seed: 7,
        routers: 1,
        configs: vec![ConfigFile {
            pipeline: "test".into(),
            path: Some("configs/test.toml".into()),
            sha256: "ab".repeat(32),
        }],
    }
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut k: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    k.sort();
    k
}

#[test]
fn report_json_has_the_documented_keys() {
    let dir = std::env::temp_dir().join(format!("switchyard-sim-report-{}", std::process::id()));
    let reports = reports();
    write_reports(&dir, &run_context(), &reports).unwrap();
    let text = std::fs::read_to_string(dir.join("report.json")).unwrap();
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(keys(&json), sorted(&["run", "pipelines"]));
    let run = &json["run"];
    assert_eq!(
        keys(run),
        sorted(&[
            "command_line",
            "switchyard_version",
            "workload",
            "trace",
            "workload_parameters",
            "requests",
            "fleet_file",
            "replicas",
            "profiles",
            "block_size_tokens",
            "scrape_interval_ms",
            "kv_event_delay_ms",
            "seed",
            "routers",
            "configs",
        ])
    );
    assert_eq!(run["configs"][0]["sha256"], "ab".repeat(32));
    assert_eq!(run["workload_parameters"]["samples"], 4);
    let array = json["pipelines"].as_array().unwrap();
    assert_eq!(array.len(), 2);
    let first = &array[0];
    assert_eq!(
        keys(first),
        sorted(&[
            "name",
            "requests",
            "completed",
            "rejected_by_router",
            "rejected_by_replica",
            "unrouted",
            "prompt_tokens",
            "prefill_tokens_computed",
            "prefill_tokens_cached",
            "prefill_tokens_ideal",
            "cache_hit_rate",
            "ttft_ms",
            "e2e_ms",
            "router_wait_ms",
            "replica_load",
            "prefills_per_prompt_per_step",
            "makespan_ms",
            "ttft_cdf_ms",
            "load_series",
            "throughput",
            "goodput",
            "queue_wait_ms",
            "prefill_ms",
            "tpot_ms",
            "preemptions",
            "evictions",
            "recomputed_tokens",
            "utilisation",
            "rl_steps",
            "rl_step_total_ms",
            "prefix_predictions",
        ])
    );
    assert_eq!(first["prefix_predictions"], serde_json::json!([]));
    assert_eq!(
        keys(&first["throughput"]),
        sorted(&["requests_per_s", "output_tokens_per_s"])
    );
    assert_eq!(
        keys(&first["goodput"]),
        sorted(&[
            "ttft_objective_ms",
            "tpot_objective_ms",
            "requests",
            "requests_per_s",
            "share"
        ])
    );
    assert_eq!(
        keys(&first["utilisation"]),
        sorted(&["busy", "kv_usage", "batch"])
    );
    assert_eq!(
        keys(&first["rl_steps"][0]),
        sorted(&["step", "requests", "start_ms", "done_ms", "duration_ms"])
    );
    for summary in [
        "ttft_ms",
        "e2e_ms",
        "router_wait_ms",
        "queue_wait_ms",
        "prefill_ms",
        "tpot_ms",
    ] {
        assert_eq!(
            keys(&first[summary]),
            sorted(&["count", "mean", "p50", "p90", "p99"])
        );
    }
    assert_eq!(
        keys(&first["replica_load"]),
        sorted(&[
            "max",
            "mean",
            "peak_per_replica",
            "served_per_replica",
            "prefill_tokens_computed_per_replica",
            "prefill_tokens_cached_per_replica",
        ])
    );
    assert_eq!(
        keys(&first["load_series"]),
        sorted(&["bucket_ms", "per_replica"])
    );
    assert_eq!(first["name"], "round-robin");
    assert_eq!(array[1]["name"], "least-in-flight");
    assert_eq!(first["ttft_cdf_ms"].as_array().unwrap().len(), 101);

    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("round-robin: load over time"));
    assert!(html.contains("least-in-flight: load over time"));
    // TTFT CDFs, RL steps, busy, KV usage, batch, and a load chart per pipeline.
    assert_eq!(html.matches("<svg class=\"chart\"").count(), 7);
    // The run: command line, workload, fleet, seed, config and its digest, version.
    for shown in [
        "switchyard simulate --set samples=4",
        "rl-rollout, 6 requests",
        "samples=4",
        "2 replicas (2 × fixed-rate)",
        &format!("configs/test.toml (sha256 {})", "ab".repeat(32)),
        "9.9.9",
        "<th>seed</th><td>7</td>",
    ] {
        assert!(html.contains(shown), "{shown} missing");
    }
    assert!(html.contains("Goodput counts completed requests"));
    assert!(!html.contains("<script"));
    assert!(
        !html.contains("Prefix predictions"),
        "no table when nothing predicts"
    );
    assert_eq!(render_predictions_table(&reports), "");
}

#[test]
fn prefix_predictions_are_shown_per_pipeline_and_producer() {
    let mut reports = reports();
    reports[1].prefix_predictions = vec![
        PrefixPrediction {
            producer: "kv-event-prefix-cache-producer".into(),
            checked_requests: 6,
            predicted_tokens: 400,
            cached_tokens: 500,
            correct_tokens: 400,
            precision: Some(1.0),
            recall: Some(0.8),
        },
        PrefixPrediction {
            producer: "silent".into(),
            checked_requests: 6,
            predicted_tokens: 0,
            cached_tokens: 500,
            correct_tokens: 0,
            precision: None,
            recall: Some(0.0),
        },
    ];
    let table = render_predictions_table(&reports);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("pipeline") && lines[0].ends_with("precision  recall"));
    let cells = |line: &str| {
        line.split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        cells(lines[1]),
        [
            "least-in-flight",
            "kv-event-prefix-cache-producer",
            "6",
            "400",
            "500",
            "400",
            "100.0%",
            "80.0%"
        ]
    );
    assert_eq!(
        cells(lines[2])[1..],
        ["silent", "6", "0", "500", "0", "-", "0.0%"]
    );
    let dir =
        std::env::temp_dir().join(format!("switchyard-sim-predictions-{}", std::process::id()));
    write_reports(&dir, &run_context(), &reports).unwrap();
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(html.contains("<h2>Prefix predictions</h2>"));
    assert!(html.contains(
        "<tr><td>least-in-flight</td><td>kv-event-prefix-cache-producer</td><td>6</td>\
         <td>400</td><td>500</td><td>400</td><td>100.0%</td><td>80.0%</td></tr>"
    ));
    let shown = &json["pipelines"][1]["prefix_predictions"];
    assert_eq!(shown[0]["recall"], 0.8);
    assert_eq!(shown[1]["precision"], serde_json::Value::Null);
    assert_eq!(
        keys(&shown[0]),
        sorted(&[
            "producer",
            "checked_requests",
            "predicted_tokens",
            "cached_tokens",
            "correct_tokens",
            "precision",
            "recall",
        ])
    );
}

#[test]
fn throughput_goodput_queue_and_step_figures() {
    // As below: each replica serves its three requests back to back, 220 ms each; the first
    // of each replica prefills for 20 ms, the later ones wait 20 ms for the slot and hit the
    // cache. Every request decodes 10 tokens after the first, 20 ms each.
    let report = &reports()[0];
    assert_eq!(report.throughput.requests_per_s, 6.0 / 0.72);
    assert_eq!(report.throughput.output_tokens_per_s, 66.0 / 0.72);
    assert_eq!(report.goodput.requests, 6);
    assert_eq!(report.goodput.share, 1.0);
    assert_eq!(report.queue_wait_ms.p50, 20.0);
    assert_eq!(report.queue_wait_ms.mean, 80.0 / 6.0);
    assert_eq!(
        report.prefill_ms,
        Summary {
            count: 6,
            mean: 40.0 / 6.0,
            p50: 0.0,
            p90: 20.0,
            p99: 20.0
        }
    );
    assert_eq!(report.tpot_ms.p99, 20.0);
    assert_eq!(report.preemptions, 0);
    let step = report.rl_steps[0];
    assert_eq!(
        (step.step, step.requests, step.start_ms, step.done_ms),
        (0, 6, 0.0, 720.0)
    );
    assert_eq!(report.rl_step_total_ms, Some(720.0));
    // Busy 0..620 and 100..720 ms of 720; one sequence at a time.
    assert_eq!(report.utilisation.busy, vec![620.0 / 720.0; 2]);
    assert_eq!(report.utilisation.batch, vec![620.0 / 720.0; 2]);
    let kv = 21.0 / 16384.0 * 620.0 / 720.0;
    assert!(report
        .utilisation
        .kv_usage
        .iter()
        .all(|&u| (u - kv).abs() < 1e-12));

    // A tighter per-token objective than the 20 ms decode fails every request.
    let strict = crate::sim::SimFleet {
        tpot_objective_ms: 19.0,
        ..crate::sim::SimFleet::from(&fleet())
    };
    let report = run(&workload(), &strict, &mut RoundRobin::new(), &mut |_, _| {});
    assert_eq!(report.goodput.requests, 0);
}

#[test]
fn load_series_keeps_the_peak_of_each_bucket() {
    // Round robin: replica 0 gets requests 0, 2, 4 (arriving at 0, 200, 400 ms), replica 1
    // gets 1, 3, 5 (100, 300, 500 ms). Each holds its single slot for 220 ms (the first of a
    // group prefills 320 tokens in 20 ms, the rest hit the cache; 10 more tokens take 200 ms),
    // so each later request waits: replica 0 is busy until 620 ms, replica 1 until 720 ms.
    let report = &reports()[0];
    assert_eq!(report.makespan_ms, 720.0);
    assert_eq!(report.replica_load.peak_per_replica, vec![2, 2]);
    let series = &report.load_series;
    assert_eq!(series.bucket_ms, 3.6);
    assert_eq!(series.per_replica.len(), 2);
    assert!(series.per_replica.iter().all(|b| b.len() == 200));
    let (r0, r1) = (&series.per_replica[0], &series.per_replica[1]);
    // Bucket 55 is [198, 201.6) ms, 83 is [298.8, 302.4) ms, 27 is [97.2, 100.8) ms.
    assert_eq!((r0[0], r0[54], r0[55], r0[199]), (1, 1, 2, 0));
    assert_eq!((r1[0], r1[26], r1[27], r1[83], r1[199]), (0, 0, 1, 2, 1));
}

#[test]
fn terminal_table_has_a_row_per_pipeline() {
    let table = render_table(&reports());
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].starts_with("pipeline"));
    assert!(lines[1].starts_with("round-robin "));
    assert!(lines[2].starts_with("least-in-flight "));
    assert!(lines[1].contains("6/6"));
    // Columns line up: every line puts the "done" column's right edge at the same place.
    let edge = |l: &str, cell: &str| l.find(cell).map(|i| i + cell.len());
    assert_eq!(edge(lines[0], "done"), edge(lines[1], "6/6"));
    assert!(lines[0].contains("requests/replica min-max"));
    let served = &reports()[0].replica_load.served_per_replica;
    let range = format!(
        " {}-{} ",
        served.iter().min().unwrap(),
        served.iter().max().unwrap()
    );
    assert!(lines[1].contains(&range), "{} lacks {range:?}", lines[1]);
}

#[test]
fn charts_show_coinciding_series_share_scales_and_draw_replicas_as_bars() {
    let mut reports = reports();
    // A copy of round robin's figures under another name, and a pipeline whose load peaks
    // higher than any other's but is otherwise round robin's too.
    let mut copy = reports[0].clone();
    copy.name = "copy".into();
    let mut busier = reports[0].clone();
    busier.name = "busier".into();
    busier.load_series.per_replica[0][0] = 17;
    reports.extend([copy, busier]);
    let html = html::page(&run_context(), &reports);

    let cdf = section(&html, "Time to first token");
    assert!(
        cdf.contains("Identical values: round-robin = copy = busier"),
        "{cdf}"
    );
    assert!(!cdf.contains("least-in-flight ="), "{cdf}");
    // The copies are drawn dashed, each differently, over the first.
    assert!(cdf.contains("stroke-dasharray=\"\" points="));
    assert!(cdf.contains("stroke-dasharray=\"8 6\" points="));
    assert!(cdf.contains("stroke-dasharray=\"2 5\" points="));

    // Per-replica figures are bars, one per pipeline and replica, not lines.
    let busy = section(&html, "Busy share per replica");
    assert_eq!(busy.matches("<polyline").count(), 0);
    assert_eq!(busy.matches("</title></rect>").count(), 4 * 2);
    assert!(busy.contains("Identical values: round-robin = copy = busier"));

    // Every load chart has the same count axis, up to the highest peak of any pipeline, in
    // whole numbers, and a legend naming each replica.
    let loads: Vec<&str> = html.split("load over time</text>").skip(1).collect();
    assert_eq!(loads.len(), 4);
    for chart in &loads {
        let chart = &chart[..chart.find("</p>").unwrap()];
        let ticks = y_ticks(chart);
        assert_eq!(ticks, ["0", "5", "10", "15", "20"], "{chart}");
        assert!(chart.contains("replica 0") && chart.contains("replica 1"));
    }
}

/// The part of `html` from the heading `title` to the next heading.
fn section<'a>(html: &'a str, title: &str) -> &'a str {
    let start = html.find(&format!("<h2>{title}</h2>")).unwrap();
    let rest = &html[start + 4..];
    &rest[..rest.find("<h2>").unwrap_or(rest.len())]
}

/// The y tick labels of one chart, bottom up.
fn y_ticks(chart: &str) -> Vec<&str> {
    chart
        .split("text-anchor=\"end\">")
        .skip(1)
        .map(|t| &t[..t.find('<').unwrap()])
        .collect()
}
