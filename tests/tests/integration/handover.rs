//! Restart without a gap (`--handover PATH`): `switchyard serve` handed over ten times in a
//! row under continuous mixed load, each successor loading another build of a plugin library,
//! with no request lost; `switchyard ext-proc` handed over with a stream in flight; and the
//! errors for a bad hand-over path or a port held by a process that offers nothing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard::config::library_file_name;
use switchyard::plugins::supply::sha256_hex;
use switchyard_tests::extproc::{channel, pick, picker_command, report_completion, Stream};
use switchyard_tests::live::{
    binary, body_bytes, burst_pipeline, endpoints_toml, eventually, fast_replicas, free_port,
    metric_sum, metrics_page, read_events, send, temp_dir, try_send, wait_healthy, Process,
};
use switchyard_tests::plugin_dir;

/// Successors started one after another under load.
const HAND_OVERS: usize = 10;
/// One request is started every this often (about 250 per second).
const REQUEST_EVERY: Duration = Duration::from_millis(4);
/// A request not answered in full within this long counts as lost.
const REQUEST_DEADLINE: Duration = Duration::from_secs(20);

/// A copy of the burst producer's library made distinct (another digest) by a trailing
/// marker, as a rebuild would be; returns its path and SHA-256.
fn library_build(dir: &Path, build: usize) -> (PathBuf, String) {
    let name = library_file_name("burst_prefix_cache_producer");
    let mut bytes = std::fs::read(plugin_dir().join(&name)).expect("library built");
    bytes.extend_from_slice(format!("\nhand-over test build {build}\n").as_bytes());
    let build_dir = dir.join(format!("build{build}"));
    std::fs::create_dir_all(&build_dir).expect("build dir");
    let path = build_dir.join(name);
    std::fs::write(&path, &bytes).expect("library copied");
    (path, sha256_hex(&bytes))
}

/// The serve config of one build: the burst pipeline with its producer pinned to that
/// build's copy, on fixed loopback ports.
fn serve_config(dir: &Path, build: usize, endpoints: &str, ports: [u16; 3]) -> PathBuf {
    let (library, digest) = library_build(dir, build);
    let pipeline = burst_pipeline(5).replacen(
        "libraries = [\"burst_prefix_cache_producer\",",
        &format!(
            "libraries = [{{ path = \"{}\", sha256 = \"{digest}\" }},",
            library.display()
        ),
        1,
    );
    assert!(pipeline.contains(&digest), "the pipeline names the build");
    let [api, metrics, admin] = ports;
    let text = format!(
        "{pipeline}\n{endpoints}\n[serve]\nlisten = \"127.0.0.1:{api}\"\n\
         metrics_listen = \"127.0.0.1:{metrics}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
         drain_timeout_ms = 15000\n"
    );
    let path = dir.join(format!("serve{build}.toml"));
    std::fs::write(&path, text).expect("config written");
    path
}

fn spawn_serve(dir: &Path, config: &Path, control: &Path, build: usize) -> Child {
    let log = std::fs::File::create(dir.join(format!("serve{build}.log"))).expect("log file");
    Command::new(binary())
        .arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--plugin-dir")
        .arg(plugin_dir())
        .arg("--handover")
        .arg(control)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("serve starts")
}

fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// Waits (bounded) for `child` to exit and returns its exit code.
async fn exit_code(child: &mut Child, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("child status") {
            return status.code();
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One request of the load: when it started, how long it took, and what went wrong.
struct Outcome {
    started: Instant,
    took: Duration,
    error: Option<String>,
}

/// Sends request `n` (streamed when `n` is odd) and checks the whole answer arrived.
async fn one_request(api: SocketAddr, n: usize) -> Option<String> {
    let stream = n % 2 == 1;
    let body = serde_json::json!({
        "model": "test-model",
        "prompt": format!("shared prefix {} of the load, request {n}", n % 8),
        "max_tokens": 6,
        "stream": stream,
    })
    .to_string();
    let response = match try_send(api, "POST", "/v1/completions", &[], &body).await {
        Ok(response) => response,
        Err(e) => return Some(format!("request {n}: {e}")),
    };
    let status = response.status();
    if status != 200 {
        let text = String::from_utf8_lossy(&body_bytes(response).await).into_owned();
        return Some(format!("request {n}: status {status}: {text}"));
    }
    if stream {
        let (events, end) = read_events(response).await;
        if let Err(e) = end {
            return Some(format!("request {n}: stream cut: {e}"));
        }
        if events.last().map(String::as_str) != Some("[DONE]") || events.len() < 3 {
            return Some(format!("request {n}: incomplete stream {events:?}"));
        }
    } else {
        use http_body_util::BodyExt;
        let bytes = match response.into_body().collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => return Some(format!("request {n}: body cut: {e}")),
        };
        let value: serde_json::Value = match serde_json::from_slice(&bytes) {
            Ok(value) => value,
            Err(e) => return Some(format!("request {n}: body not JSON ({e})")),
        };
        if value["usage"]["completion_tokens"] != 6 {
            return Some(format!("request {n}: incomplete answer {value}"));
        }
    }
    None
}

/// Starts a request every [`REQUEST_EVERY`] until `running` turns false; returns every
/// request's outcome once all have ended.
async fn load(api: SocketAddr, running: Arc<AtomicBool>) -> Vec<Outcome> {
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut ticks = tokio::time::interval(REQUEST_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0;
    while running.load(Ordering::Relaxed) {
        ticks.tick().await;
        let outcomes = outcomes.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let error = match tokio::time::timeout(REQUEST_DEADLINE, one_request(api, n)).await {
                Ok(error) => error,
                Err(_) => Some(format!("request {n}: no full answer within the deadline")),
            };
            let took = started.elapsed();
            outcomes.lock().expect("outcomes").push(Outcome {
                started,
                took,
                error,
            });
        }));
        n += 1;
    }
    for task in tasks {
        task.await.expect("request task");
    }
    Arc::try_unwrap(outcomes)
        .ok()
        .expect("all tasks ended")
        .into_inner()
        .expect("outcomes")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_hand_overs_under_load_lose_no_request() {
    let dir = temp_dir("handover-serve");
    let replicas = fast_replicas(2, &[]).await;
    let endpoints = endpoints_toml(&replicas);
    let control = dir.join("handover.sock");
    let ports = [free_port(), free_port(), free_port()];
    let [api, metrics, admin] = ports.map(|port| SocketAddr::from(([127, 0, 0, 1], port)));

    let config = serve_config(&dir, 0, &endpoints, ports);
    let mut current = spawn_serve(&dir, &config, &control, 0);
    if let Err(status) = wait_healthy(&mut current, metrics, "/health").await {
        panic!("serve exited: {status}\n{}", log_of(&dir, "serve0.log"));
    }
    assert!(
        log_of(&dir, "serve0.log").contains("binding them afresh"),
        "{}",
        log_of(&dir, "serve0.log")
    );

    let running = Arc::new(AtomicBool::new(true));
    let load_task = tokio::spawn(load(api, running.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut windows = Vec::new();
    for build in 1..=HAND_OVERS {
        let config = serve_config(&dir, build, &endpoints, ports);
        let began = Instant::now();
        let successor = spawn_serve(&dir, &config, &control, build);
        let mut predecessor = std::mem::replace(&mut current, successor);
        let code = exit_code(&mut predecessor, Duration::from_secs(20)).await;
        let ended = Instant::now();
        let previous_log = log_of(&dir, &format!("serve{}.log", build - 1));
        let log = log_of(&dir, &format!("serve{build}.log"));
        assert_eq!(
            code,
            Some(0),
            "hand-over {build}: the predecessor did not exit 0\npredecessor:\n{previous_log}\n\
             successor:\n{log}"
        );
        assert!(
            previous_log.contains("handed over to process") && log.contains("taking over"),
            "hand-over {build}:\npredecessor:\n{previous_log}\nsuccessor:\n{log}"
        );
        // A successor starts with an empty prefix index while the replicas keep their caches,
        // so its predictions may drift for a while (a warning of their own); anything else
        // warned about means the drain was not clean.
        let unclean: Vec<&str> = previous_log
            .lines()
            .filter(|line| line.contains("WARN") && !line.contains("prefix predictions drifted"))
            .collect();
        assert!(
            unclean.is_empty(),
            "hand-over {build}: the predecessor's drain was not clean\n{previous_log}"
        );
        windows.push((began, ended));
        // The admin listener was handed over too, and shows the successor's build.
        let effective = body_bytes(send(admin, "GET", "/config", &[], "").await).await;
        assert!(
            String::from_utf8_lossy(&effective).contains(&format!("build{build}")),
            "hand-over {build}: /config shows another build\n{}",
            String::from_utf8_lossy(&effective)
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.store(false, Ordering::Relaxed);
    let outcomes = load_task.await.expect("load");

    let first = outcomes.iter().map(|o| o.started).min().expect("requests");
    let last = outcomes.iter().map(|o| o.started).max().expect("requests");
    let errors: Vec<&String> = outcomes.iter().filter_map(|o| o.error.as_ref()).collect();
    let mut all: Vec<Duration> = outcomes.iter().map(|o| o.took).collect();
    all.sort();
    let mut during: Vec<Duration> = outcomes
        .iter()
        .filter(|o| {
            windows
                .iter()
                .any(|(began, ended)| o.started >= *began && o.started <= *ended)
        })
        .map(|o| o.took)
        .collect();
    during.sort();
    let span = last.duration_since(first).as_secs_f64().max(0.001);
    let handover_ms: Vec<u128> = windows
        .iter()
        .map(|(began, ended)| ended.duration_since(*began).as_millis())
        .collect();
    eprintln!(
        "hand-over load: {} requests in {span:.1} s ({:.0}/s, half streamed), {} errors, \
         {HAND_OVERS} hand-overs taking {handover_ms:?} ms (start of the successor to exit of \
         the predecessor); latency p50 {:?} p99 {:?} max {:?} overall, p99 {:?} over the {} \
         requests started during a hand-over",
        outcomes.len(),
        outcomes.len() as f64 / span,
        errors.len(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or_default(),
        percentile(&during, 0.99),
        during.len(),
    );
    assert!(
        errors.is_empty(),
        "{} of {} requests failed, the first: {:?}",
        errors.len(),
        outcomes.len(),
        &errors[..errors.len().min(5)]
    );
    assert!(
        outcomes.len() > 500 && !during.is_empty(),
        "too little load to judge"
    );

    // Every request ended, on the last process too; it stops on SIGTERM as usual.
    let idle = eventually(Duration::from_secs(10), || async {
        metric_sum(&metrics_page(metrics).await, "switchyard_in_flight_total") == 0.0
    })
    .await;
    assert!(idle, "{}", metrics_page(metrics).await);
    let mut last_process = Process {
        child: current,
        addr: api,
    };
    assert_eq!(last_process.terminate(Duration::from_secs(20)), Some(0));
    assert!(
        !control.exists(),
        "a process stopping by signal removes its socket"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_proc_hands_over_with_a_stream_in_flight() {
    let dir = temp_dir("handover-extproc");
    let replicas = fast_replicas(2, &[]).await;
    let config = dir.join("ext-proc.toml");
    std::fs::write(
        &config,
        format!("{}{}", burst_pipeline(5), endpoints_toml(&replicas)),
    )
    .expect("config written");
    let control = dir.join("handover.sock");
    let control_arg = control.display().to_string();
    let flags = ["--allow-experimental-plugins", "--handover", &control_arg];
    let ports = [free_port(), free_port(), free_port()];
    let [grpc, _, metrics] = ports.map(|port| SocketAddr::from(([127, 0, 0, 1], port)));

    let mut first = picker_command(&config, ports, &dir.join("first.log"), &flags)
        .spawn()
        .expect("ext-proc starts");
    if let Err(status) = wait_healthy(&mut first, metrics, "/health").await {
        panic!("ext-proc exited: {status}\n{}", log_of(&dir, "first.log"));
    }
    let generate = serde_json::json!({
        "model": "test-model", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8],
        "sampling_params": {"max_tokens": 2},
    })
    .to_string();
    let path = "/inference/v1/generate";

    // A tracked stream is open on the first picker when the second one takes over.
    let mut open = Stream::open(channel(grpc).await)
        .await
        .expect("stream opens");
    let placed = pick(&mut open, path, &[("x-request-id", "before")], &generate).await;
    assert!(placed.immediate.is_none(), "{:?}", placed.immediate);

    let second = picker_command(&config, ports, &dir.join("second.log"), &flags)
        .spawn()
        .expect("ext-proc starts");
    let handed = eventually(Duration::from_secs(20), || async {
        log_of(&dir, "first.log").contains("handed over to process")
    })
    .await;
    assert!(
        handed,
        "first:\n{}\nsecond:\n{}",
        log_of(&dir, "first.log"),
        log_of(&dir, "second.log")
    );
    assert!(
        first.try_wait().expect("status").is_none(),
        "the first picker waits for its open stream"
    );

    // New connections reach the second picker, which places and tracks as usual.
    let mut fresh = Stream::open(channel(grpc).await)
        .await
        .expect("stream opens");
    let placed = pick(&mut fresh, path, &[("x-request-id", "after")], &generate).await;
    assert!(placed.immediate.is_none(), "{:?}", placed.immediate);
    let page = metrics_page(metrics).await;
    assert_eq!(
        metric_sum(&page, "switchyard_in_flight_total"),
        1.0,
        "the second picker counts its own stream\n{page}"
    );

    // The stream on the first picker finishes there; then it exits 0.
    let echoed = report_completion(&mut open, 5).await;
    assert!(String::from_utf8_lossy(&echoed).contains("\"completion_tokens\":5"));
    open.half_close();
    assert!(
        matches!(open.next().await, Ok(None)),
        "the stream ends cleanly"
    );
    assert_eq!(
        exit_code(&mut first, Duration::from_secs(20)).await,
        Some(0),
        "{}",
        log_of(&dir, "first.log")
    );

    report_completion(&mut fresh, 3).await;
    fresh.half_close();
    assert!(matches!(fresh.next().await, Ok(None)));
    let page = metrics_page(metrics).await;
    assert_eq!(
        metric_sum(&page, "switchyard_completion_tokens_total"),
        3.0,
        "{page}"
    );
    let mut second = Process {
        child: second,
        addr: grpc,
    };
    assert_eq!(second.terminate(Duration::from_secs(20)), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_hand_over_paths_and_held_ports_are_refused_clearly() {
    let dir = temp_dir("handover-refusals");
    let not_a_socket = dir.join("notes.txt");
    std::fs::write(&not_a_socket, "keep me").expect("file");
    let config = dir.join("serve.toml");
    let port = free_port();
    std::fs::write(
        &config,
        format!(
            "[[endpoints]]\nname = \"r0\"\naddress = \"127.0.0.1:1\"\n\n[serve]\n\
             listen = \"127.0.0.1:{port}\"\nmetrics_listen = \"127.0.0.1:{}\"\nadmin_listen = \"\"\n",
            free_port()
        ),
    )
    .expect("config");
    let output = Command::new(binary())
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--handover")
        .arg(&not_a_socket)
        .output()
        .expect("serve runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("notes.txt") && stderr.contains("not a socket"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&not_a_socket).expect("file kept"),
        "keep me"
    );

    // A directory that does not exist: named in the error.
    let missing = dir.join("no-such-dir/handover.sock");
    let output = Command::new(binary())
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--handover")
        .arg(&missing)
        .output()
        .expect("serve runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no-such-dir/handover.sock"), "{stderr}");

    // The API port held by a process that offers nothing at the path.
    let holder = std::net::TcpListener::bind(("127.0.0.1", port)).expect("port held");
    let output = Command::new(binary())
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--handover")
        .arg(dir.join("handover.sock"))
        .output()
        .expect("serve runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{port}")) && stderr.contains("without --handover"),
        "{stderr}"
    );
    drop(holder);
    let _ = std::fs::remove_dir_all(&dir);
}
