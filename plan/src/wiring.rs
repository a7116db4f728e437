//! The wiring of the appliance: which components a plan has, who dials whom, and each component's arguments.
//! It is written once and rendered for any [`Site`]: the operator's pods (per-pod DNS names, fixed ports) and
//! `wsctl run`'s local processes (loopback, ephemeral ports learned as each component comes up) get their
//! arguments from the same function, so the two cannot wire a job differently.

use std::net::SocketAddr;
use std::path::PathBuf;

use crds::contract::{
    CommonArgs, EngineArgs, InputArgs, MemoryxArgs, Role, RoleArgs, SwarmxArgs, SwarmxChild, SwarmxNode,
};

use crate::appliance::Plan;

/// One component of an appliance: a process, or a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// Input worker `0..plan.input_workers`.
    Input(u32),
    /// The engine of CS-2 `0..plan.cs2`.
    Engine(u32),
    /// SwarmX node `index` of tree level `level` (the root is `0, 0`).
    Swarmx {
        /// Tree level, from the root (0) down.
        level: usize,
        /// Position within the level.
        index: usize,
    },
    /// MemoryX weight server `0..plan.memoryx.servers`; server 0 is the job's coordinator.
    WeightServer(u32),
}

impl Component {
    /// The role program this component runs.
    pub fn role(self) -> Role {
        match self {
            Component::Input(_) => Role::Input,
            Component::Engine(_) => Role::Engine,
            Component::Swarmx { .. } => Role::Swarmx,
            Component::WeightServer(_) => Role::Memoryx,
        }
    }

    /// The component's name within its job (`input-3`, `engine-0`, `swarmx-1-2`, `memoryx-1`; the coordinator is
    /// `memoryx`): the local runner's process and log names, and the operator's pod names after `<job>-`.
    pub fn name(self) -> String {
        match self {
            Component::Input(i) => format!("input-{i}"),
            Component::Engine(i) => format!("engine-{i}"),
            Component::Swarmx { level, index } => format!("swarmx-{level}-{index}"),
            Component::WeightServer(0) => "memoryx".into(),
            Component::WeightServer(i) => format!("memoryx-{i}"),
        }
    }

    /// The component named `name` ([`Component::name`] read back), if it names one.
    pub fn from_name(name: &str) -> Option<Component> {
        let number = |s: &str| s.parse::<u32>().ok().filter(|n| n.to_string() == s);
        if name == "memoryx" {
            return Some(Component::WeightServer(0));
        }
        let (kind, rest) = name.split_once('-')?;
        match kind {
            "input" => number(rest).map(Component::Input),
            "engine" => number(rest).map(Component::Engine),
            "memoryx" => number(rest).filter(|&i| i > 0).map(Component::WeightServer),
            "swarmx" => {
                let (level, index) = rest.split_once('-')?;
                Some(Component::Swarmx { level: number(level)? as usize, index: number(index)? as usize })
            }
            _ => None,
        }
    }

    /// The component a SwarmX node's child is.
    pub fn of_child(child: SwarmxChild) -> Component {
        match child {
            SwarmxChild::Engine(e) => Component::Engine(e),
            SwarmxChild::Swarmx { level, index } => Component::Swarmx { level, index },
        }
    }
}

/// Where an appliance runs: how one component reaches another, and what a site tells every component.
pub trait Site {
    /// The arguments every component of the job shares here (the job manifest, the identity, the HTTP port).
    fn common(&self) -> CommonArgs;
    /// Where a component of `role` serves its gRPC service.
    fn listen(&self, role: Role) -> SocketAddr;
    /// The URL at which `to`'s gRPC service is reached.
    fn address(&self, to: Component) -> String;
    /// Where input workers (and the components that read a pretrained folder in it) find the job's data
    /// volume, when the job names one.
    fn data_root(&self) -> Option<PathBuf>;
}

/// One component's arguments, typed by its role.
#[derive(Clone, Debug, PartialEq)]
pub enum Args {
    /// An input worker's.
    Input(InputArgs),
    /// An engine's.
    Engine(EngineArgs),
    /// A SwarmX node's.
    Swarmx(SwarmxArgs),
    /// A weight server's (the coordinator's at index 0).
    Memoryx(MemoryxArgs),
}

impl Args {
    /// The role program that takes these arguments.
    pub fn role(&self) -> Role {
        match self {
            Args::Input(_) => Role::Input,
            Args::Engine(_) => Role::Engine,
            Args::Swarmx(_) => Role::Swarmx,
            Args::Memoryx(_) => Role::Memoryx,
        }
    }

    /// The command line, as the role program's own parser reads it.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Args::Input(a) => a.argv(),
            Args::Engine(a) => a.argv(),
            Args::Swarmx(a) => a.argv(),
            Args::Memoryx(a) => a.argv(),
        }
    }
}

/// A plan's components and each one's arguments.
#[derive(Clone, Copy, Debug)]
pub struct Wiring<'a> {
    plan: &'a Plan,
}

