//! The `TrainingJob` spec: what a user declares. Everything that runs a job — `wsctl run`, `wsctl plan`
//! and the operator — reads it through these types, so a manifest means the same thing everywhere.

use k8s_openapi::api::core::v1::ResourceRequirements;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::execution::ExecutionMode;
use crate::status::TrainingJobStatus;

/// The API group, for code that builds references to jobs by hand.
pub const GROUP: &str = "weightstream.dev";
/// The API version of the types in this crate (`version::ApiVersion::STORED`; older ones are listed there).
pub const VERSION: &str = "v1beta1";

/// A training job for the appliance: a model, its data, how to train it, and how many CS-2 systems to use.
///
/// The user never says how the model is distributed: the appliance assembles MemoryX, the SwarmX tree and one
/// engine per CS-2 from this alone.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "weightstream.dev",
    version = "v1beta1",
    kind = "TrainingJob",
    plural = "trainingjobs",
    shortname = "tj",
    namespaced,
    status = "TrainingJobStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"CS-2","type":"integer","jsonPath":".spec.cs2"}"#,
    printcolumn = r#"{"name":"Step","type":"integer","jsonPath":".status.step"}"#,
    printcolumn = r#"{"name":"Loss","type":"number","jsonPath":".status.loss"}"#,
    printcolumn = r#"{"name":"Done","type":"integer","jsonPath":".status.progressPercentage","description":"percent of the steps done"}"#,
    printcolumn = r#"{"name":"ETA-s","type":"integer","jsonPath":".status.estimatedRemainingSeconds","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("size(self.metadata.name) <= 40")
        .message("metadata.name must be at most 40 characters: the appliance's pod names and hostnames extend it"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS label (lowercase letters, digits and '-', starting with a letter): it names the appliance's pods and their hostnames")
)]
#[x_kube(
    validation = Rule::new("self.training.batchSize % self.cs2 == 0")
        .message("spec.training.batchSize must be divisible by spec.cs2: each CS-2 takes an equal shard of the batch")
        .field_path(".training.batchSize"),
    validation = Rule::new("!has(self.minCs2) || (self.minCs2 <= self.cs2 && self.cs2 % self.minCs2 == 0)")
        .message("spec.minCs2 must be at most spec.cs2 and divide it: the job shrinks only to a count that takes whole shards of the full job, so its curve stays the same")
        .field_path(".minCs2"),
    validation = Rule::new("!has(self.training.microBatchSize) || (self.training.batchSize / self.cs2) % self.training.microBatchSize == 0")
        .message("spec.training.microBatchSize must divide each CS-2's shard (batchSize / cs2): an engine runs its shard as equal micro-batches")
        .field_path(".training.microBatchSize"),
    validation = Rule::new("(self.data.kind in ['text', 'tokens', 'jsonl']) == (self.model.kind in ['gpt', 'llama'])")
        .message("spec.data.kind: a gpt or llama trains on text, tokens or jsonl, and an mlp on mnist or arrays")
        .field_path(".data.kind"),
    // In a cluster a pretrained folder is read from the job's data volume by the pods that need it.
    validation = Rule::new(
        "!has(self.model.from) || (has(self.data.volume) && !(self.model.from.startsWith('/') || \
         self.model.from.matches('(^|/)[.][.](/|$)')))"
    )
    .message(
        "spec.model.from: a cluster job reads its pretrained folder from its data volume: set spec.data.volume and \
         give the folder's path inside it (no leading '/', no '..')"
    )
    .field_path(".model.from"),
    validation = Rule::new(
        "self.data.kind != 'mnist' || (size(self.model.layers) >= 2 && self.model.layers[0] == 784 && \
         self.model.layers[size(self.model.layers) - 1] == 10)"
    )
    .message("spec.model.layers: mnist has 784 input pixels and 10 classes, so layers must start with 784 and end with 10")
    .field_path(".model.layers")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainingJobSpec {
    /// How many CS-2 systems (one engine each) train the model data-parallel. The global batch is split
    /// evenly over them, so it must be divisible by this count.
    #[serde(default = "default_cs2")]
    #[schemars(range(min = 1, max = 192))]
    pub cs2: u32,
    /// The fewest CS-2s the job goes on with when some are lost for good (a node gone or cordoned, the pool
    /// shrunk): it continues from its last checkpoint on as many as remain, down to this count (one that
    /// divides the batch), and grows back to `cs2` when they return. The global batch and the loss curve stay
    /// those of the full job; only the shards change. Default: `cs2` (the job waits for all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 192))]
    pub min_cs2: Option<u32>,
    /// The network to train.
    pub model: ModelSpec,
    /// Where the training and held-out examples come from.
    pub data: DataSpec,
    /// Batch, length of training, seed, optimizer and learning-rate schedule.
    pub training: TrainingSpec,
    /// How often MemoryX writes a checkpoint of weights and optimizer state.
    #[serde(default)]
    pub checkpoint: CheckpointSpec,
    /// Which engine the CS-2 systems carry, and its SRAM budget.
    #[serde(default)]
    pub engine: EngineSpec,
    /// Whether weights stay resident on the engine or are streamed layer by layer.
    #[serde(default)]
    pub execution_mode: ExecutionMode,
    /// Stop the job and give back its CS-2s without losing progress: the appliance writes a checkpoint first and
    /// keeps it, and setting this back to false resumes from it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub suspend: bool,
    /// How many failures of MemoryX or engines the job survives before it is marked Failed: each failure costs a
    /// restart from the last checkpoint or a redone step, and a job that keeps failing should stop using CS-2s.
    #[serde(default = "default_restart_limit")]
    #[schemars(range(max = 100))]
    pub restart_limit: u32,
    /// Seconds the job may run, from its first admission, before it is stopped as Failed with reason
    /// `DeadlineExceeded` and its CS-2s are given back: a job that hangs or runs away cannot hold them for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31536000))]
    pub active_deadline_seconds: Option<u64>,
    /// Reorders this namespace's own waiting jobs of the same class: higher runs first, equal priorities in
    /// creation order. It never moves a job ahead of another namespace's job: the number is the tenant's to
    /// choose, so it cannot be what decides between tenants (that is `priorityClassName`).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: i32,
    /// The Kubernetes `PriorityClass` (scheduling.k8s.io/v1) whose `value` orders admission between jobs — a
    /// number cluster admins control, not the tenant — and that the job's pods carry, so the scheduler and
    /// priority-scoped quotas see the same priority. A job naming a class that does not exist is not admitted
    /// (reason `PriorityClassNotFound`); without a name, the cluster's `globalDefault` class (or 0) applies, as
    /// for pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub priority_class_name: Option<String>,
    /// Container images of the appliance, for clusters that mirror or pin them.
    #[serde(default, skip_serializing_if = "ImagesSpec::is_default")]
    pub images: ImagesSpec,
    /// Compute resources per role, so a cluster can size MemoryX's memory and the engines' hosts.
    #[serde(default, skip_serializing_if = "RolesResources::is_default")]
    pub resources: RolesResources,
    /// How MemoryX holds the model's state: over how many weight servers, and how much of it each keeps in
    /// memory (the rest on its volume).
    #[serde(default, skip_serializing_if = "MemoryxSpec::is_default")]
    pub memoryx: MemoryxSpec,
}

