//! A run's records over HTTPS, so `wsctl tensorboard pull` gets a cluster job's TensorBoard files and metrics
//! from the volume MemoryX writes them to, without a shell and without any route to the volume but MemoryX:
//!
//! - `GET /run`: the records in the run's output folder, `[{"file": NAME, "bytes": B}]` by name: `metrics.jsonl`,
//!   `summary.json` and the TensorBoard event files, regular files only, at most [`MAX_FILES`].
//! - `GET /run/{file}`: one of them, streamed, exactly as long as listed.
//!
//! Both are protected routes (the job's or the operator's certificate, like `/status`). A requested name is only
//! compared with the listing's names, never joined to a path.

use std::path::{Path, PathBuf};

use axum::Json;
use axum::Router;
use axum::extract::Path as UrlPath;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};

use crate::coordinator::records::{METRICS_FILE, SUMMARY_FILE};
use crate::memoryx::checkpoint_routes::{failure, regular, send_file};
use crate::tensorboard::is_event_file_name;

/// Most files `GET /run` lists (a run adds one event file per start; a job resumed thousands of times is not one
/// a listing has to serve whole).
pub const MAX_FILES: usize = 4096;

/// One record file as `GET /run` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFile {
    /// Its name, the only one `GET /run/{file}` answers to.
    pub file: String,
    /// Its size when listed.
    pub bytes: u64,
}

/// Whether `name` is one of a run's records: `metrics.jsonl`, `summary.json` or a TensorBoard event file (never a
/// path: no separator, no `..`).
pub fn is_run_file(name: &str) -> bool {
    name == METRICS_FILE || name == SUMMARY_FILE || is_event_file_name(name)
}

/// The records in `dir` with their paths, by name; a missing folder (nothing recorded yet) lists nothing.
pub fn listing(dir: &Path) -> std::io::Result<Vec<(RunFile, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let Some((file, bytes)) = regular(&path).filter(|(name, _)| is_run_file(name)) else { continue };
        found.push((RunFile { file, bytes }, path));
        if found.len() == MAX_FILES {
            break;
        }
    }
    found.sort_by(|a, b| a.0.file.cmp(&b.0.file));
    Ok(found)
}

/// The routes for the records in `dir` (none configured: an empty list, and every file `404`), to be merged
/// into MemoryX's protected routes.
pub fn routes(dir: Option<PathBuf>) -> Router {
    let (list_dir, file_dir) = (dir.clone(), dir);
    Router::new()
        .route("/run", get(move || list(list_dir.clone())))
        .route("/run/{file}", get(move |UrlPath(file): UrlPath<String>| download(file_dir.clone(), file)))
}

async fn list(dir: Option<PathBuf>) -> Response {
    let Some(dir) = dir else { return Json(Vec::<RunFile>::new()).into_response() };
    match tokio::task::spawn_blocking(move || listing(&dir)).await {
        Ok(Ok(found)) => Json(found.into_iter().map(|(f, _)| f).collect::<Vec<_>>()).into_response(),
        Ok(Err(e)) => failure(StatusCode::INTERNAL_SERVER_ERROR, format!("listing the run's records: {e}")),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, format!("listing the run's records: {e}")),
    }
}

async fn download(dir: Option<PathBuf>, file: String) -> Response {
    let not_found = |file: &str| {
        let why = format!("no record named {file:?}: ask GET /run for the files there are, and use one of those names");
        failure(StatusCode::NOT_FOUND, why)
    };
    let Some(dir) = dir else { return not_found(&file) };
    let found = tokio::task::spawn_blocking(move || listing(&dir)).await;
    let hit = match found {
        Ok(Ok(found)) => found.into_iter().find(|(f, _)| f.file == file),
        Ok(Err(e)) => return failure(StatusCode::INTERNAL_SERVER_ERROR, format!("finding {file}: {e}")),
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, format!("finding {file}: {e}")),
    };
    let Some((listed, path)) = hit else { return not_found(&file) };
    send_file(&path, listed.bytes, &file, not_found).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only records are listed (regular files of the record names), by name; nothing else is served.
    #[test]
    fn only_the_runs_records_are_listed() {
        let dir = std::env::temp_dir().join(format!("ws-run-routes-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        assert!(listing(&dir).unwrap().is_empty(), "nothing recorded yet");
        std::fs::create_dir_all(dir.join("events.out.tfevents.9.sub")).unwrap();
        for (name, text) in [
            (METRICS_FILE, "{}\n"),
            (SUMMARY_FILE, "{}"),
            ("events.out.tfevents.1.000000001.weightstream", "ab"),
            ("notes.txt", "not a record"),
            (".metrics.jsonl.tmp", "half"),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", dir.join("events.out.tfevents.2.x")).unwrap();
        let names: Vec<(String, u64)> = listing(&dir).unwrap().into_iter().map(|(f, _)| (f.file, f.bytes)).collect();
        let want = [("events.out.tfevents.1.000000001.weightstream", 2), (METRICS_FILE, 3), (SUMMARY_FILE, 2)];
        assert_eq!(names, want.map(|(n, b)| (n.to_string(), b)));
        std::fs::remove_dir_all(&dir).ok();
    }
}
