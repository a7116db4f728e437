//! The job's TLS identity: the names its certificate carries, the Secret that holds it, and whether a Secret
//! found under the job's name is this very job's.

use std::collections::BTreeMap;

use crds::TrainingJob;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use super::metadata::meta;
use super::names;
use crate::Error;

/// Where every role finds the job's TLS identity (the per-job Secret's `ca.crt`, `tls.crt`, `tls.key`).
pub const IDENTITY_DIR: &str = "/var/run/weightstream/identity";

/// Annotation on the identity Secret naming the uid of the job it was issued for: a job recreated under the
/// same name gets a new identity, never its predecessor's.
pub const IDENTITY_UID_ANNOTATION: &str = "weightstream.dev/job-uid";

/// The names the job's certificate carries besides the fixed one: MemoryX's Service and every weight server's,
/// SwarmX node's, engine's and input worker's pod DNS name (the operator calls the coordinator by its pod's
/// name, the coordinator calls the other weight servers by theirs).
pub fn identity_names(job: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{}.{namespace}.svc", names::memoryx(job)),
        format!("*.{}.{namespace}.svc", names::memoryx(job)),
        format!("*.{}.{namespace}.svc", names::swarmx_service(job)),
        format!("*.{}.{namespace}.svc", names::engine_service(job)),
        format!("*.{}.{namespace}.svc", names::input_service(job)),
    ]
}

/// The job's identity Secret from freshly issued material (see [`wire::identity`]): every file, the
/// operator's client certificate among them; the pods mount only the roles' three files.
pub fn identity_secret(job: &TrainingJob, issued: &wire::identity::Issued) -> Result<Secret, Error> {
    let mut m = meta(job, names::identity(&job.name_any()), None)?;
    let uid = job.uid().ok_or(Error::MissingField("metadata.uid"))?;
    m.annotations = Some(BTreeMap::from([(IDENTITY_UID_ANNOTATION.to_string(), uid)]));
    Ok(Secret {
        metadata: m,
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(
            issued.files().into_iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect(),
        ),
        ..Default::default()
    })
}

/// Whether `secret` is the identity of this very job (same uid), not a leftover of a deleted namesake.
pub fn identity_belongs_to(secret: &Secret, job: &TrainingJob) -> bool {
    let uid = secret.annotations().get(IDENTITY_UID_ANNOTATION);
    uid.is_some() && uid.cloned() == job.uid()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::children::site::{memoryx_http, weight_server_address};
    use crds::contract::HTTP_PORT;

    /// The job's certificate names every weight server (the coordinator dials them by their pod names) and the
    /// operator polls the coordinator, server 0, by its own pod name.
    #[test]
    fn the_identity_covers_every_weight_server_and_the_operator_polls_server_0() {
        let names = identity_names("mnist", "ml");
        let covered = |host: &str| {
            names.iter().any(|n| match n.strip_prefix("*.") {
                Some(rest) => host.split_once('.').is_some_and(|(first, tail)| !first.is_empty() && tail == rest),
                None => n == host,
            })
        };
        for i in 0..5 {
            let url = weight_server_address("mnist", "ml", i);
            let host = url.trim_start_matches("https://").split(':').next().unwrap();
            assert!(covered(host), "{host} is not in {names:?}");
        }
        let http = memoryx_http("mnist", "ml");
        assert_eq!(http, format!("https://mnist-memoryx-0.mnist-memoryx.ml.svc:{HTTP_PORT}"));
        assert!(covered("mnist-memoryx-0.mnist-memoryx.ml.svc") && covered("mnist-memoryx.ml.svc"));
    }
}
