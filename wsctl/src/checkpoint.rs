//! `wsctl checkpoint list|pull`: a job's checkpoints fetched from MemoryX over HTTPS with the job's identity,
//! so the trained weights come back to the user from a volume nobody else can read.
//!
//! [`list`] and [`pull`] take any base URL (`https://HOST:PORT`) and any [`Identity`]: a local run's MemoryX on
//! loopback, a port-forward through the API server to a cluster job's MemoryX pod with the identity read
//! from the job's Secret, or one to the reader pod of a deleted job's retained claim with the identity issued
//! for that pod. Whatever the address, the server must prove it holds a certificate of the job's CA
//! for [`SERVER_NAME`], which every job certificate carries: the address only says where to connect.
//!
//! Nothing the server sends is trusted beyond what it can be checked against: the listing is bounded and its
//! names must be checkpoint names (never a path), a download is bounded by the size the listing announced (and
//! by the job's plan when the job is known), and the file lands in the output folder only after its checksum
//! verified, by rename from a temporary file, so a failed pull leaves nothing half-written behind. A sliced
//! checkpoint (a job on several weight servers) arrives as its manifest and slices, each checked against the
//! manifest's checksums, and lands joined as one checkpoint file: the same kind a one-server job gives, which
//! `wsctl export`, `wsctl generate` and a resume on any number of servers read.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use runtime::memoryx::checkpoint;
use runtime::memoryx::checkpoint_routes::Entry;
use runtime::memoryx::manifest;
use wire::identity::{Identity, SERVER_NAME};

/// Most bytes of a `GET /checkpoints` answer read: a listing of thousands of checkpoints is a few hundred KiB,
/// so more is not a listing.
const MAX_LIST_BYTES: usize = 1 << 20;
/// Most bytes of an error message read from the server.
const MAX_MESSAGE_BYTES: usize = 4 << 10;
/// How long connecting to MemoryX may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the listing may take in all, and how long a download may wait for its next chunk.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Where to connect for `base`, and the URL prefix that asks for [`SERVER_NAME`] there.
struct Target {
    addr: SocketAddr,
    prefix: String,
}

async fn target(base: &str) -> Result<Target> {
    let url = reqwest::Url::parse(base).with_context(|| format!("{base:?} is not a URL; give https://HOST:PORT"))?;
    if url.scheme() != "https" {
        bail!("{base}: MemoryX speaks HTTPS only; give https://HOST:PORT");
    }
    let port = url.port_or_known_default().unwrap_or(443);
    let host = url.host_str().ok_or_else(|| anyhow!("{base} names no host; give https://HOST:PORT"))?;
    let addr = match host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::from((ip, port)),
        Err(_) => {
            let mut found = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((host, port)))
                .await
                .map_err(|_| anyhow!("{base}: looking up {host} timed out"))?
                .with_context(|| format!("{base}: cannot look up {host}"))?;
            found.next().ok_or_else(|| anyhow!("{base}: {host} has no address"))?
        }
    };
    Ok(Target { addr, prefix: format!("https://{SERVER_NAME}:{port}") })
}

/// A client that trusts only the job's CA, presents the job's certificate and reaches [`SERVER_NAME`] at `addr`.
fn client(identity: &Identity, addr: SocketAddr) -> Result<reqwest::Client> {
    let tls = identity.client_config()?;
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .https_only(true)
        .resolve(SERVER_NAME, addr)
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(IDLE_TIMEOUT)
        .build()
        .context("cannot build the HTTPS client")
}

