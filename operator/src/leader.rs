//! Leader election on a `coordination.k8s.io` Lease: only one operator replica reconciles at a time, so two
//! replicas never admit jobs against the same pool concurrently. A replica that cannot renew within the lease
//! duration stops (and is restarted by its Deployment as a follower).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::Client;

use crate::Error;

/// Who competes for which lease.
#[derive(Clone, Debug)]
pub struct Election {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a holder that stops renewing keeps the lease.
    pub lease_duration: Duration,
}

/// Whether the lease as read may be taken by `identity` at `now`: free, ours, or expired.
pub fn may_take(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> bool {
    let Some(spec) = spec else { return true };
    match spec.holder_identity.as_deref() {
        None | Some("") => true,
        Some(h) if h == identity => true,
        Some(_) => {
            let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()).map(|t| t.0);
            let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
            renewed.is_none_or(|r| r + duration < now)
        }
    }
}

impl Election {
    /// Tries once to take or renew the lease; `Ok(true)` when this replica holds it afterwards. A conflicting
    /// write by another replica is a lost round, not an error.
    pub async fn try_acquire(&self, client: &Client) -> Result<bool, Error> {
        let api: Api<Lease> = Api::namespaced(client.clone(), &self.namespace);
        let now = Timestamp::now();
        let existing = api.get_opt(&self.name).await?;
        let secs = i32::try_from(self.lease_duration.as_secs()).unwrap_or(15);
        match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(secs),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                match api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Some(mut lease) => {
                if !may_take(lease.spec.as_ref(), &self.identity, now) {
                    return Ok(false);
                }
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                    spec.holder_identity = Some(self.identity.clone());
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(secs);
                spec.renew_time = Some(MicroTime(now));
                // `replace` carries the resourceVersion we read: a concurrent writer makes this a 409.
                match api.replace(&self.name, &PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self, client: &Client) -> Result<(), Error> {
        loop {
            match self.try_acquire(client).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election: cannot read or write the lease"),
            }
            tokio::time::sleep(self.lease_duration / 3).await;
        }
    }

    /// Renews the lease every third of its duration; returns (with the reason) once it could not be renewed
    /// for a whole lease duration, after which another replica may take over.
    pub async fn hold(&self, client: &Client) -> Error {
        let mut last_renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.lease_duration / 3).await;
            match self.try_acquire(client).await {
                Ok(true) => last_renewed = tokio::time::Instant::now(),
                Ok(false) => return Error::Leadership(format!("lease {} was taken by another replica", self.name)),
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: renewing the lease failed");
                    if last_renewed.elapsed() > self.lease_duration {
                        return Error::Leadership(format!("could not renew lease {} in time: {e}", self.name));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_taken_only_when_free_ours_or_expired() {
        let now = Timestamp::from_second(1000).unwrap();
        assert!(may_take(None, "me", now));
        assert!(may_take(Some(&spec("me", 999)), "me", now));
        assert!(!may_take(Some(&spec("other", 990)), "me", now));
        assert!(may_take(Some(&spec("other", 980)), "me", now));
        assert!(may_take(Some(&LeaseSpec::default()), "me", now));
    }
}
