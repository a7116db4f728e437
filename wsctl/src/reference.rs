//! `docs/reference/wsctl.md`, generated from the clap definition of every command and flag, and the tests that
//! hold the checked-in copy to it and every flag to a help text. `WS_UPDATE_DOCS=1` rewrites the document.

use std::fmt::Write;
use std::path::Path;

use clap::{Arg, ArgAction, Command, CommandFactory};

use crate::Cli;

/// The one command that rewrites every generated reference document (this one, the CRD's and the chart's).
const UPDATE: &str = "WS_UPDATE_DOCS=1 cargo test --release --workspace --lib --bins --tests -- docs_reference";

/// wsctl as clap builds it, with every subcommand's usage and propagated arguments filled in.
fn built() -> Command {
    let mut cmd = Cli::command();
    cmd.build();
    cmd
}

/// The commands a user sees (hidden ones and clap's own `help` left out), depth first.
fn visible(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands().filter(|c| !c.is_hide_set() && c.get_name() != "help")
}

/// The arguments a user sees in `cmd`'s section: clap's `--help`/`--version` and, below the top, the global
/// ones (documented once, at the top) left out.
fn own_args(cmd: &Command, top: bool) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments().filter(move |a| {
        let id = a.get_id().as_str();
        !a.is_hide_set() && id != "help" && id != "version" && (top || !a.is_global_set())
    })
}

/// Text for a table cell: one line, pipes escaped, and `<`/`>` outside code spans kept as text (not HTML).
fn cell(s: &str) -> String {
    let one_line = s.trim().replace("\n\n", " ").replace('\n', " ").replace('|', "\\|");
    let parts: Vec<String> = one_line
        .split('`')
        .enumerate()
        .map(|(i, part)| if i % 2 == 1 { part.to_string() } else { part.replace('<', "&lt;").replace('>', "&gt;") })
        .collect();
    parts.join("`")
}

fn help_of(a: &Arg) -> String {
    a.get_long_help().or(a.get_help()).map(|h| h.to_string()).unwrap_or_default()
}

/// How the argument is written: `<JOB>`, `-o, --out <OUT>`, `--json`.
fn spelling(a: &Arg) -> String {
    let names: Vec<String> = match a.get_value_names() {
        _ if !a.get_action().takes_values() => vec![],
        Some(names) => names.iter().map(|n| format!("<{n}>")).collect(),
        None => vec![format!("<{}>", a.get_id().as_str().to_uppercase())],
    };
    if a.is_positional() {
        return names.join(" ");
    }
    let mut s = String::new();
    if let Some(c) = a.get_short() {
        s.push_str(&format!("-{c}, "));
    }
    if let Some(l) = a.get_long() {
        s.push_str(&format!("--{l}"));
    }
    for n in names {
        s.push(' ');
        s.push_str(&n);
    }
    s
}

/// The argument's row: spelling, default, and help followed by its possible values, environment variable and
/// whether it is required or repeatable.
fn row(a: &Arg) -> String {
    let mut notes = Vec::new();
    if a.is_required_set() {
        notes.push("required".to_string());
    }
    if matches!(a.get_action(), ArgAction::Append | ArgAction::Count) {
        notes.push("repeatable".to_string());
    }
    if let Some(env) = a.get_env() {
        notes.push(format!("env `{}`", env.to_string_lossy()));
    }
    let default: Vec<String> = if a.get_action().takes_values() {
        a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect()
    } else {
        vec![]
    };
    let default = if default.is_empty() { String::new() } else { format!("`{}`", default.join(",")) };
    let mut help = help_of(a);
    let values: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| match v.get_help() {
            Some(h) => format!("`{}` ({})", v.get_name(), h.to_string().trim_end_matches('.')),
            None => format!("`{}`", v.get_name()),
        })
        .collect();
    if !values.is_empty() && a.get_action().takes_values() {
        help = format!("{}. Values: {}.", help.trim_end().trim_end_matches('.'), values.join(", "));
    }
    let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join(", ")) };
    format!("| `{}`{notes} | {default} | {} |", spelling(a), cell(&help))
}

