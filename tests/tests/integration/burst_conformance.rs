//! The burst producer's assignment cases (A1–A16) and its produce cases (P2–P5), black-box
//! through a wired pipeline of the real libraries: one-token blocks, so token ids stand for
//! block hashes, every request submitted at the same virtual time, then the window sealed.

use switchyard::pipeline::{Decision, Prompt, Request, Scheduler};
use switchyard_tests::{endpoints, scheduler, try_pipeline};

const WINDOW_MS: u64 = 200;
const PRODUCER: &str = "burst-prefix-cache-producer";
const KEY: &str = "PrefixCacheMatchInfo/burst-prefix-cache-producer";

fn request(id: &str, tokens: &[u32]) -> Request {
    Request {
        id: id.into(),
        model: "m".into(),
        cache_salt: String::new(),
        prompt: Prompt::Tokens(vec![tokens.to_vec()]),
        max_output_tokens: None,
    }
}

struct Setup {
    replicas: usize,
    window_ms: u64,
    max_per_replica: i64,
    min_colocate_blocks: u64,
    balance_by: &'static str,
    block_size: u64,
    max_batch_size: i64,
    /// switchyard's `windowQuietMs`; 0 leaves it out of the config.
    window_quiet_ms: u64,
}

impl Setup {
    fn new(replicas: usize, max_per_replica: i64, min_colocate_blocks: u64) -> Setup {
        Setup {
            replicas,
            window_ms: WINDOW_MS,
            max_per_replica,
            min_colocate_blocks,
            balance_by: "requests",
            block_size: 1,
            max_batch_size: -1,
            window_quiet_ms: 0,
        }
    }

    fn tokens(mut self) -> Setup {
        self.balance_by = "tokens";
        self
    }

    fn toml(&self) -> String {
        format!(
            "allow_experimental_plugins = true\n\
             libraries = [\"burst_prefix_cache_producer\", \"prefix_cache_scorer\"]\n{}\n\
             [[plugins]]\ntype = \"token-producer\"\n\
             [[plugins]]\ntype = \"burst-prefix-cache-producer\"\n\
             [plugins.parameters]\n\
             windowDurationMs = {}\nmaxPerReplica = {}\nblockSizeTokens = {}\n\
             minColocateBlocks = {}\nmaxBatchSize = {}\nbalanceBy = \"{}\"\n{}\
             [[plugins]]\ntype = \"prefix-cache-scorer\"\n\
             [plugins.parameters]\nprefixMatchInfoProducerName = \"{PRODUCER}\"\n\
             [[plugins]]\ntype = \"max-score-picker\"\n",
            endpoints(self.replicas),
            self.window_ms,
            self.max_per_replica,
            self.block_size,
            self.min_colocate_blocks,
            self.max_batch_size,
            self.balance_by,
            if self.window_quiet_ms > 0 {
                format!("windowQuietMs = {}\n", self.window_quiet_ms)
            } else {
                String::new()
            },
        )
    }

    fn scheduler(&self, name: &str) -> Scheduler {
        let mut scheduler = scheduler(name, &self.toml(), 11);
        scheduler.set_explain(true);
        scheduler
    }
}

fn group(n: usize, tokens: &[u32]) -> Vec<Vec<u32>> {
    vec![tokens.to_vec(); n]
}

fn rep(pod: &str, n: usize) -> Vec<Option<String>> {
    vec![Some(pod.to_string()); n]
}

fn short(id: &str) -> String {
    id.rsplit('/').next().unwrap_or(id).to_string()
}

