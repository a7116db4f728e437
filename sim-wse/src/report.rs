//! The seeds' two figures reproduced from the cost model: how unstructured sparsity turns into acceleration
//! for GPT-3-like layer widths on one engine and on sixteen, and how step time scales with the number of
//! engines for models from 1.3B to 1T parameters (and MemoryX's egress, [`crate::funnel`]). `wsctl simulate`
//! prints and plots them. The models are [`crate::models`]'.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::Serialize;

use crate::cost::{Cluster, Workload};
use crate::funnel::{FunnelReport, draw_funnel, funnel_report};
use crate::models::{Transformer, funnel_model, scaling_models, sparsity_models};
use crate::plot::{COLORS, finish, svg_root};
use plan::preset::EngineModel;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The output folder could not be made.
    #[error("cannot create {path}: {source}")]
    Io {
        /// The folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Plotters failed to draw or write a chart.
    #[error("cannot draw {path}: {message}")]
    Plot {
        /// The file.
        path: PathBuf,
        /// What plotters said.
        message: String,
    },
}

/// Acceleration of one block's products (forward and backward) at one sparsity, per engine count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SparsityPoint {
    /// Fraction of weights that are zero.
    pub sparsity: f64,
    /// Dense time over sparse time, one entry per engine count of the report.
    pub acceleration: Vec<f64>,
}

/// One width's curve.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SparsityCurve {
    /// The model the width comes from.
    pub model: Transformer,
    /// The curve, by increasing sparsity.
    pub points: Vec<SparsityPoint>,
}

/// Figure 1: sparsity to acceleration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SparsityReport {
    /// Engine counts the batch is split over.
    pub engine_counts: Vec<u32>,
    /// One curve per width.
    pub curves: Vec<SparsityCurve>,
}

/// Dense over sparse product time of one block of `model` on each engine count: the batch is split over the
/// engines, so fewer tokens per engine leave the fixed partial-sum work a larger share.
pub fn acceleration(engine: &EngineModel, model: &Transformer, sparsity: f64, engine_counts: &[u32]) -> Vec<f64> {
    let dense = model.workload(0.0);
    let sparse = model.workload(sparsity);
    engine_counts
        .iter()
        .map(|&n| {
            let cluster = Cluster::new(*engine, n);
            let tokens = cluster.tokens_per_engine(model.batch_tokens);
            let cycles = |w: &Workload| w.layers.iter().map(|l| l.cycles(engine, tokens).gemm()).sum::<u64>();
            cycles(&dense) as f64 / cycles(&sparse).max(1) as f64
        })
        .collect()
}

/// Figure 1 for `models` at `sparsities` on each of `engine_counts`.
pub fn sparsity_report(
    engine: &EngineModel,
    models: &[Transformer],
    sparsities: &[f64],
    engine_counts: &[u32],
) -> SparsityReport {
    let curves = models
        .iter()
        .map(|m| SparsityCurve {
            model: m.clone(),
            points: sparsities
                .iter()
                .map(|&s| SparsityPoint { sparsity: s, acceleration: acceleration(engine, m, s, engine_counts) })
                .collect(),
        })
        .collect();
    SparsityReport { engine_counts: engine_counts.to_vec(), curves }
}

/// One cluster size for one model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScalingPoint {
    /// Engines.
    pub engines: u32,
    /// Simulated step time.
    pub step_s: f64,
    /// Step time on one engine over step time on this many.
    pub speedup: f64,
    /// Speed-up over engine count: 1 is linear scaling.
    pub efficiency: f64,
    /// Share of the step spent computing.
    pub compute_share: f64,
    /// Share of the step spent waiting on MemoryX or SwarmX.
    pub streaming_share: f64,
    /// Training samples per second.
    pub samples_per_s: f64,
}

/// One model's curve.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScalingCurve {
    /// The model.
    pub model: Transformer,
    /// Its weights.
    pub params: u64,
    /// The curve, by increasing engine count.
    pub points: Vec<ScalingPoint>,
}

