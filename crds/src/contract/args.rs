//! Each role program's arguments as one typed struct. The program parses its command line with
//! [`RoleArgs::parse`] (clap, from these very definitions), and the operator and the local runner render argv
//! with [`RoleArgs::argv`]; the round-trip tests below keep the two in step, so no flag is spelled anywhere else.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::role::Role;

/// What every role program is told: the job, its identity on the wire, its HTTP endpoint and how to log. Also
/// accepted as `WS_*` environment variables, since the programs run as pods.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct CommonArgs {
    /// The TrainingJob manifest.
    #[arg(long, env = "WS_JOB")]
    pub job: PathBuf,
    /// The job's identity on the wire (default: its name); stages refuse requests of another job.
    #[arg(long, env = "WS_JOB_ID")]
    pub job_id: Option<String>,
    /// The directory holding the job's TLS identity (`ca.crt`, `tls.crt`, `tls.key`): every endpoint but
    /// `/healthz` and `/metrics` requires it of its peers, and every call presents it. Required: roles speak only
    /// mutual TLS.
    #[arg(long, env = "WS_IDENTITY")]
    pub identity: PathBuf,
    /// Seconds one call to a stage may take, its streams included (default: derived from the plan, from the
    /// size of the model's state): a peer that answers keepalives but never finishes a call is lost after it.
    #[arg(long, env = "WS_CALL_TIMEOUT_SECONDS")]
    pub call_timeout_seconds: Option<u64>,
    /// Address of the health and metrics endpoint (port 0 picks one).
    #[arg(long, env = "WS_HTTP", default_value = "127.0.0.1:0")]
    pub http: SocketAddr,
    /// Log one JSON object per line.
    #[arg(long, env = "WS_JSON_LOGS")]
    pub json_logs: bool,
    /// Exit when standard input closes, so a local supervisor that dies takes its children with it.
    #[arg(long)]
    pub exit_with_stdin: bool,
}

impl CommonArgs {
    /// The arguments for the job manifest at `job` and the identity directory `identity`, with every other flag
    /// at its default.
    pub fn new(job: impl Into<PathBuf>, identity: impl Into<PathBuf>) -> Self {
        CommonArgs {
            job: job.into(),
            job_id: None,
            identity: identity.into(),
            call_timeout_seconds: None,
            http: ([127, 0, 0, 1], 0).into(),
            json_logs: false,
            exit_with_stdin: false,
        }
    }

    fn render(&self, out: &mut Vec<String>) {
        out.extend(["--job".into(), self.job.display().to_string()]);
        if let Some(id) = &self.job_id {
            out.extend(["--job-id".into(), id.clone()]);
        }
        out.extend(["--identity".into(), self.identity.display().to_string()]);
        if let Some(s) = self.call_timeout_seconds {
            out.extend(["--call-timeout-seconds".into(), s.to_string()]);
        }
        out.extend(["--http".into(), self.http.to_string()]);
        if self.json_logs {
            out.push("--json-logs".into());
        }
        if self.exit_with_stdin {
            out.push("--exit-with-stdin".into());
        }
    }
}

/// A role program's arguments: parsed by the program, rendered by whoever starts it.
pub trait RoleArgs: clap::Args + clap::FromArgMatches + Sized {
    /// The role these arguments start.
    const ROLE: Role;

    /// The command line, without the program name, that [`RoleArgs::try_parse_from`] turns back into `self`.
    fn argv(&self) -> Vec<String>;

    /// The program's parser.
    fn command() -> clap::Command {
        Self::augment_args(
            clap::Command::new(Self::ROLE.binary())
                .version(env!("CARGO_PKG_VERSION"))
                .about(format!("The weightstream {} role.", Self::ROLE)),
        )
    }

    /// Parses a command line whose first item is the program name.
    fn try_parse_from<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = Self::command().try_get_matches_from(argv)?;
        Self::from_arg_matches(&matches)
    }

    /// Parses this process's command line, printing help or the error and exiting as clap does.
    fn parse() -> Self {
        Self::try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }
}

