//! SwarmX: the fabric between MemoryX and the engines. It broadcasts each streamed layer to every engine and
//! sums what comes back — gradients and loss reports — so MemoryX and the training loop see one engine
//! however many CS-2s the job uses.

use crate::engine::{EngineRole, EngineStats, Shard};
use crate::error::{Error, Result};
use crate::model::loss::LossSum;
use crate::protocol::{LayerGrad, LayerStream};

/// What the training loop needs from the fabric; a gRPC client to a SwarmX tree implements it the same way.
pub trait Swarm {
    /// Engines behind the fabric.
    fn engines(&self) -> usize;
    /// Hands each engine its shard (`shards[i]` to engine `i`) and starts the step.
    fn begin_step(&mut self, shards: Vec<Shard>, grad_scale: f32, train: bool) -> Result<()>;
    /// Broadcasts a forward stream to every engine.
    fn forward(&mut self, stream: &LayerStream) -> Result<()>;
    /// The step's loss sums, added over engines.
    fn loss(&mut self) -> Result<LossSum>;
    /// Broadcasts a backward stream and returns the gradients summed over engines.
    fn backward(&mut self, stream: &LayerStream) -> Result<LayerGrad>;
    /// Each engine's counters.
    fn stats(&self) -> Vec<EngineStats>;
}

/// SwarmX with its engines in the same process: broadcast is a shared reference, reduce a sum in engine order.
pub struct LocalSwarm {
    engines: Vec<Box<dyn EngineRole>>,
}

impl LocalSwarm {
    /// A fabric over `engines`; there must be at least one.
    pub fn new(engines: Vec<Box<dyn EngineRole>>) -> Result<Self> {
        if engines.is_empty() {
            return Err(Error::Protocol("SwarmX needs at least one engine".into()));
        }
        Ok(LocalSwarm { engines })
    }
}

impl Swarm for LocalSwarm {
    fn engines(&self) -> usize {
        self.engines.len()
    }

    fn begin_step(&mut self, shards: Vec<Shard>, grad_scale: f32, train: bool) -> Result<()> {
        if shards.len() != self.engines.len() {
            return Err(Error::Protocol(format!("{} shards for {} engines", shards.len(), self.engines.len())));
        }
        for (engine, shard) in self.engines.iter_mut().zip(shards) {
            engine.begin_step(shard, grad_scale, train)?;
        }
        Ok(())
    }

    fn forward(&mut self, stream: &LayerStream) -> Result<()> {
        self.engines.iter_mut().try_for_each(|e| e.forward(stream))
    }

    fn loss(&mut self) -> Result<LossSum> {
        let mut total = LossSum::default();
        for engine in &mut self.engines {
            total.add(&engine.loss()?);
        }
        Ok(total)
    }

    fn backward(&mut self, stream: &LayerStream) -> Result<LayerGrad> {
        let mut engines = self.engines.iter_mut();
        let first = engines.next().ok_or_else(|| Error::Protocol("no engines".into()))?;
        let mut sum = first.backward(stream)?;
        for engine in engines {
            sum.add(&engine.backward(stream)?).map_err(Error::Protocol)?;
        }
        Ok(sum)
    }

    fn stats(&self) -> Vec<EngineStats> {
        self.engines.iter().map(|e| e.stats()).collect()
    }
}
