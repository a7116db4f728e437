//! The dashboard's pages as HTML (maud escapes every value): the jobs' table and one job's page. Every page
//! links the same stylesheet and script from the dashboard itself (nothing from elsewhere: no CDN is reachable
//! from a cluster's bastion, and the Content-Security-Policy allows only this origin).

use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::chart::{self, Chart};
use super::view::{Detail, Listing, Row, TREE_ORDER, bytes};

/// The page around `body`: `finished` pages do not refresh themselves.
fn page(title: &str, finished: bool, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · weightstream" }
                link rel="stylesheet" href="/dashboard.css";
                script src="/dashboard.js" defer {}
            }
            body {
                header { a href="/" { "weightstream" } " · " (title) }
                main id="content" data-finished=(finished) { (body) }
            }
        }
    }
    .into_string()
}

/// The jobs' table.
pub fn listing(l: &Listing) -> String {
    let body = html! {
        h1 { "Jobs" small { " (" (l.scope) ", " (l.rows.len()) ")" } }
        @if l.rows.is_empty() { p.empty { "No jobs." } } @else {
            table id="jobs" {
                thead { tr {
                    @if l.namespaces { th { "Namespace" } }
                    th { "Name" } th { "Phase" } th { "CS-2" } th { "Step" } th { "Loss" } th { "Samples/s" }
                    th { "ETA" } th { "Queue" } th { "Waiting for / failed by" }
                } }
                tbody { @for r in &l.rows { (row(r, l.namespaces)) } }
            }
        }
    };
    page("jobs", false, body)
}

fn row(r: &Row, namespaces: bool) -> Markup {
    html! {
        tr.job data-phase=(r.phase) {
            @if namespaces { td { (r.namespace) } }
            td { a href={ "/" (r.href) } { (r.name) } }
            td.phase { (r.phase) } td { (r.cs2) } td { (r.step) } td { (r.loss) } td { (r.throughput) }
            td { (r.eta) } td { (r.queue) } td { (r.reason) }
        }
    }
}

/// One job's page.
pub fn detail(d: &Detail) -> String {
    let body = html! {
        h1 { (d.row.name) " " span.phase data-phase=(d.row.phase) { (d.row.phase) } }
        @if !d.row.reason.is_empty() && d.row.reason != "-" { p.reason { (d.row.reason) } }
        @for gap in &d.gaps { p.gap { (gap) } }
        table.facts {
            tr { th { "CS-2" } td { (d.row.cs2) } th { "Step" } td { (d.row.step) } th { "Loss" } td { (d.row.loss) } }
            tr { th { "Samples/s" } td { (d.row.throughput) } th { "ETA" } td { (d.row.eta) }
                 th { "Queue" } td { (d.row.queue) } }
            @for pair in d.facts.chunks(3) {
                tr { @for (label, value) in pair { th { (label) } td { (value) } } }
            }
        }
        (charts(d))
        h2 { "Appliance" }
        (appliance(d))
        @if !d.events.is_empty() { h2 { "Events" } (events(d)) }
        h2 { "Checkpoints" }
        @if d.checkpoints.is_empty() { p.empty { "None kept yet." } } @else {
            table id="checkpoints" { tr { th { "Step" } th { "Size" } }
                @for c in &d.checkpoints { tr { td { (c.step) } td { (bytes(c.bytes)) } } } }
        }
        h2 { "Logs" }
        @for log in &d.logs { details.log open { summary { (log.name) } pre { (log.text) } } }
    };
    page(&d.row.name, d.finished, body)
}

fn charts(d: &Detail) -> Markup {
    let c = &d.curve;
    let held_out = c.held_out.map(|p| (p, "held-out loss"));
    let loss = Chart { title: "Loss", y: "training loss", points: &c.loss, extra: held_out };
    let speed = Chart { title: "Throughput", y: "samples/s", points: &c.throughput, extra: None };
    let figure = |id: &str, chart: &Chart| match chart::svg(chart, (640, 320)) {
        Ok(svg) => html! { figure id=(id) data-points=(chart.points.len()) { (PreEscaped(svg)) } },
        Err(e) => html! { p.gap { "cannot draw " (id) ": " (e) } },
    };
    html! { div.charts { (figure("loss", &loss)) (figure("throughput", &speed)) } }
}

