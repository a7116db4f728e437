//! `wsctl admin`: what a cluster administrator runs, not a job's user. `migrate-storage` is the last step of an
//! upgrade from a release that stored TrainingJobs as `v1alpha1`: every stored job is written again (the API
//! server stores it in the CRD's current storage version), then the CRD records that only that version is
//! stored, so a later release may stop serving the old one.

use std::time::Duration;

use crds::TrainingJob;
use crds::version::ApiVersion;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt, ResourceExt};

use super::error::Error;
use super::{Cluster, Namespace};

/// The administrator's commands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// After an upgrade that changed the storage version (apply charts/weightstream/crds/ first): rewrite every
    /// stored TrainingJob in it and record that only it is stored (the CRD's status.storedVersions). Idempotent;
    /// running jobs go on.
    MigrateStorage {
        /// Seconds the whole migration may take.
        #[arg(long, default_value = "300")]
        timeout: u64,
    },
}

/// Tries per job when another writer changes it between the read and the write.
const CONFLICT_TRIES: usize = 5;

/// Runs an administrator's command with the user's kubeconfig.
pub async fn run(command: Command) -> Result<(), Error> {
    let Command::MigrateStorage { timeout } = command;
    let client = Cluster::connect(Namespace::default()).await?.client;
    let after = Duration::from_secs(timeout);
    let what = "the storage migration".to_string();
    let done = tokio::time::timeout(after, migrate_storage(&client)).await.map_err(|_| Error::Timeout {
        after,
        what,
        last: None,
    })??;
    println!("{done}");
    Ok(())
}

/// What a migration did.
#[derive(Debug, PartialEq)]
pub struct Migrated {
    /// Jobs written again.
    pub rewritten: usize,
    /// The CRD's stored versions before.
    pub stored_before: Vec<String>,
}

impl std::fmt::Display for Migrated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stored = ApiVersion::STORED.api_version();
        if self.stored_before == [ApiVersion::STORED.as_str()] {
            return write!(f, "every TrainingJob is already stored as {stored}: nothing to do");
        }
        write!(
            f,
            "rewrote {} TrainingJob(s) as {stored}; the CRD's stored versions are now [{}] (were [{}])",
            self.rewritten,
            ApiVersion::STORED,
            self.stored_before.join(", ")
        )
    }
}

/// Rewrites every TrainingJob in the storage version and narrows the CRD's `status.storedVersions` to it.
/// Jobs are read and written undecoded, so one that the types cannot hold is migrated too.
pub async fn migrate_storage(client: &Client) -> Result<Migrated, Error> {
    let crd_name = TrainingJob::crd_name();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let read = format!("read CustomResourceDefinition {crd_name}");
    let crd = crds.get_opt(crd_name).await.map_err(Error::other(read))?.ok_or(Error::CrdMissing)?;
    let storage = crd.spec.versions.iter().find(|v| v.storage).map(|v| v.name.clone()).unwrap_or_default();
    if storage != ApiVersion::STORED.as_str() {
        return Err(Error::Invalid(format!(
            "the installed CRD {crd_name} stores '{storage}', not {}: apply this release's CRD first \
             (kubectl apply --server-side -f charts/weightstream/crds/), then migrate",
            ApiVersion::STORED
        )));
    }
    let stored_before = crd.status.and_then(|s| s.stored_versions).unwrap_or_default();
    if stored_before == [ApiVersion::STORED.as_str()] {
        return Ok(Migrated { rewritten: 0, stored_before });
    }
    let ar = ApiResource::erase::<TrainingJob>(&());
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut rewritten = 0;
    let mut page = ListParams::default().limit(200);
    loop {
        let list = all.list(&page).await.map_err(Error::other("list TrainingJobs"))?;
        for job in &list.items {
            rewritten += usize::from(rewrite(client, &ar, job).await?);
        }
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => page = page.continue_token(&token),
            None => break,
        }
    }
    let narrowed = serde_json::json!({ "status": { "storedVersions": [ApiVersion::STORED.as_str()] } });
    let action = format!("record the stored versions of {crd_name}");
    crds.patch_status(crd_name, &PatchParams::default(), &Patch::Merge(&narrowed))
        .await
        .map_err(Error::other(action))?;
    Ok(Migrated { rewritten, stored_before })
}

/// Writes `job` back unchanged, so the API server stores it in its storage version; reads it again after a
/// conflict. False when it was deleted meanwhile.
async fn rewrite(client: &Client, ar: &ApiResource, job: &DynamicObject) -> Result<bool, Error> {
    let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, ar);
    let action = format!("rewrite TrainingJob {ns}/{name}");
    let mut current = job.clone();
    for _ in 0..CONFLICT_TRIES {
        match api.replace(&name, &PostParams::default(), &current).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                match api.get_opt(&name).await.map_err(Error::other(action.clone()))? {
                    Some(again) => current = again,
                    None => return Ok(false),
                }
            }
            Err(e) => return Err(Error::other(action)(e)),
        }
    }
    Err(Error::Refused { action, message: format!("it changed under each of {CONFLICT_TRIES} tries; run again") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_says_what_was_done_or_that_nothing_was_needed() {
        let done = Migrated { rewritten: 3, stored_before: vec!["v1alpha1".into(), "v1beta1".into()] };
        assert_eq!(
            done.to_string(),
            "rewrote 3 TrainingJob(s) as weightstream.dev/v1beta1; the CRD's stored versions are now [v1beta1] \
             (were [v1alpha1, v1beta1])"
        );
        let nothing = Migrated { rewritten: 0, stored_before: vec!["v1beta1".into()] };
        assert!(nothing.to_string().contains("nothing to do"), "{nothing}");
    }
}
