//! `cascade-guard trace <resource> <name>`: follows a deletion tree in any
//! cluster until everything in it is gone, showing what is left, what state
//! each object is in and what holds it. The tree comes from Crossplane's own
//! record of composed resources (`spec.crossplane.resourceRefs`, or
//! `spec.resourceRefs` for legacy XRs); Usages that name an object are shown
//! beside it. [`view`] is the pure part, [`picture`] its drawing (`-o dot`,
//! `-o mermaid`); this module reads the cluster.

pub mod command;
pub mod picture;
pub mod view;

use std::io::Write;
use std::time::{Duration, Instant};

use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::cluster::kinds::{LookupError, ServedKinds};
use crate::policy::composed_resources;
use crate::policy::sibling::holds_record::HoldEntry;
use crate::policy::sibling::object::ObjectRef;
use view::{Key, Phase, Seen, Summary, Trace};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Lookup(#[from] LookupError),
    #[error("cannot write output: {0}")]
    Output(#[source] std::io::Error),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// A live tree on a terminal, change lines otherwise.
    Text,
    /// One JSON object per change, then the summary.
    Json,
    /// One YAML document per change, then the summary (a stream a YAML
    /// reader takes document by document as it comes).
    Yaml,
    /// One Graphviz picture at the end, nothing before it.
    Dot,
    /// One Mermaid picture at the end, nothing before it.
    Mermaid,
}

impl Output {
    /// Drawn once at the end: stdout holds nothing but the picture.
    fn picture(self) -> bool {
        matches!(self, Output::Dot | Output::Mermaid)
    }
}

pub struct Options {
    pub resource: String,
    pub name: String,
    pub namespace: Option<String>,
    pub output: Output,
    pub interval: Duration,
    /// Give up (and summarize) after this long; None: until done or interrupted.
    pub timeout: Option<Duration>,
    /// Redraw the tree in place (stdout is a terminal).
    pub live: bool,
    /// Stop after one look at the whole tree: the teardown as it stands now.
    pub once: bool,
    /// The controller's Lease (its `--leader-election-id`), looked for in
    /// every namespace: where the record of what sibling order holds is,
    /// which a picture shows.
    pub leader_election_id: String,
}

/// Follows the tree until it is done, printing to `out`; returns the summary.
pub async fn trace(
    client: &Client,
    options: &Options,
    out: &mut impl Write,
) -> Result<Summary, TraceError> {
    let kinds = ServedKinds::discover(client)
        .await
        .map_err(LookupError::Discovery)?;
    let (resource, namespaced) = kinds
        .lookup(client, &options.resource)
        .await
        .cloned()
        .ok_or_else(|| LookupError::UnknownResource(options.resource.clone()))?;
    let namespace = namespaced.then(|| {
        options
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into())
    });
    let root = Key {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        namespace: namespace.clone(),
        name: options.name.clone(),
    };
    let first = read(client, &kinds, &root, &[]).await;
    if first.state == Phase::Gone {
        return Err(LookupError::NotFound {
            resource: options.resource.clone(),
            name: options.name.clone(),
            namespace,
        }
        .into());
    }
    let mut trace = Trace::new(root.clone());
    let start = Instant::now();
    let mut drawn_lines = 0;
    emit(
        &mut trace,
        &root,
        first,
        0.0,
        &start,
        options,
        out,
        &mut drawn_lines,
    )?;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        if trace.pending().is_empty()
            || options.timeout.is_some_and(|t| start.elapsed() > t)
            || (options.once && !trace.unread())
        {
            break;
        }
        // Once: look again at once, until every object found has been read.
        if !options.once {
            tokio::select! {
                _ = tokio::time::sleep(options.interval) => {}
                _ = &mut interrupted => break,
            }
        }
        let usages = usages(client, &kinds).await;
        // One time for the whole look: what it finds gone went within it.
        let at = start.elapsed().as_secs_f64();
        for key in trace.pending() {
            let seen = read(client, &kinds, &key, &usages).await;
            emit(
                &mut trace,
                &key,
                seen,
                at,
                &start,
                options,
                out,
                &mut drawn_lines,
            )?;
        }
        if options.live && options.output == Output::Text {
            redraw(&trace, &start, out, &mut drawn_lines)?;
        }
    }
    let summary = trace.summary(start.elapsed());
    match options.output {
        Output::Dot | Output::Mermaid => {
            let holds = holds(client, &options.leader_election_id).await;
            let drawn = picture::of(&trace, summary.seconds, &holds);
            let text = if options.output == Output::Dot {
                crate::cli::plan::dot::dot(&drawn)
            } else {
                crate::cli::plan::mermaid::mermaid(&drawn)
            };
            write!(out, "{text}")
        }
        Output::Json => writeln!(out, "{}", json!({ "summary": summary })),
        Output::Yaml => write!(out, "{}", yaml_document(&json!({ "summary": summary }))),
        Output::Text => {
            if options.live {
                redraw(&trace, &start, out, &mut drawn_lines)?;
            }
            write!(out, "\n{}", summary.render())
        }
    }
    .map_err(TraceError::Output)?;
    Ok(summary)
}