fn default_cs2() -> u32 {
    1
}

fn default_restart_limit() -> u32 {
    3
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

/// The image every role runs (`memoryx`, `swarmx` and `sim-wse` are one image), overridable per cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagesSpec {
    /// The data-plane image; the operator's default (`weightstream/runtime:0.1.0`) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub runtime: Option<String>,
    /// When the kubelet pulls it: `Always`, `IfNotPresent` (the default) or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy: Option<PullPolicy>,
}

impl ImagesSpec {
    fn is_default(&self) -> bool {
        *self == ImagesSpec::default()
    }
}

/// Kubernetes image pull policies.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull only when the node lacks the image.
    IfNotPresent,
    /// Never pull: the image must be preloaded.
    Never,
}

/// MemoryX as weight servers. The model's state can outgrow one machine: each server owns an equal slice of every
/// layer (its weights, bias and optimizer moments), streams that slice and runs the optimizer on the matching
/// slice of the summed gradient, so the servers' memory and bandwidth add up. The optimizer is elementwise, so
/// any number of servers trains exactly the same model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryxSpec {
    /// How many weight servers. Unset: as many as the state needs at `memoryBytes` each (up to 8, the rest on
    /// their disks), or one when `memoryBytes` is unset too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub servers: Option<u32>,
    /// Bytes of weights and optimizer state each server keeps in memory. A server whose slice is larger keeps
    /// the rest on its volume (the disk tier), read ahead in the order the layers stream and written back after
    /// each update, so its resident memory stays within this budget. Unset: the whole slice in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1048576, max = 70368744177664u64))]
    pub memory_bytes: Option<u64>,
}

