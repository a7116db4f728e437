//! MemoryX's checkpoints over HTTPS, so a user gets the trained weights back from a volume inside an image
//! without a shell (`kubectl cp` cannot fetch them) and without any route to the volume but MemoryX itself.
//!
//! - `GET /checkpoints`: the complete checkpoint files, newest first, as
//!   `[{"step":N,"file":"step-00000010.safetensors","bytes":B}]`. Temporary files of a write in progress are
//!   never listed: a checkpoint is renamed into its listed name only once it is whole and synced.
//! - `GET /checkpoints/{file}`: one file's bytes, streamed from disk in chunks (a checkpoint may be larger than
//!   MemoryX can spare twice in memory), with its length announced up front.
//!
//! Both are protected routes (the job's or the operator's certificate, like `/status`). The requested name is
//! never used as a path: it is looked up among the names the listing itself produced, so `..`, slashes,
//! symbolic links, temporary files or anything else in (or out of) the directory are answered `404`.

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::Path as UrlPath;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::checkpoint;

/// Bytes read from disk per chunk of a streamed checkpoint: large enough to keep the TLS stream busy, small
/// enough that a download costs MemoryX no more than this in memory.
const CHUNK: usize = 256 << 10;

/// One checkpoint as `GET /checkpoints` lists it: what a client needs to choose one and to bound its download.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The step the checkpoint was taken after.
    pub step: u64,
    /// Its file name, the only name `GET /checkpoints/{file}` answers to.
    pub file: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The complete checkpoint files in `dir`, newest first: regular files only (not a symbolic link placed under a
/// checkpoint's name), each with its size. A missing directory (no checkpoint written yet) lists nothing.
pub fn entries(dir: &Path) -> wire::error::Result<Vec<(Entry, PathBuf)>> {
    Ok(checkpoint::list(dir)?
        .into_iter()
        .filter_map(|(step, path)| {
            let meta = std::fs::symlink_metadata(&path).ok().filter(std::fs::Metadata::is_file)?;
            let file = path.file_name()?.to_str()?.to_string();
            Some((Entry { step, file, bytes: meta.len() }, path))
        })
        .collect())
}

/// The routes for the checkpoints in `dir` (none configured: an empty list, and every file `404`), to be
/// merged into MemoryX's protected routes.
pub fn routes(dir: Option<PathBuf>) -> Router {
    let (list_dir, file_dir) = (dir.clone(), dir);
    Router::new()
        .route("/checkpoints", get(move || list(list_dir.clone())))
        .route("/checkpoints/{file}", get(move |UrlPath(file): UrlPath<String>| download(file_dir.clone(), file)))
}

fn failure(status: StatusCode, message: String) -> Response {
    (status, format!("{message}\n")).into_response()
}

async fn list(dir: Option<PathBuf>) -> Response {
    let Some(dir) = dir else { return Json(Vec::<Entry>::new()).into_response() };
    match tokio::task::spawn_blocking(move || entries(&dir)).await {
        Ok(Ok(found)) => Json(found.into_iter().map(|(e, _)| e).collect::<Vec<_>>()).into_response(),
        Ok(Err(e)) => failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, format!("listing checkpoints: {e}")),
    }
}

async fn download(dir: Option<PathBuf>, file: String) -> Response {
    let not_found = |file: &str| {
        failure(
            StatusCode::NOT_FOUND,
            format!("no checkpoint named {file:?}: ask GET /checkpoints for the files there are, and use one of those names"),
        )
    };
    let Some(dir) = dir else { return not_found(&file) };
    // The name is only compared with the listing's names, never joined to a path.
    let wanted = file.clone();
    let found = tokio::task::spawn_blocking(move || entries(&dir).map(|all| all.into_iter().find(|(e, _)| e.file == wanted))).await;
    let (entry, path) = match found {
        Ok(Ok(Some(hit))) => hit,
        Ok(Ok(None)) => return not_found(&file),
        Ok(Err(e)) => return failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, format!("finding {file}: {e}")),
    };
    // Opened once: a checkpoint pruned meanwhile stays readable through this handle until it is sent.
    let opened = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return not_found(&file),
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, format!("opening {file}: {e}")),
    };
    // Exactly the size announced: never more, even if the file were to grow.
    let reader = tokio::io::AsyncReadExt::take(opened, entry.bytes);
    let stream = futures::stream::unfold(reader, |mut reader| async move {
        let mut buf = vec![0u8; CHUNK];
        match tokio::io::AsyncReadExt::read(&mut reader, &mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), reader))
            }
            Err(e) => Some((Err(e), reader)),
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, entry.bytes)
        .header(header::CONTENT_DISPOSITION, format!("attachment; filename=\"{}\"", entry.file))
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| failure(StatusCode::INTERNAL_SERVER_ERROR, format!("answering with {file}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_complete_regular_checkpoints_are_listed() {
        let dir = std::env::temp_dir().join(format!("ws-serve-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let t: checkpoint::Tensors = vec![("layer.0.weight".into(), vec![1.0; 4])];
        checkpoint::write(&dir, 10, &t, "j", 5).unwrap();
        checkpoint::write(&dir, 20, &t, "j", 5).unwrap();
        std::fs::write(dir.join(".step-00000030.safetensors.tmp"), b"half").unwrap();
        std::fs::write(dir.join("notes.txt"), b"not a checkpoint").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", dir.join("step-00000040.safetensors")).unwrap();
        let found = entries(&dir).unwrap();
        let names: Vec<_> = found.iter().map(|(e, _)| (e.step, e.file.as_str())).collect();
        assert_eq!(names, vec![(20, "step-00000020.safetensors"), (10, "step-00000010.safetensors")]);
        assert_eq!(found[0].0.bytes, std::fs::metadata(dir.join("step-00000020.safetensors")).unwrap().len());
        assert!(entries(&dir.join("missing")).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).ok();
    }
}