#[allow(clippy::too_many_arguments)]
fn emit(
    trace: &mut Trace,
    key: &Key,
    seen: Seen,
    at: f64,
    start: &Instant,
    options: &Options,
    out: &mut impl Write,
    drawn_lines: &mut usize,
) -> Result<(), TraceError> {
    let changes = trace.observe(key, seen, at);
    if options.output.picture() {
        return Ok(());
    }
    if options.live && options.output == Output::Text {
        if !changes.is_empty() {
            redraw(trace, start, out, drawn_lines)?;
        }
        return Ok(());
    }
    for c in changes {
        let line = match options.output {
            Output::Json => format!("{}\n", json!(c)),
            Output::Yaml => yaml_document(&json!(c)),
            // (A picture prints no change: it returned above.)
            Output::Text | Output::Dot | Output::Mermaid => {
                format!("[{:>6.1}s] {}: {}\n", c.at, c.object, c.what)
            }
        };
        write!(out, "{line}").map_err(TraceError::Output)?;
    }
    out.flush().map_err(TraceError::Output)
}

/// One document of a YAML stream (`---` first, so that each change can be
/// read as soon as it is written).
fn yaml_document(value: &Value) -> String {
    format!(
        "---\n{}",
        serde_yaml::to_string(value).unwrap_or_else(|e| format!("# cannot write as YAML: {e}\n"))
    )
}

/// Redraws the tree in place: up over the previous drawing, clear, draw.
fn redraw(
    trace: &Trace,
    start: &Instant,
    out: &mut impl Write,
    drawn_lines: &mut usize,
) -> Result<(), TraceError> {
    let text = trace.render(start.elapsed());
    if *drawn_lines > 0 {
        write!(out, "\x1b[{}F\x1b[J", *drawn_lines).map_err(TraceError::Output)?;
    }
    write!(out, "{text}").map_err(TraceError::Output)?;
    *drawn_lines = text.lines().count();
    out.flush().map_err(TraceError::Output)
}

/// Reads one object: its state, its composed resources, the Usages on it.
async fn read(client: &Client, kinds: &ServedKinds, key: &Key, usages: &[Usage]) -> Seen {
    let unknown = |reason: String| Seen {
        state: Phase::Unknown { reason },
        children: Vec::new(),
        used_by: Vec::new(),
    };
    let Some((resource, namespaced)) = kinds.get(&key.api_version, &key.kind) else {
        return unknown(format!("{} {} is not served", key.api_version, key.kind));
    };
    let api = ServedKinds::api(
        client,
        &(resource.clone(), *namespaced),
        key.namespace.as_deref(),
    );
    let object = match api.get_opt(&key.name).await {
        Ok(Some(o)) => o,
        Ok(None) => {
            return Seen {
                state: Phase::Gone,
                children: Vec::new(),
                used_by: Vec::new(),
            };
        }
        Err(e) => return unknown(e.to_string()),
    };
    let state = if object.metadata.deletion_timestamp.is_some() {
        Phase::Deleting {
            finalizers: object.finalizers().to_vec(),
        }
    } else {
        Phase::Live
    };
    let children = composed(&object, key);
    let used_by = usages
        .iter()
        .filter(|u| {
            u.of_kind == key.kind
                && u.of_name == key.name
                && (u.namespace.is_none() || u.namespace == key.namespace)
        })
        .map(|u| u.describe())
        .collect();
    Seen {
        state,
        children,
        used_by,
    }
}

