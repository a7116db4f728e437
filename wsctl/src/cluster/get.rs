//! `wsctl get`: the jobs as a table of what users ask first (is it running, how far, how good, how long, and if
//! waiting, for what), or the objects as JSON or YAML for scripts.

use crds::TrainingJob;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::{Cluster, Error, Namespace, progress, watch as watching};

/// How `wsctl get` prints.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// The table with where each role's pods run (`ROLE=NODE,…` for every role placed).
    Wide,
    /// The TrainingJob objects (a `List` for several).
    Json,
    /// The same as YAML.
    Yaml,
}

/// Where a job's pods run, role by role in the status's order: `memoryx=n2 engine=n1,n2 …`, each node once per
/// role; `-` while nothing is placed.
pub fn nodes(job: &TrainingJob) -> String {
    let placement = job.status.as_ref().map(|s| &s.placement[..]).unwrap_or_default();
    let mut roles: Vec<(crds::contract::Role, Vec<&str>)> = Vec::new();
    for p in placement {
        match roles.last_mut() {
            Some((role, nodes)) if *role == p.role => {
                if !nodes.contains(&p.node.as_str()) {
                    nodes.push(&p.node);
                }
            }
            _ => roles.push((p.role, vec![&p.node])),
        }
    }
    if roles.is_empty() {
        return "-".into();
    }
    roles.iter().map(|(role, nodes)| format!("{role}={}", nodes.join(","))).collect::<Vec<_>>().join(" ")
}

