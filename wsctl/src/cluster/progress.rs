//! A job's status as text: the words `wsctl get` puts in its columns and `wsctl submit --watch` prints, as a
//! progress bar on a terminal or as one line per change otherwise (scripts and tests read those lines).

use std::io::{IsTerminal, Write};

use crds::conditions::{ConditionStatus, ConditionType};
use crds::{ModelKind, Phase, TrainingJob};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A duration in seconds as people read it: `42s`, `3m05s`, `1h02m`, `2d03h`.
pub fn duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// The job's phase, `-` before the operator wrote one.
pub fn phase(job: &TrainingJob) -> String {
    job.status.as_ref().and_then(|s| s.phase).map_or_else(|| "-".into(), |p| p.to_string())
}

/// `step/total`, or what is known of it.
pub fn steps(job: &TrainingJob) -> Option<String> {
    let p = &job.status.as_ref()?.progress;
    match (p.step, p.total_steps) {
        (Some(s), Some(t)) => Some(format!("{s}/{t}")),
        (Some(s), None) => Some(s.to_string()),
        (None, Some(t)) => Some(format!("0/{t}")),
        (None, None) => None,
    }
}

/// The last step's loss, four decimals.
pub fn loss(job: &TrainingJob) -> Option<String> {
    job.status.as_ref()?.progress.loss.map(|l| format!("{l:.4}"))
}

/// The training throughput in the unit users of the model think in: tokens a second for a language model (each
/// sample is a context of tokens), samples a second otherwise.
pub fn throughput(job: &TrainingJob) -> Option<String> {
    let rate = job.status.as_ref()?.progress.samples_per_second.filter(|r| r.is_finite() && *r >= 0.0)?;
    match (job.spec.model.kind, job.spec.model.context_length) {
        (ModelKind::Gpt, Some(ctx)) => Some(format!("{:.0} tokens/s", rate * f64::from(ctx))),
        _ => Some(format!("{rate:.0} samples/s")),
    }
}

/// The operator's estimate of the time left.
pub fn eta(job: &TrainingJob) -> Option<String> {
    job.status.as_ref()?.estimated_remaining_seconds.map(duration)
}

/// `#N` for a queued job's place in the queue.
pub fn queue_position(job: &TrainingJob) -> Option<String> {
    job.status.as_ref()?.queue_position.map(|p| format!("#{p}"))
}

/// What a queued job waits for: the `Admitted` condition's reason while it is not admitted.
pub fn waiting_for(job: &TrainingJob) -> Option<String> {
    let s = job.status.as_ref()?;
    if s.phase != Some(Phase::Queued) {
        return None;
    }
    s.conditions
        .iter()
        .find(|c| ConditionType::Admitted.of(c) && !ConditionStatus::True.of(c))
        .map(|c| c.reason.clone())
}

/// Why the job failed: the `Failed` condition's message (else any failing condition's), for the user.
pub fn failure(job: &TrainingJob) -> String {
    let conditions = job.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions
        .iter()
        .find(|c| ConditionType::Failed.of(c) && ConditionStatus::True.of(c))
        .or_else(|| conditions.iter().find(|c| ConditionStatus::False.of(c) && !c.message.is_empty()))
        .map_or_else(|| "no reason given in its status".into(), |c| format!("{}: {}", c.reason, c.message))
}

/// One line for the job's state: the phase, then whatever the status knows (`Running step 20/100 (20%) loss
/// 0.4321 1234 samples/s ETA 5s`; a queued job's place and reason instead of progress).
pub fn line(job: &TrainingJob) -> String {
    let mut parts = vec![phase(job)];
    if let Some(s) = steps(job) {
        let pct = job.status.as_ref().and_then(|s| s.progress_percentage);
        parts.push(format!("step {s}{}", pct.map(|p| format!(" ({p}%)")).unwrap_or_default()));
    }
    let labelled = [("loss ", loss(job)), ("", throughput(job)), ("ETA ", eta(job)), ("queue ", queue_position(job))];
    parts.extend(labelled.into_iter().filter_map(|(label, v)| v.map(|v| format!("{label}{v}"))));
    if let Some(why) = waiting_for(job) {
        parts.push(format!("waiting: {why}"));
    }
    parts.join(" ")
}

