//! The default pipeline's fair-share burst placement, through `switchyard replay` with the real
//! libraries and `configs/default.toml` (4 endpoints): skewed bursts and requests that share
//! nothing are spread evenly, and prompt groups are split no more than the shares require.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use switchyard_tests::live::{binary, temp_dir};
use switchyard_tests::{plugin_dir, workspace_root};

/// Replays `prompts` (one request per entry, all at time 0 so they share one window) and
/// returns each request's prompt index and endpoint.
fn place(tag: &str, prompts: &[usize], prompt_tokens: usize) -> Vec<(usize, String)> {
    let dir = temp_dir(tag);
    let input = dir.join("requests.jsonl");
    let lines: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let tokens: Vec<u32> = (0..prompt_tokens as u32)
                .map(|t| p as u32 * 100_000 + t)
                .collect();
            serde_json::json!({"arrival_ms": 0, "id": format!("r{i}"), "tokens": tokens})
                .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let output = Command::new(binary())
        .args([
            "replay",
            "--config",
            "configs/default.toml",
            "--brief",
            "--plugin-dir",
        ])
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
    let mut placed = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        let id = value["id"].as_str().unwrap();
        let index: usize = id[1..].parse().unwrap();
        let endpoint = value["endpoints"][0].as_str().expect("placed").to_string();
        placed.push((prompts[index], endpoint));
    }
    let _ = std::fs::remove_dir_all(dir);
    placed
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

/// Replays `requests` (`(arrival ms, prompt index, prompt tokens)`, one request each) through
/// `config` with decision records; returns each request's prompt index, endpoint and the
/// burst-affinity filter's note.
fn place_records(
    tag: &str,
    config: &str,
    requests: &[(f64, usize, usize)],
) -> Vec<(usize, String, String)> {
    let dir = temp_dir(tag);
    let input = dir.join("requests.jsonl");
    let lines: Vec<String> = requests
        .iter()
        .enumerate()
        .map(|(i, &(at, p, length))| {
            let tokens: Vec<u32> = (0..length as u32).map(|t| p as u32 * 100_000 + t).collect();
            serde_json::json!({"arrival_ms": at, "id": format!("r{i}"), "tokens": tokens})
                .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let output = Command::new(binary())
        .args(["replay", "--config", config, "--plugin-dir"])
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
    let mut placed = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        let index: usize = value["id"].as_str().unwrap()[1..].parse().unwrap();
        let endpoint = value["endpoints"][0].as_str().expect("placed").to_string();
        let note = value["decision"]["filters"][0]["note"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        placed.push((requests[index].1, endpoint, note));
    }
    let _ = std::fs::remove_dir_all(dir);
    placed
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
    let placed = place_records("gate", "configs/default.toml", &requests);
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
        let dir = temp_dir(if stale {
            "stale-scrape"
        } else {
            "fresh-scrape"
        });
        let input = dir.join("requests.jsonl");
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
        for i in 0..64u32 {
            let p = i % 8;
            let tokens: Vec<u32> = (0..640).map(|t| p * 100_000 + t).collect();
            let mut line =
                serde_json::json!({"arrival_ms": 500, "id": format!("r{i}"), "tokens": tokens});
            if i == 0 && stale {
                line["metrics"] = metrics(|r| if r == 3 { 0 } else { 20 });
            }
            lines.push(line.to_string());
        }
        std::fs::write(&input, lines.join("\n")).unwrap();
        let output = Command::new(binary())
            .args(["replay", "--config", "configs/default.toml", "--brief"])
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
            .map(|line| {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                let endpoint = value["endpoints"][0].as_str().expect("placed");
                (
                    value["id"].as_str().unwrap().to_string(),
                    endpoint.to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    let fresh = place(false);
    assert_eq!(fresh.len(), 65);
    assert_eq!(place(true), fresh);
}
