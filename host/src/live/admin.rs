//! The operator-facing routes of both live drivers, and the listeners serving them:
//! `/metrics`, `/health` and `/ready` on the metrics listener, and the admin API (bound to
//! loopback by default) with recent decision records, per-plugin counters, each plugin's
//! `state`, how prefix predictions compared with the replicas' cached tokens, the fleet, the
//! effective config and the config reload (`GET /reload` shows the running generation,
//! `POST /reload` reloads).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::fleet::FleetState;
use crate::live::connection::Guard;
use crate::live::listen::{accept, AcceptLoops};
use crate::live::metrics::Metrics;
use crate::live::metrics::RequestOutcome;
use crate::live::reload::{libraries_json, Reloaded, Reloader};
use crate::live::response::{self, ApiError};
use crate::live::LiveScheduler;

/// What the operator-facing routes read: the shared state of a live driver.
pub trait Observed: Send + Sync + 'static {
    fn live(&self) -> &Arc<LiveScheduler>;
    fn reloader(&self) -> &Arc<Reloader>;
    fn fleet(&self) -> Arc<FleetState>;
    fn metrics(&self) -> &Metrics;
}

/// How many decision records `/decisions` returns unless `?limit=` says otherwise.
const DEFAULT_RECORDS: usize = 100;

/// The operator-facing listeners of a live driver.
pub(crate) struct OperatorListeners {
    pub metrics: TcpListener,
    pub admin: Option<TcpListener>,
}

/// Serves `/metrics` `/health` `/ready` and, when it has a listener, the admin API, until
/// `stopped`.
pub(crate) fn spawn_operator_routes<O: Observed>(
    observed: Arc<O>,
    listeners: OperatorListeners,
    loops: &AcceptLoops,
    draining: Arc<AtomicBool>,
    stopped: watch::Receiver<bool>,
    drain: Duration,
    guard: Arc<Guard>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    {
        let observed = observed.clone();
        tasks.push(tokio::spawn(accept(
            listeners.metrics,
            loops.token(),
            stopped.clone(),
            drain,
            guard.clone(),
            None,
            move |request| observe(observed.clone(), draining.clone(), request),
        )));
    }
    if let Some(listener) = listeners.admin {
        tasks.push(tokio::spawn(accept(
            listener,
            loops.token(),
            stopped,
            drain,
            guard,
            None,
            move |request| admin(observed.clone(), request),
        )));
    }
    tasks
}