/// Figure 2: speed-up against engine count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScalingReport {
    /// Sparsity every model is trained at (the seeds' figure assumes a conservative 90%).
    pub sparsity: f64,
    /// One curve per model.
    pub curves: Vec<ScalingCurve>,
}

/// Figure 2 for `models` at `sparsity` over `engine_counts` (which should start at 1, the reference).
pub fn scaling_report(
    engine: &EngineModel,
    models: &[Transformer],
    sparsity: f64,
    engine_counts: &[u32],
) -> ScalingReport {
    let curves = models
        .iter()
        .map(|m| {
            let work = m.workload(sparsity);
            let base = Cluster::new(*engine, 1).step(&work).step_s;
            let points = engine_counts
                .iter()
                .map(|&n| {
                    let e = Cluster::new(*engine, n).step(&work);
                    let speedup = base / e.step_s;
                    ScalingPoint {
                        engines: e.engines,
                        step_s: e.step_s,
                        speedup,
                        efficiency: speedup / e.engines as f64,
                        compute_share: e.compute_share,
                        streaming_share: e.streaming_share,
                        samples_per_s: e.samples_per_s,
                    }
                })
                .collect();
            ScalingCurve { model: m.clone(), params: m.params(), points }
        })
        .collect();
    ScalingReport { sparsity, curves }
}

/// Both figures, as `wsctl simulate` prints and plots them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The engine simulated.
    pub engine: EngineModel,
    /// MemoryX bandwidth assumed, bytes per second.
    pub memoryx_bandwidth: f64,
    /// Figure 1.
    pub sparsity: SparsityReport,
    /// Figure 2.
    pub scaling: ScalingReport,
    /// MemoryX's egress with and without the funnel through its coordinator.
    pub funnel: FunnelReport,
}

/// Sparsities shown in the table of figure 1.
const TABLE_SPARSITIES: [f64; 8] = [0.0, 0.5, 0.75, 0.8, 0.9, 0.95, 0.98, 0.99];
/// Engine counts shown in the table of figure 2.
const TABLE_ENGINES: [u32; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 192];

impl Report {
    /// Both figures on `engine`: every whole percent of sparsity from 0 to 99 on 1 and 16 engines, and every
    /// engine count from 1 to 192 at 90% sparsity.
    pub fn new(engine: &EngineModel) -> Self {
        let sparsities: Vec<f64> = (0..100).map(|p| p as f64 / 100.0).collect();
        let engines: Vec<u32> = (1..=192).collect();
        Report {
            engine: *engine,
            memoryx_bandwidth: plan::preset::MEMORYX_BANDWIDTH,
            sparsity: sparsity_report(engine, &sparsity_models(), &sparsities, &[1, 16]),
            scaling: scaling_report(engine, &scaling_models(), 0.9, &engines),
            funnel: funnel_report(engine, &funnel_model(), 192, 0.9, &(1..=64).collect::<Vec<_>>()),
        }
    }

    /// The two tables, for a terminal.
    pub fn tables(&self) -> String {
        let mut out = String::new();
        let s = &self.sparsity;
        let _ = writeln!(out, "Sparse GEMM acceleration on {} (one block, forward + backward)", self.engine.name);
        let mut header = format!("{:>9}", "sparsity");
        for c in &s.curves {
            for n in &s.engine_counts {
                header += &format!(" {:>13}", format!("d={} ×{n}", c.model.d_model));
            }
        }
        let _ = writeln!(out, "{header}");
        for &want in &TABLE_SPARSITIES {
            let mut line = format!("{:>8.0}%", want * 100.0);
            for c in &s.curves {
                if let Some(p) = c.points.iter().find(|p| (p.sparsity - want).abs() < 1e-9) {
                    for a in &p.acceleration {
                        line += &format!(" {:>12.2}×", a);
                    }
                }
            }
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out, "(×N: the batch split over N engines; columns by layer width d)");
        let _ = writeln!(out);
        let sc = &self.scaling;
        let _ = writeln!(out, "Cluster speed-up at {:.0}% sparsity (efficiency in brackets)", sc.sparsity * 100.0);
        let mut header = format!("{:>8}", "engines");
        for c in &sc.curves {
            header += &format!(" {:>18}", c.model.name);
        }
        let _ = writeln!(out, "{header}");
        for &n in &TABLE_ENGINES {
            let mut line = format!("{n:>8}");
            for c in &sc.curves {
                if let Some(p) = c.points.iter().find(|p| p.engines == n) {
                    line += &format!(" {:>9.1} ({:>4.0}%)", p.speedup, p.efficiency * 100.0);
                }
            }
            let _ = writeln!(out, "{line}");
        }
        for c in &sc.curves {
            let _ = writeln!(
                out,
                "  {}: d={}, {} layers, {:.1}B weights, batch {:.1}M tokens ({})",
                c.model.name,
                c.model.d_model,
                c.model.layers,
                c.params as f64 / 1e9,
                c.model.batch_tokens as f64 / 1e6,
                c.model.batch_source
            );
        }
        out += &self.funnel_table();
        out
    }