impl<'a> Wiring<'a> {
    /// The wiring of `plan`.
    pub fn of(plan: &'a Plan) -> Wiring<'a> {
        Wiring { plan }
    }

    /// Every component, in an order in which each starts after all it dials: input workers, engines, the SwarmX
    /// tree from the leaves up, the weight servers, and the coordinator last.
    pub fn components(&self) -> Vec<Component> {
        let p = self.plan;
        let mut all: Vec<Component> = (0..p.input_workers).map(Component::Input).collect();
        all.extend((0..p.cs2).map(Component::Engine));
        all.extend(p.swarmx.nodes_bottom_up().map(|n| Component::Swarmx { level: n.level, index: n.index }));
        all.extend((1..p.memoryx.servers).map(Component::WeightServer));
        all.push(Component::WeightServer(0));
        all
    }

    /// Input worker `index`'s arguments: it serves its engine, and reads the data volume at the site's root.
    pub fn input(&self, site: &impl Site, index: u32) -> InputArgs {
        InputArgs::new(site.common(), site.listen(Role::Input), index, site.data_root())
    }

    /// Engine `index`'s arguments: fed by its block of the input workers ([`Plan::inputs_of`]).
    pub fn engine(&self, site: &impl Site, index: u32) -> EngineArgs {
        let inputs = self.plan.inputs_of(index).map(|w| site.address(Component::Input(w))).collect();
        let data_root = site.data_root().filter(|_| self.plan.reads_pretrained(Role::Engine));
        EngineArgs { data_root, ..EngineArgs::new(site.common(), site.listen(Role::Engine), index, inputs) }
    }

    /// A SwarmX node's arguments: its children's addresses, in engine order.
    pub fn swarmx(&self, site: &impl Site, node: &SwarmxNode) -> SwarmxArgs {
        let children = node.children.iter().map(|&c| site.address(Component::of_child(c))).collect();
        SwarmxArgs::new(site.common(), site.listen(Role::Swarmx), children)
    }

    /// The component MemoryX drives: the SwarmX root, or engine 0 itself when the job has one engine and so no
    /// tree (both serve the `Stage` service).
    pub fn stage(&self) -> Component {
        match self.plan.swarmx.root() {
            Some(root) => Component::Swarmx { level: root.level, index: root.index },
            None => Component::Engine(0),
        }
    }

    /// MemoryX's arguments: it drives the [stage](Self::stage), asks input worker 0 what the data holds and, as
    /// the coordinator, tells the SwarmX root where it serves its own slice (when the site knows its address in
    /// advance) and reaches weight servers `1..` at the addresses given (`weight_servers`, in server order:
    /// a site whose servers' addresses are learned only once they run passes them when it has them).
    pub fn memoryx(&self, site: &impl Site, weight_servers: Vec<String>) -> MemoryxArgs {
        let advertise = Some(site.address(Component::WeightServer(0))).filter(|a| !a.is_empty());
        MemoryxArgs {
            weight_servers,
            listen: site.listen(Role::Memoryx),
            advertise,
            data_root: site.data_root().filter(|_| self.plan.reads_pretrained(Role::Memoryx)),
            ..MemoryxArgs::new(site.common(), site.address(self.stage()), site.address(Component::Input(0)))
        }
    }

    /// `component`'s arguments at `site`. A weight server is told `weight_servers` (the coordinator needs the
    /// others' addresses; the others may be given none).
    pub fn args(&self, site: &impl Site, component: Component, weight_servers: Vec<String>) -> Args {
        match component {
            Component::Input(i) => Args::Input(self.input(site, i)),
            Component::Engine(i) => Args::Engine(self.engine(site, i)),
            Component::Swarmx { level, index } => {
                let node = self.plan.swarmx.levels.get(level).and_then(|l| l.get(index));
                let fallback = SwarmxNode { level, index, children: Vec::new() };
                Args::Swarmx(self.swarmx(site, node.unwrap_or(&fallback)))
            }
            Component::WeightServer(i) => {
                Args::Memoryx(MemoryxArgs { server_index: i, ..self.memoryx(site, weight_servers) })
            }
        }
    }

    /// The addresses of weight servers `1..`, where the site knows them all in advance (a cluster's DNS).
    pub fn weight_server_addresses(&self, site: &impl Site) -> Vec<String> {
        (1..self.plan.memoryx.servers).map(|i| site.address(Component::WeightServer(i))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every component's name reads back as that component, and nothing else reads as one.
    #[test]
    fn a_components_name_reads_back_as_the_component() {
        let all = [
            Component::Input(3),
            Component::Engine(0),
            Component::Engine(17),
            Component::Swarmx { level: 1, index: 2 },
            Component::WeightServer(0),
            Component::WeightServer(2),
        ];
        for c in all {
            assert_eq!(Component::from_name(&c.name()), Some(c), "{}", c.name());
        }
        for bad in ["", "engine", "engine-", "engine-01", "engine--1", "memoryx-0", "swarmx-1", "swarmx-1-x", "gpu-0"] {
            assert_eq!(Component::from_name(bad), None, "{bad}");
        }
    }
}
