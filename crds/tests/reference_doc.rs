//! The reference documents generated from the API types — `docs/reference/trainingjob.md` (every field of the
//! CRD's OpenAPI schema) and `docs/reference/status-reasons.md` (every condition reason, its cause and what to
//! do) — and the tests that hold the checked-in copies to them. `WS_UPDATE_DOCS=1` rewrites them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test stops at the line that failed

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use crds::conditions::Reason;
use kube::CustomResourceExt;
use serde_json::Value;

/// The one command that rewrites every generated reference document (this crate's, wsctl's and the chart's).
const UPDATE: &str = "WS_UPDATE_DOCS=1 cargo test --release --workspace --lib --bins --tests -- docs_reference";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Rewrites `rel` with `want` under `WS_UPDATE_DOCS`, then fails unless the checked-in file is `want`.
fn check_generated(rel: &str, want: &str) {
    let path = root().join(rel);
    if std::env::var_os("WS_UPDATE_DOCS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a file in a folder")).expect("create docs/reference");
        std::fs::write(&path, want).expect("write the reference document");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(have == want, "{rel} is out of date with the code: run `{UPDATE}` and commit the result");
}

fn header(title: &str, from: &str) -> String {
    format!("# {title}\n\n<!-- Generated from {from} by `{UPDATE}`; do not edit. -->\n\n")
}

// ---------------------------------------------------------------------------------------------------------------
// docs/reference/trainingjob.md

/// The CRD's `openAPIV3Schema`: the very schema the API server validates jobs against.
fn crd_schema() -> Value {
    let crd = serde_json::to_value(crds::TrainingJob::crd()).expect("the CRD serialises");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// What each enum value means, from the variants' doc comments: the CRD keeps only the values (Kubernetes wants a
/// plain `enum`), so they are read from the types' own JSON schema, keyed by the enum's list of values.
fn enum_meanings() -> BTreeMap<Vec<String>, Vec<(String, String)>> {
    let raw = serde_json::to_value(schemars::schema_for!(crds::TrainingJob)).expect("the schema serialises");
    let mut meanings = BTreeMap::new();
    for def in raw["$defs"].as_object().into_iter().flat_map(|d| d.values()) {
        let Some(variants) = def["oneOf"].as_array() else { continue };
        let named: Vec<(String, String)> = variants
            .iter()
            .filter_map(|v| {
                let value = v["const"].as_str().or_else(|| v["enum"].as_array()?.first()?.as_str())?;
                Some((value.to_string(), v["description"].as_str().unwrap_or_default().to_string()))
            })
            .collect();
        if named.len() == variants.len() {
            meanings.insert(named.iter().map(|(v, _)| v.clone()).collect(), named);
        }
    }
    meanings
}

/// The values the example jobs in `examples/jobs/` give each field, by dotted path, with the file each is in.
fn example_values() -> BTreeMap<String, Vec<(Value, String)>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("examples/jobs"))
        .expect("read examples/jobs")
        .map(|e| e.expect("list examples/jobs").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut found = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read an example job");
        let job: Value = serde_yaml::from_str(&text).expect("an example job is YAML");
        let name = format!("examples/jobs/{}", file.file_name().expect("a file name").to_string_lossy());
        let mut leaves = Vec::new();
        flatten("spec", &job["spec"], &mut leaves);
        for (path, value) in leaves {
            found.entry(path).or_insert_with(Vec::new).push((value, name.clone()));
        }
    }
    found
}

fn flatten(path: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, v)| flatten(&format!("{path}.{k}"), v, out)),
        Value::Null => {}
        _ => out.push((path.to_string(), v.clone())),
    }
}

/// A number as people write it: `192` rather than `192.0`.
fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e16 => format!("{}", f as i64),
        _ => v.to_string(),
    }
}

/// A JSON value inline in a document: strings bare, everything else as JSON.
fn inline(v: &Value) -> String {
    match v {
        Value::String(s) => format!("`{s}`"),
        Value::Number(_) => format!("`{}`", number(v)),
        _ => format!("`{v}`"),
    }
}

fn type_of(s: &Value) -> String {
    let ty = s["type"].as_str().unwrap_or("any");
    match (ty, s["items"]["type"].as_str()) {
        ("array", Some(item)) => format!("array of {item}"),
        _ if s.get("additionalProperties").is_some() => "map of string to quantity".to_string(),
        _ => ty.to_string(),
    }
}

