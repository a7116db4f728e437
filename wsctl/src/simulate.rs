//! `wsctl simulate`: the seeds' sparsity and scaling figures reproduced by the wafer's cost model (and MemoryX's
//! egress with and without a funnel through its coordinator), as tables
//! for a person, JSON for a machine, and SVG plots for the docs. The logic lives in `sim_wse::report`; this is
//! only the command line around it.

use std::io::{ErrorKind, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use crds::EnginePreset;

/// Prints the tables (or the JSON) and writes `sparsity.svg`, `scaling.svg` and `funnel.svg` into `out`.
pub fn simulate(preset: EnginePreset, json: bool, out: PathBuf) -> Result<()> {
    let engine = plan::preset::model(preset);
    let report = sim_wse::report::Report::new(&engine);
    let written = report.write_svgs(&out).with_context(|| format!("writing plots to {}", out.display()))?;
    let mut text = if json { serde_json::to_string_pretty(&report)? + "\n" } else { report.tables() };
    if !json {
        for path in written {
            text += &format!("wrote {}\n", path.display());
        }
    }
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        // A reader that stops early (`| head`) is not a failure of the simulation.
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