/// The metrics listener's routes.
pub async fn observe<O: Observed>(
    router: Arc<O>,
    draining: Arc<AtomicBool>,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if let Some(refusal) = get_only(&request) {
        return refusal;
    }
    match request.uri().path() {
        "/metrics" => {
            let fleet = router.fleet();
            response::text(
                StatusCode::OK,
                router
                    .metrics()
                    .render(router.live(), &fleet, router.reloader()),
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
        }
        "/health" => response::json(StatusCode::OK, &json!({"status": "ok"})),
        "/ready" => {
            let fleet = router.fleet();
            let fresh = fleet.members.iter().filter(|m| m.fresh).count();
            let draining = draining.load(Ordering::Relaxed);
            let ready = fresh > 0 && !draining;
            let status = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            response::json(
                status,
                &json!({
                    "ready": ready,
                    "fresh_endpoints": fresh,
                    "endpoints": fleet.members.len(),
                    "draining": draining,
                }),
            )
        }
        _ => unknown_route("routes: /metrics /health /ready"),
    }
}

/// The admin API's routes.
pub async fn admin<O: Observed>(
    router: Arc<O>,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if request.uri().path() == "/reload" && request.method() == Method::POST {
        let reloaded = router.reloader().reload_async("POST /reload").await;
        let status = match reloaded {
            Reloaded::Applied { .. } => StatusCode::OK,
            Reloaded::Refused { .. } => StatusCode::CONFLICT,
        };
        let libraries = router.reloader().libraries();
        return response::json(status, &reloaded.to_json(&libraries));
    }
    if request.uri().path() == "/prefix-reset" && request.method() == Method::POST {
        return prefix_reset(router.live(), request.uri().query().unwrap_or(""));
    }
    if let Some(refusal) = get_only(&request) {
        return refusal;
    }
    let query = request.uri().query().unwrap_or("");
    match request.uri().path() {
        "/decisions" => {
            let limit = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("limit="))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(DEFAULT_RECORDS);
            let records: Vec<Value> = router
                .live()
                .records(limit)
                .iter()
                .map(|r| serde_json::to_value(&**r).unwrap_or(Value::Null))
                .collect();
            response::json(StatusCode::OK, &Value::Array(records))
        }
        "/plugins" => {
            let plugins: Vec<Value> = router
                .live()
                .plugin_stats()
                .into_iter()
                .map(|(label, type_name, digest, stats)| {
                    json!({
                        "plugin": label,
                        "type": type_name,
                        "library_sha256": digest,
                        "calls": stats.calls,
                        "errors": stats.errors,
                        "timeouts": stats.timeouts,
                        "panics": stats.panics,
                        "batch_overflows": stats.batch_overflows,
                        "switched_off": stats.poisoned,
                        "timed_calls": stats.timed_calls,
                        "mean_call_us": (stats.timed_calls > 0)
                            .then(|| stats.timed_nanos as f64 / stats.timed_calls as f64 / 1000.0),
                    })
                })
                .collect();
            response::json(StatusCode::OK, &Value::Array(plugins))
        }
        "/plugins/state" => {
            let mut states = serde_json::Map::new();
            for (label, state) in router.live().plugin_states() {
                let value = match state {
                    Ok(text) => match serde_json::from_str(&text) {
                        Ok(Value::Null) => json!({"unavailable": "the plugin reports no state"}),
                        Ok(value) => value,
                        Err(_) if text.trim().is_empty() => {
                            json!({"unavailable": "the plugin reports no state"})
                        }
                        Err(_) => Value::String(text),
                    },
                    Err(reason) => json!({"unavailable": reason}),
                };
                states.insert(label, value);
            }
            response::json(StatusCode::OK, &Value::Object(states))
        }
        "/predictions" => response::json(StatusCode::OK, &router.metrics().predictions().to_json()),
        "/kv-events" => match router.live().kv_event_stats() {
            Some(stats) => response::json(StatusCode::OK, &json!({"endpoints": stats})),
            None => response::json(
                StatusCode::OK,
                &json!({"endpoints": [], "note": "no endpoint has a KV-event publisher ([kv_events] in the config)"}),
            ),
        },
        "/fleet" => {
            let fleet = router.fleet();
            let (in_flight, _) = router.live().in_flight();
            let members: Vec<Value> = fleet
                .members
                .iter()
                .map(|m| {
                    let metrics = &m.endpoint.metrics;
                    json!({
                        "id": m.endpoint.id,
                        "address": m.endpoint.address,
                        "role": m.endpoint.role,
                        "labels": m.labels,
                        "fresh": m.fresh,
                        "metrics_age_ms": m.metrics_age_ms,
                        "scrape_failures": m.scrape_failures,
                        "in_flight": in_flight.iter().find(|(id, _)| *id == m.endpoint.id).map_or(0, |(_, n)| *n),
                        "metrics": {
                            "running_requests": metrics.running_requests,
                            "waiting_requests": metrics.waiting_requests,
                            "kv_cache_usage": metrics.kv_cache_usage,
                            "cache_block_size": metrics.cache_block_size,
                            "cache_num_blocks": metrics.cache_num_blocks,
                        },
                    })
                })
                .collect();
            response::json(
                StatusCode::OK,
                &json!({"generation": fleet.generation, "endpoints": members}),
            )
        }
        "/config" => response::text(
            StatusCode::OK,
            router.reloader().effective().to_string(),
            "text/plain; charset=utf-8",
        ),
        "/reload" => {
            let reloader = router.reloader();
            let (applied, refused) = reloader.counts();
            response::json(
                StatusCode::OK,
                &json!({
                    "generation": reloader.generation(),
                    "applied": applied,
                    "refused": refused,
                    "libraries": libraries_json(&reloader.libraries()),
                }),
            )
        }
        _ => unknown_route(
            "routes: /decisions[?limit=N] /plugins /plugins/state /predictions /kv-events /fleet \
             /config /reload (GET shows the config generation, POST reloads the config), \
             POST /prefix-reset[?endpoint=ID]",
        ),
    }
}

/// Both listeners answer GET only.
fn get_only(request: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
    (request.method() != Method::GET).then(|| {
        let mut refusal = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            RequestOutcome::BadRequest,
            "these routes take GET",
        )
        .into_response();
        refusal.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET"),
        );
        refusal
    })
}

/// A 404 naming the listener's routes, as an OpenAI-shaped JSON error like every other error.
fn unknown_route(routes: &str) -> Response<Full<Bytes>> {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_route",
        RequestOutcome::BadRequest,
        routes,
    )
    .into_response()
}

/// `POST /prefix-reset[?endpoint=ID]`: empties the prefix state one endpoint (or every
/// endpoint) has in every plugin that keeps one, e.g. after the replicas loaded new weights.
fn prefix_reset(live: &Arc<LiveScheduler>, query: &str) -> Response<Full<Bytes>> {
    let endpoint = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("endpoint="))
        .map(percent_decoded);
    if let Some(id) = &endpoint {
        if !live.endpoint_ids().contains(id) {
            return ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_endpoint",
                RequestOutcome::BadRequest,
                format!("no endpoint {id} in the fleet (GET /fleet lists them)"),
            )
            .into_response();
        }
    }
    let (endpoints, plugins) =
        crate::live::kv_feed::reset_prefix_state(live, endpoint.as_ref().map(std::slice::from_ref));
    response::json(
        StatusCode::OK,
        &json!({"reset": endpoints, "plugins": plugins}),
    )
}

/// `%XX` escapes of a query value decoded (an endpoint id holds a `/`).
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
