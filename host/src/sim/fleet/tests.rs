use super::*;
use std::path::Path;

fn parse(text: &str) -> Result<SimFleet, String> {
    SimFleet::parse(Path::new("fleet.toml"), text).map_err(|e| e.to_string())
}

#[test]
fn groups_take_a_preset_and_override_its_fields() {
    let fleet = parse(
        "blockSizeTokens = 32\nscrapeIntervalMs = 100\n\n[[groups]]\nreplicas = 2\nprofile = \
         \"h100-llama3-8b\"\nkvBlocks = 5000\n\n[[groups]]\nreplicas = 3\nprofile = \
         \"fixed-rate\"\ndecodeTokensPerSecond = 25\n",
    )
    .unwrap();
    assert_eq!(fleet.block_size_tokens, 32);
    assert_eq!(fleet.scrape_interval_ms, 100.0);
    assert_eq!(fleet.replicas(), 5);
    assert_eq!(fleet.describe(), "2 × h100-llama3-8b + 3 × fixed-rate");
    let Profile::Engine(e) = &fleet.groups[0].profile else {
        panic!("engine profile expected");
    };
    assert_eq!(e.kv_blocks, 5000);
    assert_eq!(e.max_num_seqs, 256);
    let Profile::FixedRate(c) = &fleet.groups[1].profile else {
        panic!("fixed-rate profile expected");
    };
    assert_eq!(c.decode_tokens_per_second, 25.0);
    assert_eq!(
        fleet.blocks_per_replica(),
        vec![5000, 5000, 16384, 16384, 16384]
    );
}

#[test]
fn errors_name_file_line_field_value_and_range() {
    let err = parse("[[groups]]\nreplicas = 2\n\n[[groups]]\nreplicas = 1\nmaxNumSeqs = 0\n")
        .unwrap_err();
    assert_eq!(
        err,
        "fleet.toml:6: maxNumSeqs must be in 1..=100000 (got 0)"
    );
    let err = parse("scrapeIntervalMs = -1\n[[groups]]\n").unwrap_err();
    assert_eq!(
        err,
        "fleet.toml:1: scrapeIntervalMs must be in [0, 1000000] (got -1)"
    );
    let err = parse("[[groups]]\nprofile = \"b200\"\n").unwrap_err();
    assert!(
        err.starts_with("fleet.toml:2: unknown profile `b200` (expected one of: h100x2-qwen3-32b,"),
        "{err}"
    );
    let err = parse("[[groups]]\nprofile = \"fixed-rate\"\nkvBlocks = 4\n").unwrap_err();
    assert!(
        err.starts_with("fleet.toml:3: unknown key `kvBlocks` for the fixed-rate profile"),
        "{err}"
    );
    let err = parse("[[groups]]\nkvBlocks = \"many\"\n").unwrap_err();
    assert_eq!(
        err,
        "fleet.toml:2: kvBlocks must be a non-negative integer (got \"many\")"
    );
    let err = parse("blockSize = 16\n[[groups]]\n").unwrap_err();
    assert!(
        err.starts_with("fleet.toml:1: unknown key `blockSize`"),
        "{err}"
    );
    let err = parse("[groups\n").unwrap_err();
    assert!(err.starts_with("fleet.toml:1: TOML syntax"), "{err}");
    let err = parse("scrapeIntervalMs = 5\n").unwrap_err();
    assert!(err.contains("no [[groups]]"), "{err}");
}

#[test]
fn the_fixed_rate_fleet_keeps_the_old_model_with_fresh_metrics() {
    let fleet = SimFleet::from(&FleetConfig::default());
    assert_eq!(fleet.scrape_interval_ms, 0.0);
    assert_eq!(fleet.replicas(), 8);
    fleet.validate().unwrap();
    let default = SimFleet::default_fleet(8);
    assert_eq!(default.describe(), "8 × h100x2-qwen3-32b");
    assert_eq!(default.scrape_interval_ms, 50.0);
}

#[test]
fn the_kv_event_delay_is_fleet_wide_and_checked() {
    assert_eq!(SimFleet::default_fleet(2).kv_event_delay_ms, 10.0);
    let fleet = parse("kvEventDelayMs = 0\n[[groups]]\n").unwrap();
    assert_eq!(fleet.kv_event_delay_ms, 0.0);
    let fleet = parse("kvEventDelayMs = 2.5\n[[groups]]\n").unwrap();
    assert_eq!(fleet.kv_event_delay_ms, 2.5);
    let err = parse("scrapeIntervalMs = 5\nkvEventDelayMs = -3\n[[groups]]\n").unwrap_err();
    assert_eq!(
        err,
        "fleet.toml:2: kvEventDelayMs must be in [0, 1000000] (got -3)"
    );
    let err = parse("kvEventDelayMs = \"soon\"\n[[groups]]\n").unwrap_err();
    assert_eq!(
        err,
        "fleet.toml:1: kvEventDelayMs must be a number (got \"soon\")"
    );
}