/// Flags of the `memoryx` program: MemoryX, the weight store, which also coordinates the job.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct MemoryxArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// The `Stage` service MemoryX drives: the SwarmX root, or the engine itself when the job has one engine and
    /// so no SwarmX tree.
    #[arg(long, env = "WS_STAGE")]
    pub stage: String,
    /// An input worker (any of the job's): MemoryX asks it how many samples the data has, to plan the steps
    /// and the evaluation, and never opens the data itself.
    #[arg(long, env = "WS_INPUT")]
    pub input: String,
    /// Where checkpoints live; the job resumes from the newest one found here.
    #[arg(long, env = "WS_CHECKPOINT_DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Where to write metrics.jsonl, summary.json and TensorBoard event files (served on `GET /run`).
    #[arg(long, env = "WS_OUT")]
    pub out: Option<PathBuf>,
    /// Seconds to wait for the SwarmX tree to come up.
    #[arg(long, env = "WS_CONNECT_TIMEOUT", default_value_t = 120)]
    pub connect_timeout: u64,
    /// Seconds to keep rerunning a step while a lost engine comes back.
    #[arg(long, env = "WS_RETRY_SECONDS", default_value_t = 60)]
    pub retry_seconds: u64,
    /// Print each step's progress on standard output as a handshake line, for a local supervisor.
    #[arg(long)]
    pub progress: bool,
    /// Keep serving `/status` after the job ends (as a pod does), instead of exiting.
    #[arg(long, env = "WS_LINGER")]
    pub linger: bool,
    /// Seconds to pause after a checkpoint asked for on `POST /checkpoint` (the operator suspending or
    /// rescaling the job), so the job stops at that checkpoint; training goes on after it if nobody stops it.
    #[arg(long, env = "WS_HOLD_SECONDS", default_value_t = 60)]
    pub hold_seconds: u64,
    /// After training a language model, decode this many lines of text from it into `summary.json`.
    #[arg(long, env = "WS_SAMPLE", default_value_t = 0)]
    pub sample: usize,
    /// Fault injection for tests: exit abruptly, without a final checkpoint, after this many steps.
    #[arg(long, hide = true)]
    pub crash_after_steps: Option<u64>,
    /// This process's place among the job's `spec.memoryx.servers` weight servers. Server 0 is the
    /// coordinator: it drives the job, holds slice 0 and reaches the others at `--weight-servers`. Any other
    /// serves its slice to the coordinator on `--listen` and nothing else. In a StatefulSet the pod's ordinal.
    #[arg(long, env = "WS_SERVER_INDEX", default_value_t = 0)]
    pub server_index: u32,
    /// The coordinator's view of the other weight servers: their addresses, for servers 1, 2, … in order.
    #[arg(long, env = "WS_WEIGHT_SERVERS", value_delimiter = ',')]
    pub weight_servers: Vec<String>,
    /// Address of a weight server's gRPC service (port 0 picks one). The coordinator serves its own slice there
    /// too when the job has other weight servers, for the SwarmX root that streams straight from them.
    #[arg(long, env = "WS_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The URL at which the SwarmX root reaches the coordinator's slice (default: `https://` and the address
    /// `--listen` bound, which must then be a specific one).
    #[arg(long, env = "WS_ADVERTISE")]
    pub advertise: Option<String>,
    /// Where this server's disk tier keeps the part of its slice beyond `spec.memoryx.memoryBytes` (default: a
    /// `tier` directory beside the checkpoints). Its files are scratch, rebuilt from the checkpoint on restart.
    #[arg(long, env = "WS_TIER_DIR")]
    pub tier_dir: Option<PathBuf>,
    /// Where `spec.data.volume` is mounted when the job starts from a pretrained folder in it
    /// (`spec.model.from`, read inside it and never outside); unset, `from` is a path on this machine.
    #[arg(long, env = "WS_DATA_ROOT")]
    pub data_root: Option<PathBuf>,
}

impl MemoryxArgs {
    /// MemoryX for the job at `job`, driving the stage at `stage` (the SwarmX root, or a one-engine job's
    /// engine) and describing the data through the input worker at `input`; every other flag at its default.
    pub fn new(common: CommonArgs, stage: impl Into<String>, input: impl Into<String>) -> Self {
        MemoryxArgs {
            common,
            stage: stage.into(),
            input: input.into(),
            checkpoint_dir: None,
            out: None,
            connect_timeout: 120,
            retry_seconds: 60,
            progress: false,
            linger: false,
            hold_seconds: 60,
            sample: 0,
            crash_after_steps: None,
            server_index: 0,
            weight_servers: Vec::new(),
            listen: ([127, 0, 0, 1], 0).into(),
            advertise: None,
            tier_dir: None,
            data_root: None,
        }
    }
}

impl RoleArgs for MemoryxArgs {
    const ROLE: Role = Role::Memoryx;