impl MemoryxSpec {
    fn is_default(&self) -> bool {
        *self == MemoryxSpec::default()
    }
}

/// Resource requests and limits of each role's container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolesResources {
    /// MemoryX holds weights and optimizer state: give it memory for the plan's `memoryxBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memoryx: Option<ResourceRequirements>,
    /// Each SwarmX node broadcasts and reduces: mostly network and a little CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swarmx: Option<ResourceRequirements>,
    /// Each engine host (the `weightstream.dev/cs2` request is added by the operator, not here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<ResourceRequirements>,
    /// Each input worker: it holds the data set in memory (tokenized), and decodes and shards it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<ResourceRequirements>,
}

impl RolesResources {
    fn is_default(&self) -> bool {
        *self == RolesResources::default()
    }
}

/// The network. Kind-specific fields sit beside `kind` so the schema stays structural for Kubernetes.
///
/// It cannot change once the job exists: checkpoints hold this model's weights, so a different network is a new
/// job.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(
    validation = Rule::new("self == oldSelf")
        .message("spec.model is immutable: checkpoints hold this model's weights; create a new TrainingJob instead"),
    validation = Rule::new("self.kind != 'mlp' || size(self.layers) >= 2")
        .message("spec.model.layers: an mlp needs at least an input and an output width, e.g. [784, 512, 512, 10]")
        .field_path(".layers"),
    validation = Rule::new(
        "self.kind != 'gpt' || (has(self.width) && has(self.heads) && has(self.blocks) && has(self.contextLength) \
         && self.width % self.heads == 0)"
    )
    .message("spec.model: a gpt needs width, heads, blocks and contextLength, with width divisible by heads"),
    validation = Rule::new(
        "self.kind != 'llama' || (has(self.width) && has(self.heads) && has(self.blocks) && has(self.contextLength) \
         && has(self.intermediateSize) && self.width % self.heads == 0 \
         && (!has(self.kvHeads) || self.heads % self.kvHeads == 0))"
    )
    .message(
        "spec.model: a llama needs width, heads, blocks, contextLength and intermediateSize, with width divisible by \
         heads and heads by kvHeads"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    /// The model family.
    pub kind: ModelKind,
    /// Widths from input to output for an `mlp`, e.g. `[784, 512, 512, 10]`: one weight layer per adjacent pair.
    #[serde(default)]
    #[schemars(length(max = 64), inner(range(min = 1, max = 1048576)))]
    pub layers: Vec<u32>,
    /// The non-linearity between layers.
    #[serde(default)]
    pub activation: Activation,
    /// Fraction of each weight matrix that is zero, fixed by a seeded random mask. Only non-zeros are streamed
    /// and computed on, so 0.9 streams and multiplies a tenth of the weights.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 0.99))]
    pub sparsity: f64,
    /// Tokens a `gpt` or `llama` reads: 256 for text read as bytes (no tokenizer to download); with
    /// `spec.data.tokenizer` at least the tokenizer's vocabulary, and for `tokens` more than the largest id in the
    /// files. Up to 262,144 (Llama 3 has 128,256, Gemma 256,000); a pretrained model's is taken from its config.
    #[serde(default = "default_vocab", skip_serializing_if = "is_default_vocab")]
    #[schemars(range(min = 2, max = 262144))]
    pub vocab_size: u32,
    /// Tokens a `gpt` attends over: each training sample is a window of this many bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 4096))]
    pub context_length: Option<u32>,
    /// Features of a `gpt`'s residual stream (the model dimension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16384))]
    pub width: Option<u32>,
    /// Attention heads of a `gpt`; `width` must be divisible by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub heads: Option<u32>,
    /// Transformer blocks of a `gpt`: each is four stream units (QKV, attention output, MLP up, MLP down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub blocks: Option<u32>,
    /// Hidden width of a `gpt` block's MLP as a multiple of `width`.
    #[serde(default = "default_mlp_ratio", skip_serializing_if = "is_default_mlp_ratio")]
    #[schemars(range(min = 1, max = 16))]
    pub mlp_ratio: u32,
    /// Whether a `gpt`'s output head reuses the token embedding: fewer weights, and the usual choice for
    /// small language models.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub tied_embeddings: bool,
    /// Key/value heads of a `llama` (grouped-query attention): every `heads / kvHeads` query heads share one.
    /// Unset: as many as `heads` (plain multi-head attention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub kv_heads: Option<u32>,
    /// Hidden features of a `llama` block's SwiGLU MLP (its gate and up projections each have this many).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub intermediate_size: Option<u32>,
    /// Base of a `llama`'s rotary position embedding (Hugging Face's `rope_theta`). Unset: 10,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0, max = 1.0e9))]
    pub rope_theta: Option<f64>,
    /// Added to the mean square in a `llama`'s RMSNorm (Hugging Face's `rms_norm_eps`). Unset: 1e-5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub norm_eps: Option<f64>,
    /// A pretrained Hugging Face model folder (`config.json` and `model.safetensors`, or a sharded
    /// `model.safetensors.index.json`) the job starts from instead of random weights. A local path for
    /// `wsctl run`; inside the cluster a path in `spec.data.volume`. Its `config.json` shapes the model: fields
    /// the job also sets must agree with it. An `mlp` starts from a folder as `wsctl export --format safetensors`
    /// writes one (its `config.json` names `weightstream-mlp`, its layers and activation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub from: Option<String>,
    /// Whether a `gpt`'s layer norms learn a gain and a bias, as GPT-2's do. Unset: `plain` (no parameters),
    /// what jobs before it trained; a GPT-2 checkpoint in `from` makes it `affine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_norm: Option<LayerNorm>,
}

