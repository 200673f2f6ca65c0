//! Checking a label selector the way the API server will, so a bad one is
//! caught before it is written into an admission binding (where the API
//! server would reject the whole binding and leave the kind unguarded).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::shown::Shown;

const MAX_NAME: usize = 63;
const MAX_SUBDOMAIN: usize = 253;

/// Checks keys, values and operators as apimachinery's
/// `ValidateLabelSelector` does. The error says what is wrong, for a person.
pub fn validate_label_selector(selector: &LabelSelector) -> Result<(), String> {
    let mut errors = Vec::new();
    for (key, value) in selector.match_labels.iter().flatten() {
        if let Err(e) = check_qualified_name(key) {
            errors.push(format!("matchLabels key {}: {e}", Shown(key)));
        }
        if let Err(e) = check_label_value(value) {
            errors.push(format!(
                "matchLabels[{}] value {}: {e}",
                Shown(key),
                Shown(value)
            ));
        }
    }
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("matchExpressions[{i}]");
        if let Err(e) = check_qualified_name(&req.key) {
            errors.push(format!("{at} key {}: {e}", Shown(&req.key)));
        }
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => errors.push(format!(
                "{at}: operator {} needs at least one value",
                req.operator
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                errors.push(format!("{at}: operator {} takes no values", req.operator))
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errors.push(format!(
                "{at}: operator {} is not one of In, NotIn, Exists, DoesNotExist",
                Shown(other)
            )),
        }
        for v in values {
            if let Err(e) = check_label_value(v) {
                errors.push(format!("{at} value {}: {e}", Shown(v)));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// `[prefix/]name`, prefix a DNS subdomain, name a label-style name.
fn check_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err("prefix before '/' is empty".into());
        }
        if !is_dns_subdomain(p) {
            return Err("prefix must be a lowercase DNS subdomain".into());
        }
    }
    if name.is_empty() {
        return Err("name part is empty".into());
    }
    if name.len() > MAX_NAME {
        return Err(format!("name part is longer than {MAX_NAME} characters"));
    }
    if !is_label_name(name) {
        return Err(
            "name part must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

fn check_label_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_NAME {
        return Err(format!("longer than {MAX_NAME} characters"));
    }
    if !value.is_empty() && !is_label_name(value) {
        return Err(
            "must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

fn is_label_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    edge_ok(bytes.first())
        && edge_ok(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// RFC 1123 subdomain: dot-separated lowercase labels, at most 253 characters.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_SUBDOMAIN
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            let edge_ok =
                |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            edge_ok(b.first())
                && edge_ok(b.last())
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// A selector in the API's query syntax (`kubectl get -l`, `labelSelector=`),
/// as kube writes it; an operator the API does not know is an error naming it.
pub fn query_string(s: &LabelSelector) -> Result<String, String> {
    // kube's error does not say which operator it did not know.
    if let Some(e) = s.match_expressions.iter().flatten().find(|e| {
        !matches!(
            e.operator.as_str(),
            "In" | "NotIn" | "Exists" | "DoesNotExist"
        )
    }) {
        return Err(format!("unknown operator {:?}", e.operator));
    }
    kube_core::Selector::try_from(s.clone())
        .map(|selector| selector.to_string())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            match_expressions: None,
        }
    }

    fn expr(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelector {
        LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: values.map(|vs| vs.iter().map(|v| v.to_string()).collect()),
            }]),
        }
    }

    #[test]
    fn selectors() {
        let long = "a".repeat(64);
        let cases: Vec<(&str, LabelSelector, bool)> = vec![
            ("empty", LabelSelector::default(), true),
            ("plain label", labels(&[("tier", "prod")]), true),
            (
                "prefixed key",
                labels(&[("crossplane.io/composite", "x")]),
                true,
            ),
            ("empty value", labels(&[("tier", "")]), true),
            (
                "upper-case prefix",
                labels(&[("Example.com/x", "y")]),
                false,
            ),
            ("empty prefix", labels(&[("/x", "y")]), false),
            ("empty key", labels(&[("", "y")]), false),
            ("bad value", labels(&[("tier", "a b")]), false),
            ("long value", labels(&[("tier", long.as_str())]), false),
            ("long key", labels(&[(long.as_str(), "x")]), false),
            (
                "In with values",
                expr("tier", "In", Some(&["a", "b"])),
                true,
            ),
            (
                "NotIn with values",
                expr("tier", "NotIn", Some(&["a"])),
                true,
            ),
            ("In without values", expr("tier", "In", None), false),
            ("In with empty values", expr("tier", "In", Some(&[])), false),
            (
                "Exists",
                expr("crossplane.io/composite", "Exists", None),
                true,
            ),
            (
                "Exists with empty list",
                expr("tier", "Exists", Some(&[])),
                true,
            ),
            (
                "Exists with values",
                expr("tier", "Exists", Some(&["a"])),
                false,
            ),
            (
                "DoesNotExist with values",
                expr("tier", "DoesNotExist", Some(&["a"])),
                false,
            ),
            ("bad operator", expr("tier", "Equals", Some(&["a"])), false),
            (
                "lower-case operator",
                expr("tier", "in", Some(&["a"])),
                false,
            ),
            (
                "bad expression value",
                expr("tier", "In", Some(&["-a"])),
                false,
            ),
        ];
        for (what, sel, ok) in cases {
            let got = validate_label_selector(&sel);
            assert_eq!(got.is_ok(), ok, "{what}: {got:?}");
        }
    }

    #[test]
    fn dns_subdomains() {
        let cases = [
            ("cascade-guard-xrd-inferenceclusters.modelplane.ai", true),
            ("a", true),
            ("a..b", false),
            ("-a", false),
            ("a-", false),
            ("A", false),
            ("a_b", false),
            ("", false),
        ];
        for (s, ok) in cases {
            assert_eq!(is_dns_subdomain(s), ok, "{s:?}");
        }
        assert!(is_dns_subdomain(&"a".repeat(63)));
        assert!(!is_dns_subdomain(&format!(
            "{}.{}",
            "a".repeat(200),
            "b".repeat(60)
        )));
    }

    #[test]
    fn query_strings_as_kubectl_reads_them() {
        let mut both = labels(&[("app", "web")]);
        both.match_expressions = expr("tier", "NotIn", Some(&["db", "cache"])).match_expressions;
        let cases = [
            (labels(&[("app", "web"), ("team", "a")]), "app=web,team=a"),
            (expr("tier", "In", Some(&["a", "b"])), "tier in (a,b)"),
            (expr("tier", "Exists", None), "tier"),
            (expr("tier", "DoesNotExist", None), "!tier"),
            (LabelSelector::default(), ""),
        ];
        for (selector, want) in cases {
            assert_eq!(query_string(&selector).as_deref(), Ok(want), "{selector:?}");
        }
        let got = query_string(&both).unwrap_or_default();
        assert!(
            got.contains("app=web") && got.contains("tier notin (cache,db)"),
            "{got}"
        );
        let bad = query_string(&expr("tier", "Near", Some(&["a"])));
        assert!(bad.as_ref().is_err_and(|e| e.contains("Near")), "{bad:?}");
    }
}
