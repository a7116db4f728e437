//! The replica codec: a pipelined engine's whole state (the bytes of a checkpoint file) in chunks, for priming
//! engines and for taking the state back.

use bytes::Bytes;

use super::chunk::pieces;
use crate::error::{Error, Result};
use crate::protocol::pb::StateChunk;

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

/// Puts a replica's state back together, refusing chunks of another job and a stream cut short.
pub fn decode_state(chunks: impl IntoIterator<Item = StateChunk>, job: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut done = false;
    for c in chunks {
        if c.job != job {
            return Err(Error::Protocol(format!("a replica of job '{}' was sent to job '{job}'", c.job)));
        }
        if done {
            return Err(Error::Protocol("a replica chunk arrived after the last one".into()));
        }
        done = c.last;
        bytes.extend_from_slice(&c.data);
    }
    if !done {
        return Err(Error::Protocol("the replica's state is truncated: its last chunk never came".into()));
    }
    Ok(bytes)
}
