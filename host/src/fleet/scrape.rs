//! Fetching each endpoint's `/metrics` on a fixed period: one task per endpoint, one scrape in
//! flight per endpoint, every outcome reported to the fleet's tracker.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use switchyard_plugin_api::EndpointMetrics;
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::prometheus;
use super::Engine;

/// Largest metrics page read; a longer one is a failed scrape.
const MAX_PAGE_BYTES: usize = 16 * 1024 * 1024;

pub(crate) type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// A client shared by every scraper, keeping one idle connection per endpoint.
pub(crate) fn client(timeout: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// The outcome of one scrape.
#[derive(Debug)]
pub(crate) struct Report {
    /// Which scraper sent it; a report from a scraper since replaced is dropped.
    pub scraper: u64,
    pub at: Instant,
    pub result: Result<EndpointMetrics, String>,
}

/// What one scraper needs.
pub(crate) struct Job {
    pub scraper: u64,
    pub address: String,
    pub engine: Engine,
    pub interval: Duration,
    pub timeout: Duration,
}

/// Scrapes until the receiving side goes away (or the task is aborted).
pub(crate) async fn run(client: HttpClient, job: Job, reports: mpsc::Sender<Report>) {
    let uri: Result<Uri, String> = format!("http://{}/metrics", job.address)
        .parse()
        .map_err(|e| format!("'{}' does not make a URL: {e}", job.address));
    let families = job.engine.families();
    let mut page = Vec::new();
    let mut ticker = tokio::time::interval(job.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let result = match &uri {
            Ok(uri) => fetch(&client, uri, job.timeout, &mut page)
                .await
                .and_then(|()| prometheus::scan(&page, families)),
            Err(problem) => Err(problem.clone()),
        };
        let report = Report {
            scraper: job.scraper,
            at: Instant::now(),
            result,
        };
        if reports.send(report).await.is_err() {
            return;
        }
    }
}

/// GETs `uri` into `page` (cleared first, its capacity reused).
async fn fetch(
    client: &HttpClient,
    uri: &Uri,
    timeout: Duration,
    page: &mut Vec<u8>,
) -> Result<(), String> {
    page.clear();
    let exchange = async {
        let request = hyper::Request::get(uri.clone())
            .header(hyper::header::ACCEPT, "text/plain")
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let response = client.request(request).await.map_err(|e| describe(&e))?;
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| describe(&e))?;
            if let Ok(data) = frame.into_data() {
                if page.len() + data.len() > MAX_PAGE_BYTES {
                    return Err("metrics page larger than 16 MiB".into());
                }
                page.extend_from_slice(&data);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// An error with its causes, which carry the useful part ("connection refused").
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