/// The replica the producer assigned the request to, checking the shape of what it wrote:
/// one attribute per candidate, `total` = the prompt's block count, match = total on at most
/// one replica and 0 elsewhere.
fn assigned(
    decision: &Decision,
    total_blocks: u64,
    block_size: u64,
    replicas: usize,
) -> Option<String> {
    let record = decision
        .record
        .as_ref()
        .expect("explained decision")
        .render();
    let producer = record
        .producers
        .iter()
        .find(|p| p.name == PRODUCER)
        .unwrap_or_else(|| panic!("{} has a record of the burst producer", decision.request_id));
    assert_eq!(producer.error, None, "{}", decision.request_id);
    let attributes: Vec<_> = producer
        .attributes
        .iter()
        .filter(|a| a.key == KEY)
        .collect();
    assert_eq!(
        attributes.len(),
        replicas,
        "{}: one value per candidate",
        decision.request_id
    );
    let mut matched = Vec::new();
    for attribute in attributes {
        let value = &attribute.value;
        assert_eq!(
            value["totalBlocks"], total_blocks,
            "{}",
            decision.request_id
        );
        assert_eq!(
            value["blockSizeTokens"], block_size,
            "{}",
            decision.request_id
        );
        let m = value["matchBlocks"].as_u64().expect("matchBlocks");
        if m > 0 {
            assert_eq!(m, total_blocks, "{}: a full match", decision.request_id);
            matched.push(short(&attribute.endpoint));
        }
    }
    assert!(
        matched.len() <= 1,
        "{}: at most one assigned replica",
        decision.request_id
    );
    let pod = matched.pop();
    if let Some(pod) = &pod {
        let picked: Vec<String> = decision.endpoints.iter().map(|e| short(e)).collect();
        assert_eq!(
            &picked,
            std::slice::from_ref(pod),
            "{}: the scorer sends it there",
            decision.request_id
        );
    }
    pod
}

/// Submits the requests in order at t=0, seals the window, and returns each request's
/// assigned replica in submission order.
fn run_batch(setup: &Setup, name: &str, requests: &[Vec<u32>]) -> Vec<Option<String>> {
    let mut scheduler = setup.scheduler(name);
    run_on(&mut scheduler, setup, "r", requests, 0.0)
}

fn run_on(
    scheduler: &mut Scheduler,
    setup: &Setup,
    prefix: &str,
    requests: &[Vec<u32>],
    at_ms: f64,
) -> Vec<Option<String>> {
    for (i, tokens) in requests.iter().enumerate() {
        let early = scheduler.submit(request(&format!("{prefix}{i}"), tokens), at_ms);
        assert!(early.is_empty(), "a request waits for the window to seal");
    }
    assert_eq!(
        scheduler.next_deadline(),
        Some(at_ms + setup.window_ms as f64)
    );
    let decisions = scheduler.advance(at_ms + setup.window_ms as f64);
    assert_eq!(decisions.len(), requests.len());
    requests
        .iter()
        .enumerate()
        .map(|(i, tokens)| {
            let id = format!("{prefix}{i}");
            let decision = decisions
                .iter()
                .find(|d| d.request_id == id)
                .expect("every request is decided");
            assert!(decision.result.is_ok(), "{id} is placed");
            let total = tokens.len().div_ceil(setup.block_size as usize) as u64;
            assigned(decision, total, setup.block_size, setup.replicas)
        })
        .collect()
}

fn cat(parts: Vec<Vec<Option<String>>>) -> Vec<Option<String>> {
    parts.into_iter().flatten().collect()
}

fn pods(names: &[&str]) -> Vec<Option<String>> {
    names.iter().map(|n| Some(n.to_string())).collect()
}

fn seq(from: u32, to: u32) -> Vec<u32> {
    (from..=to).collect()
}

#[test]
fn a1_unlimited_colocates_whole_group() {
    let got = run_batch(&Setup::new(4, -1, 0), "a1", &group(8, &[1, 2, 3]));
    assert_eq!(got, rep("pod1", 8));
}

#[test]
fn a2_cap_spreads_evenly() {
    let got = run_batch(&Setup::new(4, 2, 0), "a2", &group(8, &[1, 2, 3]));
    assert_eq!(
        got,
        pods(&["pod1", "pod1", "pod2", "pod2", "pod3", "pod3", "pod4", "pod4"])
    );
}

