//! Which CPUs a local run's processes run on: `wsctl run --engine-cpus LIST` gives the engines those CPUs and
//! every other role (MemoryX, SwarmX, the input workers) the rest, as an appliance gives each its own hosts.

use std::fmt;

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// A set of CPU numbers, written as Linux lists them (`0-3,6`: `taskset -c`, `/proc/PID/status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList(Vec<usize>);

impl CpuList {
    /// Parses `0-3,6`: numbers and inclusive ranges, comma-separated, each below what Linux can address.
    pub fn parse(s: &str) -> Result<CpuList, String> {
        let most = CpuSet::count();
        let number = |t: &str| {
            t.trim().parse::<usize>().ok().filter(|&n| n < most).ok_or_else(|| {
                format!("'{t}' in '{s}' is not a CPU number below {most}: write CPUs as 0-3,6 (`nproc` counts them)")
            })
        };
        let mut cpus = Vec::new();
        for part in s.split(',') {
            let (from, to) = match part.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => (number(part)?, number(part)?),
            };
            if from > to {
                return Err(format!("'{part}' in '{s}' is a range that runs backwards: write {to}-{from}"));
            }
            cpus.extend(from..=to);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuList(cpus))
    }

    /// The CPUs this process may run on (its own affinity, which a container's or `taskset`'s limits narrow).
    pub fn allowed() -> Result<CpuList, String> {
        let set = sched_getaffinity(Pid::from_raw(0)).map_err(|e| format!("cannot read this process's CPUs: {e}"))?;
        Ok(CpuList((0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect()))
    }

    /// Pins the calling thread, and every thread it starts afterwards, to these CPUs; returns the CPUs the kernel
    /// then reports for it.
    pub fn pin_this_thread(&self) -> Result<CpuList, String> {
        let mut set = CpuSet::new();
        for &c in &self.0 {
            set.set(c).map_err(|e| format!("CPU {c}: {e}"))?;
        }
        sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| format!("cannot run on CPUs {self}: {e}"))?;
        CpuList::allowed()
    }
}

impl fmt::Display for CpuList {
    /// Consecutive CPUs as ranges: `0-3,6`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            while i + 1 < self.0.len() && self.0[i + 1] == self.0[i] + 1 {
                i += 1;
            }
            parts.push(if self.0[i] == start { start.to_string() } else { format!("{start}-{}", self.0[i]) });
            i += 1;
        }
        f.write_str(&parts.join(","))
    }
}

/// The CPUs of a run split between the engines and everything else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinning {
    /// The engines' CPUs (`--engine-cpus`).
    pub engines: CpuList,
    /// Every other role's: the CPUs this process may use that the engines do not.
    pub others: CpuList,
}

impl Pinning {
    /// Splits `allowed` into `engines` and the rest; refuses CPUs outside `allowed`, and a list that leaves no
    /// CPU to the other roles.
    pub fn split(engines: CpuList, allowed: &CpuList) -> Result<Pinning, String> {
        if let Some(c) = engines.0.iter().find(|c| !allowed.0.contains(c)) {
            return Err(format!(
                "--engine-cpus {engines}: CPU {c} is not one this process may run on ({allowed}); name CPUs of those"
            ));
        }
        let others = CpuList(allowed.0.iter().copied().filter(|c| !engines.0.contains(c)).collect());
        if others.0.is_empty() {
            return Err(format!(
                "--engine-cpus {engines} leaves no CPU for MemoryX, SwarmX and the input workers: leave at least one \
                 of {allowed} out"
            ));
        }
        Ok(Pinning { engines, others })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_and_write_as_linux_writes_them() {
        for (text, cpus, shown) in
            [("0", vec![0], "0"), ("0-3,6", vec![0, 1, 2, 3, 6], "0-3,6"), ("5,1-2,2", vec![1, 2, 5], "1-2,5")]
        {
            let l = CpuList::parse(text).unwrap();
            assert_eq!((&l.0[..], l.to_string().as_str()), (&cpus[..], shown), "{text}");
            assert_eq!(CpuList::parse(&l.to_string()).unwrap(), l);
        }
        for (bad, says) in [("", "not a CPU number"), ("3-1", "backwards"), ("1,x", "'x'"), ("99999", "below")] {
            let e = CpuList::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_engines_take_their_cpus_and_the_other_roles_the_rest() {
        let all = CpuList::parse("0-3").unwrap();
        let p = Pinning::split(CpuList::parse("2-3").unwrap(), &all).unwrap();
        assert_eq!((p.engines.to_string(), p.others.to_string()), ("2-3".into(), "0-1".into()));
        let e = Pinning::split(CpuList::parse("0-3").unwrap(), &all).unwrap_err();
        assert!(e.contains("leaves no CPU for MemoryX"), "{e}");
        let e = Pinning::split(CpuList::parse("7").unwrap(), &all).unwrap_err();
        assert!(e.contains("CPU 7 is not one this process may run on (0-3)"), "{e}");
    }

    /// A thread pinned to one CPU runs there only, as the kernel reports it; threads it starts inherit that.
    #[test]
    fn a_pinned_thread_and_its_children_run_on_those_cpus_only() {
        let allowed = CpuList::allowed().unwrap();
        let last = CpuList(vec![*allowed.0.last().unwrap()]);
        let seen = std::thread::spawn(move || {
            let pinned = last.pin_this_thread().unwrap();
            let child = std::thread::spawn(|| CpuList::allowed().unwrap()).join().unwrap();
            (last, pinned, child)
        })
        .join()
        .unwrap();
        assert_eq!((&seen.1, &seen.2), (&seen.0, &seen.0));
        // This thread was not pinned.
        assert_eq!(CpuList::allowed().unwrap(), allowed);
    }
}
