//! The disk tier of a weight server: the layers that do not fit its memory budget live in files on its volume,
//! one per layer, and are read when the stream reaches them and written back after their update. The order
//! layers are used in is known — forward 0..L, each read whole, updated with the last step's committed gradient
//! and written back, then backward L..0, weights and bias only — so each read also starts reading the next layer
//! in that order on a helper thread, while the engines compute the current one. At most two layers are out of
//! their files at once — the one in use and the one read ahead — which is what [`TierLayout`] reserves in the
//! budget.
//!
//! Layers and staged gradients are read into the buffers of those already used (a [`Recycled`] of the tier's):
//! a fresh buffer costs a page fault per page, which on a machine whose freed memory goes back to its host is
//! several times the read itself. Once a read has taken its buffers it frees the others kept, but for one after a
//! whole read: the buffer the layer's staged gradient takes when it is read to be applied. So beyond the layer
//! in use, the one read ahead (the window its budget reserves) and that gradient, the tier keeps at most the
//! last layer used until the next read, within the allowance a server's budget grants layers in transit
//! (`wsctl/tests/servers.rs`).
//!
//! The files are scratch: the state they hold is checkpointed like any other, and a restarted server rebuilds
//! them from its checkpoint.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::slice::{LayerLengths, LayerTensors};
use crate::protocol::codec::chunk::Recycled;
use errors::{Error, Result};

/// Which layers of a slice live on disk under a memory budget.
#[derive(Clone, Debug, PartialEq)]
pub struct TierLayout {
    /// Per layer: whether it lives in the disk tier.
    pub on_disk: Vec<bool>,
    /// Bytes reserved for the layers out of their files: the largest on-disk layer, twice.
    pub window: u64,
}

impl TierLayout {
    /// Keeps layers in memory, in order, while they and the window for the rest fit `budget`; the others go to
    /// disk. Refuses a budget that cannot hold the window.
    pub fn new(layer_bytes: &[u64], budget: u64) -> Result<TierLayout> {
        let total: u64 = layer_bytes.iter().sum();
        if total <= budget {
            return Ok(TierLayout { on_disk: vec![false; layer_bytes.len()], window: 0 });
        }
        let largest = layer_bytes.iter().copied().max().unwrap_or(0);
        let window = 2 * largest;
        if window > budget {
            return Err(Error::Plan(format!(
                "a weight server's memory budget ({}) is too small for one layer: its slice of the largest layer ({}) \
                 must fit twice, one being updated while the next is read ahead; raise spec.memoryx.memoryBytes to {} \
                 or more, or add weight servers",
                errors::units::bytes(budget),
                errors::units::bytes(largest),
                window
            )));
        }
        let mut resident = 0;
        let on_disk = layer_bytes
            .iter()
            .map(|&b| {
                if resident + b + window <= budget {
                    resident += b;
                    false
                } else {
                    true
                }
            })
            .collect();
        Ok(TierLayout { on_disk, window })
    }
}

/// A layer read ahead, or being read.
#[derive(Default)]
struct Ahead {
    /// The layer, and whether all its tensors (not just weights and bias) were read.
    layer: Option<(usize, bool)>,
    /// Its tensors once read; `None` while the read is in flight.
    tensors: Option<Result<LayerTensors>>,
}

/// The files of one server's on-disk layers.
pub struct Tier {
    dir: PathBuf,
    layout: TierLayout,
    lengths: Vec<LayerLengths>,
    files: Vec<Option<Arc<File>>>,
    /// Per on-disk layer, the file its staged gradient waits in until it is applied (after the step's commit).
    grads: Vec<Option<File>>,
    ahead: Arc<(Mutex<Ahead>, Condvar)>,
    /// The last layer used, to tell the direction of travel.
    last: Mutex<Option<usize>>,
    read: Arc<AtomicU64>,
    written: AtomicU64,
    /// Buffers of layers and gradients used, for the next reads to fill.
    recycled: Arc<Recycled>,
}

