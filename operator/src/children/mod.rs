//! The appliance a job gets, as Kubernetes objects: pure functions from the job (and what the operator decided
//! about it) to the ConfigMap, Services, the MemoryX StatefulSet, the SwarmX tree's pods and one engine pod per
//! CS-2. Being pure, they are unit-tested without a cluster, and reconcile only applies what they return.
//!
//! One concept per module: [`desired`] assembles the whole appliance at one size from the [`plan`]; [`names`],
//! [`site`] (addresses) and [`metadata`] (labels, owner) say how the children are called and found; one module
//! per kind of child ([`config_map`], [`services`], [`network_policy`], [`identity`], [`memoryx`] and its
//! [`checkpoints`] volumes, [`pods`]);
//! and the parts a pod is made of ([`container`], [`pod_security`], [`volumes`], [`hash`]).

pub mod checkpoints;
pub mod config_map;
pub mod container;
pub mod desired;
pub mod hash;
pub mod identity;
pub mod memoryx;
pub mod metadata;
pub mod names;
pub mod network_policy;
pub mod placement;
pub mod plan;
pub mod pod_security;
pub mod pods;
pub mod services;
pub mod settings;
pub mod site;
#[cfg(test)]
pub(crate) mod testing;
pub mod volumes;
