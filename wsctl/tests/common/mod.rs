//! What every `wsctl` test file needs: the repository, the binary, a fresh scratch folder.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root: examples' relative data paths are resolved from here.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `wsctl` from the repository root and waits for it.
pub fn wsctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wsctl")).args(args).current_dir(repo()).output().expect("wsctl starts")
}

/// An empty folder of its own for one test (`kind` keeps test files apart, `name` tests within one), removed
/// when its [`Scratch`] is dropped, unless that happens while the test panics (then it is kept for the reader).
pub fn scratch(kind: &str, name: &str) -> Scratch {
    // One folder, not a tree: a name with slashes (an example's path) would leave its parents behind.
    let name = name.replace('/', "_");
    let dir = std::env::temp_dir().join(format!("wsctl-{kind}-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).expect("scratch dir");
    Scratch(dir)
}

/// A test's scratch folder (a path to it, by `Deref`): every run would otherwise leave its checkpoints and logs
/// behind, and a machine that runs the suite often fills its disk.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            std::fs::remove_dir_all(&self.0).ok();
        }
    }
}

/// The TLS identity of the job whose manifest is `job`: issued once into `identity/` beside it (all five
/// files, the operator's too), so every process a test starts for that job shares it.
pub fn identity(job: &Path) -> PathBuf {
    let dir = job.parent().expect("a job file in a folder").join("identity");
    if !dir.join(wire::identity::CA_CERT).exists() {
        let issued = wire::identity::issue("test", &[]).expect("an identity");
        issued.write_roles_files(&dir).expect("identity files");
        for (name, text) in issued.files() {
            std::fs::write(dir.join(name), text).expect("identity file");
        }
    }
    dir
}

/// The CA certificate of `job`'s identity.
pub fn ca(job: &Path) -> String {
    std::fs::read_to_string(identity(job).join(wire::identity::CA_CERT)).expect("ca.crt")
}

/// One HTTP/1.1 request over TLS to `addr`, trusting `ca` and presenting `client` (certificate and key PEM)
/// if given; the whole answer (status line, headers, body), or why the exchange failed.
pub fn https(method: &str, addr: &str, path: &str, ca: &str, client: Option<(&str, &str)>) -> Result<String, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.expect("a CA certificate")).expect("a usable CA");
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes()).map(|c| c.expect("cert")).collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key"),
            )
            .expect("client identity"),
        None => builder.with_no_client_auth(),
    };
    let name = rustls_pki_types::ServerName::try_from(wire::identity::SERVER_NAME).expect("name");
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).map_err(|e| e.to_string())?;
    let tcp = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(tls, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    match tls.read_to_string(&mut answer) {
        Ok(_) => Ok(answer),
        // Servers may close without a TLS close_notify after a complete answer.
        Err(e) if !answer.is_empty() && e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(answer),
        Err(e) => Err(e.to_string()),
    }
}

/// `wsctl run JOB --out OUT EXTRA…` from the repository root.
pub fn run(job: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wsctl"))
        .arg("run")
        .arg(job)
        .arg("--out")
        .arg(out)
        .args(extra)
        .current_dir(repo())
        .output()
        .expect("wsctl runs")
}

/// [`run`], which must succeed.
pub fn run_ok(job: &Path, out: &Path, extra: &[&str]) {
    let o = run(job, out, extra);
    assert!(o.status.success(), "wsctl run {} {extra:?}: {}", job.display(), String::from_utf8_lossy(&o.stderr));
}

/// Each step's loss as the run recorded it: compared with `==`, so equal means bit for bit.
pub fn losses(out: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            (v["step"].as_u64().expect("step"), v["loss"].as_f64().expect("loss"))
        })
        .collect()
}

/// The run's `summary.json`.
pub fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary.json")).expect("json")
}

/// Processes still running with a file under `dir` on their command line: what a run must not leave behind.
pub fn processes_under(dir: &Path) -> Vec<String> {
    let out = Command::new("pgrep").arg("-fa").arg(dir.to_str().expect("a UTF-8 path")).output().expect("pgrep");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}
