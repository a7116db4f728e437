//! Leader election on a `coordination.k8s.io` Lease: only one operator replica reconciles at a time, so two
//! replicas never admit jobs against the same pool concurrently. A replica that cannot renew within the lease
//! deadline (two thirds of the lease) stops before another replica may take over, and is restarted by its
//! Deployment as a follower.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};

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

    /// Renews the lease until it cannot; returns (with the reason) *before* any other replica may take it over.
    pub async fn hold(&self, client: &Client) -> Error {
        self.hold_with(|| self.try_acquire(client)).await
    }

    /// The renewal loop against `attempt` (one take-or-renew round): the fencing the controller relies on.
    ///
    /// A follower may take the lease once `lease_duration` has passed since the last renewal the API server
    /// recorded. This replica counts from the moment it *started* that renewal (never later than the time the
    /// server recorded) and gives up at two thirds of the duration — also when a renewal is still hanging — so
    /// it has stopped reconciling a third of a lease before anyone else can start.
    pub async fn hold_with<F, Fut>(&self, mut attempt: F) -> Error
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool, Error>>,
    {
        let renew_deadline = self.lease_duration * 2 / 3;
        let retry = self.lease_duration / 5;
        // The caller has just acquired or renewed the lease.
        let mut valid_until = tokio::time::Instant::now() + renew_deadline;
        loop {
            tokio::time::sleep_until((tokio::time::Instant::now() + retry).min(valid_until)).await;
            if tokio::time::Instant::now() >= valid_until {
                return Error::Leadership(format!("could not renew lease {} within {renew_deadline:?}", self.name));
            }
            let started = tokio::time::Instant::now();
            match tokio::time::timeout_at(valid_until, attempt()).await {
                Ok(Ok(true)) => valid_until = started + renew_deadline,
                Ok(Ok(false)) => return Error::Leadership(format!("lease {} was taken by another replica", self.name)),
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election: renewing the lease failed"),
                Err(_) => {
                    return Error::Leadership(format!(
                        "renewing lease {} did not finish within {renew_deadline:?}",
                        self.name
                    ));
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

    fn election() -> Election {
        Election {
            namespace: "ns".into(),
            name: "l".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(15),
        }
    }

    /// On a paused clock: however renewals fail, the holder gives up before a follower may take the lease (15 s
    /// after the last renewal the server saw).
    #[tokio::test(start_paused = true)]
    async fn the_leader_stops_before_a_follower_may_take_the_lease() {
        let e = election();
        let lease = e.lease_duration;
        // Every renewal fails: stop within the renew deadline of the acquisition.
        let t0 = tokio::time::Instant::now();
        let err = e.hold_with(|| async { Err(Error::Leadership("api down".into())) }).await;
        assert!(t0.elapsed() <= lease * 2 / 3 && err.to_string().contains("within"), "{:?} {err}", t0.elapsed());
        // A renewal that hangs (a partition) does not keep it leading either.
        let t0 = tokio::time::Instant::now();
        let err = e.hold_with(std::future::pending::<Result<bool, Error>>).await;
        assert!(t0.elapsed() <= lease * 2 / 3, "{:?} {err}", t0.elapsed());
        // Three renewals succeed, then the API server goes away: it stops within the deadline of the last one
        // started, which the server recorded no earlier.
        let mut n = 0;
        let mut last_ok = tokio::time::Instant::now();
        let err = e
            .hold_with(|| {
                n += 1;
                let ok = n <= 3;
                if ok {
                    last_ok = tokio::time::Instant::now();
                }
                async move { if ok { Ok(true) } else { Err(Error::Leadership("api down".into())) } }
            })
            .await;
        assert!(
            last_ok.elapsed() <= lease * 2 / 3 && last_ok.elapsed() > Duration::ZERO,
            "{:?} {err}",
            last_ok.elapsed()
        );
        // Another replica took it: stop at once.
        let t0 = tokio::time::Instant::now();
        let err = e.hold_with(|| async { Ok(false) }).await;
        assert!(t0.elapsed() <= lease / 5 && err.to_string().contains("taken"), "{err}");
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
