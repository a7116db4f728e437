//! What the operator knows beyond the job itself when it builds children: its defaults, the pool's resource,
//! and the operator's own pods, which every job's NetworkPolicy admits.

use std::collections::BTreeMap;

use crate::Error;

/// What the operator knows beyond the job itself when it builds children.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The data-plane image when the job does not name one.
    pub default_image: String,
    /// Children per SwarmX node.
    pub fan_out: u32,
    /// Whether nodes advertise `weightstream.dev/cs2`, so engine pods may request it (a pod requesting a
    /// resource no node has would never schedule).
    pub request_cs2: bool,
    /// The operator's own pods, which every job's NetworkPolicy admits (the operator polls MemoryX).
    pub operator: OperatorPeer,
}

/// Where the operator's own pods run and the labels they carry: the chart passes both (the namespace through
/// the downward API, the labels rendered from the same helper that labels its Deployment's pods), so a job's
/// NetworkPolicy admits exactly the operator that manages it.
#[derive(Clone, Debug, PartialEq)]
pub struct OperatorPeer {
    /// The operator's namespace (`POD_NAMESPACE`); it also holds the leader Lease.
    pub namespace: String,
    /// Labels every operator pod carries (the chart's selector labels).
    pub labels: BTreeMap<String, String>,
}

impl Default for OperatorPeer {
    /// The chart's defaults: namespace `weightstream-system`, pods labelled `app.kubernetes.io/component: operator`.
    fn default() -> Self {
        OperatorPeer {
            namespace: crate::DEFAULT_NAMESPACE.into(),
            labels: BTreeMap::from([("app.kubernetes.io/component".to_string(), "operator".to_string())]),
        }
    }
}

impl OperatorPeer {
    /// Parses `key=value,key=value` (the `--operator-pod-labels` flag), refusing an empty list or a pair
    /// without `=`: a policy whose peer selector is empty would admit every pod of the operator's namespace.
    pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, Error> {
        let mut labels = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("operator pod label '{pair}' is not key=value")))?;
            if k.trim().is_empty() {
                return Err(Error::Config(format!("operator pod label '{pair}' has no key")));
            }
            labels.insert(k.trim().to_string(), v.trim().to_string());
        }
        if labels.is_empty() {
            return Err(Error::Config(
                "the operator's pod labels are empty: a NetworkPolicy would admit every pod of its namespace".into(),
            ));
        }
        Ok(labels)
    }
}
