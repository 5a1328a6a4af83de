//! The task behind [`LiveFleet`](super::LiveFleet): it keeps each endpoint's scrape record,
//! applies membership changes from the discovery file, and publishes a new [`FleetState`]
//! when what scorers would see has changed, at most once per scrape period.

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_plugin_api::EndpointMetrics;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::MissedTickBehavior;

use super::discovery::{FileWatch, Target};
use super::scrape::{self, HttpClient, Job, Report};
use super::{FleetState, Member};
use crate::pipeline::Endpoint;

/// How often the discovery file is re-read.
pub(crate) const DISCOVERY_POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// `None`: scraping is off.
    pub scrape_interval: Option<Duration>,
    pub scrape_timeout: Duration,
    /// `None`: scraped facts never go stale.
    pub stale_after: Option<Duration>,
}

/// One endpoint and what scraping has learnt about it.
#[derive(Debug)]
pub(crate) struct Tracked {
    pub target: Target,
    /// Facts from the last successful scrape.
    pub scraped: Option<EndpointMetrics>,
    pub last_success: Option<Instant>,
    pub failures: u64,
    /// The failure last logged, so each distinct one is logged once.
    pub last_error: Option<String>,
    /// The scraper whose reports count for this endpoint.
    pub scraper: u64,
    pub abort: Option<AbortHandle>,
}

impl Tracked {
    pub(crate) fn new(target: Target) -> Tracked {
        Tracked {
            target,
            scraped: None,
            last_success: None,
            failures: 0,
            last_error: None,
            scraper: 0,
            abort: None,
        }
    }
}

/// The members as scorers see them at `now`; see the module doc of `fleet` for the rule.
pub(crate) fn members_at(tracked: &[Tracked], settings: &Settings, now: Instant) -> Vec<Member> {
    let scraping = settings.scrape_interval.is_some();
    let age = |t: &Tracked| t.last_success.map(|at| now.saturating_duration_since(at));
    let is_fresh = |t: &Tracked| match (scraping, age(t), settings.stale_after) {
        (false, _, _) => true,
        (true, None, _) => false,
        (true, Some(_), None) => true,
        (true, Some(age), Some(limit)) => age <= limit,
    };
    let busiest_fresh_queue = tracked
        .iter()
        .filter(|t| is_fresh(t))
        .filter_map(|t| t.scraped.map(|m| m.waiting_requests))
        .max()
        .unwrap_or(0);
    tracked
        .iter()
        .map(|t| {
            let fresh = is_fresh(t);
            let metrics = if !scraping {
                t.target.metrics
            } else {
                let last = t.scraped.unwrap_or_default();
                if fresh {
                    last
                } else {
                    EndpointMetrics {
                        waiting_requests: last
                            .waiting_requests
                            .max(busiest_fresh_queue.saturating_add(1)),
                        kv_cache_usage: 1.0,
                        ..last
                    }
                }
            };
            Member {
                endpoint: Endpoint {
                    id: t.target.id.clone(),
                    address: t.target.address.clone(),
                    role: t.target.role.clone(),
                    metrics,
                },
                labels: t.target.labels.clone(),
                engine: t.target.engine,
                fresh,
                metrics_age_ms: age(t).map(|a| a.as_millis().min(u128::from(u64::MAX)) as u64),
                scrape_failures: t.failures,
            }
        })
        .collect()
}

/// Whether two views differ in anything a decision could depend on. The age of the metrics
/// and the failure count change on every scrape and are not, by themselves, news.
pub(crate) fn same_view(a: &[Member], b: &[Member]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| {
            a.endpoint == b.endpoint
                && a.labels == b.labels
                && a.engine == b.engine
                && a.fresh == b.fresh
        })
}

pub(crate) struct Tracker {
    settings: Settings,
    tracked: Vec<Tracked>,
    client: HttpClient,
    next_scraper: u64,
    state: watch::Sender<Arc<FleetState>>,
}

