//! The job's identity on the wire: mutual TLS between its roles, and between the operator and MemoryX.
//!
//! Every job gets its own certificate authority, made when the job is first assembled (by the operator, into a
//! Secret; by `wsctl run`, into the run's directory) and forgotten at once: its key is never stored, so no
//! further certificate of that job can ever be issued. The CA signs two certificates:
//! - the *job's* (`tls.crt`/`tls.key`), shared by all of the job's pods: every gRPC server presents it and
//!   requires it of its clients, every gRPC client presents it;
//! - the *operator's* (`operator.crt`/`operator.key`), a client certificate the operator keeps to itself (the
//!   pods mount only [`MOUNTED`]) and presents to MemoryX's `/status` and `/checkpoint`.
//!
//! Trusting exactly one job's CA is what tells jobs apart: a peer holding another job's certificate fails the
//! handshake, on gRPC and on HTTP alike. Server names are checked too: every certificate carries
//! [`SERVER_NAME`], which gRPC clients ask for whatever address they dial, plus the addresses the issuer names
//! (Service names for the operator's HTTP calls, loopback for local runs).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use errors::{Error, Result};

/// The CA's certificate: what every role trusts, and nothing else.
pub const CA_CERT: &str = "ca.crt";
/// The job's certificate, presented by every role as server and as client.
pub const CERT: &str = "tls.crt";
/// The job certificate's private key.
pub const KEY: &str = "tls.key";
/// The operator's client certificate (kept by the operator, never mounted into the job's pods).
pub const OPERATOR_CERT: &str = "operator.crt";
/// The operator certificate's private key.
pub const OPERATOR_KEY: &str = "operator.key";
/// The files a role reads from its identity directory.
pub const MOUNTED: [&str; 3] = [CA_CERT, CERT, KEY];
/// The name every job certificate carries and every gRPC client verifies, whatever address it dials: the CA,
/// not the name, is what distinguishes one job from another.
pub const SERVER_NAME: &str = "job.weightstream.internal";
/// The largest identity file read: a PEM certificate or key is a few KiB, so more is not an identity.
const MAX_PEM_BYTES: u64 = 64 << 10;

/// A certificate and its key, PEM-encoded.
#[derive(Clone, Debug)]
pub struct CertifiedPem {
    /// The certificate.
    pub cert: String,
    /// Its private key (PKCS#8).
    pub key: String,
}

/// What [`issue`] makes: the CA's certificate and the two certificates it signed. The CA's key is not here: it
/// is dropped inside [`issue`].
#[derive(Clone, Debug)]
pub struct Issued {
    /// The CA certificate.
    pub ca: String,
    /// The job's certificate (server and client).
    pub job: CertifiedPem,
    /// The operator's client certificate.
    pub operator: CertifiedPem,
}

fn tls_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Identity(format!("{what}: {e}"))
}

/// Issues a fresh identity for the job `job`, whose certificate also names `names` (DNS names, wildcards such
/// as `*.svc.ns.svc`, or IP addresses) besides [`SERVER_NAME`], `localhost` and `127.0.0.1`.
pub fn issue(job: &str, names: &[String]) -> Result<Issued> {
    let e = |what| move |e: rcgen::Error| tls_error(what, e);
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(e("CA parameters"))?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.distinguished_name.push(DnType::CommonName, format!("weightstream job {job} CA"));
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(e("CA key"))?)
        .map_err(e("CA certificate"))?;

    let mut sans = vec![SERVER_NAME.to_string(), "localhost".to_string(), "127.0.0.1".to_string()];
    sans.extend(names.iter().cloned());
    let leaf = |cn: String, sans: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| -> Result<CertifiedPem> {
        let mut params = CertificateParams::new(sans).map_err(e("certificate parameters"))?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages;
        let key = KeyPair::generate().map_err(e("key"))?;
        let cert = params.signed_by(&key, &ca).map_err(e("certificate"))?;
        Ok(CertifiedPem { cert: cert.pem(), key: key.serialize_pem() })
    };
    use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let job_pem = leaf(format!("weightstream job {job}"), sans, vec![ServerAuth, ClientAuth])?;
    let operator = leaf("weightstream-operator".into(), vec![], vec![ClientAuth])?;
    Ok(Issued { ca: ca.pem(), job: job_pem, operator })
}