/// The parameters of a `gpt`'s layer norms.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LayerNorm {
    /// Normalisation alone: every parameter sits in a streamed matrix (as OLMo trains).
    #[default]
    Plain,
    /// A learned gain and bias per feature, as in GPT-2: they stream with the matrix that reads the norm.
    Affine,
}

fn default_vocab() -> u32 {
    256
}
fn is_default_vocab(v: &u32) -> bool {
    *v == 256
}
pub(crate) fn default_mlp_ratio() -> u32 {
    4
}
fn is_default_mlp_ratio(v: &u32) -> bool {
    *v == 4
}
fn default_true() -> bool {
    true
}
fn is_true(b: &bool) -> bool {
    *b
}

impl ModelSpec {
    /// A fully connected network of `layers` widths, every other field at its default: what tests and tools
    /// that build specs in code need.
    pub fn mlp(layers: Vec<u32>, activation: Activation, sparsity: f64) -> Self {
        ModelSpec {
            kind: ModelKind::Mlp,
            layers,
            activation,
            sparsity,
            vocab_size: default_vocab(),
            context_length: None,
            width: None,
            heads: None,
            blocks: None,
            mlp_ratio: default_mlp_ratio(),
            tied_embeddings: true,
            kv_heads: None,
            intermediate_size: None,
            rope_theta: None,
            norm_eps: None,
            from: None,
            layer_norm: None,
        }
    }
}

