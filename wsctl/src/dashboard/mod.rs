//! `wsctl dashboard`: a web page on this machine's loopback that shows jobs as they run: the jobs' table, and
//! for one job its loss and throughput curves, its appliance as a tree, its Events, checkpoints and the tail of
//! each role's log. It reads either local runs' folders ([`local`]) or a cluster through the user's own
//! kubeconfig (`crate::cluster::dashboard`), so it adds no endpoint to the cluster and no credential.
//!
//! One module per concept: [`view`] (what a page shows, as data), [`html`] and [`chart`] (drawing it),
//! [`server`] (the loopback HTTP server and what it refuses), [`records`] (a run's files read, bounded) and
//! [`local`] (runs from their folders).

pub mod chart;
pub mod html;
pub mod local;
pub mod records;
pub mod server;
pub mod view;

use std::future::Future;
use std::time::Duration;

use view::{Detail, Listing};

/// How long one page may take to gather (API calls, a port-forward to MemoryX): past it the page says so.
pub const PAGE_DEADLINE: Duration = Duration::from_secs(15);

/// Where the dashboard's jobs come from.
pub trait Source: Send + Sync + 'static {
    /// Every job, for the first page.
    fn listing(&self) -> impl Future<Output = anyhow::Result<Listing>> + Send;
    /// The job whose page is `key` (a [`view::Row::href`] after `jobs/`), or `None` if there is no such job.
    fn detail(&self, key: &str) -> impl Future<Output = anyhow::Result<Option<Detail>>> + Send;
}