/// The table: one row per job, `-` where the status does not know yet; the namespace column only with `-A`,
/// the nodes only when `wide`.
pub fn table(jobs: &[TrainingJob], namespaces: bool, wide: bool) -> String {
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(jobs.len() + 1);
    let mut header = vec!["NAME", "PHASE", "CS-2", "STEP", "LOSS", "ETA", "QUEUE", "WAITING"];
    if namespaces {
        header.insert(0, "NAMESPACE");
    }
    if wide {
        header.push("NODES");
    }
    rows.push(header.into_iter().map(String::from).collect());
    for job in jobs {
        let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        let held = job.status.as_ref().and_then(|s| s.allocated_cs2).unwrap_or(0);
        let mut row = vec![
            job.name_any(),
            progress::phase(job),
            format!("{held}/{}", job.spec.cs2),
            dash(progress::steps(job)),
            dash(progress::loss(job)),
            dash(progress::eta(job)),
            dash(progress::queue_position(job)),
            dash(progress::waiting_for(job)),
        ];
        if namespaces {
            row.insert(0, job.namespace().unwrap_or_default());
        }
        if wide {
            row.push(nodes(job));
        }
        rows.push(row);
    }
    let widths: Vec<usize> =
        (0..rows[0].len()).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// JSON or YAML of one job, or of a `List` of several (as kubectl prints them).
pub fn render(jobs: &[TrainingJob], single: bool, output: Output) -> Result<String, Error> {
    let value = if single {
        serde_json::to_value(jobs.first())
    } else {
        serde_json::to_value(jobs)
            .map(|items| serde_json::json!({ "apiVersion": "v1", "kind": "List", "items": items }))
    };
    let encode = |e: &dyn std::fmt::Display| Error::Invalid(format!("cannot encode the jobs: {e}"));
    let value = value.map_err(|e| encode(&e))?;
    match output {
        Output::Json => serde_json::to_string_pretty(&value).map(|s| s + "\n").map_err(|e| encode(&e)),
        Output::Yaml | Output::Table | Output::Wide => serde_yaml::to_string(&value).map_err(|e| encode(&e)),
    }
}

/// `wsctl get [JOB] [-n NS | -A] [-o table|wide|json|yaml]`.
pub async fn get(name: Option<&str>, ns: Namespace, all: bool, output: Output) -> Result<(), Error> {
    let cluster = Cluster::connect(ns).await?;
    let jobs = match name {
        Some(name) => vec![cluster.job(name).await?],
        None => {
            let (api, scope): (Api<TrainingJob>, &str) = if all {
                (Api::all(cluster.client.clone()), "any namespace")
            } else {
                (cluster.jobs(), cluster.namespace.as_str())
            };
            let action = format!("list TrainingJobs (namespace: {scope})");
            let mut items =
                api.list(&ListParams::default()).await.map_err(Error::api(action, &cluster.namespace, ""))?.items;
            items.sort_by_key(|j| (j.namespace(), j.name_any()));
            if items.is_empty() && matches!(output, Output::Table | Output::Wide) {
                eprintln!(
                    "no TrainingJobs in {}",
                    if all { "any namespace".to_string() } else { format!("namespace {scope}") }
                );
                return Ok(());
            }
            items
        }
    };
    match output {
        Output::Table => print!("{}", table(&jobs, all, false)),
        Output::Wide => print!("{}", table(&jobs, all, true)),
        other => print!("{}", render(&jobs, name.is_some(), other)?),
    }
    if name.is_some() && matches!(output, Output::Table | Output::Wide) {
        print!("{}", failed_by(&jobs[0]));
    }
    Ok(())
}

/// For one failed job, the line under its table that says why: its `Failed` condition, which names the pod and
/// the log line that failed it when one did (`wsctl logs export` bundles the rest); nothing for another phase.
pub fn failed_by(job: &TrainingJob) -> String {
    let failed = job.status.as_ref().and_then(|s| s.phase) == Some(crds::Phase::Failed);
    if failed { format!("\nFailed: {}\n", progress::failure(job)) } else { String::new() }
}

/// `wsctl get JOB --watch`: the job at each change of its status (one compact JSON object per line with `-o
/// json`, else [`progress::line`]), ending with the job's end: Ok once it succeeded, the job's failure (its
/// status's reason) once it failed. Suspended is not an end: a watch started before a
/// suspend keeps reporting through the resume, since the API's watch (re-established on errors) is its source.
pub async fn watch(cluster: &Cluster, name: &str, output: Output, timeout: std::time::Duration) -> Result<(), Error> {
    use std::io::Write;
    cluster.job(name).await?; // A job that does not exist is "no such job", not "deleted while watched".
    let what = format!("TrainingJob {}/{name} to finish", cluster.namespace);
    let ns = cluster.namespace.clone();
    let mut last: Option<serde_json::Value> = None;
    watching::until(cluster, name, timeout, &what, |job| {
        let status = job.and_then(|j| serde_json::to_value(&j.status).ok());
        if let Some(job) = job
            && status != last
        {
            last = status;
            let line = match output {
                Output::Json => serde_json::to_string(job).unwrap_or_default(),
                Output::Table | Output::Wide | Output::Yaml => progress::line(job),
            };
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return Some(Ok(())); // Nobody reads any more.
            }
        }
        watching::outcome(job, &ns, name)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::testing::{queued, running, succeeded};

    #[test]
    fn the_table_aligns_every_column_and_dashes_the_unknown() {
        let t = table(&[running(), queued(), succeeded()], false, false);
        let want = "\
NAME      PHASE       CS-2   STEP      LOSS     ETA     QUEUE   WAITING
train     Running     2/2    20/100    0.4321   1m05s   -       -
waiting   Queued      0/2    -         -        -       #2      InsufficientCapacity
done      Succeeded   0/2    100/100   0.1000   0s      -       -
";
        assert_eq!(t, want);
    }

    #[test]
    fn all_namespaces_adds_the_namespace_column() {
        let t = table(&[running()], true, false);
        assert!(t.starts_with("NAMESPACE   NAME "), "{t}");
        assert!(t.lines().nth(1).is_some_and(|l| l.starts_with("ml          train ")), "{t}");
    }

    /// `-o wide` names each role's nodes once, in the status's order; `-` while nothing is placed.
    #[test]
    fn wide_adds_where_each_roles_pods_run() {
        let place = |role, pod: &str, node: &str| crds::PodPlacement { role, pod: pod.into(), node: node.into() };
        use crds::contract::Role::{Engine, Input, Memoryx};
        let mut job = running();
        if let Some(s) = job.status.as_mut() {
            s.placement = vec![
                place(Input, "train-input-0", "w1"),
                place(Input, "train-input-1", "w1"),
                place(Engine, "train-engine-0", "w1"),
                place(Engine, "train-engine-1", "w2"),
                place(Memoryx, "train-memoryx-0", "w2"),
            ];
        }
        let t = table(&[job, queued()], false, true);
        let mut lines = t.lines();
        assert!(lines.next().is_some_and(|l| l.ends_with("   NODES")), "{t}");
        assert!(lines.next().is_some_and(|l| l.ends_with("   input=w1 engine=w1,w2 memoryx=w2")), "{t}");
        assert!(lines.next().is_some_and(|l| l.ends_with("   -")), "{t}");
    }

    /// A failed job's table is followed by why, in the words of its Failed condition (the pod and line with it).
    #[test]
    fn a_failed_job_says_what_failed_it() {
        let mut job = running();
        assert_eq!(failed_by(&job), "");
        let status = job.status.as_mut().unwrap();
        status.phase = Some(crds::Phase::Failed);
        status.conditions = vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Failed".into(),
            status: "True".into(),
            reason: "DataPlaneFailed".into(),
            message: "input 0 failed; failed by pod train-input-0 (exit 1): ERROR bad tokenizer".into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
            observed_generation: None,
        }];
        let said = failed_by(&job);
        assert!(said.contains("DataPlaneFailed: ") && said.contains("failed by pod train-input-0 (exit 1)"), "{said}");
    }

    #[test]
    fn json_is_the_object_or_a_list() {
        let one: serde_json::Value = serde_json::from_str(&render(&[running()], true, Output::Json).unwrap()).unwrap();
        assert_eq!((one["kind"].as_str(), one["status"]["step"].as_u64()), (Some("TrainingJob"), Some(20)));
        let list: serde_yaml::Value =
            serde_yaml::from_str(&render(&[running(), queued()], false, Output::Yaml).unwrap()).unwrap();
        assert_eq!(list["items"][1]["status"]["queuePosition"].as_u64(), Some(2));
    }
}