/// Model families the appliance can build.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ModelKind {
    /// A fully connected network (the seeds' FC-MNIST).
    Mlp,
    /// A decoder-only transformer language model over bytes: token and position embedding, pre-norm blocks of
    /// causal multi-head attention and a GELU MLP, a final norm and an LM head.
    Gpt,
    /// A Llama-architecture decoder (Llama 3, SmolLM2, Qwen2 without biases, Mistral): token embedding,
    /// pre-norm blocks of RMSNorm (with a learned gain), grouped-query attention with rotary positions and a
    /// SwiGLU MLP, a final RMSNorm and an LM head, no biases anywhere.
    Llama,
    /// A model program: any decoder captured from PyTorch (`weightstream.from_torch(module,
    /// example_input=...)`), read from the folder `from` names (`program.json` and `model.safetensors`). Its
    /// shape is the program's: `contextLength` and `vocabSize` must agree with it.
    Program,
}

impl ModelKind {
    /// Whether the family is a language model: it reads token ids (text, tokens or jsonl data) and predicts the
    /// next token.
    pub fn is_language_model(self) -> bool {
        matches!(self, ModelKind::Gpt | ModelKind::Llama | ModelKind::Program)
    }
}

/// Element-wise non-linearities.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Activation {
    /// max(0, x).
    #[default]
    Relu,
    /// The tanh approximation of x·Φ(x), as in GPT-2.
    Gelu,
}

/// Where a job's data comes from and how it is read. Input workers read it (engines never open data files),
/// from a PersistentVolumeClaim in a cluster or from plain paths on the local machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(
    validation = Rule::new("!has(self.volume) || !(self.path.startsWith('/') || self.path.matches('(^|/)[.][.](/|$)'))")
        .message("spec.data.path must be relative to the volume and stay inside it (no leading '/', no '..')")
        .field_path(".path"),
    validation = Rule::new("!has(self.volume) || !has(self.tokenizer) || !(self.tokenizer.startsWith('/') || self.tokenizer.matches('(^|/)[.][.](/|$)'))")
        .message("spec.data.tokenizer must be relative to the volume and stay inside it (no leading '/', no '..')")
        .field_path(".tokenizer"),
    validation = Rule::new("!has(self.heldOutPath) || !has(self.volume) || !(self.heldOutPath.startsWith('/') || self.heldOutPath.matches('(^|/)[.][.](/|$)'))")
        .message("spec.data.heldOutPath must be relative to the volume and stay inside it (no leading '/', no '..')")
        .field_path(".heldOutPath"),
    validation = Rule::new("!has(self.tokenizer) || self.kind in ['text', 'jsonl']")
        .message("spec.data.tokenizer applies to text and jsonl only (tokens are already token ids)")
        .field_path(".tokenizer")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataSpec {
    /// The data set format.
    pub kind: DataKind,
    /// For `mnist`, the folder holding the files under their standard names (raw or `.gz`); for `arrays`, a
    /// `.safetensors` file or a folder of `.npy` files; otherwise the file. With `volume`, a path inside the
    /// volume; without, taken from the current directory of the process that reads it.
    #[schemars(length(min = 1, max = 4096))]
    pub path: String,
    /// A PersistentVolumeClaim in the job's namespace holding the data, mounted read-only into the input
    /// workers (never into the other roles); `path`, `heldOutPath` and `tokenizer` are taken inside it. A local
    /// `wsctl run` maps the claim to a folder with `--volume CLAIM=DIR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub volume: Option<String>,
    /// The held-out split, in the same format as `path`. Without it the last 5% of the data is held out (for
    /// `mnist`, the `t10k-` files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub held_out_path: Option<String>,
    /// Input workers per CS-2: the processes that read, decode, tokenize and shard the data and stream each
    /// engine its share of every step. More workers split each engine's shard between them; the samples an
    /// engine sees do not depend on the count.
    #[serde(default = "default_workers", skip_serializing_if = "is_default_workers")]
    #[schemars(range(min = 1, max = 16))]
    pub workers: u32,
    /// For `text` and `jsonl`: a Hugging Face `tokenizer.json` (BPE, WordPiece, …); without it text is read as
    /// bytes (256 tokens). `spec.model.vocabSize` must hold every id it produces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub tokenizer: Option<String>,
    /// For `tokens`: the width of each token id in the file (`uint16`, as nanoGPT's `train.bin`, or `uint32`).
    #[serde(default, skip_serializing_if = "TokenType::is_default")]
    pub token_type: TokenType,
    /// For `jsonl`: the field of each line holding its text.
    #[serde(default = "default_text_field", skip_serializing_if = "is_default_text_field")]
    #[schemars(length(min = 1, max = 256))]
    pub text_field: String,
    /// For `arrays`: the name of the inputs array (a tensor in the safetensors file, or `NAME.npy`), shaped
    /// `[samples, features]`.
    #[serde(default = "default_inputs_name", skip_serializing_if = "is_default_inputs_name")]
    #[schemars(length(min = 1, max = 256))]
    pub inputs: String,
    /// For `arrays`: the name of the labels array, shaped `[samples]`, integer classes below the model's output
    /// width.
    #[serde(default = "default_labels_name", skip_serializing_if = "is_default_labels_name")]
    #[schemars(length(min = 1, max = 256))]
    pub labels: String,
}

