//! What a role program tells the process that started it, one JSON object per line on standard output: the
//! addresses it bound (ephemeral ports locally), each step's progress, and that the job is done. The local
//! runner reads these typed lines instead of parsing free text; in a cluster nobody reads them and they are
//! harmless log lines.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::role::Role;

/// What one training step reports: MemoryX writes it to `metrics.jsonl`, announces it to a local supervisor
/// and copies it into `/status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgressReport {
    /// Steps completed, 1-based.
    pub step: u64,
    /// Mean loss over the global batch.
    pub loss: f64,
    /// Training throughput of this step.
    pub samples_per_s: f64,
    /// Bytes moved between MemoryX and the fabric in this step.
    pub bytes_streamed: u64,
    /// Learning rate used for this step's update.
    pub learning_rate: f64,
}

/// One line of the handshake.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum Handshake {
    /// The role's gRPC service is bound and serving at `grpc` (a role without one, MemoryX, sends `None`), and
    /// its HTTP endpoint at `http`.
    Ready {
        /// Which role.
        role: Role,
        /// The bound `Stage` address.
        grpc: Option<SocketAddr>,
        /// The bound health, metrics (and for MemoryX, status) address.
        http: SocketAddr,
    },
    /// A training step finished.
    Progress(ProgressReport),
    /// The job trained to the end; `summary.json` is written.
    Done {
        /// Steps the job ran in all.
        steps: u64,
    },
    /// MemoryX stopped on a termination signal at a step boundary: the job resumes from `checkpoint`.
    Stopped {
        /// The step its saved state holds.
        step: u64,
        /// The checkpoint written, if it has a checkpoint folder.
        checkpoint: Option<String>,
    },
}

/// Marks handshake lines, so they stand out among anything else a program may print.
const PREFIX: &str = "weightstream ";

impl Handshake {
    /// The line to print (without the newline).
    pub fn to_line(&self) -> String {
        // Serializing these plain types cannot fail.
        format!("{PREFIX}{}", serde_json::to_string(self).unwrap_or_default())
    }

    /// The handshake a printed line carries, if it is one.
    pub fn from_line(line: &str) -> Option<Handshake> {
        serde_json::from_str(line.strip_prefix(PREFIX)?).ok()
    }

    /// Prints the line on standard output at once. A supervisor that stopped reading must not bring the role
    /// down, so a closed pipe is ignored rather than a panic as `println!` would make it.
    pub fn announce(&self) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", self.to_line()).and_then(|()| out.flush());
    }
}

impl Serialize for Role {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Role::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown role '{name}'")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_other_output_is_not_a_handshake() {
        let all = [
            Handshake::Ready {
                role: Role::Engine,
                grpc: Some("127.0.0.1:4000".parse().unwrap()),
                http: "127.0.0.1:4001".parse().unwrap(),
            },
            Handshake::Ready { role: Role::Memoryx, grpc: None, http: "0.0.0.0:8080".parse().unwrap() },
            Handshake::Progress(ProgressReport {
                step: 3,
                loss: 0.5,
                samples_per_s: 10.0,
                bytes_streamed: 7,
                learning_rate: 0.1,
            }),
            Handshake::Done { steps: 9 },
            Handshake::Stopped { step: 4, checkpoint: Some("/c/step-00000004.ckpt".into()) },
        ];
        for h in all {
            assert_eq!(Handshake::from_line(&h.to_line()), Some(h));
        }
        assert_eq!(Handshake::from_line("engine grpc listening on 127.0.0.1:1"), None);
        assert_eq!(
            Handshake::from_line(r#"weightstream {"event":"ready","role":"cook","grpc":null,"http":"1.2.3.4:5"}"#),
            None
        );
    }
}
