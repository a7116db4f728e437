//! TensorBoard event files: a run's scalars as TFRecords (length, masked CRC-32C, protobuf `Event`) that
//! TensorBoard and its `EventAccumulator` read, written beside `metrics.jsonl`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

/// What TensorBoard's `Event` (`tensorboard/compat/proto/event.proto`) carries that a run writes.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    /// Seconds since the epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The training step the event belongs to.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// What happened.
    #[prost(oneof = "What", tags = "3, 5, 7")]
    pub what: Option<What>,
}

/// An event's content.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    /// The file's format, first in every file: `brain.Event:2`.
    #[prost(string, tag = "3")]
    FileVersion(String),
    /// Scalars of one step.
    #[prost(message, tag = "5")]
    Summary(Summary),
    /// A (re)start: TensorBoard drops what earlier files hold from this step on.
    #[prost(message, tag = "7")]
    SessionLog(SessionLog),
}

/// Values of one step (`tensorboard/compat/proto/summary.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    /// One per tag.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// One scalar.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    /// The series' name.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// The value, as TensorBoard's scalars hold it (32-bit).
    #[prost(float, tag = "2")]
    pub simple_value: f32,
}

/// A session's start (`SessionLog.START` = 1).
#[derive(Clone, PartialEq, Message)]
pub struct SessionLog {
    /// 1: the run (re)starts at the event's step.
    #[prost(int32, tag = "1")]
    pub status: i32,
}

const SESSION_START: i32 = 1;

/// The start of every event file's name (TensorBoard reads the files whose names hold `tfevents`).
pub const FILE_PREFIX: &str = "events.out.tfevents.";

/// Whether `name` is an event file's name as [`EventFile::create`] makes them: [`FILE_PREFIX`], then letters,
/// digits, dots, dashes or underscores, no separator and no `..`, so it can be joined to a folder safely.
pub fn is_event_file_name(name: &str) -> bool {
    name.len() <= 255
        && !name.contains("..")
        && name.strip_prefix(FILE_PREFIX).is_some_and(|rest| {
            !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
}

/// TFRecord's CRC: CRC-32C, rotated and offset so a CRC of data holding CRCs stays strong.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `data` framed as one TFRecord: length (u64 LE), its masked CRC, the data, the data's masked CRC.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The events of a file's `bytes`, each record's length and both CRCs checked; the first record that does not
/// check is the error (a file cut short by a crash ends in one), with the events before it not returned.
pub fn read_events(bytes: &[u8]) -> Result<Vec<Event>, String> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let at = bytes.len() - rest.len();
        let (head, body) = rest.split_at_checked(12).ok_or(format!("a record header cut short at byte {at}"))?;
        let (len, crc) = head.split_at(8);
        if u32::from_le_bytes(crc.try_into().unwrap_or_default()) != masked_crc(len) {
            return Err(format!("the length of the record at byte {at} fails its CRC"));
        }
        let len = usize::try_from(u64::from_le_bytes(len.try_into().unwrap_or_default())).unwrap_or(usize::MAX);
        let data = body.get(..len).ok_or(format!("the record at byte {at} is cut short"))?;
        let end = len.checked_add(4).ok_or(format!("the record at byte {at} claims an impossible length"))?;
        let crc = body.get(len..end).ok_or(format!("the record at byte {at} is cut short before its CRC"))?;
        if u32::from_le_bytes(crc.try_into().unwrap_or_default()) != masked_crc(data) {
            return Err(format!("the record at byte {at} fails its CRC"));
        }
        out.push(Event::decode(data).map_err(|e| format!("the record at byte {at} is not an Event: {e}"))?);
        rest = &body[end..];
    }
    Ok(out)
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

/// One event file of a run, appended to and flushed event by event.
pub struct EventFile {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventFile {
    /// A new file in `dir` for a run that starts after step `start`: its name sorts after the files of earlier
    /// starts, and a resumed run (`start > 0`) opens with a session start at `start + 1`, so TensorBoard drops
    /// the steps earlier files hold past `start` (they are trained again).
    pub fn create(dir: &Path, start: u64) -> std::io::Result<EventFile> {
        let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let name = format!("{FILE_PREFIX}{}.{:09}.weightstream", at.as_secs(), at.subsec_nanos());
        let path = dir.join(name);
        let mut file = EventFile { out: BufWriter::new(File::create(&path)?), path };
        let step = i64::try_from(start).unwrap_or(i64::MAX);
        file.write(Event { wall_time: now(), step, what: Some(What::FileVersion("brain.Event:2".into())) })?;
        if start > 0 {
            let log = SessionLog { status: SESSION_START };
            file.write(Event { wall_time: now(), step: step.saturating_add(1), what: Some(What::SessionLog(log)) })?;
        }
        Ok(file)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The scalars of `step`, by tag.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> std::io::Result<()> {
        let value =
            values.iter().map(|(tag, v)| SummaryValue { tag: (*tag).into(), simple_value: *v as f32 }).collect();
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        self.write(Event { wall_time: now(), step, what: Some(What::Summary(Summary { value })) })
    }

    fn write(&mut self, event: Event) -> std::io::Result<()> {
        self.out.write_all(&record(&event.encode_to_vec()))?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C's check value, and the mask TFRecord puts on it.
    #[test]
    fn the_crc_is_crc32c_masked_as_tfrecord_masks_it() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xe306_9283_u32.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    /// A resumed run's file starts with the version, then a session start after the step it resumed from, then
    /// its steps' scalars.
    #[test]
    fn a_file_holds_the_version_a_restart_and_the_scalars() {
        let dir = std::env::temp_dir().join(format!("ws-tb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = EventFile::create(&dir, 40).unwrap();
        f.scalars(41, &[("loss", 2.5), ("learning_rate", 0.01)]).unwrap();
        let bytes = std::fs::read(f.path()).unwrap();
        let got = read_events(&bytes).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].step, &got[0].what), (40, &Some(What::FileVersion("brain.Event:2".into()))));
        assert_eq!((got[1].step, &got[1].what), (41, &Some(What::SessionLog(SessionLog { status: 1 }))));
        let Some(What::Summary(s)) = &got[2].what else { panic!("{:?}", got[2]) };
        let tags: Vec<(&str, f32)> = s.value.iter().map(|v| (v.tag.as_str(), v.simple_value)).collect();
        assert_eq!((got[2].step, tags), (41, vec![("loss", 2.5), ("learning_rate", 0.01)]));
        // A file cut short, or with a byte changed, says where; names are checked before they are joined.
        assert!(read_events(&bytes[..bytes.len() - 1]).unwrap_err().contains("cut short"));
        let mut bad = bytes.clone();
        bad[20] ^= 1;
        assert!(read_events(&bad).unwrap_err().contains("CRC"));
        let name = f.path().file_name().unwrap().to_str().unwrap();
        assert!(is_event_file_name(name), "{name}");
        for bad in ["events.out.tfevents.", "events.out.tfevents.1/../x", "events.out.tfevents...", "metrics.jsonl"] {
            assert!(!is_event_file_name(bad), "{bad}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