impl Tier {
    /// Creates (or empties) the tier's files in `dir` for the on-disk layers of `layout`, whose slices have
    /// `lengths`.
    pub fn create(dir: PathBuf, lengths: &[LayerLengths], layout: TierLayout) -> Result<Tier> {
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating the disk tier {}", dir.display()), e))?;
        // Files of an earlier incarnation (a killed server cannot remove its own) are scratch too.
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.path().extension().is_some_and(|x| x == "f32") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let scratch = |prefix: &str, l: usize| -> Result<File> {
            let path = dir.join(format!("{prefix}-{l:05}.f32"));
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .map_err(|e| Error::io(format!("creating {}", path.display()), e))
        };
        let on_disk: Vec<usize> =
            (0..lengths.len()).filter(|&l| layout.on_disk.get(l).copied().unwrap_or(false)).collect();
        let mut files: Vec<Option<Arc<File>>> = vec![None; lengths.len()];
        let mut grads: Vec<Option<File>> = (0..lengths.len()).map(|_| None).collect();
        for l in on_disk {
            files[l] = Some(Arc::new(scratch("layer", l)?));
            grads[l] = Some(scratch("grad", l)?);
        }
        Ok(Tier {
            dir,
            layout,
            lengths: lengths.to_vec(),
            files,
            grads,
            ahead: Arc::default(),
            last: Mutex::new(None),
            read: Arc::default(),
            written: AtomicU64::new(0),
            recycled: Arc::new(Recycled::layer_sized()),
        })
    }

    /// Whether layer `l` lives on disk.
    pub fn on_disk(&self, l: usize) -> bool {
        self.layout.on_disk.get(l).copied().unwrap_or(false)
    }

    /// Bytes of state on disk.
    pub fn disk_bytes(&self) -> u64 {
        (0..self.lengths.len())
            .filter(|&l| self.on_disk(l))
            .map(|l| 4 * self.lengths[l].iter().sum::<usize>() as u64)
            .sum()
    }

    /// Bytes read from and written to the tier's files so far.
    pub fn traffic(&self) -> (u64, u64) {
        (self.read.load(Ordering::Relaxed), self.written.load(Ordering::Relaxed))
    }

    fn file(&self, l: usize) -> Result<Arc<File>> {
        self.files
            .get(l)
            .cloned()
            .flatten()
            .ok_or_else(|| Error::Protocol(format!("layer {l} is not in the disk tier of {}", self.dir.display())))
    }

    /// Layer `l`'s tensors (all of them with `all`, else only the weights and bias), from the read-ahead when it
    /// holds them, and starts reading the layer expected next.
    pub fn read(&self, l: usize, all: bool) -> Result<LayerTensors> {
        let next = self.next_after(l, all);
        let ahead = self.take_ahead(l, all);
        let tensors = match ahead {
            Some(t) => t,
            None => read_layer(self.file(l)?.as_ref(), &self.lengths[l], all, &self.read, &self.recycled),
        };
        if let Some((n, all)) = next {
            self.prefetch(n, all);
        }
        tensors
    }

    /// Keeps layer `l`'s staged gradient (weights and bias) in its file until it is applied.
    pub fn write_grad(&self, l: usize, weights: &[f32], bias: &[f32]) -> Result<()> {
        let file = self
            .grads
            .get(l)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Protocol(format!("layer {l} is not in the disk tier")))?;
        let w: &[u8] = bytemuck::cast_slice(weights);
        file.write_all_at(w, 0)
            .and_then(|()| file.write_all_at(bytemuck::cast_slice(bias), w.len() as u64))
            .map_err(|e| Error::io(format!("staging layer {l}'s gradient in the disk tier"), e))?;
        self.written.fetch_add(4 * (weights.len() + bias.len()) as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Layer `l`'s staged gradient, as [`Tier::write_grad`] kept it.
    pub fn read_grad(&self, l: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let file = self
            .grads
            .get(l)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Protocol(format!("layer {l} is not in the disk tier")))?;
        let (nw, nb) = (self.lengths[l][0], self.lengths[l][1]);
        let (mut w, mut b) = (self.recycled.take(nw), self.recycled.take(nb));
        read_values(file, &mut w, nw, 0)
            .and_then(|()| read_values(file, &mut b, nb, 4 * nw as u64))
            .map_err(|e| Error::io(format!("reading layer {l}'s staged gradient from the disk tier"), e))?;
        self.read.fetch_add(4 * (nw + nb) as u64, Ordering::Relaxed);
        Ok((w, b))
    }

    /// Takes back the buffers of tensors read from the tier (a layer, a staged gradient) once they are used, for
    /// the next reads to fill.
    pub fn recycle(&self, buffers: impl IntoIterator<Item = Vec<f32>>) {
        for v in buffers {
            self.recycled.give(v);
        }
    }

