//! How progress reaches the status: the operator polls the job's MemoryX (the job's coordinator) at
//! `GET /status` through its Service, and asks it for a checkpoint with `POST /checkpoint` before a suspend or a
//! rescale. It is a trait so tests (and clusters without a data plane) can stand in for MemoryX.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crds::contract::MemoryxStatus;
use crds::{CheckpointRef, TrainingJob};
use futures::future::BoxFuture;
use kube::ResourceExt;

use crate::Error;

/// Reads a job's progress from its coordinator and asks it for checkpoints.
pub trait Coordinator: Send + Sync + 'static {
    /// The coordinator's current report for `job`.
    fn status<'a>(&'a self, job: &'a TrainingJob) -> BoxFuture<'a, Result<MemoryxStatus, Error>>;
    /// Asks the coordinator to write a checkpoint after the step in flight.
    fn checkpoint<'a>(&'a self, job: &'a TrainingJob) -> BoxFuture<'a, Result<(), Error>>;
}

/// The most of a `/status` answer the operator reads.
pub const MAX_STATUS_BYTES: usize = 64 << 10;

/// Where the operator finds the identity it presents to a job's MemoryX.
#[derive(Clone)]
enum Identities {
    /// The job's Secret (the operator's own client certificate, issued with the job's identity).
    Secrets(kube::Client),
    /// One identity for every job: tests, and an operator pointed at a single local appliance.
    Fixed(wire::identity::Identity),
}

/// The real thing: HTTPS to MemoryX's Service, `https://<job>-memoryx.<namespace>.svc:8080`, presenting the
/// operator's client certificate of that job and trusting only that job's CA.
pub struct HttpCoordinator {
    identities: Identities,
    /// One HTTP client per job identity (by job uid), so connections are reused and the Secret is read once.
    clients: Mutex<HashMap<String, reqwest::Client>>,
    template: Option<String>,
}

impl HttpCoordinator {
    /// A coordinator that reads each job's identity Secret through `client`.
    pub fn new(client: kube::Client) -> HttpCoordinator {
        HttpCoordinator { identities: Identities::Secrets(client), clients: Mutex::default(), template: None }
    }

    /// A coordinator presenting `identity` to every job's MemoryX.
    pub fn with_identity(identity: wire::identity::Identity) -> HttpCoordinator {
        HttpCoordinator { identities: Identities::Fixed(identity), clients: Mutex::default(), template: None }
    }

    /// Reaches MemoryX at `template` instead of its Service, with `{job}` and `{namespace}` filled in: for an
    /// operator running outside the cluster (through a port-forward or an ingress).
    pub fn with_url_template(mut self, template: impl Into<String>) -> HttpCoordinator {
        self.template = Some(template.into());
        self
    }

    fn base(&self, job: &TrainingJob) -> String {
        let (name, ns) = (job.name_any(), job.namespace().unwrap_or_default());
        match &self.template {
            Some(t) => t.replace("{job}", &name).replace("{namespace}", &ns).trim_end_matches('/').to_string(),
            None => crate::children::site::memoryx_http(&name, &ns),
        }
    }

