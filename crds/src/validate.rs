//! Parsing and validation: the one place that decides whether a manifest is a job the appliance can run,
//! and that says in one line what is wrong and how to fix it when it is not.

use crate::error::ApiError;
use crate::spec::{DataKind, ModelKind, TrainingJob, TrainingJobSpec};
use crate::version::ApiVersion;

/// Whether a path given inside a volume would leave it: absolute, or with a `..` component.
pub fn escapes(path: &str) -> bool {
    path.starts_with('/') || path.split('/').any(|c| c == "..")
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::Invalid { field: field.into(), message: message.into() }
}

/// What [`parse_training_job_with`] asks of a program that can read pretrained folders: the shape the config of
/// the folder `from` names gives, and where it was read (for errors), or `None` where the folder is not at hand.
pub type PretrainedResolver<'a> =
    dyn Fn(&str) -> Result<Option<(crate::pretrained::PretrainedShape, String)>, ApiError> + 'a;

/// Reads a `TrainingJob` manifest and validates it, so every entry point rejects the same things the same way.
pub fn parse_training_job(text: &str) -> Result<TrainingJob, ApiError> {
    parse_training_job_with(text, &|_| Ok(None))
}

/// [`parse_training_job`] for a program that can read the job's pretrained model (`spec.model.from`):
/// `pretrained` returns the shape its config gives (or `None` where the folder is not at hand, e.g. inside a
/// volume the caller cannot see), which fills in the job's model before it is validated.
pub fn parse_training_job_with(text: &str, pretrained: &PretrainedResolver<'_>) -> Result<TrainingJob, ApiError> {
    if text.trim().is_empty() {
        return Err(ApiError::Syntax {
            path: "the document".into(),
            message: "the file is empty; start from examples/jobs/fc-mnist.yaml".into(),
        });
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Types {
        #[serde(default)]
        api_version: String,
        #[serde(default)]
        kind: String,
    }
    let syntax = |e: serde_path_to_error::Error<serde_yaml::Error>| {
        let path = e.path().to_string();
        ApiError::Syntax {
            path: if path == "." { "the document".into() } else { path },
            message: e.into_inner().to_string(),
        }
    };
    let types: Types = serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text)).map_err(syntax)?;
    // Every served version has the same fields: a v1alpha1 manifest reads as the current types.
    if ApiVersion::from_api_version(&types.api_version).is_none() || types.kind != "TrainingJob" {
        return Err(invalid(
            "apiVersion/kind",
            format!(
                "expected apiVersion {} and kind TrainingJob, found '{}' and '{}'",
                ApiVersion::STORED.api_version(),
                types.api_version,
                types.kind
            ),
        ));
    }
    let job: TrainingJob =
        serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text)).map_err(syntax)?;
    if let Some(name) = &job.metadata.name
        && (!is_dns_label(name) || name.len() > 40)
    {
        return Err(invalid(
            "metadata.name",
            format!(
                "'{name}' cannot name the appliance's pods: use at most 40 lowercase letters, digits and '-', \
                 starting with a letter (e.g. fc-mnist)"
            ),
        ));
    }
    let mut job = job;
    // A program's folder holds its graph, not a Hugging Face config: its shape is checked where it is read.
    if let Some(from) = job.spec.model.from.clone().filter(|_| job.spec.model.kind != ModelKind::Program)
        && let Some((shape, source)) = pretrained(&from)?
    {
        job.spec.model.adopt(&shape, &source)?;
        // Text is read with the pretrained model's own tokenizer unless the job names another.
        let d = &mut job.spec.data;
        if d.tokenizer.is_none() && shape.has_tokenizer && matches!(d.kind, DataKind::Text | DataKind::Jsonl) {
            d.tokenizer = Some(format!("{}/{}", from.trim_end_matches('/'), crate::pretrained::TOKENIZER_FILE));
        }
    }
    job.spec.validate()?;
    Ok(job)
}

/// The ceilings of the integer fields, the same as the schema's maxima: what the API server refuses, a local run
/// refuses too, and nothing the operator stores can overflow the types it reads them into.
pub const MAX_BATCH: u32 = 1 << 20;
/// Steps of a run, of warm-up, between checkpoints.
pub const MAX_STEPS: u64 = 1_000_000_000;
/// Epochs of a run.
pub const MAX_EPOCHS: u32 = 100_000;
/// Checkpoints kept.
pub const MAX_KEEP: u32 = 1000;
/// Weight servers of one MemoryX.
pub const MAX_SERVERS: u32 = 64;
/// The largest seed JSON carries exactly (2^53 - 1).
pub const MAX_SEED: u64 = (1 << 53) - 1;
/// More SRAM than any wafer-scale engine has (WSE-3: 44 GB).
pub const MAX_SRAM_BYTES: u64 = 64 << 30;
/// A layer's width.
pub const MAX_WIDTH: u32 = 1 << 20;
/// Tokens of a vocabulary: 2^18 = 262,144, room for Llama 3's 128,256 and Gemma's 256,000. What a vocabulary
/// costs in memory (its embedding and head, their optimizer state) the plan then bounds like any layer.
pub const MAX_VOCAB: u32 = 1 << 18;

