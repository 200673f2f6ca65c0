//! YAML streams in and out: the documents of a file or of `kubectl get -o
//! yaml` output as objects, and objects written back as one stream with
//! every string quoted (so that `Off` stays a mode, not a boolean).

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("YAML document {index} (counting from 0) cannot be parsed: {source}")]
    Parse {
        index: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error(
        "YAML document {index} (counting from 0) is a {found}, not a mapping; every document must be one Kubernetes object"
    )]
    NotAMapping { index: usize, found: &'static str },
}

/// Splits a multi-document YAML stream into objects. Empty documents are
/// skipped; a document that is not a mapping is an error naming its index,
/// since silently skipping it could skip a policy.
pub fn split_yaml_documents(text: &str) -> Result<Vec<Value>, YamlError> {
    Ok(split_yaml_stream(text)?
        .into_iter()
        .map(|(_, doc)| doc)
        .collect())
}

/// [`split_yaml_documents`], each object with its index in the stream
/// (counting from 0, empty documents included), as an editor finds it.
pub fn split_yaml_stream(text: &str) -> Result<Vec<(usize, Value)>, YamlError> {
    let mut docs = Vec::new();
    for (index, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(de)
            .map_err(|source| YamlError::Parse { index, source })?;
        let found = match &value {
            serde_yaml::Value::Null => continue,
            serde_yaml::Value::Mapping(_) => None,
            serde_yaml::Value::Bool(_) => Some("boolean"),
            serde_yaml::Value::Number(_) => Some("number"),
            serde_yaml::Value::String(_) => Some("string"),
            serde_yaml::Value::Sequence(_) => Some("list"),
            serde_yaml::Value::Tagged(_) => Some("tagged value"),
        };
        if let Some(found) = found {
            return Err(YamlError::NotAMapping { index, found });
        }
        let json = serde_json::to_value(value).map_err(|e| YamlError::Parse {
            index,
            source: serde::de::Error::custom(e),
        })?;
        docs.push((index, json));
    }
    Ok(docs)
}

/// Writes objects as a YAML stream that every YAML reader reads back the
/// same. Needed because serde_yaml writes YAML 1.2, where `Off` is a plain
/// string, but kubectl's reader is YAML 1.1 and takes an unquoted `Off` (the
/// mode, and the CRD's enum) for the boolean false. Every string value is
/// therefore double-quoted, and keys are quoted unless plainly safe.
pub fn to_yaml_stream(docs: &[Value]) -> String {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        match doc {
            Value::Object(map) if !map.is_empty() => write_mapping(map, 0, &mut out),
            Value::Array(items) if !items.is_empty() => write_sequence(items, 0, &mut out),
            scalar => {
                out.push_str(&yaml_scalar(scalar));
                out.push('\n');
            }
        }
    }
    out
}

fn write_mapping(map: &serde_json::Map<String, Value>, indent: usize, out: &mut String) {
    for (key, value) in map {
        out.push_str(&" ".repeat(indent));
        out.push_str(&yaml_key(key));
        out.push(':');
        match value {
            Value::Object(m) if !m.is_empty() => {
                out.push('\n');
                write_mapping(m, indent + 2, out);
            }
            Value::Array(items) if !items.is_empty() => {
                out.push('\n');
                write_sequence(items, indent, out);
            }
            scalar => {
                out.push(' ');
                out.push_str(&yaml_scalar(scalar));
                out.push('\n');
            }
        }
    }
}

fn write_sequence(items: &[Value], indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    for item in items {
        match item {
            Value::Object(m) if !m.is_empty() => {
                // Write the mapping two deeper, then put the dash in the
                // first line's indentation.
                let mut nested = String::new();
                write_mapping(m, indent + 2, &mut nested);
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(&nested[indent + 2..]);
            }
            Value::Array(inner) if !inner.is_empty() => {
                out.push_str(&pad);
                out.push_str("-\n");
                write_sequence(inner, indent + 2, out);
            }
            scalar => {
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(&yaml_scalar(scalar));
                out.push('\n');
            }
        }
    }
}

fn yaml_scalar(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => yaml_quoted(s),
        Value::Array(_) => "[]".to_string(),
        Value::Object(_) => "{}".to_string(),
    }
}

/// Plain only when no YAML version could read the key as anything but this
/// string.
fn yaml_key(key: &str) -> String {
    const SPECIAL: [&str; 11] = [
        "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", "<<",
    ];
    let plain = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && !SPECIAL.iter().any(|w| w.eq_ignore_ascii_case(key));
    if plain {
        key.to_string()
    } else {
        yaml_quoted(key)
    }
}

/// A YAML double-quoted scalar. Besides the usual escapes, the characters
/// YAML 1.1 treats as line breaks (NEL, U+2028, U+2029) and the byte-order
/// mark are escaped, so no reader folds or drops them.
fn yaml_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20
                || c == '\u{7f}'
                || c == '\u{85}'
                || c == '\u{2028}'
                || c == '\u{2029}'
                || c == '\u{feff}' =>
            {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_splitting() {
        let ok = "---\napiVersion: v1\nkind: A\n---\n\n---\n# just a comment\n---\napiVersion: v1\nkind: B\n";
        let docs = split_yaml_documents(ok).unwrap();
        assert_eq!(
            docs.iter()
                .map(|d| d["kind"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["A", "B"]
        );

        // Off stays a string (YAML 1.2), as annotations need.
        let off = split_yaml_documents("metadata:\n  annotations:\n    x: Off\n").unwrap();
        assert_eq!(off[0]["metadata"]["annotations"]["x"], "Off");

        let cases: &[(&str, &str)] = &[
            (
                "kind: A\n---\n- a\n- b\n",
                "document 1 (counting from 0) is a list",
            ),
            (
                "just a string\n",
                "document 0 (counting from 0) is a string",
            ),
            (
                "kind: A\n---\nkind: [unclosed\n",
                "document 1 (counting from 0) cannot be parsed",
            ),
            (
                "? [a, b]\n: list as key\n",
                "document 0 (counting from 0) cannot be parsed",
            ),
        ];
        for (text, want) in cases {
            let err = split_yaml_documents(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