impl Tracker {
    /// Publishes the initial state (generation 1) and returns the receiving side.
    pub(crate) fn new(
        settings: Settings,
        targets: Vec<Target>,
    ) -> (Tracker, watch::Receiver<Arc<FleetState>>) {
        let tracked: Vec<Tracked> = targets.into_iter().map(Tracked::new).collect();
        let members = members_at(&tracked, &settings, Instant::now());
        let (state, receiver) = watch::channel(Arc::new(FleetState {
            generation: 1,
            members: members.into(),
        }));
        let tracker = Tracker {
            settings,
            tracked,
            client: scrape::client(settings.scrape_timeout),
            next_scraper: 0,
            state,
        };
        (tracker, receiver)
    }

    /// Runs until aborted. Dropping the future aborts every scraper with it. A membership
    /// sent on `replaced` (by a config reload) takes the place of the endpoints and of the
    /// file watch.
    pub(crate) async fn run(
        mut self,
        mut watch: Option<FileWatch>,
        mut replaced: mpsc::UnboundedReceiver<(Vec<Target>, Option<FileWatch>)>,
    ) {
        let (report_tx, mut reports) = mpsc::channel::<Report>(256);
        let mut scrapers = JoinSet::new();
        for index in 0..self.tracked.len() {
            self.start_scraper(index, &mut scrapers, &report_tx);
        }
        let mut poll = tokio::time::interval(DISCOVERY_POLL);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let scrape_period = self.settings.scrape_interval;
        let mut round = tokio::time::interval(scrape_period.unwrap_or(Duration::from_secs(3600)));
        round.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = poll.tick(), if watch.is_some() => {
                    let changed = match watch.as_mut() {
                        Some(watch) => watch.poll().await,
                        None => None,
                    };
                    if let Some(targets) = changed {
                        self.set_targets(targets, &mut scrapers, &report_tx);
                        self.publish_if_changed(Instant::now());
                    }
                }
                Some((targets, new_watch)) = replaced.recv() => {
                    watch = new_watch;
                    self.set_targets(targets, &mut scrapers, &report_tx);
                    self.publish_if_changed(Instant::now());
                }
                Some(report) = reports.recv() => self.record(report),
                _ = round.tick(), if scrape_period.is_some() => {
                    self.publish_if_changed(Instant::now());
                }
                Some(_) = scrapers.join_next(), if !scrapers.is_empty() => {}
            }
        }
    }

    fn start_scraper(
        &mut self,
        index: usize,
        scrapers: &mut JoinSet<()>,
        reports: &mpsc::Sender<Report>,
    ) {
        let (Some(interval), Some(tracked)) =
            (self.settings.scrape_interval, self.tracked.get_mut(index))
        else {
            return;
        };
        self.next_scraper += 1;
        tracked.scraper = self.next_scraper;
        let job = Job {
            scraper: tracked.scraper,
            address: tracked.target.address.clone(),
            engine: tracked.target.engine,
            interval,
            timeout: self.settings.scrape_timeout,
        };
        let task = scrape::run(self.client.clone(), job, reports.clone());
        tracked.abort = Some(scrapers.spawn(task));
    }

    /// Takes a new endpoint list. An endpoint that stays at the same address with the same
    /// engine keeps its scrape record and scraper; any other is scraped afresh.
    pub(crate) fn set_targets(
        &mut self,
        targets: Vec<Target>,
        scrapers: &mut JoinSet<()>,
        reports: &mpsc::Sender<Report>,
    ) {
        let mut old = std::mem::take(&mut self.tracked);
        let mut fresh_starts = Vec::new();
        for target in targets {
            let kept = old.iter().position(|t| {
                t.target.id == target.id
                    && t.target.address == target.address
                    && t.target.engine == target.engine
            });
            match kept {
                Some(position) => {
                    let mut tracked = old.swap_remove(position);
                    tracked.target = target;
                    self.tracked.push(tracked);
                }
                None => {
                    fresh_starts.push(self.tracked.len());
                    self.tracked.push(Tracked::new(target));
                }
            }
        }
        for gone in old {
            if let Some(abort) = gone.abort {
                abort.abort();
            }
        }
        for index in fresh_starts {
            self.start_scraper(index, scrapers, reports);
        }
    }

    pub(crate) fn record(&mut self, report: Report) {
        let Some(tracked) = self
            .tracked
            .iter_mut()
            .find(|t| t.scraper == report.scraper && t.abort.is_some())
        else {
            return;
        };
        match report.result {
            Ok(metrics) => {
                tracked.scraped = Some(metrics);
                tracked.last_success = Some(report.at);
                tracked.failures = 0;
                if tracked.last_error.take().is_some() {
                    tracing::info!(
                        "scraping {} at {} works again",
                        tracked.target.id,
                        tracked.target.address
                    );
                }
            }
            Err(problem) => {
                tracked.failures += 1;
                if tracked.last_error.as_ref() != Some(&problem) {
                    tracing::warn!(
                        "scraping {} at {} failed: {problem}",
                        tracked.target.id,
                        tracked.target.address
                    );
                    tracked.last_error = Some(problem);
                }
            }
        }
    }

    /// Publishes the view at `now` when it differs from the one last published.
    pub(crate) fn publish_if_changed(&mut self, now: Instant) -> bool {
        let members = members_at(&self.tracked, &self.settings, now);
        let current = self.state.borrow().clone();
        if same_view(&members, &current.members) {
            return false;
        }
        self.state.send_replace(Arc::new(FleetState {
            generation: current.generation + 1,
            members: members.into(),
        }));
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::fleet::Engine;

    fn target(name: &str) -> Target {
        Target {
            id: format!("/{name}"),
            // Refused at once, should a test start a real scraper.
            address: "127.0.0.1:1".into(),
            role: String::new(),
            engine: Engine::Vllm,
            labels: BTreeMap::new(),
            metrics: EndpointMetrics {
                waiting_requests: 9,
                kv_cache_usage: 0.5,
                ..EndpointMetrics::default()
            },
        }
    }

    fn scraped(name: &str, waiting: u32, usage: f64, at: Option<Instant>) -> Tracked {
        let mut t = Tracked::new(target(name));
        t.scraped = at.map(|_| EndpointMetrics {
            waiting_requests: waiting,
            running_requests: 2,
            kv_cache_usage: usage,
            cache_block_size: 16,
            cache_num_blocks: 1000,
        });
        t.last_success = at;
        t
    }

    const SCRAPING: Settings = Settings {
        scrape_interval: Some(Duration::from_millis(50)),
        scrape_timeout: Duration::from_millis(1000),
        stale_after: Some(Duration::from_millis(2000)),
    };

    #[test]
    fn stale_endpoints_read_as_saturated() {
        let now = Instant::now() + Duration::from_secs(10);
        let tracked = [
            scraped("fresh-a", 4, 0.2, Some(now - Duration::from_millis(100))),
            scraped("fresh-b", 7, 0.3, Some(now - Duration::from_millis(2000))),
            scraped("stale", 2, 0.1, Some(now - Duration::from_millis(2001))),
            scraped("stale-busy", 50, 0.1, Some(now - Duration::from_secs(5))),
            scraped("never", 0, 0.0, None),
        ];
        let members = members_at(&tracked, &SCRAPING, now);
        let view: Vec<_> = members
            .iter()
            .map(|m| {
                (
                    m.fresh,
                    m.endpoint.metrics.waiting_requests,
                    m.endpoint.metrics.kv_cache_usage,
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                (true, 4, 0.2),
                (true, 7, 0.3),
                (false, 8, 1.0),
                (false, 50, 1.0),
                (false, 8, 1.0)
            ]
        );
        // The rest of a stale endpoint's facts are its last known ones.
        assert_eq!(members[2].endpoint.metrics.running_requests, 2);
        assert_eq!(members[2].endpoint.metrics.cache_num_blocks, 1000);
        assert_eq!(members[2].metrics_age_ms, Some(2001));
        assert_eq!(members[4].metrics_age_ms, None);
        assert_eq!(members[4].endpoint.metrics.cache_block_size, 0);
    }

    #[test]
    fn with_no_fresh_endpoint_stale_ones_wait_at_least_one() {
        let now = Instant::now();
        let tracked = [scraped("never", 0, 0.0, None)];
        let members = members_at(&tracked, &SCRAPING, now);
        assert!(!members[0].fresh);
        assert_eq!(members[0].endpoint.metrics.waiting_requests, 1);
        assert_eq!(members[0].endpoint.metrics.kv_cache_usage, 1.0);
        let state = FleetState {
            generation: 1,
            members: members.into(),
        };
        assert!(!state.ready());
    }

    #[test]
    fn without_scraping_every_endpoint_is_fresh_with_config_facts() {
        let settings = Settings {
            scrape_interval: None,
            ..SCRAPING
        };
        let tracked = [scraped("a", 1, 0.9, None)];
        let members = members_at(&tracked, &settings, Instant::now());
        assert!(members[0].fresh);
        assert_eq!(members[0].endpoint.metrics.waiting_requests, 9);
        assert_eq!(members[0].endpoint.metrics.kv_cache_usage, 0.5);
    }

    #[test]
    fn stale_after_zero_never_marks_scraped_facts_stale() {
        let settings = Settings {
            stale_after: None,
            ..SCRAPING
        };
        let now = Instant::now() + Duration::from_secs(3600);
        let tracked = [
            scraped("old", 3, 0.4, Some(now - Duration::from_secs(3000))),
            scraped("never", 0, 0.0, None),
        ];
        let members = members_at(&tracked, &settings, now);
        assert!(members[0].fresh);
        assert_eq!(members[0].endpoint.metrics.waiting_requests, 3);
        assert!(!members[1].fresh);
    }

    #[tokio::test]
    async fn publishes_only_what_changes_a_decision() {
        let (mut tracker, receiver) = Tracker::new(SCRAPING, vec![target("a"), target("b")]);
        let (report_tx, _reports) = mpsc::channel(8);
        let mut scrapers = JoinSet::new();
        // Fake scrapers: records are only taken from a started scraper.
        for t in &mut tracker.tracked {
            tracker.next_scraper += 1;
            t.scraper = tracker.next_scraper;
            t.abort = Some(scrapers.spawn(std::future::pending::<()>()));
        }
        assert_eq!(receiver.borrow().generation, 1);
        let now = Instant::now();
        let ok = |scraper, waiting| Report {
            scraper,
            at: now,
            result: Ok(EndpointMetrics {
                waiting_requests: waiting,
                ..EndpointMetrics::default()
            }),
        };
        tracker.record(ok(1, 3));
        tracker.record(ok(2, 5));
        assert!(tracker.publish_if_changed(now));
        assert_eq!(receiver.borrow().generation, 2);
        assert!(receiver.borrow().ready());
        // Same facts again, later: nothing new.
        tracker.record(ok(1, 3));
        tracker.record(Report {
            scraper: 2,
            at: now,
            result: Err("HTTP 500".into()),
        });
        assert!(!tracker.publish_if_changed(now + Duration::from_millis(100)));
        assert_eq!(receiver.borrow().generation, 2);
        // A report from an unknown scraper is dropped.
        tracker.record(ok(99, 40));
        assert!(!tracker.publish_if_changed(now));
        // Membership: `b` stays and keeps its facts, `c` arrives, `a` leaves.
        tracker.set_targets(vec![target("b"), target("c")], &mut scrapers, &report_tx);
        assert!(tracker.publish_if_changed(now));
        let state = receiver.borrow().clone();
        assert_eq!(state.generation, 3);
        let b = &state.members[0];
        assert_eq!(
            (
                b.endpoint.id.as_str(),
                b.endpoint.metrics.waiting_requests,
                b.fresh
            ),
            ("/b", 5, true)
        );
        assert_eq!(b.scrape_failures, 1);
        let c = &state.members[1];
        assert_eq!((c.endpoint.id.as_str(), c.fresh), ("/c", false));
        assert_eq!(c.endpoint.metrics.waiting_requests, 6);
    }
}
