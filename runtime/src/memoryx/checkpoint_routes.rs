//! MemoryX's checkpoints over HTTPS, so a user gets the trained weights back from a volume inside an image
//! without a shell (`kubectl cp` cannot fetch them) and without any route to the volume but MemoryX itself.
//!
//! - `GET /checkpoints`: the complete checkpoints, newest first, as
//!   `[{"step":N,"file":"step-00000010.safetensors","bytes":B}]`; a sliced one (several weight servers) as its
//!   manifest with its slices, `{"step":N,"file":"step-00000010.manifest.json","bytes":B,"slices":[{"file":
//!   "step-00000010.slice-0-of-3.safetensors","bytes":B0}, …]}`, listed only when every slice is there.
//!   Temporary files of a write in progress are never listed: a file is renamed into its listed name only once
//!   it is whole and synced, and a manifest is written after its slices.
//! - `GET /checkpoints/{file}`: one file's bytes, streamed from disk in chunks (a checkpoint may be larger than
//!   MemoryX can spare twice in memory), with its length announced up front.
//!
//! Both are protected routes (the job's or the operator's certificate, like `/status`). The requested name is
//! never used as a path: it is looked up among the names the listing itself produced, so `..`, slashes,
//! symbolic links, temporary files or anything else in (or out of) the directory are answered `404`.

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::Path as UrlPath;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::checkpoint;
use super::manifest;
use super::slice::SliceId;

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
    /// A sliced checkpoint's slices, in server order (`file` is then its manifest); empty for one file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<SliceFile>,
}

/// One slice of a sliced checkpoint as the listing names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceFile {
    /// Its file name, which `GET /checkpoints/{file}` answers to.
    pub file: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// A regular file's name and size (not a symbolic link placed under a checkpoint's name).
pub(crate) fn regular(path: &Path) -> Option<(String, u64)> {
    let meta = std::fs::symlink_metadata(path).ok().filter(std::fs::Metadata::is_file)?;
    Some((path.file_name()?.to_str()?.to_string(), meta.len()))
}

/// The complete checkpoints in `dir`, newest first, with the path of every file they list (the manifest and
/// slices of a sliced one): regular files only, each with its size. A manifest whose slices are not all there
/// (or unreadable) is left out. A missing directory (no checkpoint written yet) lists nothing.
pub fn entries(dir: &Path) -> errors::Result<Vec<(Entry, Vec<PathBuf>)>> {
    let mut found: Vec<(Entry, Vec<PathBuf>)> = checkpoint::list(dir)?
        .into_iter()
        .filter_map(|(step, path)| {
            let (file, bytes) = regular(&path)?;
            Some((Entry { step, file, bytes, slices: Vec::new() }, vec![path]))
        })
        .collect();
    for (step, path) in manifest::list(dir)? {
        let (Some((file, bytes)), Ok(m)) = (regular(&path), manifest::read_manifest(&path)) else { continue };
        let count = m.slices.len() as u32;
        let mut paths = vec![path];
        let slices: Option<Vec<SliceFile>> = (0..count)
            .map(|index| {
                let p = manifest::slice_path(&manifest::slice_dir(dir, index), step, SliceId { index, count });
                let (file, bytes) = regular(&p)?;
                paths.push(p);
                Some(SliceFile { file, bytes })
            })
            .collect();
        if let Some(slices) = slices.filter(|s| m.step == step && !s.is_empty()) {
            found.push((Entry { step, file, bytes, slices }, paths));
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0.step));
    Ok(found)
}

/// The file the listing names `name` (a checkpoint, a manifest or a slice), with its listed size.
fn listed(dir: &Path, name: &str) -> errors::Result<Option<(PathBuf, u64)>> {
    for (entry, paths) in entries(dir)? {
        let sizes = std::iter::once((&entry.file, entry.bytes)).chain(entry.slices.iter().map(|s| (&s.file, s.bytes)));
        for ((file, bytes), path) in sizes.zip(paths) {
            if file == name {
                return Ok(Some((path, bytes)));
            }
        }
    }
    Ok(None)
}

/// The routes for the checkpoints in `dir` (none configured: an empty list, and every file `404`), to be
/// merged into MemoryX's protected routes.
pub fn routes(dir: Option<PathBuf>) -> Router {
    let (list_dir, file_dir) = (dir.clone(), dir);
    Router::new()
        .route("/checkpoints", get(move || list(list_dir.clone())))
        .route("/checkpoints/{file}", get(move |UrlPath(file): UrlPath<String>| download(file_dir.clone(), file)))
}

pub(crate) fn failure(status: StatusCode, message: String) -> Response {
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
            format!(
                "no checkpoint named {file:?}: ask GET /checkpoints for the files there are, and use one of those names"
            ),
        )
    };
    let Some(dir) = dir else { return not_found(&file) };
    // The name is only compared with the listing's names, never joined to a path.
    let wanted = file.clone();
    let found = tokio::task::spawn_blocking(move || listed(&dir, &wanted)).await;
    let (path, bytes) = match found {
        Ok(Ok(Some(hit))) => hit,
        Ok(Ok(None)) => return not_found(&file),
        Ok(Err(e)) => return failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, format!("finding {file}: {e}")),
    };
    send_file(&path, bytes, &file, not_found).await
}

/// The listed file at `path` as a response: streamed from disk in chunks, exactly `bytes` long (its listed size,
/// never more, even if the file were to grow), `not_found` if it went meanwhile. Opened once: a file pruned
/// meanwhile stays readable through this handle until it is sent.
pub(crate) async fn send_file(path: &Path, bytes: u64, file: &str, not_found: impl Fn(&str) -> Response) -> Response {
    let opened = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return not_found(file),
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, format!("opening {file}: {e}")),
    };
    let reader = tokio::io::AsyncReadExt::take(opened, bytes);
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
        .header(header::CONTENT_LENGTH, bytes)
        .header(header::CONTENT_DISPOSITION, format!("attachment; filename=\"{file}\""))
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
        // A sliced checkpoint is listed with its slices once its manifest names them all; each is downloadable.
        let m = |step: u64| manifest::Manifest {
            step,
            job: "j".into(),
            uid: None,
            model: None,
            seed: 0,
            slices: vec![0, 0],
        };
        for i in 0..2 {
            std::fs::create_dir_all(manifest::slice_dir(&dir, i)).unwrap();
            std::fs::write(
                manifest::slice_path(&manifest::slice_dir(&dir, i), 30, SliceId { index: i, count: 2 }),
                b"slice",
            )
            .unwrap();
        }
        manifest::write_manifest(&dir, &m(30), 5).unwrap();
        manifest::write_manifest(&dir, &m(40), 5).unwrap();
        let found = entries(&dir).unwrap();
        let listed_steps: Vec<u64> = found.iter().map(|(e, _)| e.step).collect();
        assert_eq!(listed_steps, vec![30, 20, 10], "step 40's slices are missing, so it is not listed");
        let files: Vec<&str> = found[0].0.slices.iter().map(|s| s.file.as_str()).collect();
        assert_eq!(files, vec!["step-00000030.slice-0-of-2.safetensors", "step-00000030.slice-1-of-2.safetensors"]);
        let (path, bytes) = listed(&dir, "step-00000030.slice-1-of-2.safetensors").unwrap().unwrap();
        assert_eq!((path, bytes), (dir.join("server-1/step-00000030.slice-1-of-2.safetensors"), 5));
        assert!(listed(&dir, "server-1/step-00000030.slice-1-of-2.safetensors").unwrap().is_none());
        std::fs::remove_dir_all(&dir).ok();
    }
}