/// Reads at most `max` bytes of `response`'s body, failing on more; each chunk within [`IDLE_TIMEOUT`].
async fn body_bounded(mut response: reqwest::Response, max: usize, what: &str) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = next_chunk(&mut response, what).await? {
        if body.len() + chunk.len() > max {
            bail!("{what} is larger than {max} bytes");
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

async fn next_chunk(response: &mut reqwest::Response, what: &str) -> Result<Option<bytes::Bytes>> {
    tokio::time::timeout(IDLE_TIMEOUT, response.chunk())
        .await
        .map_err(|_| anyhow!("{what}: nothing arrived for {}s", IDLE_TIMEOUT.as_secs()))?
        .with_context(|| format!("{what}: the transfer failed"))
}

/// Fails with the server's own words when `response` is not a success: `401` means the identity is not the
/// job's, `404` an unknown checkpoint.
async fn check(response: reqwest::Response, what: &str) -> Result<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let message =
        body_bounded(response, MAX_MESSAGE_BYTES, what).await.map(|b| String::from_utf8_lossy(&b).trim().to_string());
    let message = message.unwrap_or_default();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        bail!(
            "{what}: MemoryX refused the identity ({status}: {message}); give the job's identity (ca.crt, tls.crt, tls.key)"
        );
    }
    bail!("{what}: {status}: {message}")
}

/// Whether `d` is the decimal digits of `n`, and nothing else.
fn digits_of(d: &str, n: u64) -> bool {
    !d.is_empty() && d.len() <= 20 && d.bytes().all(|b| b.is_ascii_digit()) && d.parse() == Ok(n)
}

/// Whether `name` is a checkpoint file's name of step `step` as MemoryX writes them: `step-` digits
/// `.safetensors` (one file) or `.manifest.json` (a sliced checkpoint's manifest), nothing else (no separator,
/// no dot-dot), so it can be joined to the output folder safely.
fn valid_name(name: &str, step: u64) -> bool {
    let Some(rest) = name.strip_prefix("step-") else { return false };
    let digits = rest.strip_suffix(".safetensors").or_else(|| rest.strip_suffix(".manifest.json"));
    digits.is_some_and(|d| digits_of(d, step))
}

/// Whether `name` is slice `index` of `count` of the checkpoint of `step`: `step-` digits `.slice-I-of-K.safetensors`.
fn valid_slice_name(name: &str, step: u64, index: usize, count: usize) -> bool {
    let Some(rest) = name.strip_prefix("step-").and_then(|r| r.strip_suffix(".safetensors")) else { return false };
    let Some((d, slice)) = rest.split_once(".slice-") else { return false };
    let Some((i, k)) = slice.split_once("-of-") else { return false };
    digits_of(d, step) && digits_of(i, index as u64) && digits_of(k, count as u64)
}

/// The JSON listing MemoryX at `base` answers on `GET /{route}` to `identity`, at most [`MAX_LIST_BYTES`].
pub(crate) async fn get_listing<T: serde::de::DeserializeOwned>(
    base: &str,
    identity: &Identity,
    route: &str,
) -> Result<T> {
    let body = get_bounded(base, identity, route, MAX_LIST_BYTES).await?;
    serde_json::from_slice(&body).with_context(|| format!("GET {base}/{route}: not a listing of {route}"))
}

/// The body of `GET {base}/{route}` (at most `max` bytes, else an error), asked with `identity`.
pub(crate) async fn get_bounded(base: &str, identity: &Identity, route: &str, max: usize) -> Result<Vec<u8>> {
    let target = target(base).await?;
    let what = format!("GET {base}/{route}");
    let http = client(identity, target.addr)?;
    let response = tokio::time::timeout(IDLE_TIMEOUT, http.get(format!("{}/{route}", target.prefix)).send())
        .await
        .map_err(|_| anyhow!("{what}: no answer within {}s", IDLE_TIMEOUT.as_secs()))?
        .with_context(|| format!("{what}: cannot reach MemoryX"))?;
    body_bounded(check(response, &what).await?, max, &what).await
}

/// The checkpoints MemoryX at `base` holds, newest first, asked with `identity`.
pub async fn list(base: &str, identity: &Identity) -> Result<Vec<Entry>> {
    let what = format!("GET {base}/checkpoints");
    let entries: Vec<Entry> = get_listing(base, identity, "checkpoints").await?;
    if let Some(bad) = entries.iter().find(|e| !valid_name(&e.file, e.step)) {
        bail!(
            "{what}: the listing names {:?} for step {}, not a checkpoint file name; refusing it",
            bad.file,
            bad.step
        );
    }
    for e in &entries {
        let n = e.slices.len();
        if n > crds::MAX_SERVERS as usize || e.file.ends_with(".manifest.json") != (n > 0) {
            bail!("{what}: the listing gives {} with {n} slices; refusing it", e.file);
        }
        if let Some((i, bad)) = e.slices.iter().enumerate().find(|(i, s)| !valid_slice_name(&s.file, e.step, *i, n)) {
            bail!(
                "{what}: the listing names {:?} as slice {i} of step {}, not a slice's name; refusing it",
                bad.file,
                e.step
            );
        }
    }
    Ok(entries)
}

