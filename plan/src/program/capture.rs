//! The file a capture writes (`program.json`, format [`FORMAT`]): the graph `torch.export` made of a module, node by
//! node, as the Python package serialises it. Nothing in it is trusted: [`super::import`] checks every name,
//! shape and argument before anything is sized from it.

use serde::Deserialize;
use std::collections::BTreeMap;

/// The format this reader understands.
pub const FORMAT: &str = "weightstream-program/1";
/// The file of a program folder holding the graph.
pub const PROGRAM_FILE: &str = "program.json";
/// The file of a program folder holding the parameters and buffers, by their state-dict names.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The largest `program.json` read: a graph of a few hundred blocks is a few MiB.
pub const MAX_PROGRAM_BYTES: u64 = 64 << 20;

/// A captured program.
#[derive(Clone, Debug, Deserialize)]
pub struct Captured {
    /// [`FORMAT`].
    pub format: String,
    /// The module's class name, for messages.
    #[serde(default)]
    pub module: String,
    /// The shape of the example batch of token ids it was captured with.
    #[serde(default)]
    pub example_input: Vec<i64>,
    /// What each placeholder of the graph is.
    pub inputs: Vec<InputSpec>,
    /// What each output of the graph is.
    #[serde(default)]
    pub outputs: Vec<OutputSpec>,
    /// The graph's nodes in execution order.
    pub nodes: Vec<CapturedNode>,
}

/// One placeholder: a parameter, a buffer, a constant or the user's input.
#[derive(Clone, Debug, Deserialize)]
pub struct InputSpec {
    /// The placeholder's node name.
    pub name: String,
    /// `parameter`, `buffer`, `constant_tensor` or `user_input` (others are refused).
    pub kind: String,
    /// The state-dict name of a parameter or buffer.
    #[serde(default)]
    pub target: Option<String>,
}

/// One output of the graph.
#[derive(Clone, Debug, Deserialize)]
pub struct OutputSpec {
    /// The node it returns.
    #[serde(default)]
    pub name: Option<String>,
    /// `user_output`, or a mutation the program would make (refused).
    pub kind: String,
}

/// One node as captured.
#[derive(Clone, Debug, Deserialize)]
pub struct CapturedNode {
    /// Its unique name in the graph.
    pub name: String,
    /// `placeholder`, `call_function` or `output`.
    pub kind: String,
    /// The operation (`aten.linear.default`), or the name for placeholders.
    pub target: String,
    /// Positional arguments.
    #[serde(default)]
    pub args: Vec<Arg>,
    /// Keyword arguments.
    #[serde(default)]
    pub kwargs: BTreeMap<String, Arg>,
    /// The output's shape, sizes or `{"sym": ...}` for the batch.
    #[serde(default)]
    pub shape: Option<Vec<Size>>,
    /// The output's element type.
    #[serde(default)]
    pub dtype: Option<String>,
    /// The Python stack that made it, innermost frame last.
    #[serde(default)]
    pub stack: Option<String>,
}

/// One size of a shape.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Size {
    /// A fixed size.
    Fixed(i64),
    /// A symbolic size (the batch).
    Sym {
        /// The symbol.
        sym: String,
    },
}

/// An argument of a node.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Arg {
    /// Nothing (`None`).
    None,
    /// Another node's output.
    Node {
        /// Its name.
        node: String,
    },
    /// A symbolic size.
    Sym {
        /// The symbol.
        sym: String,
    },
    /// A float JSON cannot hold (`inf`, `-inf`, `nan`).
    Special {
        /// Python's spelling of it.
        float: String,
    },
    /// Anything else, by its Python spelling (devices, dtypes).
    Repr {
        /// The spelling.
        repr: String,
    },
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (dtypes and layouts arrive this way too).
    Str(String),
    /// A list.
    List(Vec<Arg>),
}

impl Arg {
    /// The node it names.
    pub fn node(&self) -> Option<&str> {
        match self {
            Arg::Node { node } => Some(node),
            _ => None,
        }
    }