/// Whether `s` is a Kubernetes quantity as volume sizes are written: digits, an optional fraction and an optional
/// binary or decimal suffix (the schema's pattern is the same).
pub fn is_quantity(s: &str) -> bool {
    let number_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let mut parts = number.split('.');
    let whole_ok = parts.next().is_some_and(|w| !w.is_empty());
    let frac_ok = parts.next().is_none_or(|f| !f.is_empty());
    whole_ok
        && frac_ok
        && parts.next().is_none()
        && ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E"].contains(&suffix)
}

/// The bytes a quantity such as `1Gi` or `500M` stands for; `None` when it is not one ([`is_quantity`]) or
/// overflows.
pub fn quantity_bytes(s: &str) -> Option<u64> {
    if !is_quantity(s) {
        return None;
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let unit: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => 1 << 60,
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let whole: u64 = whole.parse().ok()?;
    let mut bytes = whole.checked_mul(unit)?;
    if !frac.is_empty() {
        let digits = frac.len().min(18) as u32;
        let frac: u64 = frac[..digits as usize].parse().ok()?;
        bytes = bytes.checked_add((u128::from(frac) * u128::from(unit) / 10u128.pow(digits)) as u64)?;
    }
    Some(bytes)
}

/// Whether `name` can name the appliance's pods and be their hostname: a DNS-1035 label (the 40-character
/// limit is checked beside it).
pub fn is_dns_label(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1] != b'-'
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// Whether `name` can name a cluster-scoped object such as a PriorityClass: a DNS-1123 subdomain, that is
/// dot-separated DNS-1123 labels of at most 253 characters in all (the schema's pattern is the same).
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

impl TrainingJobSpec {
    /// The fewest CS-2s the job goes on with (`spec.minCs2`, or all of `spec.cs2`).
    pub fn min_cs2(&self) -> u32 {
        self.min_cs2.unwrap_or(self.cs2).clamp(1, self.cs2.max(1))
    }

    /// How many CS-2s the job runs on when only `available` remain to it: the most, up to `spec.cs2`, that is at
    /// least `spec.minCs2` and divides `spec.cs2` (each CS-2 then takes whole shards of the full job, as
    /// micro-batches, so the curve stays the full job's); `None` below `spec.minCs2`.
    pub fn elastic_size(&self, available: u32) -> Option<u32> {
        (self.min_cs2()..=self.cs2.min(available)).rev().find(|n| *n > 0 && self.cs2.is_multiple_of(*n))
    }

    /// Samples per micro-batch on an engine: `spec.training.microBatchSize`, or else the full job's shard
    /// (`batchSize / cs2`) — which is also what an elastic job keeps while it runs on fewer CS-2s, so the
    /// arithmetic of every micro-batch is the full job's.
    pub fn micro_batch(&self) -> u32 {
        self.training.micro_batch_size.unwrap_or(self.training.batch_size / self.cs2.max(1))
    }

    /// Checks ranges and cross-field rules that the schema alone cannot express for a local run.
    pub fn validate(&self) -> Result<(), ApiError> {
        if self.cs2 == 0 || self.cs2 > 192 {
            return Err(invalid("spec.cs2", format!("{} is out of range: use 1 to 192 CS-2 systems", self.cs2)));
        }
        self.validate_model()?;
        self.validate_training()?;
        if let Some(min) = self.min_cs2
            && (min == 0 || min > self.cs2 || !self.cs2.is_multiple_of(min))
        {
            return Err(invalid(
                "spec.minCs2",
                format!(
                    "{min} must be from 1 to spec.cs2 = {} and divide it: the job shrinks only to a count that takes \
                     whole shards of the full job, so its curve stays the same",
                    self.cs2
                ),
            ));
        }
        if self.checkpoint.keep == 0 {
            return Err(invalid("spec.checkpoint.keep", "must keep at least 1 checkpoint"));
        }
        if self.restart_limit > 100 {
            return Err(invalid("spec.restartLimit", format!("{} is out of range: use 0 to 100", self.restart_limit)));
        }
        if let Some(t) = self.active_deadline_seconds.filter(|t| !(1..=31_536_000).contains(t)) {
            return Err(invalid(
                "spec.activeDeadlineSeconds",
                format!("{t} is out of range: use 1 to 31536000 (a year)"),
            ));
        }
        if !(-1000..=1000).contains(&self.priority) {
            return Err(invalid("spec.priority", format!("{} is out of range: use -1000 to 1000", self.priority)));
        }
        if let Some(c) = self.priority_class_name.as_deref().filter(|c| !is_dns_subdomain(c)) {
            return Err(invalid(
                "spec.priorityClassName",
                format!(
                    "'{c}' cannot name a PriorityClass: use at most 253 lowercase letters, digits, '-' and '.', \
                     starting and ending with a letter or digit (e.g. high-priority)"
                ),
            ));
        }
        if !is_quantity(&self.checkpoint.volume_size) {
            return Err(invalid(
                "spec.checkpoint.volumeSize",
                format!("'{}' is not a Kubernetes quantity: write it like 1Gi or 500Mi", self.checkpoint.volume_size),
            ));
        }
        if !(1..=86_400).contains(&self.checkpoint.snapshot_seconds) {
            return Err(invalid(
                "spec.checkpoint.snapshotSeconds",
                format!("{} is out of range: use 1 to 86400 (60 is the default)", self.checkpoint.snapshot_seconds),
            ));
        }
        if self.checkpoint.keep > MAX_KEEP {
            return Err(invalid(
                "spec.checkpoint.keep",
                format!("{} is out of range: keep 1 to {MAX_KEEP}", self.checkpoint.keep),
            ));
        }
        for (field, v) in [
            ("spec.checkpoint.intervalSteps", self.checkpoint.interval_steps),
            ("spec.training.schedule.warmupSteps", self.training.schedule.warmup_steps),
        ] {
            if v > MAX_STEPS {
                return Err(invalid(field, format!("{v} is out of range: at most {MAX_STEPS}")));
            }
        }
        if self.images.runtime.as_deref().is_some_and(|i| i.trim().is_empty()) {
            return Err(invalid("spec.images.runtime", "must name an image; omit it to use the operator's default"));
        }
        if self.engine.sram_bytes == Some(0) {
            return Err(invalid("spec.engine.sramBytes", "must be at least 1 byte; omit it to use the preset's SRAM"));
        }
        if let Some(b) = self.engine.sram_bytes.filter(|&b| b > MAX_SRAM_BYTES) {
            return Err(invalid(
                "spec.engine.sramBytes",
                format!(
                    "{b} is more SRAM than any engine has (at most {MAX_SRAM_BYTES}, 64 GiB); omit it to use the preset's"
                ),
            ));
        }
        Ok(())
    }

    fn validate_model(&self) -> Result<(), ApiError> {
        let m = &self.model;
        if !(m.sparsity.is_finite() && (0.0..=0.99).contains(&m.sparsity)) {
            return Err(invalid(
                "spec.model.sparsity",
                format!("{} is outside [0, 0.99]: use 0 for dense weights, 0.9 for 90% zeros", m.sparsity),
            ));
        }
        match m.kind {
            ModelKind::Mlp => {
                if m.layers.len() < 2 {
                    return Err(invalid(
                        "spec.model.layers",
                        "an mlp needs at least an input and an output width, e.g. [784, 512, 512, 10]",
                    ));
                }
                if let Some(i) = m.layers.iter().position(|&w| w == 0) {
                    return Err(invalid(
                        format!("spec.model.layers[{i}]"),
                        "a layer of width 0 has no units: every width must be at least 1",
                    ));
                }
                if let Some(i) = m.layers.iter().position(|&w| w > MAX_WIDTH) {
                    return Err(invalid(
                        format!("spec.model.layers[{i}]"),
                        format!("{} is wider than any layer can be: at most {MAX_WIDTH}", m.layers[i]),
                    ));
                }
            }
            ModelKind::Gpt | ModelKind::Llama => self.validate_decoder()?,
            ModelKind::Program => self.validate_program()?,
        }
        let language = matches!(self.data.kind, DataKind::Text | DataKind::Tokens | DataKind::Jsonl);
        if language != m.kind.is_language_model() {
            return Err(invalid(
                "spec.data.kind",
                "a gpt or llama trains on text, tokens or jsonl, and an mlp on mnist or arrays",
            ));
        }
        if m.kind == ModelKind::Mlp && m.layer_norm.is_some() {
            return Err(invalid("spec.model.layerNorm", "is for a gpt; an mlp has no norms"));
        }
        if let (Some(from), Some(_)) = (&m.from, &self.data.volume)
            && escapes(from)
        {
            return Err(invalid(
                "spec.model.from",
                "must be relative to spec.data.volume and stay inside it (no leading '/', no '..')",
            ));
        }
        // An mnist job is an mlp (checked above), whose layers are at least two.
        let ends = (m.layers.first().copied().unwrap_or(0), m.layers.last().copied().unwrap_or(0));
        if let (DataKind::Mnist, (first, last)) = (self.data.kind, ends)
            && (first != 784 || last != 10)
        {
            return Err(invalid(
                "spec.model.layers",
                format!(
                    "mnist has 784 input pixels and 10 classes, so layers must start with 784 and end with 10 \
                     (found {first} … {last})"
                ),
            ));
        }
        self.validate_data()
    }

    /// The data rules the CRD's CEL rules state, with the same messages: paths inside a volume stay inside it,
    /// and a tokenizer only where there is text to tokenize.
    fn validate_data(&self) -> Result<(), ApiError> {
        let d = &self.data;
        if d.volume.is_some() {
            for (field, path) in [
                ("path", Some(&d.path)),
                ("heldOutPath", d.held_out_path.as_ref()),
                ("tokenizer", d.tokenizer.as_ref()),
            ] {
                if path.is_some_and(|p| escapes(p)) {
                    return Err(invalid(
                        format!("spec.data.{field}"),
                        "must be relative to the volume and stay inside it (no leading '/', no '..')",
                    ));
                }
            }
        }
        if let Some(v) = &d.volume
            && !is_dns_subdomain(v)
        {
            return Err(invalid(
                "spec.data.volume",
                format!("'{v}' is not a PersistentVolumeClaim name (a DNS subdomain)"),
            ));
        }
        if d.tokenizer.is_some() && !matches!(d.kind, DataKind::Text | DataKind::Jsonl) {
            return Err(invalid(
                "spec.data.tokenizer",
                "applies to text and jsonl only (tokens are already token ids)",
            ));
        }
        if !(1..=16).contains(&d.workers) {
            return Err(invalid(
                "spec.data.workers",
                format!("{} is out of range: use 1 to 16 input workers per CS-2", d.workers),
            ));
        }
        Ok(())
    }

    /// The rules of a decoder-only language model, `gpt` or `llama`: its shape, and what applies to one
    /// family only.
    /// A pretrained model reads text through its own tokenizer: text with none would be read as bytes, ids
    /// 0–255 of a vocabulary made for other tokens, and train without a word of warning. Only a byte-level
    /// model (256 tokens) may read bytes. A local run has already passed on the folder's own `tokenizer.json`.
    fn validate_pretrained_text(&self) -> Result<(), ApiError> {
        let (m, d) = (&self.model, &self.data);
        let reads_text = matches!(d.kind, DataKind::Text | DataKind::Jsonl);
        let Some(from) = m.from.as_deref().filter(|_| reads_text && d.tokenizer.is_none() && m.vocab_size != 256)
        else {
            return Ok(());
        };
        Err(invalid(
            "spec.data.tokenizer",
            format!(
                "the job starts from the pretrained model {from} ({} tokens) but names no tokenizer for its text, and \
                 {from} holds no {}: text read as bytes would train ids 0-255 of that vocabulary. Name the model's \
                 tokenizer (spec.data.tokenizer: {from}/{1} once it is there), or save it into the folder \
                 (tokenizer.save_pretrained(folder), or from_torch(model, tokenizer=...) in Python)",
                m.vocab_size,
                crate::pretrained::TOKENIZER_FILE,
            ),
        ))
    }

    /// A program's shape is its own: the job names its folder and the two figures the data must fit (context
    /// and vocabulary, checked against the program where it is read), and none of a family's shape.
    fn validate_program(&self) -> Result<(), ApiError> {
        let m = &self.model;
        if m.from.is_none() {
            return Err(invalid(
                "spec.model.from",
                "a program is read from the folder weightstream.from_torch(module, example_input=...) saves it to: \
                 name that folder",
            ));
        }
        match m.context_length {
            Some(c) if (2..=4096).contains(&c) => {}
            _ => return Err(invalid("spec.model.contextLength", "a program needs its tokens per sequence, 2 to 4096")),
        }
        if !(2..=MAX_VOCAB).contains(&m.vocab_size) {
            return Err(invalid(
                "spec.model.vocabSize",
                format!("{} is out of range: use 2 to {MAX_VOCAB}", m.vocab_size),
            ));
        }
        let family = [
            ("layers", !m.layers.is_empty()),
            ("width", m.width.is_some()),
            ("heads", m.heads.is_some()),
            ("blocks", m.blocks.is_some()),
            ("kvHeads", m.kv_heads.is_some()),
            ("intermediateSize", m.intermediate_size.is_some()),
            ("ropeTheta", m.rope_theta.is_some()),
            ("normEps", m.norm_eps.is_some()),
            ("layerNorm", m.layer_norm.is_some()),
        ];
        if let Some((name, _)) = family.iter().find(|(_, set)| *set) {
            return Err(invalid(
                format!("spec.model.{name}"),
                "shapes a built-in family; a program's shape is its own",
            ));
        }
        self.validate_byte_vocabulary()
    }

    /// Text read as bytes has 256 tokens; a tokenizer's or a token file's vocabulary is checked on loading.
    fn validate_byte_vocabulary(&self) -> Result<(), ApiError> {
        let bytes = matches!(self.data.kind, DataKind::Text | DataKind::Jsonl) && self.data.tokenizer.is_none();
        if bytes && self.model.vocab_size < 256 {
            return Err(invalid(
                "spec.model.vocabSize",
                format!(
                    "{} is too small for text read as bytes (256 tokens): set it to 256, or name a tokenizer in \
                     spec.data.tokenizer",
                    self.model.vocab_size
                ),
            ));
        }
        Ok(())
    }

    fn validate_decoder(&self) -> Result<(), ApiError> {
        let m = &self.model;
        let family = if m.kind == ModelKind::Llama { "llama" } else { "gpt" };
        let need = |name: &str, v: Option<u32>, min: u32, max: u32, example: &str| match v {
            None if m.from.is_some() => Err(invalid(
                format!("spec.model.{name}"),
                format!(
                    "is taken from the config.json of spec.model.from ({}), which was not read here: run where the \
                     folder is (wsctl run), or set the model's shape in the job",
                    m.from.as_deref().unwrap_or_default()
                ),
            )),
            None => Err(invalid(format!("spec.model.{name}"), format!("a {family} needs it, e.g. {name}: {example}"))),
            Some(v) if !(min..=max).contains(&v) => {
                Err(invalid(format!("spec.model.{name}"), format!("{v} is out of range: use {min} to {max}")))
            }
            Some(v) => Ok(v),
        };
        let width = need("width", m.width, 1, 16384, "256")?;
        let heads = need("heads", m.heads, 1, 256, "4")?;
        need("blocks", m.blocks, 1, 256, "4")?;
        need("contextLength", m.context_length, 2, 4096, "128")?;
        if width % heads != 0 {
            return Err(invalid(
                "spec.model.heads",
                format!("width {width} is not divisible by {heads} heads: each head takes an equal slice of the width"),
            ));
        }
        if !(2..=MAX_VOCAB).contains(&m.vocab_size) {
            return Err(invalid(
                "spec.model.vocabSize",
                format!("{} is out of range: use 2 to {MAX_VOCAB}", m.vocab_size),
            ));
        }
        self.validate_pretrained_text()?;
        self.validate_byte_vocabulary()?;
        if !(1..=16).contains(&m.mlp_ratio) {
            return Err(invalid(
                "spec.model.mlpRatio",
                format!("{} is out of range: use 1 to 16 (4 is usual)", m.mlp_ratio),
            ));
        }
        if !m.layers.is_empty() {
            return Err(invalid(
                "spec.model.layers",
                format!("is for an mlp; a {family} is shaped by width, heads and blocks"),
            ));
        }
        if m.kind == ModelKind::Gpt {
            let llama_only = [
                ("kvHeads", m.kv_heads.is_some()),
                ("intermediateSize", m.intermediate_size.is_some()),
                ("ropeTheta", m.rope_theta.is_some()),
                ("normEps", m.norm_eps.is_some()),
            ];
            if let Some((name, _)) = llama_only.iter().find(|(_, set)| *set) {
                return Err(invalid(
                    format!("spec.model.{name}"),
                    "is for a llama; leave it out of a gpt (or use kind: llama)",
                ));
            }
            return Ok(());
        }
        let kv = m.kv_heads.unwrap_or(heads);
        if kv == 0 || heads % kv != 0 {
            return Err(invalid(
                "spec.model.kvHeads",
                format!(
                    "{heads} heads are not divisible by {kv} key/value heads: each key/value head serves an equal group"
                ),
            ));
        }
        need("intermediateSize", m.intermediate_size, 1, 65_536, "1536")?;
        if (width / heads) % 2 != 0 {
            return Err(invalid(
                "spec.model.heads",
                format!(
                    "each head has {} features, an odd number: rotary positions rotate features in pairs",
                    width / heads
                ),
            ));
        }
        if let Some(theta) = m.rope_theta.filter(|t| !(t.is_finite() && *t > 1.0)) {
            return Err(invalid(
                "spec.model.ropeTheta",
                format!("{theta} is not a rotary base: use a number above 1, e.g. 10000"),
            ));
        }
        if let Some(eps) = m.norm_eps.filter(|e| !(e.is_finite() && *e > 0.0 && *e < 1.0)) {
            return Err(invalid(
                "spec.model.normEps",
                format!("{eps} is out of range: use a small positive number, e.g. 1e-5"),
            ));
        }
        if m.mlp_ratio != crate::spec::default_mlp_ratio() {
            return Err(invalid("spec.model.mlpRatio", "is for a gpt; a llama's MLP is sized by intermediateSize"));
        }
        if m.layer_norm.is_some() {
            return Err(invalid("spec.model.layerNorm", "is for a gpt; a llama's RMSNorms always learn a gain"));
        }
        Ok(())
    }

    fn validate_training(&self) -> Result<(), ApiError> {
        let t = &self.training;
        if t.batch_size == 0 {
            return Err(invalid("spec.training.batchSize", "must be at least 1"));
        }
        if t.batch_size > MAX_BATCH {
            return Err(invalid(
                "spec.training.batchSize",
                format!("{} is out of range: at most {MAX_BATCH}", t.batch_size),
            ));
        }
        if t.seed > MAX_SEED {
            return Err(invalid(
                "spec.training.seed",
                format!("{} is out of range: at most {MAX_SEED} (2^53 - 1)", t.seed),
            ));
        }
        if !t.batch_size.is_multiple_of(self.cs2) {
            return Err(invalid(
                "spec.training.batchSize",
                format!(
                    "{} is not divisible by spec.cs2 = {}: each CS-2 takes an equal shard of the batch",
                    t.batch_size, self.cs2
                ),
            ));
        }
        if let Some(micro) = t.micro_batch_size {
            let shard = t.batch_size / self.cs2;
            if micro == 0 || !shard.is_multiple_of(micro) {
                return Err(invalid(
                    "spec.training.microBatchSize",
                    format!(
                        "{micro} must divide each CS-2's shard of {shard} samples (batchSize {} over {} CS-2s): an engine \
                         runs its shard as equal micro-batches",
                        t.batch_size, self.cs2
                    ),
                ));
            }
        }
        match (t.steps, t.epochs) {
            (Some(_), Some(_)) => {
                return Err(invalid("spec.training", "give either steps or epochs, not both"));
            }
            (None, None) => return Err(invalid("spec.training", "give the length of training as steps or epochs")),
            (Some(0), _) => return Err(invalid("spec.training.steps", "must be at least 1")),
            (_, Some(0)) => return Err(invalid("spec.training.epochs", "must be at least 1")),
            (Some(n), _) if n > MAX_STEPS => {
                return Err(invalid("spec.training.steps", format!("{n} is out of range: at most {MAX_STEPS}")));
            }
            (_, Some(n)) if n > MAX_EPOCHS => {
                return Err(invalid("spec.training.epochs", format!("{n} is out of range: at most {MAX_EPOCHS}")));
            }
            _ => {}
        }
        let o = &t.optimizer;
        if !(o.learning_rate.is_finite() && o.learning_rate > 0.0) {
            return Err(invalid("spec.training.optimizer.learningRate", "must be a positive number"));
        }
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            return Err(invalid("spec.training.optimizer.weightDecay", "must be zero or positive"));
        }
        for (name, v) in [("momentum", o.momentum), ("beta1", o.beta1), ("beta2", o.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return Err(invalid(format!("spec.training.optimizer.{name}"), format!("{v} is outside [0, 1)")));
            }
        }
        if !(o.epsilon.is_finite() && o.epsilon > 0.0) {
            return Err(invalid("spec.training.optimizer.epsilon", "must be a positive number"));
        }
        let floor = t.schedule.min_learning_rate;
        if !(floor.is_finite() && floor >= 0.0 && floor <= o.learning_rate) {
            return Err(invalid(
                "spec.training.schedule.minLearningRate",
                format!("{floor} must lie between 0 and the learning rate {}", o.learning_rate),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared test job (the testing module's `MLP_YAML`), read from its file so this module imports nothing
    /// above it.
    const GOOD: &str = include_str!("../fixtures/mlp-job.yaml");

    fn err(text: &str) -> String {
        parse_training_job(text).expect_err("should be rejected").to_string()
    }

    #[test]
    fn a_good_job_parses_with_defaults() {
        let job = parse_training_job(GOOD).expect("valid");
        assert_eq!(job.spec.cs2, 2);
        assert_eq!(job.spec.checkpoint.keep, 3);
        assert_eq!(job.spec.training.optimizer.beta2, 0.999);
    }

    #[test]
    fn a_v1alpha1_manifest_reads_as_the_same_job() {
        let old = GOOD.replace("weightstream.dev/v1beta1", "weightstream.dev/v1alpha1");
        assert_ne!(old, GOOD);
        let (old, new) = (parse_training_job(&old).expect("v1alpha1 is still read"), parse_training_job(GOOD).unwrap());
        assert_eq!((old.metadata, old.spec), (new.metadata, new.spec));
    }

    #[test]
    fn bad_manifests_name_the_field() {
        assert!(err("spec: [").contains("invalid TrainingJob manifest"));
        assert!(err(&GOOD.replace("kind: mlp", "kind: cnn")).contains("spec.model.kind"));
        assert!(err(&GOOD.replace("[784, 32, 10]", "[784, 0, 10]")).contains("spec.model.layers[1]"));
        assert!(err(&GOOD.replace("0.5}", "1.5}")).contains("spec.model.sparsity"));
        assert!(err(&GOOD.replace("0.5}", "-0.1}")).contains("spec.model.sparsity"));
        assert!(err(&GOOD.replace("batchSize: 64", "batchSize: 63")).contains("not divisible"));
        assert!(err(&GOOD.replace("steps: 30", "steps: 30\n    epochs: 1")).contains("not both"));
        assert!(err(&GOOD.replace("learningRate: 0.002", "learningRate: 0")).contains("learningRate"));
        assert!(err(&GOOD.replace("[784, 32, 10]", "[700, 32, 10]")).contains("784"));
        assert!(err(&GOOD.replace("sparsity: 0.5", "sparsity: 0.5, depth: 3")).contains("unknown field"));
        assert!(err(&GOOD.replace("weightstream.dev/v1beta1", "v1")).contains("apiVersion"));
        assert!(err(&GOOD.replace("weightstream.dev/v1beta1", "weightstream.dev/v2")).contains("v1beta1"));
        assert!(err("").contains("empty"));
        assert!(err(&GOOD.replace("cs2: 2", "cs2: 2\n  restartLimit: 101")).contains("spec.restartLimit"));
        assert!(err(&GOOD.replace("cs2: 2", "cs2: 2\n  minCs2: 3")).contains("spec.minCs2"));
        assert!(err(&GOOD.replace("cs2: 2", "cs2: 2\n  minCs2: 0")).contains("spec.minCs2"));
        assert!(err(&GOOD.replace("cs2: 2", "cs2: 2\n  priority: 5000")).contains("spec.priority"));
        assert!(err(&GOOD.replace("cs2: 2", "cs2: 2\n  images: {runtime: ' '}")).contains("spec.images.runtime"));
        assert!(err(&GOOD.replace("cs2: 2", "cs2: 2\n  images: {pullPolicy: Sometimes}")).contains("pullPolicy"));
        assert!(err(&GOOD.replace("kind: mnist", "kind: text")).contains("spec.data.kind"));
        // The holes a tenant could use to store what nothing can run or read back.
        for name in ["a.b", "FcMnist", "-x", "x-", "9lives", "a_b"] {
            assert!(
                err(&GOOD.replace("{name: small}", &format!("{{name: '{name}'}}"))).contains("metadata.name"),
                "{name}"
            );
        }
        assert!(
            err(&GOOD.replace("{name: small}", &format!("{{name: {}}}", "a".repeat(41)))).contains("metadata.name")
        );
        for size in ["1GB", "1.5.0Gi", "Gi", "-1Gi", "1 Gi"] {
            let e = err(&GOOD.replace("cs2: 2", &format!("cs2: 2\n  checkpoint: {{volumeSize: '{size}'}}")));
            assert!(e.contains("spec.checkpoint.volumeSize") && e.contains("quantity"), "{size}: {e}");
        }
        assert!(
            err(&GOOD.replace("cs2: 2", "cs2: 2\n  engine: {sramBytes: 18446744073709551615}"))
                .contains("more SRAM than any engine")
        );
        assert!(err(&GOOD.replace("batchSize: 64", "batchSize: 4294967296")).contains("batchSize"));
        assert!(err(&GOOD.replace("batchSize: 64", "batchSize: 2097152")).contains("at most 1048576"));
        assert!(err(&GOOD.replace("steps: 30", "steps: 1000000001")).contains("spec.training.steps"));
        assert!(err(&GOOD.replace("[784, 32, 10]", "[784, 2000000, 10]")).contains("spec.model.layers[1]"));
        assert!(err(&GOOD.replace("seed: 3", "seed: 9007199254740992")).contains("spec.training.seed"));
        for ok in ["1Gi", "500Mi", "1.5Gi", "10G", "1024"] {
            assert!(is_quantity(ok), "{ok}");
        }
        assert_eq!(quantity_bytes("1Gi"), Some(1 << 30));
        assert_eq!(quantity_bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("1024"), Some(1024));
        assert_eq!(quantity_bytes("99999999999Ei"), None, "overflow");
        assert_eq!(quantity_bytes("1GB"), None);
    }

    const GPT: &str = r#"
apiVersion: weightstream.dev/v1beta1
kind: TrainingJob
metadata: {name: g}
spec:
  model: {kind: gpt, contextLength: 64, width: 64, heads: 4, blocks: 2, sparsity: 0.9}
  data: {kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}
  training:
    batchSize: 8
    steps: 10
    optimizer: {kind: adamw, learningRate: 0.001}
"#;

    /// A Llama job starting from the folder `smol`, whose config gives the shape below.
    const PRETRAINED: &str = r#"
apiVersion: weightstream.dev/v1beta1
kind: TrainingJob
metadata: {name: smol}
spec:
  model: {kind: llama, from: smol, contextLength: 64}
  data: {kind: text, path: examples/data/moby-dick/moby-dick.txt.gz}
  training:
    batchSize: 8
    steps: 10
    optimizer: {kind: adamw, learningRate: 0.001}
"#;

    fn smol(vocab_size: u32, has_tokenizer: bool) -> crate::pretrained::PretrainedShape {
        crate::pretrained::PretrainedShape {
            kind: ModelKind::Llama,
            vocab_size,
            width: 64,
            heads: 4,
            kv_heads: 2,
            blocks: 2,
            intermediate_size: 128,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            tied_embeddings: true,
            has_tokenizer,
            max_context: 2048,
            layers: Vec::new(),
            activation: crate::spec::Activation::Relu,
        }
    }

    fn parse_from(text: &str, shape: crate::pretrained::PretrainedShape) -> Result<TrainingJob, ApiError> {
        parse_training_job_with(text, &|_| Ok(Some((shape.clone(), "smol/config.json".into()))))
    }

    #[test]
    fn a_pretrained_model_reads_text_through_its_tokenizer_or_is_refused() {
        // The folder's own tokenizer is passed on.
        let job = parse_from(PRETRAINED, smol(49_152, true)).expect("the folder's tokenizer");
        assert_eq!(job.spec.data.tokenizer.as_deref(), Some("smol/tokenizer.json"));
        // None in the folder and none named: refused, naming the tokenizer, instead of training on bytes.
        let e = parse_from(PRETRAINED, smol(49_152, false)).expect_err("no tokenizer").to_string();
        assert!(e.contains("spec.data.tokenizer") && e.contains("tokenizer.json") && e.contains("49152 tokens"), "{e}");
        assert!(e.contains("from_torch(model, tokenizer=...)"), "{e}");
        // Where the folder is not at hand (a submission), the job must name it too.
        let shaped = PRETRAINED.replace(
            "contextLength: 64",
            "contextLength: 64, width: 64, heads: 4, kvHeads: 2, blocks: 2, intermediateSize: 128, vocabSize: 49152",
        );
        assert!(err(&shaped).contains("spec.data.tokenizer"));
        let named = shaped.replace("kind: text,", "kind: text, tokenizer: smol/tokenizer.json,");
        assert_eq!(
            parse_training_job(&named).expect("named").spec.data.tokenizer.as_deref(),
            Some("smol/tokenizer.json")
        );
        // A byte-level model (256 tokens) reads bytes; a token file has no tokenizer to name.
        assert!(parse_from(PRETRAINED, smol(256, false)).is_ok());
        let tokens = PRETRAINED
            .replace("kind: text, path: examples/data/moby-dick/moby-dick.txt.gz", "kind: tokens, path: t.bin");
        assert!(parse_from(&tokens, smol(49_152, false)).is_ok());
        // Llama 3's vocabulary is taken from its config; one past the ceiling is not.
        assert_eq!(parse_from(PRETRAINED, smol(128_256, true)).expect("Llama 3").spec.model.vocab_size, 128_256);
        let e = parse_from(PRETRAINED, smol(MAX_VOCAB + 1, true)).expect_err("too large").to_string();
        assert!(e.contains("spec.model.vocabSize") && e.contains("262144"), "{e}");
    }

    #[test]
    fn a_gpt_job_needs_its_shape_and_text() {
        let job = parse_training_job(GPT).expect("valid");
        assert_eq!(
            (job.spec.model.vocab_size, job.spec.model.mlp_ratio, job.spec.model.tied_embeddings),
            (256, 4, true)
        );
        assert!(err(&GPT.replace("heads: 4", "heads: 3")).contains("spec.model.heads"));
        assert!(err(&GPT.replace("width: 64, ", "")).contains("spec.model.width"));
        assert!(err(&GPT.replace("contextLength: 64", "contextLength: 1")).contains("contextLength"));
        assert!(err(&GPT.replace("kind: text", "kind: mnist")).contains("spec.data.kind"));
        assert!(err(&GPT.replace("blocks: 2", "blocks: 2, vocabSize: 100")).contains("vocabSize"));
        assert!(err(&GPT.replace("blocks: 2", "blocks: 2, vocabSize: 262145")).contains("use 2 to 262144"));
        let bpe = GPT
            .replace("blocks: 2", "blocks: 2, vocabSize: 1000")
            .replace("kind: text,", "kind: text, tokenizer: t.json,");
        assert_eq!(parse_training_job(&bpe).expect("a tokenizer's vocabulary").spec.model.vocab_size, 1000);
        // Llama 3's and Gemma's vocabularies, and the ceiling itself.
        for vocab in [128_256, 256_000, MAX_VOCAB] {
            let big = bpe.replace("vocabSize: 1000", &format!("vocabSize: {vocab}"));
            assert_eq!(parse_training_job(&big).expect("a large vocabulary").spec.model.vocab_size, vocab);
        }
        assert!(err(&GPT.replace("blocks: 2", "blocks: 2, layers: [1, 2]")).contains("spec.model.layers"));
    }

    #[test]
    fn priority_class_names_are_dns_subdomains() {
        for bad in ["High", "high_priority", "-high", "high-", "a..b", ".a", "a.", " ", ""] {
            let e = err(&GOOD.replace("cs2: 2", &format!("cs2: 2\n  priorityClassName: '{bad}'")));
            assert!(e.contains("spec.priorityClassName"), "{bad:?}: {e}");
        }
        let long = format!("{}.b", "a".repeat(251));
        assert!(
            err(&GOOD.replace("cs2: 2", &format!("cs2: 2\n  priorityClassName: '{long}'")))
                .contains("spec.priorityClassName")
        );
        assert!(
            err(&GOOD.replace("cs2: 2", &format!("cs2: 2\n  priorityClassName: '{}'", "a".repeat(64))))
                .contains("spec.priorityClassName"),
            "a label of 64"
        );
        for good in ["high", "team-a.high", "system-cluster-critical", "0", "a.b.c-d"] {
            let job = parse_training_job(&GOOD.replace("cs2: 2", &format!("cs2: 2\n  priorityClassName: '{good}'")))
                .unwrap_or_else(|e| panic!("{good}: {e}"));
            assert_eq!(job.spec.priority_class_name.as_deref(), Some(good));
        }
        assert!(is_dns_subdomain(&format!("{}.{}", "a".repeat(63), "b".repeat(63))));
        assert!(
            !is_dns_subdomain(&format!("{}.{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(63))),
            "254 characters"
        );
        assert_eq!(parse_training_job(GOOD).expect("valid").spec.priority_class_name, None);
    }

    #[test]
    fn appliance_fields_default_to_a_running_job_with_three_restarts() {
        let job = parse_training_job(GOOD).expect("valid");
        assert!(!job.spec.suspend);
        assert_eq!((job.spec.restart_limit, job.spec.priority), (3, 0));
        assert_eq!(job.spec.checkpoint.volume_size, "1Gi");
        assert_eq!(job.spec.images, crate::spec::ImagesSpec::default());
        let with = parse_training_job(&GOOD.replace(
            "cs2: 2",
            "cs2: 2\n  suspend: true\n  priority: -3\n  images: {runtime: 'r:1', pullPolicy: Never}\n  resources: {engine: {limits: {cpu: '2'}}}",
        ))
        .expect("valid");
        assert!(with.spec.suspend);
        assert_eq!(with.spec.images.runtime.as_deref(), Some("r:1"));
        assert!(with.spec.resources.engine.is_some() && with.spec.resources.memoryx.is_none());
    }

    /// A job shrinks to the most CS-2s that remain, down to minCs2, and only to counts that divide spec.cs2.
    #[test]
    fn a_job_shrinks_to_what_remains_down_to_min_cs2_in_whole_shards() {
        let mut spec = crate::testing::mlp_job("j", "ns", 8).spec;
        spec.training.batch_size = 48;
        spec.cs2 = 12;
        assert_eq!(
            (spec.min_cs2(), spec.elastic_size(12), spec.elastic_size(11)),
            (12, Some(12), None),
            "no minCs2: all or nothing"
        );
        spec.min_cs2 = Some(2);
        let sizes: Vec<Option<u32>> = (0..=13).map(|n| spec.elastic_size(n)).collect();
        let six = Some(6);
        assert_eq!(
            sizes,
            [None, None, Some(2), Some(3), Some(4), Some(4), six, six, six, six, six, six, Some(12), Some(12)]
        );
        spec.validate().expect("minCs2 2 of 12 over a batch of 48");
        assert_eq!(spec.micro_batch(), 4, "the full job's shard");
        spec.min_cs2 = Some(5);
        assert!(spec.validate().unwrap_err().to_string().contains("divide it"), "5 does not divide 12");
        spec.min_cs2 = None;
        spec.training.micro_batch_size = Some(3);
        assert!(spec.validate().unwrap_err().to_string().contains("microBatchSize"), "3 does not divide a shard of 4");
        spec.training.micro_batch_size = Some(2);
        assert_eq!((spec.validate().is_ok(), spec.micro_batch()), (true, 2));
    }
}
