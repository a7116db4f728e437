//! How a failed command reports itself: the one line people read, or with `--error-format json` that same line
//! inside one JSON object on standard error, with the kind of failure beside it, so a program driving `wsctl`
//! (the Python package) raises a typed error carrying exactly the message `wsctl` prints.

use serde::Serialize;

use crate::cluster;

/// How `wsctl` writes its error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ErrorFormat {
    /// `error: MESSAGE`, for people.
    #[default]
    Text,
    /// `{"kind": KIND, "message": MESSAGE}` on one line, for programs.
    Json,
}

/// What went wrong, as programs branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// The job is not runnable as written (manifest, spec, plan or data): nothing was started or sent.
    InvalidJob,
    /// The model program holds an operation the appliance cannot run; the message names it and its line.
    UnsupportedModel,
    /// No usable kubeconfig, or the cluster in it does not answer.
    Unreachable,
    /// The cluster does not serve the TrainingJob API: weightstream is not installed there.
    NotInstalled,
    /// The named job does not exist (or was deleted while it was waited for).
    NotFound,
    /// A job of that name exists already.
    AlreadyExists,
    /// The API server refused the request (forbidden, invalid, conflict).
    Refused,
    /// A wait ran out of time.
    Timeout,
    /// The job ran and failed; the message is its status's reason.
    JobFailed,
    /// Anything else: a local run that failed, a file that cannot be written, a checkpoint that does not verify.
    Failed,
}

/// The kind of `e`, from the first error in its chain that says.
pub fn kind(e: &anyhow::Error) -> Kind {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<cluster::Error>() {
            return match c {
                cluster::Error::Kubeconfig(_) | cluster::Error::Unreachable { .. } => Kind::Unreachable,
                cluster::Error::CrdMissing => Kind::NotInstalled,
                cluster::Error::NotFound { .. } | cluster::Error::Deleted { .. } => Kind::NotFound,
                cluster::Error::AlreadyExists { .. } => Kind::AlreadyExists,
                cluster::Error::Manifest { .. } => Kind::InvalidJob,
                cluster::Error::Refused { .. } => Kind::Refused,
                cluster::Error::Timeout { .. } => Kind::Timeout,
                cluster::Error::JobFailed { .. } => Kind::JobFailed,
                cluster::Error::Invalid(_) | cluster::Error::Checkpoint { .. } | cluster::Error::Io { .. } => {
                    Kind::Failed
                }
            };
        }
        if cause.is::<crds::ApiError>() {
            return Kind::InvalidJob;
        }
        if let Some(w) = cause.downcast_ref::<errors::Error>() {
            return match w {
                errors::Error::UnsupportedModel { .. } => Kind::UnsupportedModel,
                errors::Error::Spec(_)
                | errors::Error::Data(_)
                | errors::Error::Plan(_)
                | errors::Error::OutOfSram { .. } => Kind::InvalidJob,
                _ => Kind::Failed,
            };
        }
    }
    Kind::Failed
}

/// The error as `format` writes it (without the newline).
pub fn render(e: &anyhow::Error, format: ErrorFormat) -> String {
    let message = format!("{e:#}");
    match format {
        ErrorFormat::Text => format!("error: {message}"),
        ErrorFormat::Json => {
            #[derive(Serialize)]
            struct Report<'a> {
                kind: Kind,
                message: &'a str,
            }
            serde_json::to_string(&Report { kind: kind(e), message: &message })
                .unwrap_or_else(|_| format!("{{\"kind\":\"failed\",\"message\":{message:?}}}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_spec_is_an_invalid_job_with_the_line_people_read() {
        let e =
            crds::parse_training_job(&crds::testing::MLP_YAML.replace("batchSize: 64", "batchSize: 63")).unwrap_err();
        let e = anyhow::Error::from(e).context("job.yaml");
        let text = render(&e, ErrorFormat::Text);
        let json: serde_json::Value = serde_json::from_str(&render(&e, ErrorFormat::Json)).unwrap();
        assert_eq!(json["kind"], "invalid-job");
        assert_eq!(format!("error: {}", json["message"].as_str().unwrap()), text);
        assert!(text.starts_with("error: job.yaml: ") && text.contains("batchSize"), "{text}");
    }

    #[test]
    fn cluster_errors_keep_their_kind_through_context() {
        let e =
            anyhow::Error::from(cluster::Error::NotFound { namespace: "ml".into(), name: "x".into() }).context("get");
        assert_eq!(kind(&e), Kind::NotFound);
        assert_eq!(kind(&anyhow::Error::from(cluster::Error::Kubeconfig("none".into()))), Kind::Unreachable);
        assert_eq!(kind(&anyhow::anyhow!("memoryx exited")), Kind::Failed);
    }
}