    /// The integer it holds.
    pub fn int(&self) -> Option<i64> {
        match self {
            Arg::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The number it holds, integer or float (infinities included).
    pub fn number(&self) -> Option<f64> {
        match self {
            Arg::Int(i) => Some(*i as f64),
            Arg::Float(f) => Some(*f),
            Arg::Bool(b) => Some(f64::from(u8::from(*b))),
            Arg::Special { float } => match float.as_str() {
                "inf" => Some(f64::INFINITY),
                "-inf" => Some(f64::NEG_INFINITY),
                _ => None,
            },
            _ => None,
        }
    }

    /// The list it holds.
    pub fn list(&self) -> Option<&[Arg]> {
        match self {
            Arg::List(l) => Some(l),
            _ => None,
        }
    }
}

impl CapturedNode {
    /// Positional argument `i`, or keyword `name`, or `None` when neither was given.
    pub fn arg(&self, i: usize, name: &str) -> Option<&Arg> {
        self.args.get(i).or_else(|| self.kwargs.get(name)).filter(|a| **a != Arg::None)
    }

    /// Where the user's code made this node: the innermost frame of its stack outside PyTorch itself, as
    /// `file:line (code)`; the node's name when the capture recorded no stack.
    pub fn source(&self) -> String {
        let Some(stack) = &self.stack else { return format!("node {}", self.name) };
        let lines: Vec<&str> = stack.lines().collect();
        let frames = lines.iter().enumerate().filter_map(|(i, l)| {
            let l = l.trim();
            let rest = l.strip_prefix("File \"")?;
            let (path, rest) = rest.split_once('"')?;
            let line = rest.trim_start_matches(", line ").split(',').next()?.trim();
            let code = lines.get(i + 1).map(|c| c.trim()).filter(|c| !c.starts_with("File \""));
            Some((path, line, code))
        });
        let in_torch = |p: &str| p.contains("/torch/") || p.starts_with("torch/");
        let frames: Vec<_> = frames.collect();
        match frames.iter().rev().find(|(p, ..)| !in_torch(p)).or(frames.last()) {
            Some((path, line, code)) => {
                let file = path.rsplit('/').next().unwrap_or(path);
                match code {
                    Some(code) => format!("{file}:{line} ({code})"),
                    None => format!("{file}:{line}"),
                }
            }
            None => format!("node {}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_is_the_users_innermost_line() {
        let node = CapturedNode {
            name: "linear".into(),
            kind: "call_function".into(),
            target: "aten.linear.default".into(),
            args: vec![],
            kwargs: BTreeMap::new(),
            shape: None,
            dtype: None,
            stack: Some(
                "File \"/x/decoders.py\", line 58, in forward\n    return self.o_proj(y)\n  File \
                 \"/v/site-packages/torch/nn/modules/linear.py\", line 134, in forward\n    return F.linear(input)"
                    .into(),
            ),
        };
        assert_eq!(node.source(), "decoders.py:58 (return self.o_proj(y))");
        assert_eq!(CapturedNode { stack: None, ..node }.source(), "node linear");
    }

    #[test]
    fn arguments_parse_in_every_form() {
        let args: Vec<Arg> =
            serde_json::from_str(r#"[{"node":"x"},[{"sym":"s1"},16],1e-05,false,null,{"float":"-inf"},"tanh",3]"#)
                .expect("parses");
        assert_eq!(args[0].node(), Some("x"));
        assert_eq!(args[1].list().map(|l| l.len()), Some(2));
        assert_eq!(args[2].number(), Some(1e-5));
        assert_eq!(args[3], Arg::Bool(false));
        assert_eq!(args[4], Arg::None);
        assert_eq!(args[5].number(), Some(f64::NEG_INFINITY));
        assert_eq!(args[6], Arg::Str("tanh".into()));
        assert_eq!(args[7].int(), Some(3));
    }
}
