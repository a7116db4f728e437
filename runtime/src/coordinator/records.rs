//! What a run records step by step in its output folder: `metrics.jsonl` (one line per step) and TensorBoard
//! event files with the same steps' scalars, then the held-out evaluation.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use crds::contract::ProgressReport;
use errors::{Error, Result};

use crate::coordinator::train::EvalReport;
use crate::tensorboard::EventFile;

/// The file with one JSON line per step.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The file with the run's summary, written at its end.
pub const SUMMARY_FILE: &str = "summary.json";

/// The TensorBoard tags of a step's scalars: the names `metrics.jsonl` gives them.
pub const STEP_TAGS: [&str; 4] = ["loss", "learning_rate", "samples_per_s", "bytes_streamed"];
/// The TensorBoard tags of the held-out evaluation, recorded at the last step.
pub const EVAL_TAGS: [&str; 2] = ["eval_loss", "eval_accuracy"];

/// A run's records, open for appending.
pub struct Records {
    metrics: BufWriter<File>,
    events: EventFile,
}

impl Records {
    /// The records in `out` of a run starting after step `start`: `metrics.jsonl` fresh for a new run, for a
    /// resumed one cut back to the steps up to `start` (those after it are about to run again) and appended to,
    /// so it keeps one line per step; a new event file, which tells TensorBoard to drop earlier files' steps
    /// past `start`.
    pub fn open(out: &Path, start: u64) -> Result<Records> {
        std::fs::create_dir_all(out).map_err(|e| Error::io(format!("creating {}", out.display()), e))?;
        let path = out.join(METRICS_FILE);
        let file = if start > 0 {
            keep_steps_up_to(&path, start)?;
            OpenOptions::new().append(true).create(true).open(&path)
        } else {
            File::create(&path)
        };
        let metrics = BufWriter::new(file.map_err(|e| Error::io(format!("opening {}", path.display()), e))?);
        let events = EventFile::create(out, start)
            .map_err(|e| Error::io(format!("creating a TensorBoard event file in {}", out.display()), e))?;
        Ok(Records { metrics, events })
    }

    /// Records a finished step.
    pub fn step(&mut self, m: &ProgressReport) -> Result<()> {
        serde_json::to_writer(&mut self.metrics, m).map_err(|e| Error::io("writing metrics.jsonl", e.into()))?;
        let f = &mut self.metrics;
        f.write_all(b"\n").and_then(|()| f.flush()).map_err(|e| Error::io("writing metrics.jsonl", e))?;
        let values = [m.loss, m.learning_rate, m.samples_per_s, m.bytes_streamed as f64];
        let scalars: Vec<(&str, f64)> = STEP_TAGS.into_iter().zip(values).collect();
        self.events.scalars(m.step, &scalars).map_err(|e| Error::io("writing TensorBoard events", e))
    }

    /// Records the held-out evaluation after training, at the last step.
    pub fn eval(&mut self, step: u64, eval: &EvalReport) -> Result<()> {
        let scalars: Vec<(&str, f64)> = EVAL_TAGS.into_iter().zip([eval.loss, eval.accuracy]).collect();
        self.events.scalars(step, &scalars).map_err(|e| Error::io("writing TensorBoard events", e))
    }
}

fn keep_steps_up_to(path: &Path, start: u64) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(()) };
    let kept: String = text
        .lines()
        .filter(|l| serde_json::from_str::<ProgressReport>(l).is_ok_and(|m| m.step <= start))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, kept).map_err(|e| Error::io(format!("rewriting {}", path.display()), e))
}