fn default_workers() -> u32 {
    1
}
fn is_default_workers(v: &u32) -> bool {
    *v == 1
}
fn default_text_field() -> String {
    "text".into()
}
fn is_default_text_field(v: &str) -> bool {
    v == "text"
}
fn default_inputs_name() -> String {
    "inputs".into()
}
fn is_default_inputs_name(v: &str) -> bool {
    v == "inputs"
}
fn default_labels_name() -> String {
    "labels".into()
}
fn is_default_labels_name(v: &str) -> bool {
    v == "labels"
}

impl DataSpec {
    /// Data of `kind` at `path` on the local machine, every other field at its default: what tests and tools
    /// that build specs in code need.
    pub fn local(kind: DataKind, path: impl Into<String>) -> Self {
        DataSpec {
            kind,
            path: path.into(),
            volume: None,
            held_out_path: None,
            workers: default_workers(),
            tokenizer: None,
            token_type: TokenType::default(),
            text_field: default_text_field(),
            inputs: default_inputs_name(),
            labels: default_labels_name(),
        }
    }
}

/// Data set formats the appliance reads.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DataKind {
    /// MNIST digits in IDX files: `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-…`.
    Mnist,
    /// A UTF-8 text file (raw or `.gz`), for `gpt`: read as bytes, or tokenized by `tokenizer`.
    Text,
    /// Pre-tokenized token ids, a flat little-endian array of `tokenType` (like nanoGPT's `train.bin`).
    Tokens,
    /// JSON Lines, one document per line, its text in `textField`; documents are joined by a newline.
    Jsonl,
    /// Named arrays of inputs and labels (safetensors, or NumPy `.npy`), for an `mlp` of any width.
    Arrays,
}

/// Widths of a token file's ids.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TokenType {
    /// Two bytes per id (vocabularies up to 65,536).
    #[default]
    Uint16,
    /// Four bytes per id.
    Uint32,
}

impl TokenType {
    fn is_default(&self) -> bool {
        *self == TokenType::default()
    }

