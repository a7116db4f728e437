//! MemoryX's egress against what the engines ask of it. Weight servers that stream straight to SwarmX add up
//! their hosts' links; every slice sent through the coordinator instead (a funnel) leaves MemoryX over one
//! host's link, however many servers hold the weights.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use crate::cost::cluster::Cluster;
use crate::models::Transformer;
use crate::plot::{COLORS, finish, svg_root};
use plan::preset::EngineModel;

/// A weight server host's link to the SwarmX fabric, bytes per second: twelve 100 GbE ports, a CS-2's own
/// I/O. Not in the seeds (they give MemoryX 4 TB/s in all); an assumption of this figure, named here once.
pub const SERVER_LINK: f64 = 12.0 * 100e9 / 8.0;

/// MemoryX with one server count, both ways.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunnelPoint {
    /// Weight servers.
    pub servers: u32,
    /// MemoryX's egress when each server streams straight to SwarmX: their links together, up to MemoryX's
    /// bandwidth in the seeds.
    pub direct_bytes_per_s: f64,
    /// Its egress through the coordinator: one host's link.
    pub funnel_bytes_per_s: f64,
    /// The step with the direct egress, seconds.
    pub direct_step_s: f64,
    /// The step through the funnel, seconds.
    pub funnel_step_s: f64,
    /// The engines' busy share with the direct egress.
    pub direct_busy: f64,
    /// The engines' busy share through the funnel.
    pub funnel_busy: f64,
}

/// The figure: one model on one engine count, MemoryX over a range of server counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunnelReport {
    /// The model.
    pub model: Transformer,
    /// CS-2 engines.
    pub engines: u32,
    /// Its weights' sparsity.
    pub sparsity: f64,
    /// The egress at which the engines never wait for a layer (the most any pass of the step asks for), bytes
    /// per second.
    pub demand_bytes_per_s: f64,
    /// Each server's link ([`SERVER_LINK`]).
    pub server_link: f64,
    /// By increasing server count.
    pub points: Vec<FunnelPoint>,
}

/// The egress at which `cluster`'s engines never wait on MemoryX for `model`'s step at `sparsity`: over every
/// pass of a block, the bytes it moves (the larger direction) over the time its compute takes.
fn demand(cluster: &Cluster, model: &Transformer, sparsity: f64) -> f64 {
    let work = model.workload(sparsity);
    let e = &cluster.engine;
    let tokens = cluster.tokens_per_engine(work.global_tokens);
    let secs = |cycles: u64| cycles as f64 / e.clock_hz;
    work.layers
        .iter()
        .flat_map(|l| {
            let c = l.cycles(e, tokens);
            [
                l.forward_bytes() as f64 / secs(c.forward()),
                l.backward_bytes().max(l.gradient_bytes()) as f64 / secs(c.backward()),
            ]
        })
        .fold(0.0, f64::max)
}

/// The figure for `model` at `sparsity` on `engines` engines, MemoryX on each of `servers` server counts.
pub fn funnel_report(
    engine: &EngineModel,
    model: &Transformer,
    engines: u32,
    sparsity: f64,
    servers: &[u32],
) -> FunnelReport {
    let cluster = Cluster::new(*engine, engines);
    let work = model.workload(sparsity);
    let at = |egress: f64| Cluster { memoryx_bandwidth: egress, ..cluster }.step(&work);
    let points = servers
        .iter()
        .map(|&n| {
            let direct = (f64::from(n) * SERVER_LINK).min(plan::preset::MEMORYX_BANDWIDTH);
            let funnel = SERVER_LINK.min(direct);
            let (d, f) = (at(direct), at(funnel));
            FunnelPoint {
                servers: n,
                direct_bytes_per_s: direct,
                funnel_bytes_per_s: funnel,
                direct_step_s: d.step_s,
                funnel_step_s: f.step_s,
                direct_busy: d.compute_share,
                funnel_busy: f.compute_share,
            }
        })
        .collect();
    FunnelReport {
        model: model.clone(),
        engines,
        sparsity,
        demand_bytes_per_s: demand(&cluster, model, sparsity),
        server_link: SERVER_LINK,
        points,
    }
}