    /// The HTTP client that speaks to `job`'s MemoryX as the operator, with short timeouts, so one unreachable
    /// MemoryX never stalls reconciling the others.
    async fn client(&self, job: &TrainingJob, url: &str) -> Result<reqwest::Client, Error> {
        // An identity Secret is immutable and issued once per job uid (a namesake gets a new uid, hence a new
        // key), so a client built for a uid stays right: polls after the first read no Secret.
        let key = match &self.identities {
            Identities::Fixed(_) => String::new(),
            Identities::Secrets(_) => job.uid().unwrap_or_default(),
        };
        if let Some(c) = self.clients.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        let identity = match &self.identities {
            Identities::Fixed(id) => id.clone(),
            Identities::Secrets(client) => {
                let ns = job.namespace().unwrap_or_default();
                let name = crate::children::names::identity(&job.name_any());
                let secret = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
                    .get_opt(&name)
                    .await?
                    .filter(|s| crate::children::identity::identity_belongs_to(s, job))
                    .ok_or_else(|| {
                        unreachable(url, format!("the job's identity Secret {ns}/{name} does not exist yet"))
                    })?;
                let file = |f: &str| {
                    let bytes = secret.data.as_ref().and_then(|d| d.get(f)).map(|b| b.0.clone()).unwrap_or_default();
                    String::from_utf8(bytes).map_err(|_| unreachable(url, format!("{name}: {f} is not PEM text")))
                };
                use wire::identity::{CA_CERT, OPERATOR_CERT, OPERATOR_KEY};
                wire::identity::Identity::from_pem(&file(CA_CERT)?, &file(OPERATOR_CERT)?, &file(OPERATOR_KEY)?)
            }
        };
        let tls = identity.client_config().map_err(|e| unreachable(url, e))?;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .https_only(true)
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client for MemoryX: {e}")))?;
        if let Ok(mut m) = self.clients.lock() {
            // Jobs come and go: start afresh rather than grow without bound.
            if m.len() > 1024 {
                m.clear();
            }
            m.insert(key, client.clone());
        }
        Ok(client)
    }
}

fn unreachable(url: &str, e: impl std::fmt::Display) -> Error {
    Error::Coordinator { url: url.into(), message: e.to_string() }
}

impl Coordinator for HttpCoordinator {
    fn status<'a>(&'a self, job: &'a TrainingJob) -> BoxFuture<'a, Result<MemoryxStatus, Error>> {
        Box::pin(async move {
            let url = format!("{}/status", self.base(job));
            let resp = self.client(job, &url).await?.get(&url).send().await.map_err(|e| unreachable(&url, e))?;
            let mut resp = resp.error_for_status().map_err(|e| unreachable(&url, e))?;
            // A status is a few hundred bytes; whatever answers there gets no more of the operator's memory.
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| unreachable(&url, e))? {
                if body.len() + chunk.len() > MAX_STATUS_BYTES {
                    return Err(unreachable(&url, format!("/status answered more than {MAX_STATUS_BYTES} bytes")));
                }
                body.extend_from_slice(&chunk);
            }
            serde_json::from_slice::<MemoryxStatus>(&body)
                .map_err(|e| unreachable(&url, format!("bad /status body: {e}")))
        })
    }

    fn checkpoint<'a>(&'a self, job: &'a TrainingJob) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let url = format!("{}/checkpoint", self.base(job));
            let resp = self.client(job, &url).await?.post(&url).send().await.map_err(|e| unreachable(&url, e))?;
            resp.error_for_status().map_err(|e| unreachable(&url, e))?;
            Ok(())
        })
    }
}

/// A stand-in for MemoryX whose reports the caller sets, for tests and for exercising the operator on a cluster
/// without a data plane. Like MemoryX, a checkpoint request makes the current step the last checkpoint.
#[derive(Clone, Default)]
pub struct ScriptedCoordinator {
    reports: Arc<Mutex<HashMap<String, MemoryxStatus>>>,
    delays: Arc<Mutex<HashMap<String, Duration>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl ScriptedCoordinator {
    /// Makes `namespace/name` report `status` from now on.
    pub fn set(&self, key: &str, status: MemoryxStatus) {
        if let Ok(mut m) = self.reports.lock() {
            m.insert(key.to_string(), status);
        }
    }

    /// Makes `namespace/name` answer only after `delay`, as a MemoryX on a busy or distant node would.
    pub fn set_delay(&self, key: &str, delay: Duration) {
        if let Ok(mut m) = self.delays.lock() {
            m.insert(key.to_string(), delay);
        }
    }

    /// Makes `namespace/name` unreachable again.
    pub fn clear(&self, key: &str) {
        if let Ok(mut m) = self.reports.lock() {
            m.remove(key);
        }
    }

    /// The jobs (`namespace/name`) a checkpoint was requested for, in order.
    pub fn checkpoint_requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    fn key(job: &TrainingJob) -> String {
        crate::job_key(&job.namespace().unwrap_or_default(), &job.name_any())
    }
}

impl Coordinator for ScriptedCoordinator {
    fn status<'a>(&'a self, job: &'a TrainingJob) -> BoxFuture<'a, Result<MemoryxStatus, Error>> {
        let key = Self::key(job);
        let delay = self.delays.lock().ok().and_then(|m| m.get(&key).copied());
        let reports = self.reports.clone();
        Box::pin(async move {
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            let found = reports.lock().ok().and_then(|m| m.get(&key).cloned());
            found.ok_or_else(|| unreachable(&key, "no report scripted"))
        })
    }