/// The schema's bounds on a value: range, length, pattern, items.
fn bounds(s: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match (s.get("minimum"), s.get("maximum")) {
        (Some(lo), Some(hi)) => out.push(format!("{} to {}", number(lo), number(hi))),
        (Some(lo), None) => out.push(format!("at least {}", number(lo))),
        (None, Some(hi)) => out.push(format!("at most {}", number(hi))),
        (None, None) => {}
    }
    match (s.get("minLength"), s.get("maxLength")) {
        (Some(lo), Some(hi)) => out.push(format!("{} to {} characters", number(lo), number(hi))),
        (None, Some(hi)) => out.push(format!("at most {} characters", number(hi))),
        (Some(lo), None) => out.push(format!("at least {} characters", number(lo))),
        (None, None) => {}
    }
    if let Some(p) = s["pattern"].as_str() {
        out.push(format!("matches `{p}`"));
    }
    if let Some(n) = s.get("maxItems") {
        out.push(format!("at most {} items", number(n)));
    }
    if s["items"].is_object() && s["items"]["properties"].is_null() {
        out.extend(bounds(&s["items"]).into_iter().map(|b| format!("each item {b}")));
    }
    out
}

/// A Kubernetes type the schema inlines: documented by Kubernetes, so named here rather than walked.
fn kubernetes_type(s: &Value) -> Option<&'static str> {
    let props = s["properties"].as_object()?;
    let names: Vec<&str> = props.keys().map(String::as_str).collect();
    (names == ["claims", "limits", "requests"]).then_some(
        "a Kubernetes [ResourceRequirements](https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#resources) \
         (`requests`, `limits`, `claims`), as a container's `resources`",
    )
}

struct Walk {
    meanings: BTreeMap<Vec<String>, Vec<(String, String)>>,
    examples: BTreeMap<String, Vec<(Value, String)>>,
    out: String,
}

