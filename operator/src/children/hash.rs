//! The stable hashes by which a changed pod spec or configuration is told from an unchanged one.

use k8s_openapi::api::core::v1::PodSpec;

use crate::Error;

/// A stable hash (FNV-1a over the JSON) of a pod spec: the same spec hashes the same in every operator build,
/// so an operator upgrade does not replace running pods.
pub fn spec_hash(spec: &PodSpec) -> Result<String, Error> {
    let json = serde_json::to_vec(spec).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(fnv(&json))
}

/// FNV-1a of `bytes`, as 16 hex digits.
pub(crate) fn fnv(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}