    /// Writes layer `l`'s tensors back to its file.
    pub fn write(&self, l: usize, tensors: &LayerTensors) -> Result<()> {
        let file = self.file(l)?;
        let mut at = 0u64;
        for (t, &want) in tensors.iter().zip(&self.lengths[l]) {
            if t.len() != want {
                return Err(Error::Protocol(format!("layer {l}: a tensor of {} values where {want} belong", t.len())));
            }
            let bytes: &[u8] = bytemuck::cast_slice(t);
            file.write_all_at(bytes, at).map_err(|e| Error::io(format!("writing layer {l} to the disk tier"), e))?;
            at += bytes.len() as u64;
        }
        self.written.fetch_add(at, Ordering::Relaxed);
        // A write makes any read-ahead of the layer stale: one in flight is waited for, then dropped.
        let (lock, ready) = &*self.ahead;
        if let Ok(mut a) = lock.lock()
            && a.layer.is_some_and(|(al, _)| al == l)
        {
            while a.tensors.is_none() {
                match ready.wait(a) {
                    Ok(g) => a = g,
                    Err(_) => return Ok(()),
                }
            }
            *a = Ahead::default();
        }
        Ok(())
    }

    /// The on-disk layer expected after `l` (read whole when `all`), from the direction of travel, and whether
    /// all its tensors will be wanted. A whole read goes up the forward pass, where each layer is read whole to
    /// apply its committed gradient, and so do part reads that rise (evaluation). Part reads go down the
    /// backward pass (weights and bias only), which reads no weights of layer 0 (no gradient flows past it):
    /// below layer 1 the next read is the next step's forward pass, from its lowest layer on disk, whole (the
    /// one just read, if it is that layer). Reading the moments ahead in the backward pass, which does not use
    /// them, was a quarter of the tier's reads.
    fn next_after(&self, l: usize, all: bool) -> Option<(usize, bool)> {
        let n = self.lengths.len();
        let prev = self.last.lock().ok()?.replace(l);
        let up = all || matches!(prev, Some(p) if p < l);
        if up {
            return (l + 1..n).find(|&k| self.on_disk(k)).map(|k| (k, all));
        }
        (1..l)
            .rev()
            .find(|&k| self.on_disk(k))
            .map(|k| (k, false))
            .or_else(|| (0..n).find(|&k| self.on_disk(k)).map(|k| (k, true)))
    }

    /// Starts reading layer `l` (all its tensors, or with `all` false its weights and bias) on a helper thread,
    /// unless a read-ahead is already held or in flight: one at a time, which is the window the budget reserves.
    pub fn prefetch(&self, l: usize, all: bool) {
        let Ok(file) = self.file(l) else { return };
        {
            let Ok(mut a) = self.ahead.0.lock() else { return };
            if a.layer.is_some() {
                return;
            }
            *a = Ahead { layer: Some((l, all)), tensors: None };
        }
        let (ahead, lengths, read, recycled) =
            (self.ahead.clone(), self.lengths[l], self.read.clone(), self.recycled.clone());
        std::thread::spawn(move || {
            let tensors = read_layer(&file, &lengths, all, &read, &recycled);
            let (lock, ready) = &*ahead;
            if let Ok(mut a) = lock.lock() {
                a.tensors = Some(tensors);
                ready.notify_all();
            }
        });
    }

    /// The read-ahead of layer `l`, waiting for it if it is in flight; `None` when another layer (or too little
    /// of this one) is ahead, which is then dropped.
    fn take_ahead(&self, l: usize, all: bool) -> Option<Result<LayerTensors>> {
        let (lock, ready) = &*self.ahead;
        let mut a = lock.lock().ok()?;
        match a.layer {
            Some((al, aall)) if al == l && (aall || !all) => {
                while a.tensors.is_none() {
                    a = ready.wait(a).ok()?;
                }
                let t = a.tensors.take();
                *a = Ahead::default();
                t
            }
            Some(_) if a.tensors.is_some() => {
                *a = Ahead::default();
                None
            }
            _ => None,
        }
    }
}

