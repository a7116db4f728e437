//! The documents, checked without a cluster: `docs/reference/chart-values.md` is generated from the chart's
//! `values.yaml` and `values.schema.json` (`WS_UPDATE_DOCS=1` rewrites it), every value is in both, the defaults
//! meet the schema; and every relative link and repository path in README.md, CONTRIBUTING.md and docs/ exists.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use serde_yaml::Value as Yaml;

/// The one command that rewrites every generated reference document (this one, the CRD's and wsctl's).
const UPDATE: &str = "WS_UPDATE_DOCS=1 cargo test --release --workspace --lib --bins --tests -- docs_reference";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn values() -> Yaml {
    serde_yaml::from_str(&read("charts/weightstream/values.yaml")).expect("values.yaml is YAML")
}

fn schema() -> Json {
    serde_json::from_str(&read("charts/weightstream/values.schema.json")).expect("values.schema.json is JSON")
}

// ---------------------------------------------------------------------------------------------------------------
// The chart's values

/// A value the chart documents: its dotted key, default (from values.yaml) and schema.
struct Leaf {
    key: String,
    default: Yaml,
    schema: Json,
}

/// The documented values, in values.yaml's order: a mapping is walked into when its schema lists properties,
/// and is otherwise one value (`resources`, `nodeSelector`). Keys missing from either file are reported.
fn leaves(prefix: &str, yaml: &Yaml, schema: &Json, out: &mut Vec<Leaf>, problems: &mut Vec<String>) {
    let props = schema["properties"].as_object();
    let (Some(map), Some(props)) = (yaml.as_mapping(), props) else {
        out.push(Leaf { key: prefix.to_string(), default: yaml.clone(), schema: schema.clone() });
        return;
    };
    for (k, v) in map {
        let k = k.as_str().unwrap_or_default();
        let key = if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
        match props.get(k) {
            Some(s) => leaves(&key, v, s, out, problems),
            None => problems.push(format!("`{key}` is in values.yaml but not in values.schema.json")),
        }
    }
    for k in props.keys().filter(|k| !map.contains_key(k.as_str()) && k.as_str() != "global") {
        problems.push(format!("`{prefix}.{k}` is in values.schema.json but has no default in values.yaml"));
    }
}

fn all_leaves() -> (Vec<Leaf>, Vec<String>) {
    let (mut out, mut problems) = (Vec::new(), Vec::new());
    leaves("", &values(), &schema(), &mut out, &mut problems);
    (out, problems)
}

fn type_name(s: &Json) -> String {
    match &s["type"] {
        Json::Array(types) => types.iter().filter_map(Json::as_str).collect::<Vec<_>>().join(" or "),
        Json::String(t) if t == "array" => match s["items"]["type"].as_str() {
            Some(item) => format!("array of {item}"),
            None => "array".into(),
        },
        Json::String(t) if t == "object" && s["additionalProperties"]["type"].is_string() => {
            format!("map of {}", s["additionalProperties"]["type"].as_str().unwrap_or_default())
        }
        Json::String(t) => t.clone(),
        _ => "any".into(),
    }
}

