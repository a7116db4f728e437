//! The replica codec: a pipelined engine's whole state (the bytes of a checkpoint file) in chunks, for priming
//! engines and for taking the state back.

use bytes::Bytes;

use super::chunk::pieces;
use crate::protocol::pb::StateChunk;
use errors::{Error, Result};
use plan::limits::Limits;

/// A replica's state (the bytes of a checkpoint file) cut into chunks for `job`, sharing its buffer.
pub fn encode_state(bytes: Bytes, job: &str) -> Vec<StateChunk> {
    let mut chunks: Vec<StateChunk> =
        pieces(bytes).map(|d| StateChunk { job: job.to_string(), data: d, last: false }).collect();
    if chunks.is_empty() {
        chunks.push(StateChunk { job: job.to_string(), ..StateChunk::default() });
    }
    if let Some(last) = chunks.last_mut() {
        last.last = true;
    }
    chunks
}

/// A replica's state checked chunk by chunk as it arrives: of this job, not past its last chunk, and never more
/// bytes than the model's whole state may take ([`Limits::state_bytes`]), so an oversized `Prime` or `Snapshot`
/// is refused at the first chunk beyond the plan.
pub struct StateMeter {
    have: u64,
    limit: u64,
    done: bool,
}

impl StateMeter {
    /// A meter for states of the model `limits` describes.
    pub fn new(limits: &Limits) -> Self {
        StateMeter { have: 0, limit: limits.state_bytes(), done: false }
    }

    /// Checks the next chunk for `job`, before the caller keeps it.
    pub fn check(&mut self, c: &StateChunk, job: &str) -> Result<()> {
        if c.job != job {
            return Err(Error::Protocol(format!("a replica of job '{}' was sent to job '{job}'", c.job)));
        }
        if self.done {
            return Err(Error::Protocol("a replica chunk arrived after the last one".into()));
        }
        let have = self.have.saturating_add(c.data.len() as u64);
        Error::check_limit(|| "the replica's state (bytes received)".into(), have, self.limit)?;
        self.have = have;
        self.done = c.last;
        Ok(())
    }

    /// Whether the last chunk has come.
    pub fn done(&self) -> bool {
        self.done
    }
}

/// Puts a replica's state back together, refusing chunks of another job, a state larger than the model's
/// (before keeping the chunk that makes it so) and a stream cut short.
pub fn decode_state(chunks: impl IntoIterator<Item = StateChunk>, job: &str, limits: &Limits) -> Result<Vec<u8>> {
    let mut meter = StateMeter::new(limits);
    let mut bytes = Vec::new();
    for c in chunks {
        meter.check(&c, job)?;
        bytes.extend_from_slice(&c.data);
    }
    if !meter.done() {
        return Err(Error::Protocol("the replica's state is truncated: its last chunk never came".into()));
    }
    Ok(bytes)
}
