//! What the operator tells Prometheus and the kubelet: reconcile counts, errors and latency, jobs per phase and
//! the CS-2 pool, served with `/healthz` and `/readyz` by a small axum server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of per-result counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `error`.
    pub result: String,
}

/// Labels of per-phase gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// The job phase.
    pub phase: String,
}

/// The operator's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    /// Reconcile passes by result.
    pub reconciles: Family<ResultLabel, Counter>,
    /// Seconds per reconcile pass.
    pub duration: Histogram,
    /// Jobs per phase, from the last census.
    pub jobs: Family<PhaseLabel, Gauge>,
    /// CS-2s in the pool at the last admission.
    pub pool: Gauge<u64, AtomicU64>,
    /// CS-2s held by jobs at the last admission.
    pub allocated: Gauge<u64, AtomicU64>,
    phases_seen: Mutex<Vec<String>>,
}

impl Metrics {
    /// Registers every metric under the `weightstream_operator` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("weightstream_operator");
        let reconciles = Family::<ResultLabel, Counter>::default();
        // 1 ms to 32 s: a pass that assembles a 192-CS-2 job takes seconds, and its p99 must fall in a bucket.
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let jobs = Family::<PhaseLabel, Gauge>::default();
        let pool = Gauge::<u64, AtomicU64>::default();
        let allocated = Gauge::<u64, AtomicU64>::default();
        registry.register("reconciles", "Reconcile passes by result", reconciles.clone());
        registry.register("reconcile_duration_seconds", "Seconds per reconcile pass", duration.clone());
        registry.register("jobs", "TrainingJobs per phase (queued, running, …)", jobs.clone());
        registry.register("cs2_pool", "CS-2 systems in the pool", pool.clone());
        registry.register("cs2_allocated", "CS-2 systems held by jobs", allocated.clone());
        Metrics { registry, reconciles, duration, jobs, pool, allocated, phases_seen: Mutex::new(Vec::new()) }
    }

    /// Counts one reconcile pass.
    pub fn observe(&self, ok: bool, took: Duration) {
        let result = if ok { "ok" } else { "error" }.to_string();
        self.reconciles.get_or_create(&ResultLabel { result }).inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// Replaces the per-phase job counts, zeroing phases that have no job any more.
    pub fn census(&self, counts: &[(String, i64)]) {
        if let Ok(mut seen) = self.phases_seen.lock() {
            for p in seen.iter() {
                self.jobs.get_or_create(&PhaseLabel { phase: p.clone() }).set(0);
            }
            for (p, n) in counts {
                self.jobs.get_or_create(&PhaseLabel { phase: p.clone() }).set(*n);
                if !seen.contains(p) {
                    seen.push(p.clone());
                }
            }
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Records the pool and what jobs hold of it.
    pub fn set_pool(&self, pool: u32, allocated: u32) {
        self.pool.set(u64::from(pool));
        self.allocated.set(u64::from(allocated));
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The state an operator process shares between its controller and its HTTP endpoints.
#[derive(Clone)]
pub struct Shared {
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// What `/readyz` reports: the process reached the API server and runs (or stands by to run) the controller.
    pub ready: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared { metrics: Arc::new(Metrics::new()), ready: Arc::new(std::sync::atomic::AtomicBool::new(false)) }
    }
}

/// `/healthz` (the process serves), `/readyz` (it reached the API server) and `/metrics`.
pub fn router(shared: Shared) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<Shared>| async move {
                if s.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready").into_response()
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not connected to the API server yet").into_response()
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(s): State<Shared>| async move {
                ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
            }),
        )
        .with_state(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_with_their_labels() {
        let m = Metrics::new();
        m.observe(true, Duration::from_millis(3));
        m.observe(false, Duration::from_millis(3));
        m.census(&[("Running".into(), 2)]);
        m.census(&[("Queued".into(), 1)]);
        m.set_pool(8, 6);
        let text = m.encode();
        assert!(text.contains(r#"weightstream_operator_reconciles_total{result="ok"} 1"#), "{text}");
        assert!(text.contains(r#"weightstream_operator_jobs{phase="Running"} 0"#), "{text}");
        assert!(text.contains(r#"weightstream_operator_jobs{phase="Queued"} 1"#), "{text}");
        assert!(text.contains("weightstream_operator_cs2_pool 8"), "{text}");
        assert!(text.contains("weightstream_operator_reconcile_duration_seconds_count 2"), "{text}");
    }

    #[tokio::test]
    async fn health_readiness_and_metrics_are_served() {
        let shared = Shared::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(shared.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let get = |path: &str| reqwest::get(format!("http://{addr}{path}"));
        assert_eq!(get("/healthz").await.unwrap().status(), 200);
        assert_eq!(get("/readyz").await.unwrap().status(), 503, "not ready before the controller runs");
        shared.ready.store(true, Ordering::Relaxed);
        assert_eq!(get("/readyz").await.unwrap().status(), 200);
        shared.metrics.observe(true, Duration::from_millis(1));
        let body = get("/metrics").await.unwrap().text().await.unwrap();
        assert!(body.contains("weightstream_operator_reconciles_total{result=\"ok\"} 1"), "{body}");
    }
}