impl Drop for Tier {
    /// The files are scratch: the state they held is gone with the server (its checkpoints keep it).
    fn drop(&mut self) {
        for l in 0..self.files.len() {
            if self.files[l].is_some() {
                let _ = std::fs::remove_file(self.dir.join(format!("layer-{l:05}.f32")));
                let _ = std::fs::remove_file(self.dir.join(format!("grad-{l:05}.f32")));
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Reads a layer's tensors from its file into buffers from `recycled`: all six tensors, or only the weights and
/// bias (the others left empty). What `recycled` keeps beyond them is then freed, but for the one buffer a whole
/// read (the forward pass) leaves for its layer's staged gradient, read beside it to be applied: freeing that
/// one too mapped every gradient fresh, ~2.5% of the machine for each weight server of a 3 B-shaped run.
fn read_layer(
    file: &File,
    lengths: &LayerLengths,
    all: bool,
    counter: &AtomicU64,
    recycled: &Recycled,
) -> Result<LayerTensors> {
    let wanted = |k: usize| all || k < 2;
    let mut out: LayerTensors = Default::default();
    for (k, &len) in lengths.iter().enumerate().filter(|(k, _)| wanted(*k)) {
        out[k] = recycled.take(len);
    }
    recycled.free_all_but(usize::from(all));
    let mut at = 0u64;
    for (k, &len) in lengths.iter().enumerate() {
        if wanted(k) {
            read_values(file, &mut out[k], len, at).map_err(|e| Error::io("reading a layer from the disk tier", e))?;
            counter.fetch_add(4 * len as u64, Ordering::Relaxed);
        }
        at += 4 * len as u64;
    }
    Ok(out)
}

/// Reads `len` values at byte `offset` of `file` into `out` (emptied first), straight into its spare room: a
/// kept buffer zero-filled only for the read to overwrite it was a tenth of a tiered step's update phase.
fn read_values(file: &File, out: &mut Vec<f32>, len: usize, offset: u64) -> std::io::Result<()> {
    out.clear();
    out.reserve_exact(len);
    let bytes = len * std::mem::size_of::<f32>();
    let room = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
    let mut done = 0;
    while done < bytes {
        let at = libc::off_t::try_from(offset + done as u64).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "a disk tier offset past the file API's range")
        })?;
        // SAFETY: `room + done .. room + bytes` lies within the spare capacity reserved above, which `pread`
        // only writes; nothing else holds the buffer.
        let n = unsafe { libc::pread(file.as_raw_fd(), room.add(done).cast(), bytes - done, at) };
        match n {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the disk tier file ends before the layer does",
                ));
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    // SAFETY: the reads above wrote all `len` values.
    unsafe { out.set_len(len) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_stay_in_memory_while_they_and_the_window_fit() {
        let all = TierLayout::new(&[100, 100, 100], 300).unwrap();
        assert_eq!(all.on_disk, vec![false; 3]);
        let some = TierLayout::new(&[100, 100, 100, 100], 350).unwrap();
        assert_eq!((some.on_disk, some.window), (vec![false, true, true, true], 200));
        let err = TierLayout::new(&[100, 300, 300], 500).unwrap_err().to_string();
        assert!(err.contains("too small for one layer"), "{err}");
    }

    #[test]
    fn large_buffers_come_back_zeroed_and_small_ones_are_left_to_the_heap() {
        let dir = std::env::temp_dir().join(format!("ws-tier-recycle-{}", std::process::id()));
        // Nothing on disk: no read-ahead thread shares the buffers with this test.
        let tier = Tier::create(
            dir.clone(),
            &[[Recycled::LAYER_SIZED, 1, 0, 0, 0, 0]],
            TierLayout { on_disk: vec![false], window: 0 },
        )
        .unwrap();
        let mut big = tier.recycled.zeroed(Recycled::LAYER_SIZED + 5);
        big[7] = 3.0;
        let at = big.as_ptr();
        tier.recycle([big, vec![1.0; 8]]);
        let reused = tier.recycled.zeroed(Recycled::LAYER_SIZED);
        assert_eq!(
            (reused.as_ptr(), reused.len()),
            (at, Recycled::LAYER_SIZED),
            "the large buffer comes back, at the length asked"
        );
        assert!(reused.iter().all(|&x| x == 0.0), "zeroed");
        assert_eq!(tier.recycled.zeroed(8).capacity(), 8, "a small one was not kept");
        drop(tier);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A step reads each on-disk layer whole and its staged gradient going up, and the weights going down. Once
    /// the forward pass is under way, each layer and each gradient is read into buffers the tier kept: none is
    /// mapped fresh, and the tier never holds more than the layer in use, the one read ahead and a gradient.
    #[test]
    fn in_the_forward_pass_layers_and_gradients_are_read_into_kept_buffers() {
        let dir = std::env::temp_dir().join(format!("ws-tier-keep-{}", std::process::id()));
        let n = Recycled::LAYER_SIZED;
        let shape = [n, 1, n, n, 1, 1];
        let tier = Tier::create(dir.clone(), &[shape; 4], TierLayout { on_disk: vec![true; 4], window: 0 }).unwrap();
        for l in 0..4 {
            tier.write(l, &std::array::from_fn(|k| vec![l as f32; shape[k]])).unwrap();
            tier.write_grad(l, &vec![1.0; n], &[1.0]).unwrap();
        }
        // Each read's read-ahead has taken its buffers before the caller goes on, as a fetch then takes its time.
        let read = |l: usize, all: bool| {
            let t = tier.read(l, all).unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            let in_flight = || {
                let a = tier.ahead.0.lock().unwrap();
                a.layer.is_some() && a.tensors.is_none()
            };
            while in_flight() {
                assert!(std::time::Instant::now() < deadline, "the read-ahead did not finish");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            t
        };
        let mut missed = Vec::new();
        for _step in 0..2 {
            for l in 0..4 {
                let before = tier.recycled.misses();
                let t = read(l, true);
                let (w, b) = tier.read_grad(l).unwrap();
                missed.push(tier.recycled.misses() - before);
                assert_eq!((t[0][0], t[3].len(), w.len(), b.len()), (l as f32, n, n, 1));
                tier.recycle([w, b]);
                tier.write(l, &t).unwrap();
                tier.recycle(t);
                let (held, _) = tier.recycled.held();
                assert!(held <= 7 * n, "in use, ahead and a gradient at most: {held} values");
            }
            for l in (1..4).rev() {
                let t = read(l, false);
                assert_eq!((t[0][0], t[2].len()), (l as f32, 0), "weights and bias only");
                tier.recycle(t);
                tier.write_grad(l, &vec![1.0; n], &[1.0]).unwrap();
            }
        }
        // The first layers of each step take what the backward pass (which kept little) left; from the third on,
        // every buffer is a kept one.
        assert_eq!((missed[2], missed[3], missed[6], missed[7]), (0, 0, 0, 0), "misses by layer read: {missed:?}");
        drop(tier);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_layer_written_is_read_back_and_read_ahead_in_stream_order() {
        let dir = std::env::temp_dir().join(format!("ws-tier-{}", std::process::id()));
        let lengths = vec![[3, 1, 3, 3, 1, 1]; 5];
        // Layer 1 stays in memory: read-ahead passes over it.
        let on_disk = vec![true, false, true, true, true];
        let tier = Tier::create(dir.clone(), &lengths, TierLayout { on_disk, window: 0 }).unwrap();
        for l in [0, 2, 3, 4] {
            let v = |k: usize, n: usize| (0..n).map(|i| (100 * l + 10 * k + i) as f32).collect::<Vec<_>>();
            let t: LayerTensors = std::array::from_fn(|k| v(k, lengths[l][k]));
            tier.write(l, &t).unwrap();
        }
        let ahead = |tier: &Tier| tier.ahead.0.lock().unwrap().layer;
        // Up the forward pass, each layer read whole (its committed gradient applied): the next on disk is read
        // ahead whole, and handed over.
        let first = tier.read(0, true).unwrap();
        assert_eq!((first[0].clone(), first[3].clone()), (vec![0.0, 1.0, 2.0], vec![30.0, 31.0, 32.0]));
        assert_eq!(ahead(&tier), Some((2, true)), "the next layer on disk, whole");
        let second = tier.read(2, true).unwrap();
        assert_eq!(second[3], vec![230.0, 231.0, 232.0]);
        assert_eq!(ahead(&tier), Some((3, true)));
        tier.read(3, true).unwrap();
        tier.read(4, true).unwrap();
        assert_eq!(ahead(&tier), None, "nothing above the top");
        // The turn at the top, then down the backward pass: weights and bias only.
        let top = tier.read(4, false).unwrap();
        assert_eq!((top[0].clone(), top[2].len()), (vec![400.0, 401.0, 402.0], 0), "weights and bias only");
        assert_eq!(ahead(&tier), Some((3, false)));
        tier.read(3, false).unwrap();
        tier.read(2, false).unwrap();
        // Past the layer in memory, the backward pass reads no weights of layer 0: next is the next step's
        // forward pass, from its lowest layer on disk, whole.
        assert_eq!(ahead(&tier), Some((0, true)), "the next step's first layer");
        // The turn at the bottom: the next step's forward pass goes up again, whole.
        tier.read(0, true).unwrap();
        assert_eq!(ahead(&tier), Some((2, true)));
        tier.read(2, true).unwrap();

        // Buffers handed back are filled by the next reads, with that layer's values.
        tier.recycle(second);
        let again = tier.read(2, true).unwrap();
        assert_eq!((again[0].clone(), again[3].clone()), (vec![200.0, 201.0, 202.0], vec![230.0, 231.0, 232.0]));

        // A write drops a stale read-ahead: the value read is the one written.
        let mut t = tier.read(3, true).unwrap();
        t[0][0] = -1.0;
        tier.write(3, &t).unwrap();
        assert_eq!(tier.read(3, true).unwrap()[0][0], -1.0);
        std::fs::remove_dir_all(&dir).ok();
    }
}