    /// Bytes per token id.
    pub fn width(self) -> usize {
        match self {
            TokenType::Uint16 => 2,
            TokenType::Uint32 => 4,
        }
    }
}

/// How to train.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(
    validation = Rule::new("has(self.steps) != has(self.epochs)")
        .message("spec.training: give the length of training as either steps or epochs, not both"),
    validation = Rule::new("self.schedule.minLearningRate <= self.optimizer.learningRate")
        .message("spec.training.schedule.minLearningRate must lie between 0 and the learning rate")
        .field_path(".schedule.minLearningRate")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainingSpec {
    /// Samples per optimizer step over all CS-2s together.
    #[schemars(range(min = 1, max = 1048576))]
    pub batch_size: u32,
    /// Samples per micro-batch: an engine runs its shard as micro-batches of this size, each streamed layer
    /// serving all of them before the next arrives, their gradients summed on the engine. Must divide the
    /// shard (`batchSize / cs2`); defaults to the whole shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub micro_batch_size: Option<u32>,
    /// Train for this many optimizer steps (give `steps` or `epochs`, not both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000000))]
    pub steps: Option<u64>,
    /// Train for this many passes over the training set (give `steps` or `epochs`, not both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub epochs: Option<u32>,
    /// Seeds initial weights, sparsity masks and data order, so a run can be repeated exactly.
    #[serde(default)]
    #[schemars(range(max = 9007199254740991u64))]
    pub seed: u64,
    /// The update rule MemoryX applies.
    pub optimizer: OptimizerSpec,
    /// How the learning rate changes over the run.
    #[serde(default)]
    pub schedule: ScheduleSpec,
}

/// The optimizer MemoryX runs on the summed gradients.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[x_kube(
    validation = Rule::new("self.learningRate > 0.0")
        .message("spec.training.optimizer.learningRate must be a positive number")
        .field_path(".learningRate"),
    validation = Rule::new("self.momentum < 1.0 && self.beta1 < 1.0 && self.beta2 < 1.0")
        .message("spec.training.optimizer: momentum, beta1 and beta2 must lie in [0, 1)"),
    validation = Rule::new("self.epsilon > 0.0")
        .message("spec.training.optimizer.epsilon must be a positive number")
        .field_path(".epsilon")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OptimizerSpec {
    /// The update rule.
    pub kind: OptimizerKind,
    /// Peak learning rate (reached after warm-up).
    pub learning_rate: f64,
    /// L2 penalty (`sgd`, `momentum`, `adam`) or decoupled decay (`adamw`); biases are never decayed.
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    pub weight_decay: f64,
    /// Momentum coefficient for `momentum`.
    #[serde(default = "default_momentum")]
    #[schemars(range(min = 0.0))]
    pub momentum: f64,
    /// First-moment decay for `adam`/`adamw`.
    #[serde(default = "default_beta1")]
    #[schemars(range(min = 0.0))]
    pub beta1: f64,
    /// Second-moment decay for `adam`/`adamw`.
    #[serde(default = "default_beta2")]
    #[schemars(range(min = 0.0))]
    pub beta2: f64,
    /// Denominator guard for `adam`/`adamw`.
    #[serde(default = "default_epsilon")]
    pub epsilon: f64,
}

fn default_momentum() -> f64 {
    0.9
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_epsilon() -> f64 {
    1e-8
}

/// Update rules.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OptimizerKind {
    /// Plain gradient descent.
    Sgd,
    /// Gradient descent with heavy-ball momentum.
    Momentum,
    /// Adam with L2 penalty folded into the gradient.
    Adam,
    /// Adam with decoupled weight decay.
    Adamw,
}

/// Linear warm-up, then a constant rate or a cosine decay to `minLearningRate`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Steps over which the rate ramps linearly from near zero to its peak.
    #[serde(default)]
    #[schemars(range(max = 1000000000))]
    pub warmup_steps: u64,
    /// What happens after warm-up.
    #[serde(default)]
    pub decay: Decay,
    /// The floor the cosine decays to.
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    pub min_learning_rate: f64,
}