impl Walk {
    /// One object: its own section (description, cross-field rules, fields), then a section per object field.
    fn object(&mut self, path: &str, s: &Value) {
        let _ = writeln!(self.out, "## `{path}`\n");
        if let Some(d) = s["description"].as_str() {
            let _ = writeln!(self.out, "{}\n", d.trim());
        }
        self.rules(s);
        let required: Vec<&str> = s["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let props = s["properties"].as_object().cloned().unwrap_or_default();
        let mut nested = Vec::new();
        for (name, field) in &props {
            let field_path = format!("{path}.{name}");
            self.field(&field_path, field, required.contains(&name.as_str()));
            if field["properties"].is_object() && kubernetes_type(field).is_none() {
                nested.push((field_path, field.clone()));
            } else if field["items"]["properties"].is_object() {
                nested.push((format!("{field_path}[]"), field["items"].clone()));
            }
        }
        for (p, f) in nested {
            self.object(&p, &f);
        }
    }

    /// A value an example job gives the field, other than its default: the first such, in file order.
    fn example(&self, path: &str, default: Option<&Value>) -> Option<&(Value, String)> {
        let differs = |v: &Value| default.is_none_or(|d| d != v && number(d) != number(v));
        self.examples.get(path)?.iter().find(|(v, _)| differs(v))
    }

    fn rules(&mut self, s: &Value) {
        let rules = s["x-kubernetes-validations"].as_array().cloned().unwrap_or_default();
        if rules.is_empty() {
            return;
        }
        let _ = writeln!(self.out, "Rules the API server checks across these fields:\n");
        for r in rules {
            let rule = r["rule"].as_str().unwrap_or_default().split_whitespace().collect::<Vec<_>>().join(" ");
            let _ = writeln!(self.out, "- {} (`{rule}`)", r["message"].as_str().unwrap_or(""));
        }
        self.out.push('\n');
    }

    fn field(&mut self, path: &str, s: &Value, required: bool) {
        let _ = writeln!(self.out, "### `{path}`\n");
        let mut facts = vec![format!("**Type:** {}", type_of(s))];
        if required {
            facts.push("**Required**".into());
        } else if s["nullable"].as_bool() == Some(true) {
            facts.push("**Optional** (unset by default)".into());
        }
        if let Some(d) = s.get("default").filter(|d| !d.is_object()) {
            facts.push(format!("**Default:** {}", inline(d)));
        }
        let values: Vec<String> =
            s["enum"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect();
        if !values.is_empty() {
            facts.push(format!(
                "**One of:** {}",
                values.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", ")
            ));
        }
        let b = bounds(s);
        if !b.is_empty() {
            facts.push(format!("**Bounds:** {}", b.join("; ")));
        }
        if let Some(e) = s.get("example").or_else(|| s["examples"].get(0)) {
            facts.push(format!("**Example:** {}", inline(e)));
        } else if let Some((e, file)) = self.example(path, s.get("default")) {
            facts.push(format!("**Example:** {} ([{file}](../../{file}))", inline(e)));
        }
        let _ = writeln!(self.out, "{}\n", facts.join(" · "));
        if let Some(d) = s["description"].as_str() {
            let _ = writeln!(self.out, "{}\n", d.trim());
        }
        if let Some(k) = kubernetes_type(s) {
            let _ = writeln!(self.out, "Its value is {k}.\n");
        } else if s["properties"].is_object() {
            let _ =
                writeln!(self.out, "Its fields are in [`{path}`](#{}) below.\n", path.replace('.', "").to_lowercase());
            return;
        } else if s["items"]["properties"].is_object() {
            let _ = writeln!(
                self.out,
                "Its items' fields are in [`{path}[]`](#{}) below.\n",
                path.replace('.', "").to_lowercase()
            );
            return;
        }
        if path.ends_with("conditions[].reason") {
            let _ = writeln!(
                self.out,
                "The reasons, their causes and what to do are in [status-reasons.md](status-reasons.md).\n"
            );
        }
        if let Some(meanings) = self.meanings.get(&values) {
            let _ = writeln!(self.out, "| Value | Meaning |\n| --- | --- |");
            for (v, m) in meanings {
                let _ = writeln!(self.out, "| `{v}` | {} |", m.replace('\n', " "));
            }
            self.out.push('\n');
        }
        self.rules(s);
    }
}

fn trainingjob_reference() -> String {
    let schema = crd_schema();
    let mut walk = Walk { meanings: enum_meanings(), examples: example_values(), out: String::new() };
    walk.out = header("TrainingJob reference", "the API types in crds/src");
    walk.out.push_str(
        "A `TrainingJob` (`apiVersion: weightstream.dev/v1beta1`, short name `tj`) is namespaced. \
         `weightstream.dev/v1alpha1` is still served, deprecated, with the same fields: the API server converts \
         between the two by the `apiVersion` alone. This page lists \
         every field of its `spec`, then of the `status` the operator writes, as the CRD's OpenAPI schema has them: \
         the API server checks each type, bound and rule below when a job is applied. Examples are from the jobs \
         in [examples/jobs](../../examples/jobs); what the status reasons mean is in \
         [status-reasons.md](status-reasons.md).\n\n",
    );
    walk.rules(&schema);
    walk.object("spec", &schema["properties"]["spec"]);
    walk.object("status", &schema["properties"]["status"]);
    while walk.out.ends_with("\n\n") {
        walk.out.pop();
    }
    walk.out
}

#[test]
fn docs_reference_trainingjob_matches_the_types() {
    check_generated("docs/reference/trainingjob.md", &trainingjob_reference());
}

#[test]
fn every_spec_field_has_a_description() {
    fn walk(path: &str, s: &Value, missing: &mut Vec<String>) {
        for (name, field) in s["properties"].as_object().into_iter().flatten() {
            let p = format!("{path}.{name}");
            if field["description"].as_str().is_none_or(|d| d.trim().is_empty()) {
                missing.push(p.clone());
            }
            if kubernetes_type(field).is_none() {
                walk(&p, field, missing);
            }
        }
    }
    let mut missing = Vec::new();
    walk("spec", &crd_schema()["properties"]["spec"], &mut missing);
    assert!(
        missing.is_empty(),
        "these spec fields have no doc comment, so the reference cannot say what they do: {missing:?}"
    );
}

#[test]
fn every_enum_value_has_a_meaning() {
    let meanings = enum_meanings();
    for (values, named) in &meanings {
        for (v, m) in named {
            assert!(!m.trim().is_empty(), "enum value `{v}` (of {values:?}) has no doc comment");
        }
    }
    fn enums(s: &Value, out: &mut Vec<Vec<String>>) {
        if let Some(values) = s["enum"].as_array() {
            out.push(values.iter().filter_map(|v| v.as_str().map(String::from)).collect());
        }
        s["properties"].as_object().into_iter().flatten().for_each(|(_, f)| enums(f, out));
        if s["items"].is_object() {
            enums(&s["items"], out);
        }
    }
    let mut found = Vec::new();
    enums(&crd_schema()["properties"]["spec"], &mut found);
    assert!(found.len() >= 8, "the spec has its enums: {found:?}");
    for values in found {
        assert!(meanings.contains_key(&values), "the reference cannot say what the values {values:?} mean");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// docs/reference/status-reasons.md

fn status_reasons_reference() -> String {
    let mut out = header("Status reasons", "`crds::conditions::Reason`");
    out.push_str(
        "A job's `status.conditions` (`Admitted`, `Ready`, `Suspended`, `Complete`, `Failed`) and the Events the \
         operator records each carry one of these reasons; the condition's message gives the particulars. \
         `wsctl get JOB` and `kubectl describe tj JOB` show them. Fields named `spec.…` are in \
         [trainingjob.md](trainingjob.md).\n\n\
         | Reason | Cause | What to do |\n| --- | --- | --- |\n",
    );
    for r in Reason::ALL {
        let _ = writeln!(out, "| `{}` | {} | {} |", r.as_str(), r.cause(), r.remedy());
    }
    out
}

#[test]
fn docs_reference_status_reasons_match_the_reasons() {
    check_generated("docs/reference/status-reasons.md", &status_reasons_reference());
}