fn section(cmd: &Command, path: &str, top: bool, out: &mut String) {
    let _ = writeln!(out, "## `{path}`\n");
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim());
    }
    let usage = cmd.clone().render_usage().to_string();
    let _ = writeln!(out, "```\n{}\n```\n", usage.trim().trim_start_matches("Usage: "));
    let args: Vec<&Arg> = own_args(cmd, top).collect();
    if !args.is_empty() {
        let _ = writeln!(out, "| Argument | Default | Description |\n| --- | --- | --- |");
        for a in args {
            let _ = writeln!(out, "{}", row(a));
        }
        out.push('\n');
    }
    for sub in visible(cmd) {
        section(sub, &format!("{path} {}", sub.get_name()), false, out);
    }
}

fn wsctl_reference() -> String {
    let cmd = built();
    let mut out = format!(
        "# wsctl reference\n\n<!-- Generated from wsctl's clap definitions (wsctl/src) by `{UPDATE}`; do not edit. -->\n\n\
         Every command and flag of `wsctl`, as `wsctl COMMAND --help` prints them. Every command also takes `-h`/`--help`, and `wsctl --version` prints the version.\n\n"
    );
    let _ = writeln!(out, "Commands:\n");
    for sub in visible(&cmd) {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        let _ = writeln!(out, "- [`wsctl {}`](#wsctl-{}): {}", sub.get_name(), sub.get_name(), cell(&about));
    }
    out.push('\n');
    section(&cmd, "wsctl", true, &mut out);
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

#[test]
fn docs_reference_wsctl_matches_the_cli() {
    let rel = "docs/reference/wsctl.md";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let want = wsctl_reference();
    if std::env::var_os("WS_UPDATE_DOCS").is_some() {
        std::fs::create_dir_all(path.parent().expect("docs/reference")).expect("create docs/reference");
        std::fs::write(&path, &want).expect("write the reference document");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(have == want, "{rel} is out of date with wsctl's commands: run `{UPDATE}` and commit the result");
}

/// Every command and every argument a user sees says what it does: the reference is only as good as the help.
#[test]
fn every_command_and_flag_has_help() {
    fn walk(cmd: &Command, path: &str, top: bool, missing: &mut Vec<String>) {
        if cmd.get_about().is_none_or(|a| a.to_string().trim().is_empty()) {
            missing.push(format!("`{path}` has no about"));
        }
        for a in own_args(cmd, top) {
            if help_of(a).trim().is_empty() {
                missing.push(format!("`{path} {}` has no help", spelling(a)));
            }
            for v in a.get_possible_values().iter().filter(|v| !v.is_hide_set()) {
                if v.get_help().is_none() && a.get_action().takes_values() {
                    missing.push(format!("value `{}` of `{path} {}` has no help", v.get_name(), spelling(a)));
                }
            }
        }
        for sub in visible(cmd) {
            walk(sub, &format!("{path} {}", sub.get_name()), false, missing);
        }
    }
    let mut missing = Vec::new();
    walk(&built(), "wsctl", true, &mut missing);
    assert!(missing.is_empty(), "give these a doc comment (clap's help):\n{}", missing.join("\n"));
}

/// The document names every visible subcommand and long flag, so a walk that skipped some would show here.
#[test]
fn the_reference_names_every_flag() {
    let doc = wsctl_reference();
    fn walk(cmd: &Command, path: &str, top: bool, doc: &str) {
        assert!(doc.contains(&format!("## `{path}`")), "no section for `{path}`");
        for a in own_args(cmd, top) {
            if let Some(l) = a.get_long() {
                assert!(doc.contains(&format!("--{l}")), "`{path} --{l}` is not in the reference");
            }
        }
        for sub in visible(cmd) {
            walk(sub, &format!("{path} {}", sub.get_name()), false, doc);
        }
    }
    walk(&built(), "wsctl", true, &doc);
    for flag in ["--checkpoint-dir", "--error-format", "--namespace"] {
        assert!(doc.contains(flag), "{flag} missing");
    }
}
