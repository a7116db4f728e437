//! The job's NetworkPolicy: who may reach its pods (the job itself, the operator, metrics scrapers) and whom
//! they may reach (the job itself and DNS).

use std::collections::BTreeMap;

use crds::TrainingJob;
use crds::contract::{HTTP_PORT, JOB_LABEL, METRICS_SCRAPER_LABEL};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::metadata::meta;
use super::names;
use super::settings::OperatorPeer;
use crate::Error;

/// The job's NetworkPolicy: the data plane's endpoints take plaintext calls that read (`Snapshot`, `/status`)
/// and replace (`Prime`, `Apply`, `/checkpoint`) the job's state, so its pods accept traffic only from
/// - the same job's pods (the SwarmX tree and the engines call each other on every port, and the SwarmX root
///   streams straight from the weight servers on theirs);
/// - the operator's pods ([`OperatorPeer`]), on the HTTP port only (it polls `/status` and asks for
///   checkpoints there);
/// - pods in namespaces labelled [`METRICS_SCRAPER_LABEL`]` = "true"`, on the HTTP port only (`/metrics`,
///   `/healthz`): a cluster admin labels the monitoring namespace so Prometheus can scrape the roles. Any pod
///   in such a namespace reaches the HTTP port, so only admins should be able to label namespaces.
///
/// Egress is limited too, to the same job's pods and DNS (port 53 anywhere: the roles find each other by
/// name): the data plane talks to nothing else, so a compromised role cannot reach the API server, another
/// tenant or the node's metadata endpoints. Kubelet probes come from the node, which policy agents admit.
pub fn network_policy(job: &TrainingJob, operator: &OperatorPeer) -> Result<NetworkPolicy, Error> {
    let name = job.name_any();
    let same_job = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(JOB_LABEL.to_string(), name.clone())])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let port = |protocol: &str, port: u16| NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(IntOrString::Int(i32::from(port))),
        ..Default::default()
    };
    let namespace_named = |ns: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.to_string())])),
        ..Default::default()
    };
    let operator_pods = NetworkPolicyPeer {
        namespace_selector: Some(namespace_named(&operator.namespace)),
        pod_selector: Some(LabelSelector { match_labels: Some(operator.labels.clone()), ..Default::default() }),
        ..Default::default()
    };
    let scrapers = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(METRICS_SCRAPER_LABEL.to_string(), "true".to_string())])),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(NetworkPolicy {
        metadata: meta(job, names::network_policy(&name), None)?,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(JOB_LABEL.to_string(), name.clone())])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule { from: Some(vec![same_job.clone()]), ports: None },
                NetworkPolicyIngressRule {
                    from: Some(vec![operator_pods, scrapers]),
                    ports: Some(vec![port("TCP", HTTP_PORT)]),
                },
            ]),
            egress: Some(vec![
                NetworkPolicyEgressRule { to: Some(vec![same_job]), ports: None },
                NetworkPolicyEgressRule { to: None, ports: Some(vec![port("UDP", 53), port("TCP", 53)]) },
            ]),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::contract::{ROLE_LABEL, Role};
    use kube::ResourceExt;

    use crate::children::metadata::labels;
    use crate::children::site::grpc_port;
    use crate::children::testing::{build, job, settings};

    fn matches(selector: &Option<LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
        let s = selector.as_ref().expect("a selector");
        assert!(s.match_expressions.is_none(), "the evaluator reads matchLabels only");
        s.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// A pod somewhere: its namespace's labels (as the API server sets them) and its own.
    struct Peer {
        ns: BTreeMap<String, String>,
        pod: BTreeMap<String, String>,
    }

    fn peer(ns: &str, ns_labels: &[(&str, &str)], pod: &[(&str, &str)]) -> Peer {
        let mut n: BTreeMap<String, String> = ns_labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        n.insert("kubernetes.io/metadata.name".into(), ns.into());
        Peer { ns: n, pod: pod.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    /// NetworkPolicy semantics for matchLabels peers: a peer with only a podSelector is in the policy's own
    /// namespace; with a namespaceSelector (and a podSelector) both must match; a rule without ports allows all.
    fn peer_matches(p: &NetworkPolicyPeer, policy_ns: &str, who: &Peer) -> bool {
        assert!(p.ip_block.is_none());
        let ns_ok = match &p.namespace_selector {
            Some(_) => matches(&p.namespace_selector, &who.ns),
            None => who.ns["kubernetes.io/metadata.name"] == policy_ns,
        };
        ns_ok && (p.pod_selector.is_none() || matches(&p.pod_selector, &who.pod))
    }

    fn port_allowed(ports: &Option<Vec<NetworkPolicyPort>>, proto: &str, port: u16) -> bool {
        ports.as_ref().is_none_or(|ps| {
            ps.iter().any(|p| {
                p.protocol.as_deref().unwrap_or("TCP") == proto
                    && p.port.as_ref().is_none_or(|x| *x == IntOrString::Int(i32::from(port)))
            })
        })
    }

    fn ingress_allowed(np: &NetworkPolicy, from: &Peer, port: u16) -> bool {
        let ns = np.metadata.namespace.as_deref().unwrap();
        np.spec.as_ref().unwrap().ingress.iter().flatten().any(|r| {
            port_allowed(&r.ports, "TCP", port)
                && r.from.as_ref().is_none_or(|f| f.iter().any(|p| peer_matches(p, ns, from)))
        })
    }

    fn egress_allowed(np: &NetworkPolicy, to: Option<&Peer>, proto: &str, port: u16) -> bool {
        let ns = np.metadata.namespace.as_deref().unwrap();
        np.spec.as_ref().unwrap().egress.iter().flatten().any(|r| {
            port_allowed(&r.ports, proto, port)
                && r.to.as_ref().is_none_or(|t| to.is_some_and(|to| t.iter().any(|p| peer_matches(p, ns, to))))
        })
    }

    #[test]
    fn the_network_policy_admits_the_job_the_operator_and_scrapers_only() {
        let d = build(&job(4), &settings(false), 4);
        let np = &d.network_policy;
        let spec = np.spec.as_ref().unwrap();
        assert_eq!(np.metadata.name.as_deref(), Some("mnist-network"));
        assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]));
        // It selects every pod of the job (MemoryX's template included) and no other job's.
        let mut pod_labels: Vec<BTreeMap<String, String>> = d.pods.iter().map(|p| p.labels().clone()).collect();
        pod_labels.push(d.memoryx.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.clone().unwrap());
        assert_eq!(pod_labels.len(), 1 + 3 + 4 + 4);
        assert!(pod_labels.iter().all(|l| matches(&spec.pod_selector, l)));
        assert!(!matches(&spec.pod_selector, &labels("other", Some(Role::Engine))));

        let (http, engine, fabric) = (HTTP_PORT, grpc_port(Role::Engine), grpc_port(Role::Swarmx));
        let job_pod = peer("ml", &[], &[(JOB_LABEL, "mnist"), (ROLE_LABEL, "swarmx")]);
        for port in [http, engine, fabric] {
            assert!(ingress_allowed(np, &job_pod, port), "the job's own pods reach port {port}");
        }
        let strangers = [
            ("another job in the namespace", peer("ml", &[], &[(JOB_LABEL, "other"), (ROLE_LABEL, "engine")])),
            ("a pod of the namespace", peer("ml", &[], &[("app", "x")])),
            ("the job's label in another namespace", peer("tenant-b", &[], &[(JOB_LABEL, "mnist")])),
            (
                "operator labels outside its namespace",
                peer("tenant-b", &[], &[("app.kubernetes.io/component", "operator")]),
            ),
            ("a pod of the operator's namespace", peer(crate::DEFAULT_NAMESPACE, &[], &[("app", "x")])),
        ];
        for (what, p) in &strangers {
            for port in [http, engine, fabric] {
                assert!(!ingress_allowed(np, p, port), "{what} must not reach port {port}");
            }
        }
        let operator = peer(crate::DEFAULT_NAMESPACE, &[], &[("app.kubernetes.io/component", "operator"), ("x", "y")]);
        assert!(ingress_allowed(np, &operator, http), "the operator polls MemoryX's /status");
        assert!(!ingress_allowed(np, &operator, engine) && !ingress_allowed(np, &operator, fabric));
        let scraper = peer("monitoring", &[(METRICS_SCRAPER_LABEL, "true")], &[("app", "prometheus")]);
        assert!(ingress_allowed(np, &scraper, http), "a labelled namespace scrapes /metrics");
        assert!(!ingress_allowed(np, &scraper, engine) && !ingress_allowed(np, &scraper, fabric));
        let unlabelled = peer("monitoring", &[(METRICS_SCRAPER_LABEL, "false")], &[("app", "prometheus")]);
        assert!(!ingress_allowed(np, &unlabelled, http));

        assert!(egress_allowed(np, Some(&job_pod), "TCP", engine), "the tree reaches the engines");
        let weights = grpc_port(Role::Memoryx);
        assert_eq!(weights, 7400);
        let server = peer("ml", &[], &[(JOB_LABEL, "mnist"), (ROLE_LABEL, "memoryx")]);
        assert!(
            egress_allowed(np, Some(&server), "TCP", weights) && ingress_allowed(np, &server, weights),
            "weight servers reach each other"
        );
        assert!(ingress_allowed(np, &job_pod, weights), "the SwarmX root streams straight from the weight servers");
        for (what, p) in &strangers {
            assert!(!ingress_allowed(np, p, weights), "{what} must not reach the weight servers");
        }
        assert!(!ingress_allowed(np, &operator, weights), "the operator polls HTTP only");
        assert!(egress_allowed(np, None, "UDP", 53) && egress_allowed(np, None, "TCP", 53), "DNS");
        assert!(!egress_allowed(np, Some(&strangers[0].1), "TCP", engine), "not another job's engines");
        assert!(!egress_allowed(np, None, "TCP", 6443), "not the API server");
        let o = &np.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((o.name.as_str(), o.controller), ("mnist", Some(true)));
        assert_eq!(np.metadata.labels.as_ref().unwrap()[JOB_LABEL], "mnist", "cleanup finds it by label");
    }

    #[test]
    fn the_operator_peer_follows_the_settings() {
        let mut s = settings(false);
        s.operator = OperatorPeer {
            namespace: "ops".into(),
            labels: OperatorPeer::parse_labels(
                "app.kubernetes.io/name=weightstream-operator, app.kubernetes.io/instance=ws",
            )
            .unwrap(),
        };
        let np = build(&job(1), &s, 1).network_policy;
        let chart_pod = peer(
            "ops",
            &[],
            &[("app.kubernetes.io/name", "weightstream-operator"), ("app.kubernetes.io/instance", "ws")],
        );
        assert!(ingress_allowed(&np, &chart_pod, HTTP_PORT));
        let other_release = peer(
            "ops",
            &[],
            &[("app.kubernetes.io/name", "weightstream-operator"), ("app.kubernetes.io/instance", "b")],
        );
        assert!(!ingress_allowed(&np, &other_release, HTTP_PORT));
        let default_ns = peer(
            crate::DEFAULT_NAMESPACE,
            &[],
            &[("app.kubernetes.io/name", "weightstream-operator"), ("app.kubernetes.io/instance", "ws")],
        );
        assert!(!ingress_allowed(&np, &default_ns, HTTP_PORT));
        for bad in ["", " , ", "novalue", "=x"] {
            assert!(OperatorPeer::parse_labels(bad).is_err(), "{bad:?}");
        }
    }
}
