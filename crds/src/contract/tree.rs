//! The SwarmX tree: which nodes a job's fabric has and what each one's children are. The plan holds it; the
//! operator names pods after it, the local runner starts processes from it and the cost model prices its
//! depth, so the three always agree. Level 0 is the root; the deepest level's nodes have engines as children.
//! A job of one engine has no tree: there is nothing to broadcast to or sum, so MemoryX drives the engine
//! itself (both speak the same `Stage` service), and no process relays bytes it does not need to touch.

use serde::{Deserialize, Serialize};

/// Children per SwarmX node unless a job or an operator flag says otherwise. The seeds say only that the
/// fabric is a tree; 8 is an assumption, and only the tree's depth (its fill latency) depends on it.
pub const DEFAULT_FAN_OUT: u32 = 8;

/// What a SwarmX node sends to and sums from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SwarmxChild {
    /// Engine (CS-2) `index`.
    Engine(u32),
    /// The SwarmX node at `(level, index)`.
    Swarmx {
        /// Its level (one below the parent's).
        level: usize,
        /// Its place in that level.
        index: usize,
    },
}

/// One node of the tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwarmxNode {
    /// Its level, 0 for the root.
    pub level: usize,
    /// Its place in its level.
    pub index: usize,
    /// Its children in engine order.
    pub children: Vec<SwarmxChild>,
}

/// The whole fabric of one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwarmxTree {
    /// Children per node (at least 2).
    pub fan_out: u32,
    /// The nodes, level by level, root first.
    pub levels: Vec<Vec<SwarmxNode>>,
}

impl SwarmxTree {
    /// The tree over `engines` engines with up to `fan_out` children per node: leaves take up to `fan_out`
    /// engines each, inner nodes up to `fan_out` nodes, and the root is one node. One engine (or none) gets no
    /// node at all: a node over a single engine would only pass its bytes on.
    pub fn new(engines: u32, fan_out: u32) -> SwarmxTree {
        let fan_out = fan_out.max(2);
        if engines <= 1 {
            return SwarmxTree { fan_out, levels: Vec::new() };
        }
        let mut widths = vec![engines.div_ceil(fan_out) as usize];
        while let Some(&w) = widths.last() {
            if w <= 1 {
                break;
            }
            widths.push(w.div_ceil(fan_out as usize));
        }
        widths.reverse();
        let f = fan_out as usize;
        let levels = widths
            .iter()
            .enumerate()
            .map(|(level, &width)| {
                (0..width)
                    .map(|index| {
                        let span = index * f..(index + 1) * f;
                        let children = match widths.get(level + 1) {
                            Some(&below) => span
                                .take_while(|&j| j < below)
                                .map(|j| SwarmxChild::Swarmx { level: level + 1, index: j })
                                .collect(),
                            None => span
                                .take_while(|&e| e < engines as usize)
                                .map(|e| SwarmxChild::Engine(e as u32))
                                .collect(),
                        };
                        SwarmxNode { level, index, children }
                    })
                    .collect()
            })
            .collect();
        SwarmxTree { fan_out, levels }
    }

    /// Levels of nodes from the root (1 when a single node reaches every engine, 0 for a one-engine job): the
    /// relays a layer passes between MemoryX and an engine.
    pub fn depth(&self) -> u32 {
        self.levels.len() as u32
    }

    /// The node MemoryX drives, when the job has a tree.
    pub fn root(&self) -> Option<&SwarmxNode> {
        self.levels.first().and_then(|l| l.first())
    }

    /// Every node, root first, level by level.
    pub fn nodes(&self) -> impl Iterator<Item = &SwarmxNode> {
        self.levels.iter().flatten()
    }

    /// Every node, leaves first: the order to start them in, so each node's children are up before it.
    pub fn nodes_bottom_up(&self) -> impl Iterator<Item = &SwarmxNode> {
        self.levels.iter().rev().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_hangs_under_exactly_one_leaf_and_every_node_under_one_parent() {
        for (engines, fan_out) in [(2, 8), (4, 2), (8, 8), (9, 8), (64, 8), (192, 8), (192, 4), (5, 1)] {
            let t = SwarmxTree::new(engines, fan_out);
            assert_eq!(t.levels[0].len(), 1, "one root");
            let mut seen_engines = Vec::new();
            for node in t.nodes() {
                assert!(!node.children.is_empty() && node.children.len() <= t.fan_out as usize);
                for c in &node.children {
                    match *c {
                        SwarmxChild::Engine(e) => seen_engines.push(e),
                        SwarmxChild::Swarmx { level, index } => {
                            assert_eq!(level, node.level + 1);
                            assert!(index < t.levels[level].len());
                        }
                    }
                }
            }
            assert_eq!(seen_engines, (0..engines).collect::<Vec<_>>());
            let parents: usize =
                t.nodes().map(|n| n.children.iter().filter(|c| matches!(c, SwarmxChild::Swarmx { .. })).count()).sum();
            assert_eq!(parents, t.nodes().count() - 1);
        }
        assert_eq!(SwarmxTree::new(192, 8).depth(), 3);
        assert_eq!(SwarmxTree::new(8, 8).depth(), 1);
        assert_eq!(SwarmxTree::new(2, 8).root().map(|r| r.children.len()), Some(2));
        let bottom: Vec<usize> = SwarmxTree::new(20, 2).nodes_bottom_up().map(|n| n.level).collect();
        assert!(bottom.windows(2).all(|w| w[0] >= w[1]));
    }

    #[test]
    fn one_engine_has_no_tree_to_relay_through() {
        for engines in [0, 1] {
            let t = SwarmxTree::new(engines, 8);
            assert_eq!((t.depth(), t.nodes().count(), t.root()), (0, 0, None));
        }
    }
}