/// One of a point's egress figures.
type Egress = fn(&FunnelPoint) -> f64;

/// Draws the egress both ways and the engines' demand against the server count, in TB/s.
pub(crate) fn draw_funnel(r: &FunnelReport, engine: &str, path: &Path) -> Result<(), String> {
    let root = svg_root(path)?;
    let tb = |b: f64| b / 1e12;
    let max_n = r.points.iter().map(|p| p.servers).max().unwrap_or(1) as f64;
    let top = r.points.iter().map(|p| tb(p.direct_bytes_per_s)).fold(tb(r.demand_bytes_per_s), f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "MemoryX's egress for {} on {} {engine} engines ({:.0}% sparse)",
                r.model.name,
                r.engines,
                r.sparsity * 100.0
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..max_n, 0f64..top)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("weight servers")
        .y_desc("TB/s")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()
        .map_err(|e| e.to_string())?;
    let demand = tb(r.demand_bytes_per_s);
    chart
        .draw_series(DashedLineSeries::new(vec![(1.0, demand), (max_n, demand)], 6, 4, BLACK.stroke_width(2)))
        .map_err(|e| e.to_string())?
        .label("what the engines ask (never waiting)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    let lines: [(&str, Egress); 2] = [
        ("servers straight to SwarmX", |p| p.direct_bytes_per_s),
        ("through the coordinator (funnel)", |p| p.funnel_bytes_per_s),
    ];
    for (i, (label, of)) in lines.into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = r.points.iter().map(|p| (f64::from(p.servers), tb(of(p)))).collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    finish(chart, &root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::funnel_model;
    use plan::preset::WSE2;

    fn gpt3_175b() -> Transformer {
        funnel_model()
    }

    /// Through the funnel MemoryX's egress and the step stay where one server leaves them; straight to SwarmX,
    /// servers add up until the engines stop waiting, and beyond that add nothing.
    #[test]
    fn servers_add_up_only_without_the_funnel() {
        let r = funnel_report(&WSE2, &gpt3_175b(), 192, 0.9, &(1..=64).collect::<Vec<_>>());
        let (one, many) = (&r.points[0], &r.points[63]);
        assert_eq!(one.direct_bytes_per_s, one.funnel_bytes_per_s);
        assert!(r.points.iter().all(|p| p.funnel_bytes_per_s == SERVER_LINK && p.funnel_step_s == one.funnel_step_s));
        assert!(r.points.windows(2).all(|w| w[1].direct_step_s <= w[0].direct_step_s));
        // The engines ask for more than one host's link: through the funnel they wait, at any server count.
        assert!(r.demand_bytes_per_s > SERVER_LINK, "demand {:.3e}", r.demand_bytes_per_s);
        assert!(many.funnel_busy < 0.9 * many.direct_busy, "{many:?}");
        // Enough servers meet the demand: the engines never wait on MemoryX (what is left is the fabric's fill).
        let enough = r.points.iter().find(|p| p.direct_bytes_per_s >= r.demand_bytes_per_s).expect("a count");
        assert!(enough.direct_busy > 0.99, "{enough:?}");
        assert!(many.direct_step_s == enough.direct_step_s, "more servers than needed change nothing");
    }

    #[test]
    fn the_figure_is_drawn() {
        let r = funnel_report(&WSE2, &gpt3_175b(), 192, 0.9, &[1, 2, 4, 8]);
        let path = std::env::temp_dir().join(format!("sim-wse-funnel-{}.svg", std::process::id()));
        draw_funnel(&r, "WSE-2", &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("funnel") && svg.contains("GPT-3 175B"), "{svg}");
        let _ = std::fs::remove_file(&path);
    }
}