    /// The funnel's table: MemoryX's egress, the step and the engines' busy share, both ways, by server count.
    fn funnel_table(&self) -> String {
        let f = &self.funnel;
        let mut out = format!(
            "\nMemoryX's egress for {} on {} engines at {:.0}% sparsity: the engines ask {:.2} TB/s; each weight \
             server's link {:.2} TB/s (assumed)\n{:>8} {:>24} {:>24}\n",
            f.model.name,
            f.engines,
            f.sparsity * 100.0,
            f.demand_bytes_per_s / 1e12,
            f.server_link / 1e12,
            "servers",
            "straight to SwarmX",
            "through the coordinator"
        );
        for p in f.points.iter().filter(|p| p.servers.is_power_of_two() || p.servers == 48) {
            let cell = |bytes: f64, step: f64, busy: f64| {
                format!("{:.2} TB/s {:.2}s {:>3.0}%", bytes / 1e12, step, busy * 100.0)
            };
            let _ = writeln!(
                out,
                "{:>8} {:>24} {:>24}",
                p.servers,
                cell(p.direct_bytes_per_s, p.direct_step_s, p.direct_busy),
                cell(p.funnel_bytes_per_s, p.funnel_step_s, p.funnel_busy)
            );
        }
        out
    }

    /// Writes `sparsity.svg`, `scaling.svg` and `funnel.svg` into `dir`, returning their paths.
    pub fn write_svgs(&self, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::Io { path: dir.to_path_buf(), source })?;
        let sparsity = dir.join("sparsity.svg");
        let scaling = dir.join("scaling.svg");
        let plot_err = |path: &Path| {
            let path = path.to_path_buf();
            move |e: String| ReportError::Plot { path: path.clone(), message: e }
        };
        draw_sparsity(&self.sparsity, self.engine.name, &sparsity).map_err(plot_err(&sparsity))?;
        draw_scaling(&self.scaling, self.engine.name, &scaling).map_err(plot_err(&scaling))?;
        let funnel = dir.join("funnel.svg");
        draw_funnel(&self.funnel, self.engine.name, &funnel).map_err(plot_err(&funnel))?;
        Ok(vec![sparsity, scaling, funnel])
    }
}

