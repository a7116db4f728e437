//! The dashboard's HTTP server: bound to 127.0.0.1 only, answering only requests addressed to that address or
//! `localhost` (a page elsewhere cannot rebind a name of its own to this port and read the jobs: DNS
//! rebinding), with headers that keep the page from being framed or fed another origin's script.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use super::{PAGE_DEADLINE, Source, html};

const STYLE: &str = include_str!("dashboard.css");
const SCRIPT: &str = include_str!("dashboard.js");

/// The headers every answer carries: only this origin's script and style, no framing, no sniffing, no caching
/// (a job's page is its state now), no referrer.
const HEADERS: [(header::HeaderName, &str); 5] = [
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self'; \
         connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::CACHE_CONTROL, "no-store"),
    (header::REFERRER_POLICY, "no-referrer"),
];

/// Binds 127.0.0.1:`port` (0: any free port) and serves `source` until Ctrl-C; `ready` hears the address first.
pub async fn serve<S: Source>(source: S, port: u16, ready: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{port} (is the port taken? pick another with --port)"))?;
    let addr = listener.local_addr().context("cannot read the address listened on")?;
    ready(addr);
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    axum::serve(listener, router(Arc::new(source), addr.port()))
        .with_graceful_shutdown(shutdown)
        .await
        .context("the dashboard's server failed")
}

/// The routes: `/` (the jobs), `/jobs/{key}` (one job), the stylesheet and the script.
pub fn router<S: Source>(source: Arc<S>, port: u16) -> Router {
    Router::new()
        .route("/", get(listing::<S>))
        .route("/jobs/{*key}", get(detail::<S>))
        .route("/dashboard.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }))
        .route("/dashboard.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT) }))
        .with_state(source)
        .layer(from_fn_with_state(port, guard))
}

/// Refuses a request not addressed to this loopback port by name (421), and adds [`HEADERS`] to every answer.
async fn guard(State(port): State<u16>, request: Request, next: Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let mut response = if is_loopback_host(host, port) {
        next.run(request).await
    } else {
        let message = format!(
            "this dashboard answers only http://127.0.0.1:{port}/ or http://localhost:{port}/, not Host {host:?}"
        );
        (StatusCode::MISDIRECTED_REQUEST, message).into_response()
    };
    for (name, value) in HEADERS {
        response.headers_mut().insert(name, HeaderValue::from_static(value));
    }
    response
}

/// `host` (a Host header) names this machine's loopback at `port`.
pub fn is_loopback_host(host: &str, port: u16) -> bool {
    let Some((name, p)) = host.rsplit_once(':') else { return false };
    p.parse::<u16>().ok() == Some(port) && matches!(name.to_ascii_lowercase().as_str(), "127.0.0.1" | "localhost")
}

async fn listing<S: Source>(State(source): State<Arc<S>>) -> Response {
    match tokio::time::timeout(PAGE_DEADLINE, source.listing()).await {
        Ok(Ok(l)) => Html(html::listing(&l)).into_response(),
        Ok(Err(e)) => failed(StatusCode::BAD_GATEWAY, "jobs", &format!("{e:#}")),
        Err(_) => failed(StatusCode::GATEWAY_TIMEOUT, "jobs", &late()),
    }
}

async fn detail<S: Source>(State(source): State<Arc<S>>, UrlPath(key): UrlPath<String>) -> Response {
    match tokio::time::timeout(PAGE_DEADLINE, source.detail(&key)).await {
        Ok(Ok(Some(d))) => Html(html::detail(&d)).into_response(),
        Ok(Ok(None)) => failed(StatusCode::NOT_FOUND, &key, &format!("no job {key}: the first page lists them")),
        Ok(Err(e)) => failed(StatusCode::BAD_GATEWAY, &key, &format!("{e:#}")),
        Err(_) => failed(StatusCode::GATEWAY_TIMEOUT, &key, &late()),
    }
}

fn late() -> String {
    format!("gathering this page took longer than {}s; it is tried again at the next refresh", PAGE_DEADLINE.as_secs())
}

fn failed(status: StatusCode, title: &str, message: &str) -> Response {
    (status, Html(html::error(title, message))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_ports_loopback_names_are_answered() {
        assert!(is_loopback_host("127.0.0.1:8089", 8089));
        assert!(is_loopback_host("LOCALHOST:8089", 8089));
        for host in ["127.0.0.1:8090", "evil.example:8089", "127.0.0.1", "", "localhost.evil.example:8089"] {
            assert!(!is_loopback_host(host, 8089), "{host}");
        }
    }
}
