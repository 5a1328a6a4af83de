//! The default pipeline's fair-share burst placement, through `switchyard replay` with the real
//! libraries and `configs/default.toml` (4 endpoints): skewed bursts and requests that share
//! nothing are spread evenly, and prompt groups are split no more than the shares require.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use switchyard_tests::live::{binary, temp_dir};
use switchyard_tests::{plugin_dir, workspace_root};

/// Replays the request `lines` through `configs/default.toml` (with decision records unless
/// `brief`) and returns the decisions, in order.
fn replay(tag: &str, lines: &[String], brief: bool) -> Vec<serde_json::Value> {
    let dir = temp_dir(tag);
    let input = dir.join("requests.jsonl");
    std::fs::write(&input, lines.join("\n")).unwrap();
    let mut command = Command::new(binary());
    command.args(["replay", "--config", "configs/default.toml"]);
    if brief {
        command.arg("--brief");
    }
    let output = command
        .arg("--plugin-dir")
        .arg(plugin_dir())
        .arg("--input")
        .arg(&input)
        .current_dir(workspace_root())
        .output()
        .expect("switchyard runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The request with id `r{i}`, prompt `p` of `length` tokens, arriving at `at` ms.
fn request(i: usize, at: f64, p: usize, length: usize) -> serde_json::Value {
    let tokens: Vec<u32> = (0..length as u32).map(|t| p as u32 * 100_000 + t).collect();
    serde_json::json!({"arrival_ms": at, "id": format!("r{i}"), "tokens": tokens})
}

/// The index `i` of a decision's request id `r{i}`, and its endpoint.
fn placed(decision: &serde_json::Value) -> (usize, String) {
    let index = decision["id"].as_str().unwrap()[1..].parse().unwrap();
    let endpoint = decision["endpoints"][0].as_str().expect("placed");
    (index, endpoint.to_string())
}

/// Replays `prompts` (one request per entry, all at time 0 so they share one window) and
/// returns each request's prompt index and endpoint.
fn place(tag: &str, prompts: &[usize], prompt_tokens: usize) -> Vec<(usize, String)> {
    let lines: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, &p)| request(i, 0.0, p, prompt_tokens).to_string())
        .collect();
    replay(tag, &lines, true)
        .iter()
        .map(|decision| {
            let (index, endpoint) = placed(decision);
            (prompts[index], endpoint)
        })
        .collect()
}

fn per_endpoint(placed: &[(usize, String)]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (_, endpoint) in placed {
        *counts.entry(endpoint.clone()).or_insert(0) += 1;
    }
    counts
}

#[test]
fn a_skewed_burst_fills_every_endpoint_evenly_with_few_splits() {
    // 2 prompts x 32 samples, interleaved, over 4 endpoints.
    let prompts: Vec<usize> = (0..64).map(|i| i % 2).collect();
    let placed = place("skewed", &prompts, 640);
    let counts = per_endpoint(&placed);
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(counts.values().all(|&n| n == 16), "{counts:?}");
    let pairs: BTreeSet<_> = placed.iter().collect();
    let (groups, endpoints) = (2, 4);
    assert!(
        pairs.len() < groups + endpoints,
        "{} placements, more than P + R - 1: {pairs:?}",
        pairs.len()
    );
}

#[test]
fn whole_groups_that_fit_the_shares_stay_whole() {
    // 8 prompts x 8 samples over 4 endpoints: two whole groups per endpoint.
    let prompts: Vec<usize> = (0..64).map(|i| i % 8).collect();
    let placed = place("whole", &prompts, 640);
    let counts = per_endpoint(&placed);
    assert!(counts.values().all(|&n| n == 16), "{counts:?}");
    let pairs: BTreeSet<_> = placed.iter().collect();
    assert_eq!(pairs.len(), 8, "each prompt on one endpoint: {pairs:?}");
}

#[test]
fn requests_that_share_nothing_are_spread_evenly() {
    let prompts: Vec<usize> = (0..32).collect();
    let counts = per_endpoint(&place("distinct", &prompts, 640));
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(counts.values().all(|&n| n == 8), "{counts:?}");
}