#[test]
fn a3_cap_fills_before_spilling() {
    let got = run_batch(&Setup::new(4, 4, 0), "a3", &group(8, &[1, 2, 3]));
    assert_eq!(got, cat(vec![rep("pod1", 4), rep("pod2", 4)]));
}

#[test]
fn a4_singleton_gets_no_affinity() {
    let got = run_batch(&Setup::new(2, -1, 0), "a4", &group(1, &[1, 2, 3]));
    assert_eq!(got, vec![None]);
}

#[test]
fn a5_empty_prefix_gets_no_affinity() {
    // Both get PMI(0,0,1) on every replica (checked inside `assigned`).
    let got = run_batch(&Setup::new(2, -1, 0), "a5", &group(2, &[]));
    assert_eq!(got, vec![None, None]);
}

#[test]
fn a6_distinct_groups_spread_across_replicas() {
    let requests = [group(8, &[1, 2, 3]), group(8, &[9, 9, 9])].concat();
    let got = run_batch(&Setup::new(4, -1, 0), "a6", &requests);
    assert_eq!(got, cat(vec![rep("pod1", 8), rep("pod2", 8)]));
}

#[test]
fn a7_shared_prefix_families_colocate_within_fair_share() {
    let requests = [
        group(2, &[1, 2, 3]),
        group(2, &[1, 2, 4]),
        group(2, &[7, 8, 5]),
        group(2, &[7, 8, 6]),
    ]
    .concat();
    let got = run_batch(&Setup::new(2, -1, 2), "a7", &requests);
    assert_eq!(got, cat(vec![rep("pod1", 4), rep("pod2", 4)]));
}

#[test]
fn a8_fair_share_spreads_prefix_sharing_groups() {
    let requests = [
        group(2, &[1, 2, 3]),
        group(2, &[1, 2, 4]),
        group(2, &[1, 2, 5]),
        group(2, &[1, 2, 6]),
    ]
    .concat();
    let got = run_batch(&Setup::new(4, -1, 2), "a8", &requests);
    assert_eq!(
        got,
        cat(vec![
            rep("pod1", 2),
            rep("pod2", 2),
            rep("pod3", 2),
            rep("pod4", 2)
        ])
    );
}

#[test]
fn a9_singleton_attaches_to_overlapping_group() {
    let requests = [
        group(2, &[1, 2, 3]),
        group(1, &[1, 2, 8]),
        group(2, &[7, 8, 5]),
        group(1, &[7, 8, 9]),
    ]
    .concat();
    let got = run_batch(&Setup::new(2, -1, 2), "a9", &requests);
    assert_eq!(got, cat(vec![rep("pod1", 3), rep("pod2", 3)]));
}

#[test]
fn a10_lone_singleton_gets_no_affinity() {
    let requests = [group(2, &[1, 2, 3]), group(1, &[5, 5, 5])].concat();
    let got = run_batch(&Setup::new(2, -1, 2), "a10", &requests);
    assert_eq!(got, cat(vec![rep("pod1", 2), vec![None]]));
}

#[test]
fn a11_overlapping_singletons_colocate_without_groups() {
    let requests = [
        group(1, &[1, 2, 3]),
        group(1, &[1, 2, 4]),
        group(1, &[1, 2, 5]),
        group(1, &[1, 2, 6]),
    ]
    .concat();
    let got = run_batch(&Setup::new(2, -1, 2), "a11", &requests);
    assert_eq!(got, pods(&["pod1", "pod1", "pod2", "pod2"]));
}

#[test]
fn a12_shared_prefix_below_threshold_does_not_colocate() {
    let requests = [
        group(2, &[1, 2, 3]),
        group(2, &[1, 2, 4]),
        group(2, &[7, 8, 5]),
        group(2, &[7, 8, 6]),
    ]
    .concat();
    let got = run_batch(&Setup::new(2, -1, 3), "a12", &requests);
    assert_eq!(
        got,
        cat(vec![
            rep("pod1", 2),
            rep("pod2", 2),
            rep("pod1", 2),
            rep("pod2", 2)
        ])
    );
}