fn draw_sparsity(r: &SparsityReport, engine: &str, path: &Path) -> Result<(), String> {
    let root = svg_root(path)?;
    let top = r
        .curves
        .iter()
        .flat_map(|c| c.points.iter().flat_map(|p| p.acceleration.iter().copied()))
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Sparsity to acceleration ({engine}, one GPT-3 block, forward + backward)"),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..100f64, (1f64..top * 1.3).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("weight sparsity (%)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_desc("acceleration over dense (×)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    // The bound without partial sums: only the non-zeros cost anything, so acceleration is 1 / density.
    if let Some(c) = r.curves.first() {
        let ideal: Vec<(f64, f64)> = c.points.iter().map(|p| (p.sparsity * 100.0, 1.0 / (1.0 - p.sparsity))).collect();
        chart
            .draw_series(LineSeries::new(ideal, BLACK.mix(0.4).stroke_width(1)))
            .map_err(|e| e.to_string())?
            .label("1 / (1 − sparsity): no partial-sum overhead")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
    }
    for (i, c) in r.curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        for (j, n) in r.engine_counts.iter().enumerate() {
            let pts: Vec<(f64, f64)> = c.points.iter().map(|p| (p.sparsity * 100.0, p.acceleration[j])).collect();
            let label =
                format!("d={} ({}), {} engine{}", c.model.d_model, c.model.name, n, if *n == 1 { "" } else { "s" });
            let style = color.stroke_width(2);
            if j == 0 {
                chart.draw_series(LineSeries::new(pts, style)).map_err(|e| e.to_string())?
            } else {
                chart.draw_series(DashedLineSeries::new(pts, 6, 4, style)).map_err(|e| e.to_string())?
            }
            .label(label)
            .legend(move |(x, y)| {
                // The legend repeats the curve's dash: two short strokes for the multi-engine curves.
                let gap = if j == 0 { 0 } else { 5 };
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (8, 0)], color.stroke_width(2))
                    + PathElement::new(vec![(8 + gap, 0), (20, 0)], color.stroke_width(2))
            });
        }
    }
    finish(chart, &root)
}

