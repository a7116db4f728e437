//! Many API writes sent as Kubernetes' Job controller sends its pods: in batches that double from one, each
//! batch's requests in flight together, stopping at the first refusal. A 192-CS-2 appliance (over 400 pods)
//! is then created in a few round trips instead of one request after another, while a namespace that refuses
//! pods (a quota, Pod Security, a webhook) sees one failing request, not hundreds.

use std::future::Future;

/// The largest batch: the requests one pass keeps in flight at once.
pub const MAX_BATCH: usize = 32;

/// Runs `op` on every item of `items` in batches of 1, 2, 4, … up to [`MAX_BATCH`], the items of a batch
/// concurrently and the batches one after another; returns the first error, after which no further batch
/// starts (the requests of the failing batch still in flight are dropped: the next pass sees what they did).
pub async fn in_batches<'a, T, E, F, Fut>(items: &'a [T], mut op: F) -> Result<(), E>
where
    F: FnMut(&'a T) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let (mut start, mut batch) = (0, 1);
    while start < items.len() {
        let end = (start + batch).min(items.len());
        futures::future::try_join_all(items[start..end].iter().map(&mut op)).await?;
        start = end;
        batch = (batch * 2).min(MAX_BATCH);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Runs `in_batches` over `n` items whose op fails at item `fail_at`; returns the batches it started
    /// (the items of each, in order) and its result.
    fn run(n: usize, fail_at: Option<usize>) -> (Vec<Vec<usize>>, Result<(), String>) {
        let items: Vec<usize> = (0..n).collect();
        let started = Mutex::new(Vec::<usize>::new());
        let batches = Mutex::new(Vec::<Vec<usize>>::new());
        let result = futures::executor::block_on(in_batches(&items, |&i| {
            started.lock().unwrap().push(i);
            let batches = &batches;
            let started = &started;
            async move {
                // Every request of a batch has been started before any of them completes: the batch is sent
                // at once. The first to complete records the batch.
                let mut b = batches.lock().unwrap();
                let now: Vec<usize> = started.lock().unwrap().clone();
                let seen: usize = b.iter().map(Vec::len).sum();
                if now.len() > seen {
                    b.push(now[seen..].to_vec());
                }
                if Some(i) == fail_at { Err(format!("item {i} refused")) } else { Ok(()) }
            }
        }));
        (batches.into_inner().unwrap(), result)
    }

    #[test]
    fn batches_double_from_one_up_to_the_largest() {
        let (batches, result) = run(100, None);
        assert_eq!(result, Ok(()));
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, 2, 4, 8, 16, 32, 32, 5]);
        assert_eq!(batches.concat(), (0..100).collect::<Vec<_>>(), "every item once, in order");
    }

    #[test]
    fn a_refusal_stops_every_later_batch() {
        // Item 0 is the first batch on its own: nothing else is sent.
        let (batches, result) = run(400, Some(0));
        assert_eq!(result, Err("item 0 refused".to_string()));
        assert_eq!(batches, vec![vec![0]]);
        // A refusal in the batch of items 3..7 leaves items 7.. unsent.
        let (batches, result) = run(400, Some(5));
        assert_eq!(result, Err("item 5 refused".to_string()));
        assert_eq!(batches.concat(), (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn nothing_to_do_sends_nothing() {
        let (batches, result) = run(0, None);
        assert_eq!((batches.len(), result), (0, Ok(())));
    }
}