#[test]
fn a13_single_replica_places_everything() {
    let requests = [group(4, &[1, 2, 3]), group(4, &[9, 9, 9])].concat();
    let got = run_batch(&Setup::new(1, -1, 2), "a13", &requests);
    assert_eq!(got, rep("pod1", 8));
}

#[test]
fn a14_balance_by_tokens_spreads_large_prefix() {
    let requests = [group(2, &[1, 2, 3, 4]), group(2, &[5]), group(2, &[6])].concat();
    let by_requests = run_batch(&Setup::new(2, -1, 0), "a14a", &requests);
    assert_eq!(
        by_requests,
        cat(vec![rep("pod1", 2), rep("pod2", 2), rep("pod1", 2)])
    );
    let by_tokens = run_batch(&Setup::new(2, -1, 0).tokens(), "a14b", &requests);
    assert_eq!(by_tokens, cat(vec![rep("pod1", 2), rep("pod2", 4)]));
}

#[test]
fn a15_balance_by_tokens_discounts_shared_prefix() {
    let a1 = seq(1, 10);
    let a2 = [seq(1, 9), vec![11]].concat();
    let a3 = [seq(1, 9), vec![12]].concat();
    let requests = [group(2, &a1), group(2, &a2), group(2, &a3)].concat();
    let got = run_batch(&Setup::new(2, -1, 9).tokens(), "a15", &requests);
    assert_eq!(got, rep("pod1", 6));
    // The contrast the reference leaves untested: counting requests, a3 spills to pod2.
    let got = run_batch(&Setup::new(2, -1, 9), "a15-requests", &requests);
    assert_eq!(got, cat(vec![rep("pod1", 4), rep("pod2", 2)]));
}

#[test]
fn a16_overflow_guard_balances_beyond_cap() {
    let got = run_batch(&Setup::new(2, 2, 0), "a16", &group(8, &[1, 2, 3]));
    assert_eq!(
        got,
        pods(&["pod1", "pod1", "pod2", "pod2", "pod1", "pod2", "pod1", "pod2"])
    );
}

fn produce_setup(replicas: usize, window_ms: u64) -> Setup {
    Setup {
        window_ms,
        block_size: 4,
        ..Setup::new(replicas, -1, 0)
    }
}

#[test]
fn p2_colocates_identical_prompt_burst() {
    let setup = produce_setup(4, 100);
    // PMI(2,2,4) on pod1 and PMI(0,2,4) elsewhere, checked inside `assigned`.
    let got = run_batch(&setup, "p2", &group(8, &seq(1, 8)));
    assert_eq!(got, rep("pod1", 8));
}

#[test]
fn p3_singleton_has_no_affinity() {
    let setup = produce_setup(2, 50);
    let mut scheduler = setup.scheduler("p3");
    assert!(scheduler
        .submit(request("only", &[1, 2, 3, 4]), 0.0)
        .is_empty());
    assert!(
        scheduler.advance(49.0).is_empty(),
        "not sealed before the window ends"
    );
    let decisions = scheduler.advance(50.0);
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].decided_ms, 50.0);
    assert_eq!(assigned(&decisions[0], 1, 4, 2), None);
}

// P4 (a request cancelled before the seal) has no equivalent: a submitted request cannot be
// withdrawn from an open window through the scheduler.

