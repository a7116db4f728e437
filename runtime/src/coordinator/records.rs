//! What a run records step by step in its output folder: `metrics.jsonl` (one line per step) and TensorBoard
//! event files with the same steps' scalars, then the held-out evaluation and the engines' busy share.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use crds::contract::ProgressReport;
use errors::{Error, Result};

use crate::coordinator::train::EvalReport;
use crate::tensorboard::{EventFile, is_event_file_name};

/// The file with one JSON line per step.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The file with the run's summary, written at its end.
pub const SUMMARY_FILE: &str = "summary.json";

/// The TensorBoard tags of a step's scalars: the names `metrics.jsonl` gives them.
pub const STEP_TAGS: [&str; 4] = ["loss", "learning_rate", "samples_per_s", "bytes_streamed"];
/// The TensorBoard tags of the run's end, recorded at the last step: the held-out evaluation and the engines'
/// busy share over the run (`summary.json`'s `eval.loss`, `eval.accuracy` and `wse_utilization`).
pub const END_TAGS: [&str; 3] = ["eval_loss", "eval_accuracy", "engine_busy"];

/// A run's records, open for appending.
pub struct Records {
    metrics: BufWriter<File>,
    events: EventFile,
}

impl Records {
    /// The records in `out` of a run starting after step `start`: `metrics.jsonl` fresh for a new run, for a
    /// resumed one cut back to the steps up to `start` (those after it are about to run again) and appended to,
    /// so it keeps one line per step; a new event file, which tells TensorBoard to drop earlier files' steps
    /// past `start`. A new run removes the event files an earlier run left in `out`, as it starts
    /// `metrics.jsonl` afresh.
    pub fn open(out: &Path, start: u64) -> Result<Records> {
        std::fs::create_dir_all(out).map_err(|e| Error::io(format!("creating {}", out.display()), e))?;
        let path = out.join(METRICS_FILE);
        let file = if start > 0 {
            keep_steps_up_to(&path, start)?;
            OpenOptions::new().append(true).create(true).open(&path)
        } else {
            remove_event_files(out)?;
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

    /// Records the run's end at step `step`: the held-out evaluation after training, and the engines' busy share.
    pub fn end(&mut self, step: u64, eval: &EvalReport, engine_busy: f64) -> Result<()> {
        let scalars: Vec<(&str, f64)> = END_TAGS.into_iter().zip([eval.loss, eval.accuracy, engine_busy]).collect();
        self.events.scalars(step, &scalars).map_err(|e| Error::io("writing TensorBoard events", e))
    }
}

/// Removes the TensorBoard event files in `out` (regular files of that name only).
fn remove_event_files(out: &Path) -> Result<()> {
    let entries = std::fs::read_dir(out).map_err(|e| Error::io(format!("listing {}", out.display()), e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file && name.to_str().is_some_and(is_event_file_name) {
            std::fs::remove_file(entry.path()).map_err(|e| Error::io(format!("removing {name:?}"), e))?;
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event_files(dir: &Path) -> usize {
        let names = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string());
        names.filter(|n| is_event_file_name(n)).count()
    }

    /// A new run in a folder starts its records afresh; a resumed one adds an event file beside the earlier ones.
    #[test]
    fn a_new_run_starts_afresh_and_a_resumed_one_adds_a_file() {
        let dir = std::env::temp_dir().join(format!("ws-records-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let step =
            |n: u64| ProgressReport { step: n, loss: 1.0, samples_per_s: 1.0, bytes_streamed: 1, learning_rate: 0.1 };
        let mut r = Records::open(&dir, 0).unwrap();
        (1..=3).for_each(|n| r.step(&step(n)).unwrap());
        drop(r);
        std::fs::write(dir.join("notes.txt"), "kept").unwrap();
        let mut r = Records::open(&dir, 2).unwrap();
        r.step(&step(3)).unwrap();
        drop(r);
        assert_eq!(event_files(&dir), 2, "the resumed run's file beside the first");
        let lines = std::fs::read_to_string(dir.join(METRICS_FILE)).unwrap().lines().count();
        assert_eq!(lines, 3, "steps 1, 2 kept, 3 again");
        drop(Records::open(&dir, 0).unwrap());
        assert_eq!(event_files(&dir), 1, "a new run's own file only");
        assert!(dir.join("notes.txt").exists(), "nothing but event files removed");
        assert_eq!(std::fs::read_to_string(dir.join(METRICS_FILE)).unwrap(), "");
        std::fs::remove_dir_all(&dir).ok();
    }
}