    fn checkpoint<'a>(&'a self, job: &'a TrainingJob) -> BoxFuture<'a, Result<(), Error>> {
        let key = Self::key(job);
        let result = match self.reports.lock() {
            Ok(mut m) => match m.get_mut(&key) {
                Some(s) => {
                    let step = s.step();
                    s.progress.last_checkpoint = Some(CheckpointRef { step, path: format!("ckpt-{step:08}") });
                    if let Ok(mut r) = self.requests.lock() {
                        r.push(key.clone());
                    }
                    Ok(())
                }
                None => Err(unreachable(&key, "no report scripted")),
            },
            Err(_) => Err(unreachable(&key, "poisoned")),
        };
        Box::pin(async move { result })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn http_coordinator_reads_status_and_asks_for_checkpoints() {
        use axum::routing::{get, post};
        let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let app = axum::Router::new()
            .route(
                "/j/ns/status",
                get(|| async {
                    r#"{"phase":"Running","step":7,"totalSteps":50,"loss":0.5,"samplesPerSecond":null,
                        "simulatedStepSeconds":0.01,"lastCheckpoint":{"step":5,"path":"/c/5"},"evalAccuracy":null,"message":null}"#
                }),
            )
            .route("/huge/ns/status", get(|| async { format!("{{\"phase\":\"Running\",\"message\":\"{}\"}}", "x".repeat(1 << 20)) }))
            .route(
                "/j/ns/checkpoint",
                post({
                    let asked = asked.clone();
                    move || async move {
                        asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        axum::http::StatusCode::ACCEPTED
                    }
                }),
            );
        // A MemoryX stand-in that serves the routes as MemoryX does: over TLS, to the job's certificates only.
        let issued = wire::identity::issue("j", &[]).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = issued.job_identity();
        tokio::spawn(async move { wire::https::serve(listener, &server, axum::Router::new(), app).await });
        let template = format!("https://{addr}/{{job}}/{{namespace}}/");
        let c = HttpCoordinator::with_identity(issued.operator_identity()).with_url_template(template.clone());
        let mut job = crds::TrainingJob::new(
            "j",
            serde_json::from_value(serde_json::json!({
                "model": {"kind": "mlp", "layers": [784, 10]}, "data": {"kind": "mnist", "path": "d"},
                "training": {"batchSize": 1, "steps": 1, "optimizer": {"kind": "sgd", "learningRate": 0.1}}
            }))
            .unwrap(),
        );
        job.metadata.namespace = Some("ns".into());
        let s = c.status(&job).await.unwrap();
        assert_eq!(
            (s.phase, s.step(), s.progress.last_checkpoint.unwrap().step),
            (crds::contract::MemoryxPhase::Running, 7, 5)
        );
        c.checkpoint(&job).await.unwrap();
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        job.metadata.name = Some("huge".into());
        let err = c.status(&job).await.unwrap_err().to_string();
        assert!(err.contains("more than 65536 bytes"), "{err}");
        job.metadata.name = Some("missing".into());
        let err = c.status(&job).await.unwrap_err().to_string();
        assert!(err.contains("/missing/ns/status"), "{err}");
        // Another job's operator certificate (another CA) gets nothing, not even a checkpoint.
        job.metadata.name = Some("j".into());
        let other = wire::identity::issue("other", &[]).unwrap();
        let stranger = HttpCoordinator::with_identity(other.operator_identity()).with_url_template(template);
        assert!(stranger.status(&job).await.is_err());
        assert!(stranger.checkpoint(&job).await.is_err());
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the stranger's checkpoint request never arrived"
        );
    }
}