    fn argv(&self) -> Vec<String> {
        let mut v = Vec::new();
        self.common.render(&mut v);
        v.extend(["--stage".into(), self.stage.clone()]);
        v.extend(["--input".into(), self.input.clone()]);
        if let Some(d) = &self.checkpoint_dir {
            v.extend(["--checkpoint-dir".into(), d.display().to_string()]);
        }
        if let Some(d) = &self.out {
            v.extend(["--out".into(), d.display().to_string()]);
        }
        v.extend(["--connect-timeout".into(), self.connect_timeout.to_string()]);
        v.extend(["--retry-seconds".into(), self.retry_seconds.to_string()]);
        if self.progress {
            v.push("--progress".into());
        }
        if self.linger {
            v.push("--linger".into());
        }
        v.extend(["--hold-seconds".into(), self.hold_seconds.to_string()]);
        if self.sample > 0 {
            v.extend(["--sample".into(), self.sample.to_string()]);
        }
        if let Some(n) = self.crash_after_steps {
            v.extend(["--crash-after-steps".into(), n.to_string()]);
        }
        if self.server_index > 0 {
            v.extend(["--server-index".into(), self.server_index.to_string()]);
        }
        if !self.weight_servers.is_empty() {
            v.extend(["--weight-servers".into(), self.weight_servers.join(",")]);
        }
        v.extend(["--listen".into(), self.listen.to_string()]);
        if let Some(a) = &self.advertise {
            v.extend(["--advertise".into(), a.clone()]);
        }
        if let Some(d) = &self.tier_dir {
            v.extend(["--tier-dir".into(), d.display().to_string()]);
        }
        if let Some(d) = &self.data_root {
            v.extend(["--data-root".into(), d.display().to_string()]);
        }
        v
    }
}

/// Flags of the `swarmx` program: one node of the fabric.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct SwarmxArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Address of the gRPC service (port 0 picks one).
    #[arg(long, env = "WS_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The children, in engine order: engines or further SwarmX nodes (comma-separated URLs).
    #[arg(long, env = "WS_CHILDREN", value_delimiter = ',', required = true)]
    pub children: Vec<String>,
    /// Seconds to wait for every child to answer.
    #[arg(long, env = "WS_CONNECT_TIMEOUT", default_value_t = 120)]
    pub connect_timeout: u64,
}

impl SwarmxArgs {
    /// A node above `children`, listening on `listen`.
    pub fn new(common: CommonArgs, listen: SocketAddr, children: Vec<String>) -> Self {
        SwarmxArgs { common, listen, children, connect_timeout: 120 }
    }
}

impl RoleArgs for SwarmxArgs {
    const ROLE: Role = Role::Swarmx;

    fn argv(&self) -> Vec<String> {
        let mut v = Vec::new();
        self.common.render(&mut v);
        v.extend(["--listen".into(), self.listen.to_string()]);
        v.extend(["--children".into(), self.children.join(",")]);
        v.extend(["--connect-timeout".into(), self.connect_timeout.to_string()]);
        v
    }
}

/// Flags of the `sim-wse` program: one simulated CS-2.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct EngineArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Address of the gRPC service (port 0 picks one).
    #[arg(long, env = "WS_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// This engine's place among the job's engines (its CS-2), used in names and errors.
    #[arg(long, env = "WS_INDEX", default_value_t = 0)]
    pub index: u32,
    /// This engine's input workers (comma-separated URLs): it splits each shard of samples evenly over them,
    /// in this order, and never opens a data file itself.
    #[arg(long, env = "WS_INPUTS", value_delimiter = ',', required = true)]
    pub inputs: Vec<String>,
    /// Where `spec.data.volume` is mounted when this engine reads the pretrained folder in it (a pipelined
    /// replica pruned by magnitude, `spec.model.from`); unset, `from` is a path on this machine.
    #[arg(long, env = "WS_DATA_ROOT")]
    pub data_root: Option<PathBuf>,
}

impl EngineArgs {
    /// Engine `index`, listening on `listen`, fed by `inputs`.
    pub fn new(common: CommonArgs, listen: SocketAddr, index: u32, inputs: Vec<String>) -> Self {
        EngineArgs { common, listen, index, inputs, data_root: None }
    }
}

impl RoleArgs for EngineArgs {
    const ROLE: Role = Role::Engine;

    fn argv(&self) -> Vec<String> {
        let mut v = Vec::new();
        self.common.render(&mut v);
        v.extend(["--listen".into(), self.listen.to_string()]);
        v.extend(["--index".into(), self.index.to_string()]);
        v.extend(["--inputs".into(), self.inputs.join(",")]);
        if let Some(d) = &self.data_root {
            v.extend(["--data-root".into(), d.display().to_string()]);
        }
        v
    }
}

/// Flags of the `input` program: one input worker.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct InputArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Address of the gRPC service (port 0 picks one).
    #[arg(long, env = "WS_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// This worker's place among the job's input workers, used in names and errors.
    #[arg(long, env = "WS_INDEX", default_value_t = 0)]
    pub index: u32,
    /// Where `spec.data.volume` is mounted (in a pod, [`super::DATA_MOUNT`]); the data's paths are taken
    /// inside it and may not leave it. Without it, a job naming a volume is refused.
    #[arg(long, env = "WS_DATA_ROOT")]
    pub data_root: Option<PathBuf>,
}