fn draw_scaling(r: &ScalingReport, engine: &str, path: &Path) -> Result<(), String> {
    let root = svg_root(path)?;
    let max_n = r.curves.iter().flat_map(|c| c.points.iter().map(|p| p.engines)).max().unwrap_or(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Cluster speed-up at {:.0}% sparsity ({engine} engines, MemoryX 4 TB/s)", r.sparsity * 100.0),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_n, 0f64..max_n)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("CS-2 engines")
        .y_desc("speed-up over one engine")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(DashedLineSeries::new(vec![(1.0, 1.0), (max_n, max_n)], 6, 4, BLACK.mix(0.5).stroke_width(1)))
        .map_err(|e| e.to_string())?
        .label("linear")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
    for (i, c) in r.curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = c.points.iter().map(|p| (p.engines as f64, p.speedup)).collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(format!("{} (d={}, {} layers)", c.model.name, c.model.d_model, c.model.layers))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    finish(chart, &root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plan::preset::WSE2;

    fn at(curve: &SparsityCurve, sparsity: f64) -> &[f64] {
        curve
            .points
            .iter()
            .find(|p| (p.sparsity - sparsity).abs() < 1e-9)
            .map(|p| p.acceleration.as_slice())
            .unwrap_or(&[])
    }

    #[test]
    fn sparsity_curves_have_the_seeds_shape() {
        let sparsities = [0.0, 0.5, 0.8, 0.9, 0.95, 0.99];
        let r = sparsity_report(&WSE2, &sparsity_models(), &sparsities, &[1, 16]);
        let widest = r.curves.iter().max_by_key(|c| c.model.d_model).map(|c| at(c, 0.9).to_vec()).unwrap_or_default();
        let narrowest =
            r.curves.iter().min_by_key(|c| c.model.d_model).map(|c| at(c, 0.9).to_vec()).unwrap_or_default();
        assert_eq!((widest.len(), narrowest.len()), (2, 2));
        // About 10× at 90% for the widest layers on one engine: at least 8, never more than the 10× the skipped
        // zeros allow.
        assert!(widest[0] >= 8.0 && widest[0] <= 10.0, "widest, 1 engine: {}", widest[0]);
        // Clearly less for the narrowest, and on sixteen engines (Amdahl's law: fewer tokens per engine).
        assert!(narrowest[0] < 0.85 * widest[0], "narrow {} vs wide {}", narrowest[0], widest[0]);
        assert!(narrowest[1] < 0.5 * narrowest[0], "narrow on 16 engines {} vs 1 {}", narrowest[1], narrowest[0]);
        for c in &r.curves {
            let a = at(c, 0.9);
            assert!(a[1] < a[0], "{}: 16 engines {} vs 1 engine {}", c.model.name, a[1], a[0]);
            // Dense is the reference, and more sparsity always helps (the curves rise monotonically).
            for j in 0..2 {
                assert!((c.points[0].acceleration[j] - 1.0).abs() < 1e-12);
                assert!(c.points.windows(2).all(|w| w[1].acceleration[j] > w[0].acceleration[j]), "{}", c.model.name);
            }
        }
        // Wider is better at every engine count.
        let at90: Vec<Vec<f64>> = r.curves.iter().map(|c| at(c, 0.9).to_vec()).collect();
        for j in 0..2 {
            assert!(at90.windows(2).all(|w| w[1][j] > w[0][j]), "{at90:?}");
        }
    }

    #[test]
    fn larger_models_keep_linear_scaling_further() {
        let engines = [1, 8, 16, 32, 64, 128, 192];
        let r = scaling_report(&WSE2, &scaling_models(), 0.9, &engines);
        let eff = |c: &ScalingCurve, n: u32| c.points.iter().find(|p| p.engines == n).map_or(0.0, |p| p.efficiency);
        // The engine count where efficiency first drops below 80%: "near-linear up to here".
        let knee = |c: &ScalingCurve| c.points.iter().find(|p| p.efficiency < 0.8).map_or(u32::MAX, |p| p.engines);
        for w in r.curves.windows(2) {
            assert!(w[1].params > w[0].params);
            assert!(eff(&w[1], 192) > eff(&w[0], 192), "{} vs {} at 192", w[1].model.name, w[0].model.name);
            assert!(
                knee(&w[1]) >= knee(&w[0]),
                "{} knee {} vs {} knee {}",
                w[1].model.name,
                knee(&w[1]),
                w[0].model.name,
                knee(&w[0])
            );
        }
        let (small, large) = (&r.curves[0], &r.curves[r.curves.len() - 1]);
        assert!(eff(large, 192) >= 0.85, "1T at 192 engines: {}", eff(large, 192));
        assert!(eff(small, 192) < 0.5, "1.3B at 192 engines: {}", eff(small, 192));
        assert!(knee(small) < knee(large));
        for c in &r.curves {
            assert!((eff(c, 1) - 1.0).abs() < 1e-12);
            // More engines never make a step slower.
            assert!(c.points.windows(2).all(|w| w[1].step_s <= w[0].step_s), "{}", c.model.name);
        }
    }

    #[test]
    fn the_1t_batch_follows_the_critical_batch_law() {
        let models = scaling_models();
        let (b175, b1t) = (models[2].batch_tokens as f64, models[3].batch_tokens as f64);
        let ratio = models[3].params() as f64 / models[2].params() as f64;
        assert!(ratio > 5.0 && ratio < 6.5, "1T over 175B: {ratio}");
        assert!((b1t / b175 - ratio.powf(0.076 / 0.21)).abs() < 1e-6);
    }

    #[test]
    fn plots_and_tables_are_written() {
        let r = Report {
            engine: WSE2,
            memoryx_bandwidth: plan::preset::MEMORYX_BANDWIDTH,
            sparsity: sparsity_report(&WSE2, &sparsity_models()[..1], &[0.0, 0.5, 0.9], &[1, 16]),
            scaling: scaling_report(&WSE2, &scaling_models()[..1], 0.9, &[1, 2, 4]),
            funnel: funnel_report(&WSE2, &funnel_model(), 192, 0.9, &[1, 2, 4]),
        };
        let dir = std::env::temp_dir().join(format!("sim-wse-report-{}", std::process::id()));
        let paths = r.write_svgs(&dir).unwrap();
        for p in &paths {
            let svg = std::fs::read_to_string(p).unwrap();
            assert!(svg.contains("<svg") && svg.contains("GPT-3"), "{}", p.display());
        }
        let t = r.tables();
        assert!(t.contains("90%") && t.contains("GPT-3 1.3B") && t.contains("through the coordinator"), "{t}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["scaling"]["curves"][0]["points"][2]["engines"], 4);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