/// What sibling order holds now, from its record in the namespace of the
/// controller's Lease (the live one, else the last). None when no
/// controller was ever installed, or either cannot be read: the picture then
/// shows no hold, which is all a trace without them can say.
async fn holds(client: &Client, lease_id: &str) -> Vec<(ObjectRef, HoldEntry)> {
    let Ok(found) = crate::cluster::running::find(client, lease_id).await else {
        return Vec::new();
    };
    let Some(running) = found.first() else {
        return Vec::new();
    };
    crate::cluster::holds::read(client, &running.namespace)
        .await
        .unwrap_or_default()
}

/// The composed resources Crossplane recorded on an XR.
fn composed(object: &DynamicObject, key: &Key) -> Vec<Key> {
    composed_resources(&object.data, key.namespace.as_deref())
        .resources
        .into_iter()
        .map(|r| Key {
            api_version: r.api_version,
            kind: r.kind,
            namespace: r.namespace,
            name: r.name,
        })
        .collect()
}

/// A Usage or ClusterUsage, as far as trace shows it.
struct Usage {
    kind: &'static str,
    name: String,
    namespace: Option<String>,
    of_kind: String,
    of_name: String,
    by: Option<String>,
    reason: Option<String>,
}

impl Usage {
    fn describe(&self) -> String {
        let what = match (&self.by, &self.reason) {
            (Some(by), _) => format!("in use by {by}"),
            (None, Some(reason)) => format!("in use: {reason}"),
            (None, None) => "in use".to_string(),
        };
        format!("{} {}: {what}", self.kind, self.name)
    }
}

/// Crossplane's Usages and ClusterUsages, when the cluster serves them.
async fn usages(client: &Client, kinds: &ServedKinds) -> Vec<Usage> {
    let mut found = Vec::new();
    for (kind, cluster) in [("Usage", false), ("ClusterUsage", true)] {
        let Some((resource, _)) = kinds.of_kind(Some("protection.crossplane.io"), kind).next()
        else {
            continue;
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        let Ok(list) = api.list(&ListParams::default()).await else {
            continue;
        };
        for u in list.items {
            let spec = &u.data["spec"];
            let (Some(of_kind), Some(of_name)) = (
                spec.pointer("/of/kind").and_then(Value::as_str),
                spec.pointer("/of/resourceRef/name").and_then(Value::as_str),
            ) else {
                continue;
            };
            let by = match (
                spec.pointer("/by/kind").and_then(Value::as_str),
                spec.pointer("/by/resourceRef/name").and_then(Value::as_str),
            ) {
                (Some(k), Some(n)) => Some(format!("{k}/{n}")),
                (Some(k), None) => Some(k.to_string()),
                _ => None,
            };
            found.push(Usage {
                kind,
                name: u.name_any(),
                namespace: if cluster { None } else { u.namespace() },
                of_kind: of_kind.to_string(),
                of_name: of_name.to_string(),
                by,
                reason: spec["reason"].as_str().map(str::to_string),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_output_is_a_stream_read_back_document_by_document() {
        let changes = [
            json!({"at": 0.5, "object": "XR/a", "what": "deleting"}),
            json!({"at": 1.0, "object": "XR/a", "what": "gone: it's done"}),
        ];
        let stream: String = changes.iter().map(yaml_document).collect();
        let read = crate::policy::split_yaml_documents(&stream).expect("YAML");
        assert_eq!(read, changes);
    }
}