#[test]
fn p5_second_window_after_seal() {
    let setup = produce_setup(3, 30);
    let mut scheduler = setup.scheduler("p5");
    let first = run_on(&mut scheduler, &setup, "w1-", &group(4, &seq(1, 8)), 0.0);
    assert_eq!(first, rep("pod1", 4));
    assert_eq!(scheduler.next_deadline(), None, "no window left open");
    assert_eq!(scheduler.pending(), 0);
    // Loads start from zero in the next batch, so it goes to pod1 again.
    let second = run_on(&mut scheduler, &setup, "w2-", &group(4, &seq(9, 16)), 40.0);
    assert_eq!(second, rep("pod1", 4));
}

#[test]
fn window_opens_at_first_request_and_does_not_slide() {
    let setup = Setup {
        window_ms: 100,
        ..Setup::new(2, -1, 0)
    };
    let mut scheduler = setup.scheduler("window");
    assert!(scheduler.submit(request("a", &[1, 2]), 0.0).is_empty());
    assert!(scheduler.submit(request("b", &[1, 2]), 90.0).is_empty());
    assert_eq!(
        scheduler.next_deadline(),
        Some(100.0),
        "a later arrival does not extend it"
    );
    let first = scheduler.advance(100.0);
    let ids: Vec<&str> = first.iter().map(|d| d.request_id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    for d in &first {
        let window = d
            .record
            .as_ref()
            .unwrap()
            .render()
            .window
            .expect("window record");
        assert_eq!(
            (window.opened_ms, window.sealed_ms, window.batch_size),
            (0.0, 100.0, 2)
        );
        assert_eq!(assigned(d, 2, 1, 2), Some("pod1".into()));
    }
    // Arriving at 150 with a 100 ms window opened at 0: it is in the next window.
    assert!(scheduler.submit(request("c", &[1, 2]), 150.0).is_empty());
    assert_eq!(scheduler.next_deadline(), Some(250.0));
    assert!(scheduler.advance(249.0).is_empty());
    let second = scheduler.advance(250.0);
    assert_eq!(second.len(), 1);
    let window = second[0].record.as_ref().unwrap().render().window.unwrap();
    assert_eq!(
        (window.opened_ms, window.sealed_ms, window.batch_size),
        (150.0, 250.0, 1)
    );
    assert_eq!(assigned(&second[0], 2, 1, 2), None, "alone in its window");
}

#[test]
fn a_quiet_window_seals_once_arrivals_pause_and_never_after_the_window() {
    let setup = Setup {
        window_ms: 100,
        window_quiet_ms: 10,
        ..Setup::new(2, -1, 0)
    };
    let mut scheduler = setup.scheduler("quiet");
    assert!(scheduler.submit(request("a", &[1, 2]), 0.0).is_empty());
    assert_eq!(scheduler.next_deadline(), Some(10.0));
    assert!(scheduler.submit(request("b", &[1, 2]), 5.0).is_empty());
    assert_eq!(
        scheduler.next_deadline(),
        Some(15.0),
        "each arrival moves the seal"
    );
    assert!(scheduler.submit(request("c", &[1, 2]), 14.0).is_empty());
    assert!(scheduler.advance(23.0).is_empty());
    let sealed = scheduler.advance(24.0);
    assert_eq!(sealed.len(), 3);
    for d in &sealed {
        let window = d.record.as_ref().unwrap().render().window.unwrap();
        assert_eq!(
            (window.opened_ms, window.sealed_ms, window.batch_size),
            (0.0, 24.0, 3)
        );
        assert_eq!(d.decided_ms, 24.0, "the wait ends at the seal");
        assert_eq!(assigned(d, 2, 1, 2), Some("pod1".into()));
    }
    // Arrivals that never pause for 10 ms: the window still seals 100 ms after it opened.
    for k in 0..12 {
        let at = 200.0 + 9.0 * f64::from(k);
        assert!(scheduler
            .submit(request(&format!("r{k}"), &[3, 4]), at)
            .is_empty());
    }
    assert_eq!(scheduler.next_deadline(), Some(300.0));
    let sealed = scheduler.advance(300.0);
    assert_eq!(sealed.len(), 12);
    // The reference's fixed window is unchanged without the parameter: see
    // `window_opens_at_first_request_and_does_not_slide`.
}

#[test]
fn max_batch_size_overflow_gets_the_error_and_is_still_scheduled() {
    let setup = Setup {
        max_batch_size: 2,
        ..Setup::new(2, -1, 0)
    };
    let mut scheduler = setup.scheduler("overflow");
    assert!(scheduler.submit(request("a", &[1, 2, 3]), 0.0).is_empty());
    assert!(scheduler.submit(request("b", &[1, 2, 3]), 1.0).is_empty());
    let overflow = scheduler.submit(request("c", &[1, 2, 3]), 2.0);
    assert_eq!(
        overflow.len(),
        1,
        "decided at once, without the producer's data"
    );
    let decision = &overflow[0];
    assert!(decision.result.is_ok());
    assert_eq!(decision.decided_ms, 2.0);
    let record = decision.record.as_ref().unwrap().render();
    let burst = record
        .producers
        .iter()
        .find(|p| p.name == PRODUCER)
        .unwrap();
    assert_eq!(
        burst.error.as_deref(),
        Some("batch full: maxBatchSize 2 reached in the window opened at 0 ms")
    );
    assert!(burst.attributes.is_empty());
    let tokens = record
        .producers
        .iter()
        .find(|p| p.name == "token-producer")
        .expect("the token producer still ran");
    assert_eq!(tokens.error, None);
    let stats = scheduler.stats();
    let (_, burst_stats) = stats.iter().find(|(n, _)| n == PRODUCER).unwrap();
    assert_eq!(burst_stats.batch_overflows, 1);

    let rest = scheduler.advance(WINDOW_MS as f64);
    let got: Vec<_> = rest.iter().map(|d| assigned(d, 3, 1, 2)).collect();
    assert_eq!(got, rep("pod1", 2));
}

#[test]
fn alpha_plugin_is_refused_without_the_switch() {
    let toml = Setup::new(2, -1, 0)
        .toml()
        .replace("allow_experimental_plugins = true\n", "");
    let error = try_pipeline("alpha", &toml).err().expect("refused");
    assert!(error.contains(PRODUCER), "{error}");
    assert!(error.contains("allow_experimental_plugins"), "{error}");
    assert!(try_pipeline("alpha-ok", &Setup::new(2, -1, 0).toml()).is_ok());
}

#[test]
fn a_request_cancelled_in_its_window_leaves_the_batch() {
    // Two samples of one prompt would be co-located; once one is cancelled, the other is a
    // singleton and gets no affinity, and the cancelled one is never placed.
    let setup = Setup::new(2, -1, 0);
    let mut scheduler = setup.scheduler("burst-cancel");
    assert!(scheduler.submit(request("a", &[1, 2, 3]), 0.0).is_empty());
    assert!(scheduler.submit(request("b", &[1, 2, 3]), 0.0).is_empty());
    assert_eq!(scheduler.pending(), 2);
    assert!(scheduler.cancel("a", 10.0));
    assert_eq!(scheduler.pending(), 1);
    assert!(!scheduler.cancel("never-seen", 10.0));
    let decisions = scheduler.advance(WINDOW_MS as f64);
    assert_eq!(decisions.len(), 1);
    assert_eq!(decisions[0].request_id, "b");
    assert_eq!(assigned(&decisions[0], 3, 1, 2), None);
}

#[test]
fn cancelling_the_only_waiting_request_closes_the_window() {
    let mut scheduler = Setup::new(2, -1, 0).scheduler("burst-cancel-last");
    assert!(scheduler.submit(request("a", &[1, 2, 3]), 0.0).is_empty());
    assert_eq!(scheduler.next_deadline(), Some(WINDOW_MS as f64));
    assert!(scheduler.cancel("a", 1.0));
    assert_eq!(scheduler.next_deadline(), None);
    assert!(scheduler.advance(WINDOW_MS as f64).is_empty());
}
