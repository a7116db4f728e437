//! A run's records as the dashboard shows them: `metrics.jsonl` to the curves, `summary.json` to the facts and
//! the held-out point. Local runs and cluster jobs (whose coordinator writes the same files to its `run` folder)
//! read them alike; what is read is bounded first.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crds::contract::ProgressReport;
use runtime::coordinator::train::Summary;

use super::view::{Curve, bytes};

/// Most bytes of `metrics.jsonl` read (its end: the newest steps); ~400,000 steps.
pub const MAX_METRICS_BYTES: u64 = 64 << 20;
/// Most bytes of `summary.json` read.
pub const MAX_SUMMARY_BYTES: u64 = 16 << 20;

/// The last `max` bytes of the file at `path` (all of it when smaller), starting at a line's start when cut;
/// `None` when there is no such file.
pub fn tail(path: &Path, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let start = len.saturating_sub(max);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::with_capacity(len.min(max) as usize);
    file.take(max).read_to_end(&mut bytes)?;
    if start > 0 {
        let first = bytes.iter().position(|&b| b == b'\n').map_or(bytes.len(), |i| i + 1);
        bytes.drain(..first);
    }
    Ok(Some(bytes))
}

/// Each step `metrics.jsonl` holds, in order; a line that is not a step (the one being written) is skipped.
pub fn steps(metrics: &[u8]) -> Vec<ProgressReport> {
    metrics.split(|&b| b == b'\n').filter_map(|line| serde_json::from_slice::<ProgressReport>(line).ok()).collect()
}

/// The curves of `steps`, with the held-out loss of `summary` after its last step.
pub fn curve(steps: &[ProgressReport], summary: Option<&Summary>) -> Curve {
    Curve {
        loss: steps.iter().map(|s| (s.step, s.loss)).collect(),
        held_out: summary.filter(|s| s.eval.samples > 0).map(|s| (s.steps, s.eval.loss)),
        throughput: steps.iter().map(|s| (s.step, s.samples_per_s)).collect(),
    }
}

/// `summary.json`'s text as a summary, or why not.
pub fn summary(text: &[u8]) -> Result<Summary, String> {
    serde_json::from_slice(text).map_err(|e| format!("summary.json is not a run's summary: {e}"))
}

/// What the summary says, for the facts table.
pub fn facts(s: &Summary) -> Vec<(String, String)> {
    let mut facts = vec![
        ("Final loss", format!("{:.4}", s.final_loss)),
        ("Held-out loss", format!("{:.4}", s.eval.loss)),
        ("Held-out accuracy", format!("{:.1}%", s.eval.accuracy * 100.0)),
        ("Wall time", format!("{:.1} s", s.wall_s)),
        ("Samples/s (run)", format!("{:.0}", s.samples_per_s)),
        ("Tokens/s (run)", format!("{:.0}", s.tokens_per_s)),
        ("Execution", api_word(&s.execution_mode)),
        ("Engines busy", format!("{:.0}%", s.wse_utilization * 100.0)),
        ("Model weights", bytes(s.model_weight_bytes)),
        ("Streamed", bytes(s.bytes_streamed)),
        ("Simulated step", format!("{:.3} s", s.simulated_step_s)),
    ];
    if let Some(p) = s.eval.perplexity {
        facts.push(("Perplexity", format!("{p:.2}")));
    }
    facts.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The word the API uses for `value` (an enum serialised as a string).
fn api_word(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_else(|| "-".into())
}

/// Each engine's share of the run's wall time spent computing, by engine index.
pub fn busy(s: &Summary) -> Vec<f64> {
    s.engines.iter().map(|e| if s.wall_s > 0.0 { (e.compute_s / s.wall_s).min(1.0) } else { 0.0 }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: u64, loss: f64) -> String {
        let r = ProgressReport { step, loss, samples_per_s: 100.0, bytes_streamed: 10, learning_rate: 0.1 };
        serde_json::to_string(&r).unwrap() + "\n"
    }

    /// A file longer than the bound is read from a line's start; a line being written is skipped.
    #[test]
    fn a_long_file_is_read_from_its_end_and_a_partial_line_is_skipped() {
        let dir = std::env::temp_dir().join(format!("ws-dashboard-records-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let text: String = (1..=100).map(|s| line(s, 1.0 / s as f64)).collect::<String>() + "{\"step\": 10";
        std::fs::write(&path, &text).unwrap();
        let all = steps(&tail(&path, MAX_METRICS_BYTES).unwrap().unwrap());
        assert_eq!(all.iter().map(|s| s.step).collect::<Vec<_>>(), (1..=100).collect::<Vec<_>>());
        let end = steps(&tail(&path, 10 * line(100, 0.01).len() as u64).unwrap().unwrap());
        assert!(end.len() >= 8 && end.len() <= 10 && end.last().unwrap().step == 100, "{end:?}");
        assert!(tail(&dir.join("nothing"), 10).unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
