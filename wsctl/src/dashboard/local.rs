//! Local runs as the dashboard's jobs: each folder a `wsctl run` wrote (`metrics.jsonl`, `summary.json`,
//! `logs/` with its `processes` table, `checkpoints/`), read afresh at every page so a running run's page
//! moves with it. Every read is bounded; a folder that holds no run yet is listed as waiting for one.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Result, bail};
use plan::wiring::Component as Part;
use runtime::coordinator::records::{METRICS_FILE, SUMMARY_FILE};
use runtime::coordinator::train::Summary;

use super::records::{self, MAX_METRICS_BYTES, MAX_SUMMARY_BYTES};
use super::view::{Checkpoint, Component, Detail, Listing, LogTail, Row};
use super::{Source, view};

/// Bytes of each log's end shown.
pub const LOG_TAIL_BYTES: u64 = 8 << 10;
/// Most bytes of the `processes` table read.
const MAX_PROCESSES_BYTES: u64 = 1 << 20;
/// A run with no process table (`--in-process`) counts as running while its records changed this recently.
const RECENT: Duration = Duration::from_secs(30);

/// The local runs: each folder with the name its page goes by.
pub struct LocalRuns {
    runs: Vec<PathBuf>,
}

impl LocalRuns {
    /// The runs in `folders`, each of which must be a folder.
    pub fn open(folders: Vec<PathBuf>) -> Result<LocalRuns> {
        for f in &folders {
            if !f.is_dir() {
                bail!(
                    "{} is not a folder: give the folders `wsctl run` wrote (its --out, runs/<job> by default)",
                    f.display()
                );
            }
        }
        Ok(LocalRuns { runs: folders })
    }

    fn read(&self, index: usize) -> Run<'_> {
        Run::read(index, &self.runs[index])
    }
}

impl Source for LocalRuns {
    async fn listing(&self) -> Result<Listing> {
        let rows = (0..self.runs.len()).map(|i| self.read(i).row()).collect();
        let scope = format!("local run{}", if self.runs.len() == 1 { "" } else { "s" });
        Ok(Listing { scope, namespaces: false, rows })
    }

    async fn detail(&self, key: &str) -> Result<Option<Detail>> {
        let index = key.parse::<usize>().ok().filter(|&i| i < self.runs.len() && key == i.to_string());
        Ok(index.map(|i| self.read(i).detail()))
    }
}

/// What one run folder holds now.
struct Run<'a> {
    index: usize,
    dir: &'a Path,
    steps: Vec<crds::contract::ProgressReport>,
    summary: Option<Summary>,
    /// Each process of the run's table and whether it is alive.
    processes: Vec<(String, bool)>,
    gaps: Vec<String>,
}

impl<'a> Run<'a> {
    fn read(index: usize, dir: &'a Path) -> Run<'a> {
        let mut gaps = Vec::new();
        let mut file = |name: &str, max: u64| match records::tail(&dir.join(name), max) {
            Ok(bytes) => bytes,
            Err(e) => {
                gaps.push(format!("cannot read {}: {e}", dir.join(name).display()));
                None
            }
        };
        let steps = file(METRICS_FILE, MAX_METRICS_BYTES).map(|b| records::steps(&b)).unwrap_or_default();
        let summary = file(SUMMARY_FILE, MAX_SUMMARY_BYTES).map(|b| records::summary(&b));
        let table = file("logs/processes", MAX_PROCESSES_BYTES).unwrap_or_default();
        let summary = summary.and_then(|s| s.map_err(|e| gaps.push(e)).ok());
        let processes = String::from_utf8_lossy(&table)
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(name, pid)| (name.to_string(), pid.parse::<u32>().is_ok_and(alive)))
            .collect();
        Run { index, dir, steps, summary, processes, gaps }
    }