/// Replays `requests` (`(arrival ms, prompt index, prompt tokens)`, one request each) with
/// decision records; returns each request's prompt index, endpoint and the burst-affinity
/// filter's note.
fn place_records(tag: &str, requests: &[(f64, usize, usize)]) -> Vec<(usize, String, String)> {
    let lines: Vec<String> = requests
        .iter()
        .enumerate()
        .map(|(i, &(at, p, length))| request(i, at, p, length).to_string())
        .collect();
    replay(tag, &lines, false)
        .iter()
        .map(|decision| {
            let (index, endpoint) = placed(decision);
            let note = decision["decision"]["filters"][0]["note"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (requests[index].1, endpoint, note)
        })
        .collect()
}

#[test]
fn a_burst_cut_into_windows_keeps_the_plans_balance_past_the_load_gate() {
    // Unequal groups with prompts of unequal lengths, sent in five pauses-apart waves as a
    // lagging client delivers them: the plan must split the largest groups over windows, and
    // the filter's load gate must not pull the split-off samples back to their first replica
    // (the samples of one prompt on one replica are one prefill, not one each).
    let sizes = [48usize, 4, 32, 12, 40, 8, 28, 16];
    let mut order: Vec<usize> = sizes
        .iter()
        .enumerate()
        .flat_map(|(g, &n)| std::iter::repeat_n(g, n))
        .collect();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for i in (1..order.len()).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        order.swap(i, (state >> 33) as usize % (i + 1));
    }
    let waves = [0.0, 12.0, 24.0, 36.0, 48.0];
    let requests: Vec<(f64, usize, usize)> = order
        .iter()
        .enumerate()
        .map(|(k, &g)| {
            let wave = waves[k * waves.len() / order.len()];
            (wave + (k % 40) as f64 * 0.02, g, 700 + 450 * g)
        })
        .collect();
    let placed = place_records("gate", &requests);
    let released: Vec<&String> = placed
        .iter()
        .map(|(_, _, note)| note)
        .filter(|note| note.contains("released"))
        .collect();
    assert!(released.is_empty(), "the gate released {released:?}");
    let mut counts = BTreeMap::new();
    for (_, endpoint, _) in &placed {
        *counts.entry(endpoint.clone()).or_insert(0usize) += 1;
    }
    let fair = order.len() as f64 / 4.0;
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(
        counts
            .values()
            .all(|&n| (n as f64 - fair).abs() <= (0.1 * fair).max(2.0)),
        "fair share {fair}: {counts:?}"
    );
}

#[test]
fn a_scrape_still_counting_a_finished_burst_does_not_skew_the_next() {
    // The router saw every replica idle beside its own traffic; half a second later a stale
    // scrape still counts 20 running requests on three of the four replicas (a burst of ours
    // that has since finished). The next burst goes exactly where it goes without that scrape.
    let place = |stale: bool| {
        let metrics = |running: fn(usize) -> u32| -> serde_json::Value {
            (0..4)
                .map(|r| {
                    let facts = serde_json::json!({"running_requests": running(r)});
                    (format!("/replica-{r}"), facts)
                })
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        let mut lines = vec![serde_json::json!({
            "arrival_ms": 0, "id": "before", "tokens": [1, 2, 3], "metrics": metrics(|_| 0)
        })
        .to_string()];
        for i in 0..64 {
            let mut line = request(i, 500.0, i % 8, 640);
            if i == 0 && stale {
                line["metrics"] = metrics(|r| if r == 3 { 0 } else { 20 });
            }
            lines.push(line.to_string());
        }
        let tag = if stale {
            "stale-scrape"
        } else {
            "fresh-scrape"
        };
        replay(tag, &lines, true)
            .iter()
            .map(|d| (d["id"].to_string(), d["endpoints"][0].to_string()))
            .collect::<Vec<_>>()
    };
    let fresh = place(false);
    assert_eq!(fresh.len(), 65);
    assert_eq!(place(true), fresh);
}