impl InputArgs {
    /// Input worker `index`, listening on `listen`.
    pub fn new(common: CommonArgs, listen: SocketAddr, index: u32, data_root: Option<PathBuf>) -> Self {
        InputArgs { common, listen, index, data_root }
    }
}

impl RoleArgs for InputArgs {
    const ROLE: Role = Role::Input;

    fn argv(&self) -> Vec<String> {
        let mut v = Vec::new();
        self.common.render(&mut v);
        v.extend(["--listen".into(), self.listen.to_string()]);
        v.extend(["--index".into(), self.index.to_string()]);
        if let Some(root) = &self.data_root {
            v.extend(["--data-root".into(), root.display().to_string()]);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<A: RoleArgs + PartialEq + std::fmt::Debug>(args: &A) {
        let argv = std::iter::once(A::ROLE.binary().to_string()).chain(args.argv());
        let parsed = A::try_parse_from(argv).unwrap_or_else(|e| panic!("{:?} does not parse: {e}", args.argv()));
        assert_eq!(&parsed, args);
    }

    fn common() -> CommonArgs {
        CommonArgs {
            job: "/etc/weightstream/job.yaml".into(),
            job_id: Some("fc-mnist-42".into()),
            identity: "/var/run/weightstream/identity".into(),
            call_timeout_seconds: Some(90),
            http: "0.0.0.0:8080".parse().unwrap(),
            json_logs: true,
            exit_with_stdin: true,
        }
    }

    #[test]
    fn every_role_round_trips_through_its_own_parser() {
        let mut m = MemoryxArgs::new(common(), "https://root:7100", "https://input-0:7300");
        round_trip(&m);
        m.checkpoint_dir = Some("/ckpt".into());
        m.out = Some("runs/x".into());
        m.progress = true;
        m.linger = true;
        m.sample = 3;
        m.crash_after_steps = Some(5);
        m.retry_seconds = 7;
        m.hold_seconds = 0;
        m.connect_timeout = 9;
        round_trip(&m);
        m.server_index = 2;
        m.weight_servers =
            vec!["https://j-memoryx-1.j-memoryx:7400".into(), "https://j-memoryx-2.j-memoryx:7400".into()];
        m.listen = "0.0.0.0:7400".parse().unwrap();
        m.advertise = Some("https://j-memoryx-0.j-memoryx:7400".into());
        m.tier_dir = Some("/ckpt/tier".into());
        round_trip(&m);
        round_trip(&MemoryxArgs::new(CommonArgs::new("job.yaml", "id"), "https://127.0.0.1:1", "https://127.0.0.1:2"));
        let mut s = SwarmxArgs::new(
            common(),
            "0.0.0.0:7100".parse().unwrap(),
            vec!["https://a:1".into(), "https://b:2".into()],
        );
        round_trip(&s);
        s.connect_timeout = 3;
        s.common = CommonArgs::new("j.yaml", "id");
        round_trip(&s);
        round_trip(&EngineArgs::new(
            common(),
            "0.0.0.0:7200".parse().unwrap(),
            17,
            vec!["https://i-34:7300".into(), "https://i-35:7300".into()],
        ));
        round_trip(&EngineArgs::new(
            CommonArgs::new("j.yaml", "id"),
            "127.0.0.1:0".parse().unwrap(),
            0,
            vec!["https://127.0.0.1:9".into()],
        ));
        round_trip(&InputArgs::new(
            common(),
            "0.0.0.0:7300".parse().unwrap(),
            3,
            Some("/var/run/weightstream/data".into()),
        ));
        round_trip(&InputArgs::new(CommonArgs::new("j.yaml", "id"), "127.0.0.1:0".parse().unwrap(), 0, None));
    }

    #[test]
    fn a_missing_required_flag_is_refused_by_name() {
        let err =
            SwarmxArgs::try_parse_from(["swarmx", "--job", "j.yaml", "--identity", "id"]).unwrap_err().to_string();
        assert!(err.contains("--children"), "{err}");
        let err = EngineArgs::try_parse_from(["sim-wse", "--job", "j", "--index", "x"]).unwrap_err().to_string();
        assert!(err.contains("--index"), "{err}");
        let err =
            MemoryxArgs::try_parse_from(["memoryx", "--job", "j", "--stage", "https://x:1", "--input", "https://y:2"])
                .unwrap_err()
                .to_string();
        assert!(err.contains("--identity"), "{err}");
    }
}