/// The appliance as a tree: MemoryX → SwarmX → engines ← input workers, each component with its node, phase,
/// restarts, busy share and bytes a step.
fn appliance(d: &Detail) -> Markup {
    html! {
        ol id="appliance" {
            @for role in TREE_ORDER {
                @let parts: Vec<_> = d.appliance.iter().filter(|c| c.role == role).collect();
                @if !parts.is_empty() {
                    li.tier data-role=(role.as_str()) {
                        span.role { (role.as_str()) " ×" (parts.len()) }
                        ul { @for c in parts {
                            li.pod data-name=(c.name) {
                                b { (c.name) } " on " (c.node) " · " (c.phase)
                                @if c.restarts > 0 { " · " (c.restarts) " restarts" }
                                @if let Some(b) = c.busy { " · busy " (format!("{:.0}%", b * 100.0)) }
                                @if let Some(n) = c.bytes_per_step { " · " (bytes(n)) "/step" }
                            }
                        } }
                    }
                }
            }
        }
    }
}

fn events(d: &Detail) -> Markup {
    html! {
        table id="events" {
            tr { th { "Last seen" } th { "Type" } th { "Reason" } th { "Object" } th { "Message" } }
            @for e in &d.events {
                tr.event data-kind=(e.kind) {
                    td { (e.time) } td { (e.kind) } td { (e.reason) } td { (e.object) } td { (e.message) }
                }
            }
        }
    }
}

/// The page for an error: what failed, and nothing else.
pub fn error(title: &str, message: &str) -> String {
    page(title, false, html! { h1 { (title) } p.error { (message) } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dashboard::view::{Component, Curve};
    use crds::contract::Role;

    fn detail() -> Detail {
        let component = |role, name: &str| Component {
            role,
            name: name.into(),
            node: "n1".into(),
            phase: "Running".into(),
            restarts: 0,
            busy: None,
            bytes_per_step: None,
        };
        Detail {
            row: Row { name: "train<1>".into(), phase: "Running".into(), ..Row::default() },
            curve: Curve { loss: vec![(1, 2.0), (2, 1.5), (3, 1.2)], held_out: Some((3, 1.3)), throughput: vec![] },
            appliance: vec![
                component(Role::Input, "t-input-0"),
                component(Role::Engine, "t-engine-0"),
                component(Role::Memoryx, "t-memoryx-0"),
            ],
            ..Detail::default()
        }
    }

    /// The tree lists MemoryX first and the input workers last, whatever order the source gave; text is escaped.
    #[test]
    fn the_page_escapes_names_and_orders_the_tree() {
        let html = detail_page();
        assert!(html.contains("train&lt;1&gt;") && !html.contains("train<1>"), "{html}");
        let at = |s: &str| html.find(s).unwrap();
        assert!(at("t-memoryx-0") < at("t-engine-0") && at("t-engine-0") < at("t-input-0"));
        assert!(html.contains(r#"id="loss" data-points="3""#));
        for fetched in ["src=\"http", "href=\"http", "src=\"//", "href=\"//"] {
            assert!(!html.contains(fetched), "nothing is fetched from elsewhere: {fetched}");
        }
    }

    fn detail_page() -> String {
        super::detail(&detail())
    }

    #[test]
    fn the_listing_links_each_job_under_the_root() {
        let rows = vec![Row { href: "jobs/ml/a".into(), name: "a".into(), ..Row::default() }];
        let html = listing(&Listing { scope: "namespace ml".into(), namespaces: false, rows });
        assert!(html.contains(r#"<a href="/jobs/ml/a">a</a>"#), "{html}");
        assert!(html.contains(r#"data-finished="false""#));
    }
}