    fn phase(&self) -> &'static str {
        let recent = std::fs::metadata(self.dir.join(METRICS_FILE))
            .and_then(|m| m.modified())
            .is_ok_and(|t| SystemTime::now().duration_since(t).is_ok_and(|age| age < RECENT));
        match (&self.summary, self.processes.iter().any(|(_, alive)| *alive), self.steps.is_empty()) {
            (Some(_), _, _) => "Succeeded",
            (None, true, _) => "Running",
            (None, false, false) if recent && self.processes.is_empty() => "Running",
            (None, false, true) if self.processes.is_empty() => "Waiting",
            (None, false, _) => "Stopped",
        }
    }

    fn row(&self) -> Row {
        let name = self.dir.file_name().map_or_else(|| self.dir.display().to_string(), |n| n.to_string_lossy().into());
        let last = self.steps.last();
        let phase = self.phase();
        let reason = match phase {
            "Stopped" => "ended without a summary.json: its logs say why".to_string(),
            "Waiting" => "no records yet".to_string(),
            _ => "-".to_string(),
        };
        Row {
            href: format!("jobs/{}", self.index),
            name,
            phase: phase.into(),
            cs2: self.summary.as_ref().map_or_else(|| "-".into(), |s| s.cs2.to_string()),
            step: last.map_or_else(|| "-".into(), |s| s.step.to_string()),
            loss: last.map_or_else(|| "-".into(), |s| format!("{:.4}", s.loss)),
            throughput: last.map_or_else(|| "-".into(), |s| format!("{:.0}", s.samples_per_s)),
            eta: "-".into(),
            queue: "-".into(),
            reason,
            ..Row::default()
        }
    }

    fn detail(self) -> Detail {
        let row = self.row();
        let finished = matches!(row.phase.as_str(), "Succeeded" | "Stopped");
        let mut gaps = self.gaps.clone();
        if self.processes.is_empty() && !self.steps.is_empty() {
            gaps.push("this run has no process table (`--in-process`): one process ran every role".into());
        }
        Detail {
            facts: self.summary.as_ref().map(records::facts).unwrap_or_default(),
            curve: records::curve(&self.steps, self.summary.as_ref()),
            appliance: self.appliance(),
            events: Vec::new(),
            checkpoints: self.checkpoints(&mut gaps),
            logs: self.logs(),
            gaps,
            finished,
            row,
        }
    }

    /// The processes of the table, each with its role; engines with their busy share once the summary says it.
    fn appliance(&self) -> Vec<Component> {
        let busy = self.summary.as_ref().map(records::busy).unwrap_or_default();
        let streamed = self.steps.last().map(|s| s.bytes_streamed);
        let mut parts: Vec<Component> = self
            .processes
            .iter()
            .filter_map(|(name, alive)| {
                let part = Part::from_name(name)?;
                Some(Component {
                    role: part.role(),
                    name: name.clone(),
                    node: "local".into(),
                    phase: if *alive { "Running" } else { "exited" }.into(),
                    restarts: 0,
                    busy: match part {
                        Part::Engine(i) => busy.get(i as usize).copied(),
                        _ => None,
                    },
                    bytes_per_step: (part == Part::WeightServer(0)).then_some(streamed).flatten(),
                })
            })
            .collect();
        parts.sort_by(|a, b| crate::cluster::logs::natural(&a.name, &b.name));
        parts
    }

    fn checkpoints(&self, gaps: &mut Vec<String>) -> Vec<Checkpoint> {
        let dir = self.dir.join("checkpoints");
        match runtime::memoryx::checkpoint_routes::entries(&dir) {
            Ok(found) => found.into_iter().map(|(e, _)| Checkpoint { step: e.step, bytes: e.bytes }).collect(),
            Err(e) => {
                gaps.push(format!("cannot list {}: {e}", dir.display()));
                Vec::new()
            }
        }
    }

    /// The end of the first log of each role, the coordinator's first.
    fn logs(&self) -> Vec<LogTail> {
        let mut tails = Vec::new();
        for role in view::TREE_ORDER {
            let first =
                self.processes.iter().map(|(n, _)| n).find(|n| Part::from_name(n).map(Part::role) == Some(role));
            let Some(name) = first else { continue };
            let path = self.dir.join("logs").join(format!("{name}.log"));
            let text = match records::tail(&path, LOG_TAIL_BYTES) {
                Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                Ok(None) => "(no log)".into(),
                Err(e) => format!("cannot read {}: {e}", path.display()),
            };
            tails.push(LogTail { name: name.clone(), text });
        }
        tails
    }
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::contract::Role;

    fn roles(parts: &[Component]) -> Vec<Role> {
        parts.iter().map(|c| c.role).collect()
    }

    /// A folder with a process table of dead processes and steps but no summary stopped; its page lists every
    /// process under its role, and the engine's log.
    #[test]
    fn a_run_without_a_summary_whose_processes_are_gone_stopped() {
        let dir = std::env::temp_dir().join(format!("ws-dashboard-local-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let dead = u32::MAX - 7;
        let table: String =
            ["input-0", "engine-0", "swarmx-0-0", "memoryx"].iter().map(|n| format!("{n}\t{dead}\n")).collect();
        std::fs::write(dir.join("logs/processes"), table).unwrap();
        std::fs::write(dir.join("logs/engine-0.log"), "engine 0 started\nboom\n").unwrap();
        let step = crds::contract::ProgressReport {
            step: 1,
            loss: 2.5,
            samples_per_s: 10.0,
            bytes_streamed: 4096,
            learning_rate: 0.1,
        };
        std::fs::write(dir.join(METRICS_FILE), serde_json::to_string(&step).unwrap() + "\n").unwrap();
        let runs = LocalRuns::open(vec![dir.clone()]).unwrap();
        let d = runs.read(0).detail();
        assert_eq!(d.row.phase, "Stopped");
        assert!(d.finished);
        assert_eq!(roles(&d.appliance), vec![Role::Engine, Role::Input, Role::Memoryx, Role::Swarmx]);
        let coordinator = d.appliance.iter().find(|c| c.name == "memoryx").unwrap();
        assert_eq!(coordinator.bytes_per_step, Some(4096));
        assert!(d.logs.iter().any(|l| l.name == "engine-0" && l.text.ends_with("boom\n")), "{:?}", d.logs);
        assert_eq!(d.curve.loss, vec![(1, 2.5)]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(LocalRuns::open(vec![dir]).is_err(), "a folder that is not there is refused");
    }
}
