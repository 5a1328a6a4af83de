//! A bounded ext_proc load client: `CONCURRENCY` pick-only streams at a time against a running
//! `switchyard ext-proc`, each sending request headers and a ~9 KB completion body with
//! end_of_stream and waiting for the destination and the echoed body, as Envoy does. Prints
//! picks per second and latency percentiles; stops after `--requests` picks or `--seconds`.
//!
//! ```sh
//! extproc-load --target 127.0.0.1:9002 [--concurrency 64] [--requests 200000] [--seconds 20]
//!              [--connections 2] [--warmup-seconds 3]
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_tests::extproc::{pick, Stream};
use tonic::transport::Channel;

struct Settings {
    target: String,
    concurrency: usize,
    requests: u64,
    seconds: u64,
    connections: usize,
    warmup_seconds: u64,
}

fn settings() -> Result<Settings, String> {
    let mut settings = Settings {
        target: String::new(),
        concurrency: 64,
        requests: 200_000,
        seconds: 20,
        connections: 2,
        warmup_seconds: 3,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        let number = |text: String| {
            text.parse::<u64>()
                .map_err(|_| format!("{flag} takes a number, not '{text}'"))
        };
        match flag.as_str() {
            "--target" => settings.target = value()?,
            "--concurrency" => settings.concurrency = number(value()?)?.max(1) as usize,
            "--requests" => settings.requests = number(value()?)?,
            "--seconds" => settings.seconds = number(value()?)?.max(1),
            "--connections" => settings.connections = number(value()?)?.max(1) as usize,
            "--warmup-seconds" => settings.warmup_seconds = number(value()?)?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if settings.target.is_empty() {
        return Err("--target HOST:PORT is required".into());
    }
    Ok(settings)
}

/// A ~9 KB completion body: a long prefix shared by every request and a short tail that
/// differs, so the prefix index matches the shared blocks and inserts a new tail each time.
fn body(n: u64) -> String {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let prefix = PREFIX.get_or_init(|| {
        let sentence = "The quick brown fox jumps over the lazy dog while the picker decides. ";
        let mut prefix = String::with_capacity(9000);
        let mut i = 0;
        while prefix.len() < 8900 {
            i += 1;
            prefix.push_str(&format!("[{i}] {sentence}"));
        }
        prefix
    });
    let tail = n.wrapping_mul(2_654_435_761) % 1_000_003;
    format!(r#"{{"model":"m","max_tokens":16,"prompt":"{prefix}Question {n}: {tail}"}}"#)
}

async fn worker(
    channel: Channel,
    next: Arc<AtomicU64>,
    limit: u64,
    stop: Arc<AtomicBool>,
    measuring: Arc<AtomicBool>,
) -> (Vec<u32>, u64) {
    let mut latencies_us = Vec::new();
    let mut errors = 0;
    while !stop.load(Ordering::Relaxed) {
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= limit {
            break;
        }
        let text = body(n);
        let started = Instant::now();
        let ok = match Stream::open(channel.clone()).await {
            Ok(mut stream) => {
                let chosen = pick(&mut stream, "/v1/completions", &[], &text).await;
                chosen.immediate.is_none() && !chosen.header.is_empty()
            }
            Err(_) => false,
        };
        let elapsed = started.elapsed();
        if measuring.load(Ordering::Relaxed) {
            if ok {
                latencies_us.push(elapsed.as_micros().min(u128::from(u32::MAX)) as u32);
            } else {
                errors += 1;
            }
        }
    }
    (latencies_us, errors)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    f64::from(sorted[rank]) / 1000.0
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let settings = settings()?;
    let mut channels = Vec::new();
    for _ in 0..settings.connections {
        let channel = Channel::from_shared(format!("http://{}", settings.target))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", settings.target))?;
        channels.push(channel);
    }
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(settings.warmup_seconds == 0));
    let tasks: Vec<_> = (0..settings.concurrency)
        .map(|i| {
            tokio::spawn(worker(
                channels[i % channels.len()].clone(),
                next.clone(),
                settings.requests,
                stop.clone(),
                measuring.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(settings.warmup_seconds)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let at_start = next.load(Ordering::Relaxed);
    let deadline = started + Duration::from_secs(settings.seconds);
    while Instant::now() < deadline && next.load(Ordering::Relaxed) < settings.requests {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (mut l, e) = task.await.map_err(|e| e.to_string())?;
        latencies.append(&mut l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let done = latencies.len();
    println!(
        "picks {done} (issued during measurement ~{}), errors {errors}, {:.1} s, {:.0} picks/s, \
         p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, concurrency {}, connections {}",
        next.load(Ordering::Relaxed).saturating_sub(at_start),
        elapsed,
        done as f64 / elapsed,
        percentile(&latencies, 50.0),
        percentile(&latencies, 90.0),
        percentile(&latencies, 99.0),
        percentile(&latencies, 99.9),
        settings.concurrency,
        settings.connections
    );
    if errors > 0 {
        return Err(format!("{errors} picks failed"));
    }
    Ok(())
}