/// The most bytes a checkpoint of the job `spec` can take: its plan's state size.
pub fn planned_bytes(spec: &crds::TrainingJobSpec) -> u64 {
    plan::limits::Limits::for_spec(spec).state_bytes()
}

/// Fetches the checkpoint of `step` (the newest without one) from MemoryX at `base` into `out_dir` and returns
/// its path. The download is bounded by the size the listing announced and, when given, by `max_bytes` (the
/// job's [`planned_bytes`]): both before it starts and while it runs. It goes to a temporary file in `out_dir`,
/// is verified (checksum) and only then renamed to the checkpoint's name; on any failure the temporary file is
/// removed.
pub async fn pull(
    base: &str,
    identity: &Identity,
    step: Option<u64>,
    out_dir: &Path,
    max_bytes: Option<u64>,
) -> Result<PathBuf> {
    let entries = list(base, identity).await?;
    let entry = match step {
        Some(s) => entries.iter().find(|e| e.step == s).ok_or_else(|| {
            let steps: Vec<String> = entries.iter().map(|e| e.step.to_string()).collect();
            anyhow!("MemoryX at {base} has no checkpoint of step {s}; it has steps [{}]", steps.join(", "))
        })?,
        None => entries.first().ok_or_else(|| {
            anyhow!(
                "MemoryX at {base} has no checkpoint yet; a job writes them every spec.checkpoint.intervalSteps steps"
            )
        })?,
    }
    .clone();
    let total = entry.bytes + entry.slices.iter().map(|s| s.bytes).sum::<u64>();
    if let Some(max) = max_bytes.filter(|&max| total > max) {
        bail!(
            "{} is {total} bytes, more than the {max} bytes the job's plan allows for its state; refusing it",
            entry.file
        );
    }
    std::fs::create_dir_all(out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    if !entry.slices.is_empty() {
        return pull_sliced(base, identity, &entry, out_dir, max_bytes.unwrap_or(total)).await;
    }
    let tmp = out_dir.join(format!(".{}.{}.part", entry.file, std::process::id()));
    let result = download(base, identity, ("checkpoints", &entry.file), (entry.bytes, Listed::Exact), &tmp)
        .await
        .and_then(|()| {
            checkpoint::read(&tmp, entry.bytes)
                .with_context(|| format!("{} arrived damaged; nothing was kept", entry.file))?;
            let path = out_dir.join(&entry.file);
            std::fs::rename(&tmp, &path)
                .with_context(|| format!("cannot move the checkpoint to {}", path.display()))?;
            Ok(path)
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Fetches the sliced checkpoint `entry` (its manifest and every slice, into a temporary folder laid out as
/// MemoryX lays it out), checks every slice against the manifest, and writes the state joined into one
/// checkpoint file in `out_dir`, recording the job, model and seed the manifest names. The temporary folder is
/// removed whatever happens.
async fn pull_sliced(
    base: &str,
    identity: &Identity,
    entry: &Entry,
    out_dir: &Path,
    max_bytes: u64,
) -> Result<PathBuf> {
    let staging = out_dir.join(format!(".{}.{}.part", entry.file, std::process::id()));
    let result = async {
        let manifest_path = staging.join(&entry.file);
        std::fs::create_dir_all(&staging).with_context(|| format!("cannot create {}", staging.display()))?;
        download(base, identity, ("checkpoints", &entry.file), (entry.bytes, Listed::Exact), &manifest_path).await?;
        let m = manifest::read_manifest(&manifest_path)?;
        if m.step != entry.step || m.slices.len() != entry.slices.len() {
            bail!(
                "{}: the manifest names step {} with {} slices; the listing said step {} with {}",
                entry.file,
                m.step,
                m.slices.len(),
                entry.step,
                entry.slices.len()
            );
        }
        for (i, slice) in entry.slices.iter().enumerate() {
            let dir = manifest::slice_dir(&staging, i as u32);
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            download(
                base,
                identity,
                ("checkpoints", &slice.file),
                (slice.bytes, Listed::Exact),
                &dir.join(&slice.file),
            )
            .await?;
        }
        let (m, tensors) = manifest::read_joined(&manifest_path, max_bytes)
            .with_context(|| format!("{} arrived damaged; nothing was kept", entry.file))?;
        let owner = checkpoint::Owner {
            job: &m.job,
            uid: m.uid.as_deref(),
            model: m.model.as_ref().map(|model| (model, m.seed)),
        };
        let bytes = checkpoint::encode(m.step, &tensors, &owner)?;
        drop(tensors);
        let joined = staging.join("joined.safetensors");
        std::fs::write(&joined, &bytes).with_context(|| format!("cannot write {}", joined.display()))?;
        checkpoint::read(&joined, bytes.len() as u64).context("the joined checkpoint does not read back")?;
        let path = checkpoint::path_for(out_dir, m.step);
        std::fs::rename(&joined, &path).with_context(|| format!("cannot move the checkpoint to {}", path.display()))?;
        Ok(path)
    }
    .await;
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// What a listed size promises of the file a download then gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listed {
    /// The file is whole and never changes (a checkpoint): exactly that many bytes, never more.
    Exact,
    /// The file only grows, by whole records (a run's records while it runs): its first that many bytes, the
    /// rest of a grown file left unread.
    Prefix,
}

/// Streams the listed file `file` (`bytes` long) of the listing at `/{route}` into `tmp`, never more than its
/// listed size.
pub(crate) async fn download(
    base: &str,
    identity: &Identity,
    (route, file): (&str, &str),
    (bytes, listed): (u64, Listed),
    tmp: &Path,
) -> Result<()> {
    use std::io::Write;
    let target = target(base).await?;
    let what = format!("GET {base}/{route}/{file}");
    let http = client(identity, target.addr)?;
    let response = tokio::time::timeout(IDLE_TIMEOUT, http.get(format!("{}/{route}/{file}", target.prefix)).send())
        .await
        .map_err(|_| anyhow!("{what}: no answer within {}s", IDLE_TIMEOUT.as_secs()))?
        .with_context(|| format!("{what}: cannot reach MemoryX"))?;
    let mut response = check(response, &what).await?;
    if listed == Listed::Exact && response.content_length().is_some_and(|n| n > bytes) {
        bail!("{what}: the server announces more bytes than the listing did ({bytes}); refusing it");
    }
    let file = std::fs::File::create(tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let mut received = 0u64;
    while received < bytes || listed == Listed::Exact {
        let Some(mut chunk) = next_chunk(&mut response, &what).await? else { break };
        let room = bytes - received;
        if chunk.len() as u64 > room {
            if listed == Listed::Exact {
                bail!("{what}: more than the {bytes} bytes announced; refusing it");
            }
            chunk.truncate(room as usize);
        }
        received += chunk.len() as u64;
        out.write_all(&chunk).with_context(|| format!("cannot write {}", tmp.display()))?;
    }
    if received != bytes {
        bail!("{what}: {received} of {bytes} bytes arrived");
    }
    let file = out.into_inner().map_err(|e| anyhow!("cannot write {}: {}", tmp.display(), e.error()))?;
    file.sync_all().with_context(|| format!("cannot write {}", tmp.display()))?;
    Ok(())
}

/// `wsctl checkpoint list`: prints the checkpoints as a table.
pub fn list_command(url: &str, identity_dir: &Path, json: bool) -> Result<()> {
    let identity = Identity::load(identity_dir)?;
    let entries = runtime_block_on(list(url, &identity))?;
    print!("{}", listing(&entries, json));
    Ok(())
}

/// The listing as `wsctl checkpoint list` prints it: the [`table`], or with `--json` the entries as JSON.
pub fn listing(entries: &[Entry], json: bool) -> String {
    if json {
        serde_json::to_string(entries).map(|s| s + "\n").unwrap_or_else(|e| format!("cannot encode the listing: {e}\n"))
    } else {
        table(entries)
    }
}

/// The checkpoints, one line each (a sliced one with its slices' bytes and count), as `wsctl checkpoint list`
/// prints them for a local run's MemoryX and for a cluster job's alike.
pub fn table(entries: &[Entry]) -> String {
    if entries.is_empty() {
        return "no checkpoints yet\n".into();
    }
    let line = |e: &Entry| {
        let bytes = e.bytes + e.slices.iter().map(|s| s.bytes).sum::<u64>();
        let how = if e.slices.is_empty() { String::new() } else { format!("  ({} slices)", e.slices.len()) };
        format!("{:>10}  {:>12}  {}{how}\n", e.step, errors::units::bytes(bytes), e.file)
    };
    entries.iter().map(line).collect()
}

/// `wsctl checkpoint pull`: fetches one checkpoint and prints where it went.
pub fn pull_command(
    url: &str,
    identity_dir: &Path,
    step: Option<u64>,
    out_dir: &Path,
    job: Option<&Path>,
) -> Result<()> {
    let identity = Identity::load(identity_dir)?;
    let max_bytes = match job {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            let job = crds::parse_training_job_with(&text, &runtime::memoryx::huggingface::resolve)
                .with_context(|| path.display().to_string())?;
            Some(planned_bytes(&job.spec))
        }
        None => None,
    };
    let path = runtime_block_on(pull(url, &identity, step, out_dir, max_bytes))?;
    println!("{}", path.display());
    Ok(())
}

pub(crate) fn runtime_block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(f)
}

#[cfg(test)]
mod tests {
    use runtime::memoryx::checkpoint_routes::{Entry, SliceFile};

    #[test]
    fn the_list_is_a_table_of_steps_sizes_and_files() {
        let e = Entry { step: 20, file: "step-00000020.safetensors".into(), bytes: 2048, slices: Vec::new() };
        let t = super::table(&[e]);
        assert_eq!(t.lines().count(), 1);
        assert!(t.trim_start().starts_with("20 ") && t.trim_end().ends_with("step-00000020.safetensors"), "{t}");
        assert_eq!(super::table(&[]), "no checkpoints yet\n");
        let slice = |i: u32| SliceFile { file: format!("step-00000030.slice-{i}-of-2.safetensors"), bytes: 1000 };
        let sliced =
            Entry { step: 30, file: "step-00000030.manifest.json".into(), bytes: 48, slices: vec![slice(0), slice(1)] };
        let t = super::table(&[sliced]);
        assert!(
            t.contains("2.0 KiB  step-00000030.manifest.json  (2 slices)"),
            "the manifest and its slices' bytes: {t}"
        );
    }

    #[test]
    fn only_checkpoint_names_are_accepted() {
        assert!(super::valid_name("step-00000010.safetensors", 10));
        for (bad, step) in [
            ("step-00000010.safetensors", 11),
            ("../step-00000010.safetensors", 10),
            ("step-/../10.safetensors", 10),
            ("step-.safetensors", 0),
            (".step-00000010.safetensors.tmp", 10),
            ("passwd", 0),
        ] {
            assert!(!super::valid_name(bad, step), "{bad}");
        }
        assert!(super::valid_name("step-00000010.manifest.json", 10));
        assert!(super::valid_slice_name("step-00000010.slice-2-of-3.safetensors", 10, 2, 3));
        for bad in [
            "step-00000010.slice-1-of-3.safetensors",
            "step-00000010.slice-2-of-4.safetensors",
            "step-10.slice-2-of-3/../x.safetensors",
            "server-2/step-00000010.slice-2-of-3.safetensors",
        ] {
            assert!(!super::valid_slice_name(bad, 10, 2, 3), "{bad}");
        }
    }
}