/// Shows a watched job's changes: a bar on a terminal, one line per change otherwise.
pub enum Reporter {
    /// Interactive: a bar of the steps with the rest as its message.
    Bar(ProgressBar),
    /// Plain output: each distinct [`line`] once.
    Lines {
        /// The last line printed, so an unchanged status prints nothing.
        last: String,
    },
}

impl Reporter {
    /// A bar when stdout is a terminal, else lines.
    pub fn new() -> Reporter {
        if std::io::stdout().is_terminal() {
            let style = ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}")
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stdout()).with_style(style);
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            Reporter::Bar(bar)
        } else {
            Reporter::Lines { last: String::new() }
        }
    }

    /// Shows the job's current state.
    pub fn show(&mut self, job: &TrainingJob) {
        match self {
            Reporter::Bar(bar) => {
                let p = job.status.as_ref().map(|s| s.progress.clone()).unwrap_or_default();
                if let Some(t) = p.total_steps {
                    bar.set_length(t);
                }
                if let Some(s) = p.step {
                    bar.set_position(s);
                }
                let mut msg = vec![phase(job)];
                msg.extend(
                    [loss(job).map(|l| format!("loss {l}")), throughput(job), eta(job).map(|e| format!("ETA {e}"))]
                        .into_iter()
                        .flatten(),
                );
                msg.extend(queue_position(job).map(|q| format!("queue {q}")));
                msg.extend(waiting_for(job).map(|w| format!("waiting: {w}")));
                bar.set_message(msg.join("  "));
            }
            Reporter::Lines { last } => {
                let now = line(job);
                if now != *last {
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{now}").and_then(|()| out.flush());
                    *last = now;
                }
            }
        }
    }

    /// Ends the display, leaving the final state on screen as a line.
    pub fn finish(&self, job: Option<&TrainingJob>) {
        if let Reporter::Bar(bar) = self {
            bar.finish_and_clear();
            if let Some(j) = job {
                println!("{}", line(j));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::testing::{queued, running, succeeded};
    use crds::conditions::Reason;

    #[test]
    fn durations_read_like_a_clock() {
        let cases = [(0, "0s"), (42, "42s"), (185, "3m05s"), (3720, "1h02m"), (183_600, "2d03h")];
        for (secs, want) in cases {
            assert_eq!(duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn a_running_job_shows_steps_loss_throughput_and_eta() {
        let job = running();
        assert_eq!(line(&job), "Running step 20/100 (20%) loss 0.4321 1234 samples/s ETA 1m05s");
    }

    #[test]
    fn a_language_model_counts_tokens() {
        let mut job = running();
        job.spec.model.kind = ModelKind::Gpt;
        job.spec.model.context_length = Some(64);
        assert_eq!(throughput(&job).as_deref(), Some("78976 tokens/s"));
    }

    #[test]
    fn a_queued_job_shows_its_place_and_what_it_waits_for() {
        assert_eq!(line(&queued()), "Queued queue #2 waiting: InsufficientCapacity");
        assert_eq!(waiting_for(&running()), None);
    }

    #[test]
    fn a_new_job_is_a_dash_and_a_failed_one_says_why() {
        let mut job = running();
        job.status = None;
        assert_eq!(line(&job), "-");
        let mut failed = succeeded();
        let s = failed.status.get_or_insert_with(Default::default);
        s.phase = Some(Phase::Failed);
        s.conditions = vec![crate::cluster::testing::condition(
            ConditionType::Failed,
            ConditionStatus::True,
            Reason::RestartLimitExceeded,
            "4 restarts",
        )];
        assert_eq!(failure(&failed), "RestartLimitExceeded: 4 restarts");
    }
}