/// Learning-rate decay after warm-up.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Decay {
    /// Keep the peak rate.
    Constant,
    /// Half a cosine from the peak rate down to the floor at the last step.
    #[default]
    Cosine,
}

/// Checkpointing of MemoryX state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Write a checkpoint every this many steps (0 turns periodic checkpoints off; the final state is always
    /// written when a checkpoint directory is given).
    #[serde(default)]
    #[schemars(range(max = 1000000000))]
    pub interval_steps: u64,
    /// How many checkpoints to keep; older ones are removed once a newer one is complete.
    #[serde(default = "default_keep")]
    #[schemars(range(min = 1, max = 1000))]
    pub keep: u32,
    /// Size of MemoryX's checkpoint volume (a Kubernetes quantity such as `1Gi`); it outlives suspension so a
    /// resumed job continues from it.
    #[serde(default = "default_volume_size")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"))]
    pub volume_size: String,
    /// Storage class of the checkpoint volume; the cluster's default class when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// With the model resident on the engines (pipelined), MemoryX takes the replicas' state back into its
    /// memory at least this often (not to disk), so a fault that loses every replica costs at most this much
    /// work.
    #[serde(default = "default_snapshot_seconds", skip_serializing_if = "is_default_snapshot_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub snapshot_seconds: u64,
    /// What becomes of the checkpoint volumes when the job is deleted (`wsctl cancel`, `kubectl delete`).
    /// `Retain` (the default): each weight server's PersistentVolumeClaim outlives the job, labelled with its
    /// name (`weightstream.dev/job`) and uid (`weightstream.dev/job-uid`), and `wsctl checkpoint list|pull JOB`
    /// still reads it; remove it yourself with `kubectl delete pvc -l weightstream.dev/job-uid=UID`. `Delete`:
    /// the claims go with the job. A job submitted again under the same name gets claims of its own (their
    /// names carry its uid): it never resumes from, nor overwrites, a retained one.
    #[serde(default, skip_serializing_if = "RetainPolicy::is_retain")]
    #[schemars(extend("default" = "Retain"))]
    pub retain: RetainPolicy,
}

/// What becomes of a job's checkpoint volumes when the job is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RetainPolicy {
    /// Keep them: the claims outlive the job, labelled with its name and uid.
    #[default]
    Retain,
    /// Delete them with the job.
    Delete,
}

impl RetainPolicy {
    fn is_retain(&self) -> bool {
        *self == RetainPolicy::Retain
    }
}

fn default_snapshot_seconds() -> u64 {
    60
}
fn is_default_snapshot_seconds(s: &u64) -> bool {
    *s == default_snapshot_seconds()
}

fn default_volume_size() -> String {
    "1Gi".into()
}

fn default_keep() -> u32 {
    3
}

impl Default for CheckpointSpec {
    fn default() -> Self {
        CheckpointSpec {
            interval_steps: 0,
            keep: default_keep(),
            volume_size: default_volume_size(),
            storage_class_name: None,
            snapshot_seconds: default_snapshot_seconds(),
            retain: RetainPolicy::Retain,
        }
    }
}

/// The engine each CS-2 carries.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EngineSpec {
    /// The engine generation, which sets the SRAM size and speed the simulation uses.
    #[serde(default)]
    pub preset: EnginePreset,
    /// Override the preset's on-chip SRAM in bytes, e.g. to check that a model too large for the engine still
    /// trains by weight streaming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 68719476736u64))]
    pub sram_bytes: Option<u64>,
}

/// Engine generations.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum EnginePreset {
    /// WSE-2, as in the CS-2 system.
    #[default]
    Wse2,
    /// WSE-3.
    Wse3,
    /// A scaled-down engine for tests.
    Tiny,
}