impl Issued {
    /// Every file of the identity with its content: the operator's Secret holds them all.
    pub fn files(&self) -> [(&'static str, &str); 5] {
        [
            (CA_CERT, &self.ca),
            (CERT, &self.job.cert),
            (KEY, &self.job.key),
            (OPERATOR_CERT, &self.operator.cert),
            (OPERATOR_KEY, &self.operator.key),
        ]
    }

    /// The identity the job's roles use.
    pub fn job_identity(&self) -> Identity {
        Identity::from_pem(&self.ca, &self.job.cert, &self.job.key)
    }

    /// The identity the operator (or a local supervisor) uses to call MemoryX.
    pub fn operator_identity(&self) -> Identity {
        Identity::from_pem(&self.ca, &self.operator.cert, &self.operator.key)
    }

    /// Writes the roles' files ([`MOUNTED`]) into `dir`, readable by the owner only: a local run's identity.
    pub fn write_roles_files(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        for (name, text) in self.files().into_iter().filter(|(n, _)| MOUNTED.contains(n)) {
            let path = dir.join(name);
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&path).map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
            f.write_all(text.as_bytes()).map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        }
        Ok(())
    }
}

/// A role's (or the operator's) identity: the CA it trusts and the certificate it presents.
#[derive(Clone)]
pub struct Identity {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Identity { .. }")
    }
}

fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| {
        Error::Identity(format!(
            "cannot read {}: {e}; every role needs the job's identity (ca.crt, tls.crt, tls.key) in the --identity directory",
            path.display()
        ))
    })?;
    let mut buf = Vec::new();
    f.take(MAX_PEM_BYTES + 1).read_to_end(&mut buf).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if buf.len() as u64 > MAX_PEM_BYTES {
        return Err(Error::Identity(format!(
            "{} is larger than {MAX_PEM_BYTES} bytes: not a certificate or key",
            path.display()
        )));
    }
    Ok(buf)
}

/// ring's cryptography, its suites as they are with AES-128-GCM moved first: TLS 1.3's mandatory suite, and the
/// cheapest per byte streamed on processors with AES instructions (the 256-bit suite does 40% more rounds for no
/// gain a job's data needs). The TLS 1.2 suites stay for clients that speak only 1.2.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::{cipher_suite, default_provider};
    let mut provider = default_provider();
    let first = cipher_suite::TLS13_AES_128_GCM_SHA256.suite();
    provider.cipher_suites.sort_by_key(|s| s.suite() != first);
    Arc::new(provider)
}

impl Identity {
    /// The identity from PEM texts.
    pub fn from_pem(ca: &str, cert: &str, key: &str) -> Identity {
        Identity { ca: ca.as_bytes().to_vec(), cert: cert.as_bytes().to_vec(), key: key.as_bytes().to_vec() }
    }

    /// Reads `ca.crt`, `tls.crt` and `tls.key` from `dir` (a mounted Secret, or a local run's directory) and
    /// checks that they make a usable identity, so a role with a broken one fails at start, saying which file.
    pub fn load(dir: &Path) -> Result<Identity> {
        let id = Identity {
            ca: read_bounded(&dir.join(CA_CERT))?,
            cert: read_bounded(&dir.join(CERT))?,
            key: read_bounded(&dir.join(KEY))?,
        };
        id.server_config(false)?;
        Ok(id)
    }

