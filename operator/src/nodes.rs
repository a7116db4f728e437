//! What the nodes say about the CS-2s: how many the pool has (the ready CS-2 hosts that take engines) and which
//! nodes are lost (unreachable: stopped, hung, cut off), whose pods the operator takes back.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use crate::children::pods::engine::CS2_RESOURCE;

/// The status of `node`'s `Ready` condition, when it has one.
fn ready(node: &Node) -> Option<&str> {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().find(|c| c.type_ == "Ready").map(|c| c.status.as_str())
}

/// Whether `node` takes no engines now: its `Ready` condition says anything but `True` (`False`: its kubelet
/// reports it unhealthy, for a moment when the kubelet restarts, say; `Unknown`: it is lost). A node that has
/// not reported any condition yet is not counted out.
pub fn is_not_ready(node: &Node) -> bool {
    ready(node).is_some_and(|s| s != "True")
}

/// Whether `node` is lost: its `Ready` condition is `Unknown`, which the node controller sets once it has heard
/// nothing from the node's kubelet for its grace period. Its pods then run on unmanaged, if at all; a node whose
/// kubelet reports it not ready (`False`) still stops its pods itself, and is not lost.
pub fn is_lost(node: &Node) -> bool {
    ready(node) == Some("Unknown")
}

/// The names of the lost nodes ([`is_lost`]).
pub fn lost(nodes: &[Node]) -> BTreeSet<String> {
    nodes.iter().filter(|n| is_lost(n)).map(|n| n.name_any()).collect()
}

/// The CS-2 pool: the sum of the schedulable, ready nodes' allocatable `weightstream.dev/cs2` when any node
/// knows the resource, or else the `configured` size. The second value says whether engines request the
/// resource: it follows whether nodes know it at all, not how many they offer this moment, so a device plugin or
/// kubelet restart (allocatable briefly 0) changes no engine pod's spec and replaces none.
pub fn pool_of(nodes: &[Node], configured: Option<u32>) -> Option<(u32, bool)> {
    let mut total: u32 = 0;
    let mut known = false;
    let has = |r: Option<&BTreeMap<String, Quantity>>| r.is_some_and(|r| r.contains_key(CS2_RESOURCE));
    for node in nodes {
        let status = node.status.as_ref();
        known |= has(status.and_then(|s| s.capacity.as_ref())) || has(status.and_then(|s| s.allocatable.as_ref()));
        // A cordoned node takes no new engines, and one not ready runs none: their CS-2s are not the pool's (a
        // job on them goes on with fewer once the dip outlasts the operator's grace period).
        if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) || is_not_ready(node) {
            continue;
        }
        let q = status.and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get(CS2_RESOURCE));
        if let Some(q) = q {
            total = total.saturating_add(q.0.trim().parse::<u32>().unwrap_or(0));
        }
    }
    if known {
        return Some((total, true));
    }
    configured.map(|p| (p, false))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};

    use super::*;

    fn node(allocatable: Option<&str>, capacity: Option<&str>, cordoned: bool, ready: Option<&str>) -> Node {
        let q = |v: Option<&str>| v.map(|v| BTreeMap::from([(CS2_RESOURCE.to_string(), Quantity(v.into()))]));
        let conditions = ready.map(|r| {
            let ready = NodeCondition { type_: "Ready".into(), status: r.into(), ..Default::default() };
            let pressure = NodeCondition { type_: "DiskPressure".into(), status: "False".into(), ..Default::default() };
            vec![pressure, ready]
        });
        let mut n = Node {
            spec: Some(NodeSpec { unschedulable: cordoned.then_some(true), ..Default::default() }),
            status: Some(NodeStatus {
                allocatable: q(allocatable),
                capacity: q(capacity),
                conditions,
                ..Default::default()
            }),
            ..Default::default()
        };
        n.metadata.name = Some(format!("n-{}-{}", allocatable.unwrap_or("none"), ready.unwrap_or("new")));
        n
    }

    #[test]
    fn the_pool_is_the_schedulable_ready_nodes_cs2s_and_requesting_them_does_not_flicker() {
        let ready = Some("True");
        assert_eq!(
            pool_of(&[node(Some("4"), Some("4"), false, ready), node(Some("2"), Some("2"), false, None)], Some(9)),
            Some((6, true))
        );
        assert_eq!(
            pool_of(&[node(Some("4"), Some("4"), false, ready), node(Some("2"), Some("2"), true, ready)], None),
            Some((4, true)),
            "cordoned"
        );
        for lost in ["False", "Unknown"] {
            let nodes = [node(Some("4"), Some("4"), false, Some(lost)), node(Some("2"), Some("2"), false, ready)];
            assert_eq!(pool_of(&nodes, None), Some((2, true)), "a node {lost}");
        }
        assert_eq!(
            pool_of(&[node(Some("0"), Some("4"), false, ready)], Some(9)),
            Some((0, true)),
            "a plugin restarting"
        );
        assert_eq!(pool_of(&[node(None, Some("4"), false, ready)], Some(9)), Some((0, true)));
        assert_eq!(pool_of(&[node(None, None, false, ready)], Some(9)), Some((9, false)), "no node knows CS-2s");
        assert_eq!(pool_of(&[], None), None);
    }

    #[test]
    fn a_node_is_lost_when_it_is_unreachable_and_out_of_the_pool_when_not_ready() {
        let nodes = [
            node(Some("2"), None, false, Some("True")),
            node(Some("3"), None, false, Some("False")),
            node(Some("4"), None, true, Some("Unknown")),
            node(Some("5"), None, false, None),
        ];
        let want: BTreeSet<String> = ["n-4-Unknown".to_string()].into();
        assert_eq!(lost(&nodes), want, "only an unreachable node is lost; one whose kubelet says False is not");
        let not_ready: Vec<bool> = nodes.iter().map(is_not_ready).collect();
        assert_eq!(not_ready, [false, true, true, false]);
    }
}
