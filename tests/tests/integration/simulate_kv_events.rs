//! `simulate` with the precise producer fed by the simulated replicas' own KV-cache events,
//! beside the approximate producer, through the real binary and plugin libraries.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;
use switchyard_tests::live::binary;
use switchyard_tests::{plugin_dir, workspace_root};

fn run(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .current_dir(workspace_root())
        .env_remove("SWITCHYARD_PLUGIN_DIR")
        .output()
        .expect("switchyard runs")
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "switchyard-simulate-kv-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Four replicas whose pools hold fewer blocks than the tenants' prefixes sent to them, and a
/// short kv-pressure run: 120 tenants of 2000 tokens, outputs long enough that running
/// sequences take half of each pool. Returns `report.json`.
fn simulate_under_pressure(dir: &std::path::Path, extra: &[&str]) -> Value {
    let fleet = dir.join("fleet.toml");
    std::fs::write(&fleet, "[[groups]]\nreplicas = 4\nkvBlocks = 3000\n").unwrap();
    let plugins = plugin_dir().display().to_string();
    let output = dir.join("report");
    let mut args = vec![
        "simulate",
        "--config",
        "configs/approx-prefix-load.toml",
        "--compare",
        "configs/precise-prefix-load.toml",
        "--no-baselines",
        "--plugin-dir",
        &plugins,
        "--fleet",
        fleet.to_str().unwrap(),
        "--workload",
        "kv-pressure",
        "--set",
        "tenants=120",
        "--set",
        "prefixTokens=2000",
        "--set",
        "questionTokensMin=200",
        "--set",
        "questionTokensMax=400",
        "--set",
        "outputTokensMin=300",
        "--set",
        "outputTokensMax=600",
        "--set",
        "requests=600",
        "--output",
        output.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("kv-event-prefix-cache-producer"),
        "the predictions table names the producers:\n{stdout}"
    );
    serde_json::from_str(&std::fs::read_to_string(output.join("report.json")).unwrap()).unwrap()
}

/// `name`'s object of `report`.
fn pipeline<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["pipelines"]
        .as_array()
        .expect("pipelines")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no pipeline {name}"))
}

/// `producer`'s figures in `name`'s object of `report`.
fn figures<'a>(report: &'a Value, name: &str, producer: &str) -> &'a Value {
    let object = pipeline(report, name);
    object["prefix_predictions"]
        .as_array()
        .expect("prefix_predictions")
        .iter()
        .find(|p| p["producer"] == producer)
        .unwrap_or_else(|| panic!("{name} has no figures of {producer}: {object}"))
}

fn share(figures: &Value, key: &str) -> f64 {
    figures[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} in {figures}"))
}

#[test]
fn simulated_precise_predictions_hold_under_kv_pressure_and_approximate_ones_less() {
    let dir = temp_dir("pressure");
    let report = simulate_under_pressure(&dir, &["--kv-event-delay-ms", "0"]);
    assert_eq!(report["run"]["kv_event_delay_ms"], 0.0);
    assert_eq!(report["run"]["workload"], "kv-pressure");
    for p in report["pipelines"].as_array().unwrap() {
        assert_eq!(p["completed"], 600, "{}", p["name"]);
        assert!(
            p["evictions"].as_u64().unwrap() > 10_000,
            "{}: the pools evict all the time ({})",
            p["name"],
            p["evictions"]
        );
    }

    let precise = figures(
        &report,
        "precise-prefix-load",
        "kv-event-prefix-cache-producer",
    );
    assert!(precise["checked_requests"].as_u64().unwrap() >= 590);
    assert!(precise["cached_tokens"].as_u64().unwrap() > 100_000);
    let (precision, recall) = (share(precise, "precision"), share(precise, "recall"));
    assert!(
        recall >= 0.95 && precision >= 0.95,
        "the engines' own events predict what they hold: {precise}"
    );

    // The approximate producer, routing on its own estimate, believes in blocks the pools
    // evicted to make room for running sequences.
    let approx = figures(
        &report,
        "approx-prefix-load",
        "approx-prefix-cache-producer",
    );
    let approx_precision = share(approx, "precision");
    assert!(
        approx_precision <= precision - 0.03,
        "approximate precision {approx_precision} against precise {precision}: {approx}"
    );

    // The same seed, the same report.
    let again = simulate_under_pressure(&dir, &["--kv-event-delay-ms", "0"]);
    assert_eq!(again["pipelines"], report["pipelines"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_two_routers_side_by_side_only_the_engines_events_keep_the_whole_picture() {
    let dir = temp_dir("side-by-side");
    let report = simulate_under_pressure(&dir, &["--routers", "2"]);
    assert_eq!(report["run"]["routers"], 2);
    for p in report["pipelines"].as_array().unwrap() {
        assert_eq!(p["completed"], 600, "{}", p["name"]);
    }

    // Each router hears every replica's events, so its index is the fleet's.
    let precise = figures(
        &report,
        "precise-prefix-load",
        "kv-event-prefix-cache-producer",
    );
    assert!(
        share(precise, "precision") >= 0.95 && share(precise, "recall") >= 0.95,
        "{precise}"
    );
    // Each approximate producer models the caches from half the requests that fill them: it
    // believes in prefixes the other router's requests pushed out.
    let approx = figures(
        &report,
        "approx-prefix-load",
        "approx-prefix-cache-producer",
    );
    assert!(share(approx, "precision") <= 0.8, "{approx}");

    let hit_rate = |name| share(pipeline(&report, name), "cache_hit_rate");
    let (precise_hits, approx_hits) = (
        hit_rate("precise-prefix-load"),
        hit_rate("approx-prefix-load"),
    );
    assert!(
        precise_hits >= approx_hits + 0.1,
        "hit rate {precise_hits} with the engines' events against {approx_hits} estimated"
    );
    let p90 = |name| share(&pipeline(&report, name)["ttft_ms"], "p90");
    assert!(
        p90("precise-prefix-load") < p90("approx-prefix-load"),
        "TTFT p90 {} against {}",
        p90("precise-prefix-load"),
        p90("approx-prefix-load")
    );

    // One router: the same requests, the approximate producer sees them all.
    let alone = simulate_under_pressure(&dir, &[]);
    assert_eq!(alone["run"]["routers"], 1);
    let alone_approx = figures(&alone, "approx-prefix-load", "approx-prefix-cache-producer");
    assert!(share(alone_approx, "precision") >= 0.9, "{alone_approx}");
    let _ = std::fs::remove_dir_all(&dir);
}