/// A default as a reader would write it in a values file: YAML in flow style, on one line.
fn flow(v: &Yaml) -> String {
    match v {
        Yaml::Null => "null".into(),
        Yaml::String(s) => format!("{s:?}"),
        Yaml::Mapping(m) => {
            let items: Vec<String> =
                m.iter().map(|(k, v)| format!("{}: {}", k.as_str().unwrap_or_default(), flow(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Yaml::Sequence(s) => format!("[{}]", s.iter().map(flow).collect::<Vec<_>>().join(", ")),
        other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
    }
}

fn cell(s: &str) -> String {
    s.trim().replace('\n', " ").replace('|', "\\|")
}

fn chart_values_reference() -> String {
    let (leaves, _) = all_leaves();
    let schema = schema();
    let mut out = format!(
        "# Chart values\n\n<!-- Generated from charts/weightstream/values.yaml and values.schema.json by `{UPDATE}`; \
         do not edit. -->\n\n\
         Every value of the Helm chart in [charts/weightstream](../../charts/weightstream), with its default. Helm \
         checks the values of every install and upgrade against \
         [values.schema.json](../../charts/weightstream/values.schema.json), so a misspelt key or a value of the \
         wrong type is refused before anything is applied.\n"
    );
    let mut section = String::new();
    for leaf in &leaves {
        let top = leaf.key.split('.').next().unwrap_or_default();
        let nested = leaf.key.contains('.');
        if top != section && nested {
            section = top.to_string();
            let _ = writeln!(out, "\n## `{top}`\n");
            if let Some(d) = schema["properties"][top]["description"].as_str() {
                let _ = writeln!(out, "{d}\n");
            }
            let _ = writeln!(out, "| Key | Type | Default | Description |\n| --- | --- | --- | --- |");
        } else if !nested && section != "(top)" {
            section = "(top)".into();
            let _ = writeln!(out, "\n## Names\n\n| Key | Type | Default | Description |\n| --- | --- | --- | --- |");
        }
        let mut description = leaf.schema["description"].as_str().unwrap_or_default().to_string();
        if let Some(values) = leaf.schema["enum"].as_array() {
            let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
            description.push_str(&format!(" One of {}.", values.join(", ")));
        }
        let _ = writeln!(
            out,
            "| `{}` | {} | `{}` | {} |",
            leaf.key,
            type_name(&leaf.schema),
            flow(&leaf.default).replace('|', "\\|"),
            cell(&description)
        );
    }
    out
}

#[test]
fn docs_reference_chart_values_match_the_chart() {
    let rel = "docs/reference/chart-values.md";
    let want = chart_values_reference();
    if std::env::var_os("WS_UPDATE_DOCS").is_some() {
        std::fs::create_dir_all(root().join("docs/reference")).expect("create docs/reference");
        std::fs::write(root().join(rel), &want).expect("write the reference document");
    }
    let have = std::fs::read_to_string(root().join(rel)).unwrap_or_default();
    assert!(have == want, "{rel} is out of date with the chart's values: run `{UPDATE}` and commit the result");
}

#[test]
fn every_chart_value_is_in_the_schema_with_a_description_and_in_the_reference() {
    let (leaves, mut problems) = all_leaves();
    assert!(leaves.len() > 40, "the walk found the chart's values: {}", leaves.len());
    let doc = chart_values_reference();
    for leaf in &leaves {
        if leaf.schema["description"].as_str().is_none_or(|d| d.trim().is_empty()) {
            problems.push(format!("`{}` has no description in values.schema.json", leaf.key));
        }
        if !doc.contains(&format!("| `{}` |", leaf.key)) {
            problems.push(format!("`{}` is not in the reference", leaf.key));
        }
    }
    assert!(problems.is_empty(), "the chart's values and their schema disagree:\n{}", problems.join("\n"));
}

/// Whether `v` meets `s` in the parts of JSON Schema the chart's schema uses (type, enum, bounds, required,
/// closed objects): so the chart's own defaults are known to pass Helm's check before any install.
fn violations(key: &str, v: &Json, s: &Json, out: &mut Vec<String>) {
    let types: Vec<&str> = match &s["type"] {
        Json::String(t) => vec![t.as_str()],
        Json::Array(ts) => ts.iter().filter_map(Json::as_str).collect(),
        _ => vec![],
    };
    let actual = match v {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    };
    let allowed = types.is_empty() || types.contains(&actual) || (actual == "integer" && types.contains(&"number"));
    if !allowed {
        out.push(format!("`{key}` is {actual}, the schema wants {types:?}"));
    }
    if let Some(allowed) = s["enum"].as_array().filter(|a| !a.contains(v)) {
        out.push(format!("`{key}` = {v} is not one of {allowed:?}"));
    }
    if let (Some(x), Some(min)) = (v.as_f64(), s["minimum"].as_f64())
        && x < min
    {
        out.push(format!("`{key}` = {x} is below its minimum {min}"));
    }
    if let (Some(x), Some(max)) = (v.as_f64(), s["maximum"].as_f64())
        && x > max
    {
        out.push(format!("`{key}` = {x} is above its maximum {max}"));
    }
    if let Some(obj) = v.as_object() {
        for r in s["required"].as_array().into_iter().flatten().filter_map(Json::as_str) {
            if !obj.contains_key(r) {
                out.push(format!("`{key}` lacks `{r}`"));
            }
        }
        for (k, item) in obj {
            match s["properties"].get(k) {
                Some(p) => violations(&format!("{key}.{k}"), item, p, out),
                None if s["additionalProperties"] == Json::Bool(false) => {
                    out.push(format!("`{key}.{k}` is not allowed"))
                }
                None if s["additionalProperties"].is_object() => {
                    violations(&format!("{key}.{k}"), item, &s["additionalProperties"], out)
                }
                None => {}
            }
        }
    }
    for (i, item) in v.as_array().into_iter().flatten().enumerate() {
        violations(&format!("{key}[{i}]"), item, &s["items"], out);
    }
}

#[test]
fn the_chart_defaults_meet_the_schema_and_the_schema_refuses_mistakes() {
    let schema = schema();
    assert!(
        schema["$schema"].as_str().is_some_and(|s| s.contains("json-schema.org")),
        "values.schema.json names its draft"
    );
    let values: Json = serde_yaml::from_str(&read("charts/weightstream/values.yaml")).expect("values.yaml is YAML");
    let mut problems = Vec::new();
    violations("", &values, &schema, &mut problems);
    assert!(problems.is_empty(), "values.yaml does not meet values.schema.json:\n{}", problems.join("\n"));
    // What Helm will refuse with the schema: a misspelt key, a wrong type, a pull policy that does not exist.
    for (mistake, patch) in [
        ("a misspelt key", serde_json::json!({"operator": {"replica": 2}})),
        ("a string for a number", serde_json::json!({"operator": {"replicas": "two"}})),
        ("an unknown pull policy", serde_json::json!({"operator": {"image": {"pullPolicy": "Sometimes"}}})),
        ("a pool below zero", serde_json::json!({"cs2": {"pool": -1}})),
    ] {
        let mut problems = Vec::new();
        violations("", &patch, &schema, &mut problems);
        assert!(!problems.is_empty(), "the schema accepts {mistake}: {patch}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Links and paths

/// README.md, CONTRIBUTING.md and every Markdown file under docs/.
fn documents() -> Vec<String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = format!("{rel}/{name}");
            if e.path().is_dir() {
                walk(&e.path(), &path, out);
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    let mut docs: Vec<String> =
        ["README.md", "CONTRIBUTING.md"].into_iter().filter(|f| root().join(f).exists()).map(String::from).collect();
    walk(&root().join("docs"), "docs", &mut docs);
    docs.sort();
    docs
}

/// The text outside fenced code blocks, line by line with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The targets of a line's links and images: `[text](target)`, `![alt](target)` and `<img src="target">`,
/// outside code spans.
fn link_targets(line: &str) -> Vec<String> {
    let line: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    let line = line.as_str();
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        out.push(after[..end].split_whitespace().next().unwrap_or_default().trim_matches(['<', '>']).to_string());
        rest = &after[end..];
    }
    for attr in ["src=\"", "href=\""] {
        let mut rest = line;
        while let Some(i) = rest.find(attr) {
            let after = &rest[i + attr.len()..];
            let end = after.find('"').unwrap_or(after.len());
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// The inline code spans of a line.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// The .gitignore patterns: paths that are made (models/smollm2-135m, runs/), not kept in the repository.
fn ignored(path: &str) -> bool {
    let gitignore = std::fs::read_to_string(root().join(".gitignore")).unwrap_or_default();
    gitignore.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).any(|pattern| {
        let pattern = pattern.trim_matches('/');
        if pattern.contains('/') {
            path == pattern || path.starts_with(&format!("{pattern}/"))
        } else if let Some(suffix) = pattern.strip_prefix('*') {
            path.split('/').any(|seg| seg.ends_with(suffix))
        } else {
            path.split('/').any(|seg| seg == pattern)
        }
    })
}

/// A code span that names a file or folder of the repository: a path under one of its top-level folders (not an
/// ignored one such as `runs/` or `target/`), with an extension or a trailing `/`, and no placeholder (`<job>`,
/// `*`, `…`).
fn repo_path(span: &str) -> Option<String> {
    let span = span.trim();
    if span.contains(char::is_whitespace)
        || span.contains(['<', '>', '*', '{', '$', '…', '=', '|', '@', '['])
        || span.contains("..")
    {
        return None;
    }
    let span = span.split('#').next().unwrap_or_default();
    // `file.rs:42` and `file.rs:fn_name` point into a file.
    let path = span.split(':').next().unwrap_or_default();
    let first = path.split('/').next().unwrap_or_default();
    let last = path.rsplit('/').next().unwrap_or_default();
    let file_like = path.ends_with('/') || (last.contains('.') && !last.starts_with('.'));
    let top_level = !first.is_empty() && !first.starts_with('.') && root().join(first).is_dir() && path.contains('/');
    (file_like && top_level && !ignored(first)).then(|| path.to_string())
}

#[test]
fn links_and_paths_in_the_docs_exist() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = read(&doc);
        let dir = Path::new(&doc).parent().unwrap_or(Path::new("")).to_path_buf();
        for (n, line) in prose(&text) {
            for target in link_targets(line) {
                if target.is_empty()
                    || target.starts_with('#')
                    || target.contains("://")
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                let file = target.split(['#', '?']).next().unwrap_or_default();
                let resolved = if let Some(abs) = file.strip_prefix('/') {
                    root().join(abs)
                } else {
                    root().join(&dir).join(file)
                };
                if !resolved.exists() {
                    broken.push(format!("{doc}:{n}: link `{target}` points at nothing"));
                }
            }
            for path in code_spans(line).into_iter().filter_map(repo_path) {
                if !root().join(&path).exists() && !ignored(&path) {
                    broken.push(format!("{doc}:{n}: path `{path}` does not exist"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{} broken links or paths:\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn the_link_checker_sees_links_and_paths() {
    assert_eq!(
        link_targets("see [a](docs/x.md#y) and ![d](img.svg \"t\") <img src=\"a.svg\">"),
        ["docs/x.md#y", "img.svg", "a.svg"]
    );
    assert!(link_targets("a rule `self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')`").is_empty(), "code is not a link");
    assert_eq!(repo_path("examples/jobs/fc-mnist.yaml"), Some("examples/jobs/fc-mnist.yaml".into()));
    assert_eq!(repo_path("crds/src/spec.rs:42"), Some("crds/src/spec.rs".into()));
    assert_eq!(repo_path("docs/"), Some("docs/".into()));
    assert_eq!(repo_path("runs/fc-mnist/summary.json"), None, "runs/ is not a folder of the repository");
    assert_eq!(repo_path("spec.model.vocabSize"), None);
    assert_eq!(repo_path("examples/jobs/<name>.yaml"), None);
    assert!(
        ignored("models/smollm2-135m/config.json") && ignored("runs/x/summary.json") && !ignored("crds/src/spec.rs")
    );
    assert_eq!(prose("a\n```\n[x](nowhere)\n```\nb").len(), 2);
}