    fn roots(&self) -> Result<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&self.ca) {
            let c = c.map_err(|e| tls_error(CA_CERT, e))?;
            roots.add(c).map_err(|e| tls_error(CA_CERT, e))?;
        }
        if roots.is_empty() {
            return Err(Error::Identity(format!("{CA_CERT} holds no certificate")));
        }
        Ok(roots)
    }

    fn chain(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        let chain: Vec<_> =
            CertificateDer::pem_slice_iter(&self.cert).collect::<Result<_, _>>().map_err(|e| tls_error(CERT, e))?;
        if chain.is_empty() {
            return Err(Error::Identity(format!("{CERT} holds no certificate")));
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| tls_error(KEY, e))?;
        Ok((chain, key))
    }

    /// A rustls server configuration that trusts only this job's CA. With `optional_clients`, a client without
    /// a certificate may connect (for `/healthz` probes); a client with a certificate of another CA never can.
    pub fn server_config(&self, optional_clients: bool) -> Result<rustls::ServerConfig> {
        let mut config = self.server(optional_clients, rustls::DEFAULT_VERSIONS, provider())?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// The server configuration of a gRPC connection ([`crate::tls::record`]): TLS 1.3 only, every client
    /// presenting the job's certificate, HTTP/2, no session tickets (a role's clients keep their connections),
    /// and its traffic secrets handed to the record layer after the handshake.
    pub fn grpc_server_config(&self) -> Result<rustls::ServerConfig> {
        let mut config = self.server(false, &[&rustls::version::TLS13], provider())?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.send_tls13_tickets = 0;
        config.enable_secret_extraction = true;
        Ok(config)
    }

    fn server(
        &self,
        optional_clients: bool,
        versions: &[&'static rustls::SupportedProtocolVersion],
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<rustls::ServerConfig> {
        let builder =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(self.roots()?), provider.clone());
        let builder = if optional_clients { builder.allow_unauthenticated() } else { builder };
        let verifier = builder.build().map_err(|e| tls_error("client verifier", e))?;
        let (chain, key) = self.chain()?;
        rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(|e| tls_error("TLS versions", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| tls_error("certificate and key", e))
    }

    /// A rustls client configuration that trusts only this job's CA and presents this identity: for HTTP clients
    /// (the operator's calls to MemoryX).
    pub fn client_config(&self) -> Result<rustls::ClientConfig> {
        self.client(rustls::DEFAULT_VERSIONS, provider())
    }

    /// The client configuration of a gRPC connection ([`crate::tls::record`]): TLS 1.3 only, HTTP/2, and its
    /// traffic secrets handed to the record layer after the handshake.
    pub fn grpc_client_config(&self) -> Result<rustls::ClientConfig> {
        let mut config = self.client(&[&rustls::version::TLS13], provider())?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.enable_secret_extraction = true;
        Ok(config)
    }

    fn client(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<rustls::ClientConfig> {
        let (chain, key) = self.chain()?;
        rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(|e| tls_error("TLS versions", e))?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(chain, key)
            .map_err(|e| tls_error("certificate and key", e))
    }
}

/// rustls' own configurations for the peer of a record-layer connection in its tests: TLS 1.3 with `suite`
/// only, so either side of a handshake with them negotiates it; the server answers `h2` as the roles' do.
#[cfg(test)]
pub(crate) fn rustls_peer(
    id: &Identity,
    suite: rustls::SupportedCipherSuite,
) -> Result<(rustls::ServerConfig, rustls::ClientConfig)> {
    let mut one = rustls::crypto::ring::default_provider();
    one.cipher_suites = vec![suite];
    let one = Arc::new(one);
    let mut server = id.server(false, &[&rustls::version::TLS13], one.clone())?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    let mut client = id.client(&[&rustls::version::TLS13], one)?;
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok((server, client))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_identities_load_and_build_every_configuration() {
        let issued = issue("mnist", &["mnist-memoryx.ml.svc".into(), "*.mnist-engine.ml.svc".into()]).unwrap();
        let dir = std::env::temp_dir().join(format!("ws-identity-{}", std::process::id()));
        issued.write_roles_files(&dir).unwrap();
        let id = Identity::load(&dir).unwrap();
        id.server_config(true).unwrap();
        id.client_config().unwrap();
        id.grpc_server_config().unwrap();
        id.grpc_client_config().unwrap();
        issued.operator_identity().client_config().unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join(KEY)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the key must not be readable by others");
        }
        assert!(!dir.join(OPERATOR_KEY).exists(), "the operator's key is not a role's file");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_or_bogus_identity_is_refused_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("ws-identity-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = Identity::load(&dir).unwrap_err().to_string();
        assert!(err.contains("ca.crt") && err.contains("--identity"), "{err}");
        for f in MOUNTED {
            std::fs::write(dir.join(f), "not a pem").unwrap();
        }
        let err = Identity::load(&dir).unwrap_err().to_string();
        assert!(err.contains("ca.crt"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
