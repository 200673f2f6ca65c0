//! Failing closed (pure): the delete of a root of a Refuse or Convert tree
//! goes through only once cascade-guard has ordered that tree.
//!
//! Sibling order keeps its holds only in trees it has read. A tree composed
//! while the controller was down, one read before its last change, or one
//! whose holds the controller may not make (RBAC) would be torn down in no
//! order by a delete that Refuse lets through (`--cascade=foreground`) or that
//! Convert converts: the seed's failure. So the controller writes, for every
//! root it reads, how its tree stands ([`TreeOrder`]) into one record of
//! its own namespace ([`ORDERED_TREES`]), and the ValidatingAdmissionPolicies
//! of [`compile_gate`] read it as their parameter: a delete of a root with
//! something to cascade is refused, with the reason, unless the record
//! says its tree was ordered at the root's present generation.
//!
//! What is never refused by the gate: a delete of an object with a
//! controller (the garbage collector's, within a cascade that already went
//! through), of an object already being deleted, of a composite or claim with
//! nothing to cascade, cascade-guard's own (the Convert re-issue), and
//! break-glass.
//!
//! The record is the gate's parameter with `parameterNotFoundAction:
//! Deny`: without it nothing says which trees are ordered, and every delete
//! of a gated kind is refused (the controller writes it before the policy).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, ValidatingAdmissionPolicy, ValidatingAdmissionPolicySpec,
    Validation,
};

use crate::admission::Compiled;
use crate::cel::{break_glass_for, cel_string_literal, inline_variables, var};
use crate::kind::Shape;
use crate::names::BREAK_GLASS_ANNOTATION;
use crate::settings::CompileSettings;
use crate::sibling::hold_policy::{
    HOLD_OBJECT_NAME, MATCH_POLICY, delete_rule, reading_record, record_param,
    sibling_order_metadata,
};

/// The ConfigMap, in the controller's namespace, that says how each root's
/// tree stands: its uid to a [`TreeOrder`] value.
pub const ORDERED_TREES: &str = "cascade-guard-ordered-trees";
/// What a ConfigMap may hold (1 MiB), less room for its metadata: past it,
/// roots are left out of it, and their deletes refused.
pub const ORDERED_TREES_MAX_BYTES: usize = 900 * 1024;

/// The record's key under which every ordered tree is kept, all in one
/// string: ` uid=generation uid=generation ... ` (a space on each side of
/// each). The API server turns the whole ConfigMap into a CEL value at
/// every evaluation of the gate, before any match condition, for every
/// DELETE of a gated kind, the garbage collector's included, at a cost per
/// map entry: one string costs as little as one entry. Trees that are not ordered keep an entry of their own,
/// their uid to the reason.
pub const ORDERED_KEY: &str = "ordered";

/// The record's data for these marks (a root's uid to its [`TreeOrder`]
/// value).
pub fn encode_marks(marks: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut ordered = String::from(" ");
    let mut data = BTreeMap::new();
    for (uid, value) in marks {
        match TreeOrder::parse(value) {
            TreeOrder::Ordered { generation } => {
                ordered.push_str(&format!("{uid}={generation} "));
            }
            TreeOrder::Unordered { .. } => {
                data.insert(uid.clone(), value.clone());
            }
        }
    }
    data.insert(ORDERED_KEY.to_string(), ordered);
    data
}

/// The marks a record's data holds: what [`encode_marks`] was given.
pub fn decode_marks(data: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut marks: BTreeMap<String, String> = data
        .iter()
        .filter(|(k, _)| k.as_str() != ORDERED_KEY)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for pair in data
        .get(ORDERED_KEY)
        .map(String::as_str)
        .unwrap_or_default()
        .split(' ')
    {
        if let Some((uid, generation)) = pair.split_once('=') {
            marks.insert(uid.to_string(), generation.to_string());
        }
    }
    marks
}

/// How one root's tree stands, as the controller last read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeOrder {
    /// Read whole at this generation of the root, every hold the order needs
    /// in place.
    Ordered { generation: i64 },
    /// Read, and not ordered: why, in words.
    Unordered { reason: String },
}

impl TreeOrder {
    /// The record's value: the generation's digits, or the reason (which
    /// never reads as digits alone).
    pub fn value(&self) -> String {
        match self {
            TreeOrder::Ordered { generation } => generation.to_string(),
            TreeOrder::Unordered { reason } if reason.chars().all(|c| c.is_ascii_digit()) => {
                format!("not ordered: {reason}")
            }
            TreeOrder::Unordered { reason } => reason.clone(),
        }
    }

    pub fn parse(value: &str) -> Self {
        match value.parse::<i64>() {
            Ok(generation) if value.chars().all(|c| c.is_ascii_digit()) => {
                TreeOrder::Ordered { generation }
            }
            _ => TreeOrder::Unordered {
                reason: value.to_string(),
            },
        }
    }
}

/// Whether a delete of a root now would be ordered, from the record's
/// value for it (`None`: absent) and the root's generation: what the gate
/// decides, in words, for `plan` and `status`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "state", content = "reason")]
pub enum GateState {
    Ordered,
    /// The controller has not read this tree (down, new, or behind).
    NotRead,
    /// Read at another generation: the root changed since.
    Changed,
    /// Read, and it cannot be ordered: why.
    CannotOrder(String),
}

impl GateState {
    pub fn of(value: Option<&str>, generation: i64) -> Self {
        match value.map(TreeOrder::parse) {
            None => GateState::NotRead,
            Some(TreeOrder::Ordered { generation: g }) if g == generation => GateState::Ordered,
            Some(TreeOrder::Ordered { .. }) => GateState::Changed,
            Some(TreeOrder::Unordered { reason }) => GateState::CannotOrder(reason),
        }
    }
}

impl std::fmt::Display for GateState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GateState::Ordered => f.write_str("ordered: the controller read the tree whole since its last change and holds what the order needs"),
            GateState::NotRead => f.write_str("the controller has not read this tree (it is down, new, or still reading)"),
            GateState::Changed => f.write_str("the tree changed since the controller last read it"),
            GateState::CannotOrder(reason) => write!(f, "the controller cannot order this tree: {reason}"),
        }
    }
}

/// A kind whose roots the gate guards.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GatedKind {
    pub group: String,
    pub plural: String,
    pub shape: Shape,
}

/// The name of the gate's policy and binding for one shape.
pub fn gate_name(shape: Shape) -> String {
    let suffix = match shape {
        Shape::CompositeResource => "composites",
        Shape::Claim => "claims",
        Shape::Other => "others",
    };
    format!("{HOLD_OBJECT_NAME}-roots-{suffix}")
}

/// The names of every gate object cascade-guard may have written, for
/// removing them.
pub fn gate_names() -> Vec<String> {
    [Shape::CompositeResource, Shape::Claim, Shape::Other]
        .into_iter()
        .map(gate_name)
        .collect()
}

/// A policy and binding per shape among `kinds` (the expressions of one shape
/// read fields the others do not have), reading [`ORDERED_TREES`] in
/// `namespace`.
pub fn compile_gate(
    kinds: &[GatedKind],
    settings: &CompileSettings,
    namespace: &str,
) -> Vec<Compiled> {
    let mut by_shape: BTreeMap<Shape, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    for k in kinds {
        by_shape
            .entry(k.shape)
            .or_default()
            .entry(k.group.as_str())
            .or_default()
            .push(k.plural.as_str());
    }
    by_shape
        .into_iter()
        .map(|(shape, groups)| compile_one(shape, &groups, settings, namespace))
        .collect()
}

fn compile_one(
    shape: Shape,
    groups: &BTreeMap<&str, Vec<&str>>,
    settings: &CompileSettings,
    namespace: &str,
) -> Compiled {
    let name = gate_name(shape);
    let rules = groups
        .iter()
        .map(|(group, plurals)| {
            let mut resources: Vec<String> = plurals.iter().map(|p| p.to_string()).collect();
            resources.sort();
            resources.dedup();
            delete_rule(group, resources)
        })
        .collect();
    let mut conditions = vec![
        condition(
            "a-root",
            "!oldObject.metadata.?ownerReferences.orValue([]).exists(r, r.?controller.orValue(false))",
        ),
        condition(
            "not-deleting-already",
            "!has(oldObject.metadata.deletionTimestamp)",
        ),
        condition(
            "not-cascade-guard",
            &format!(
                "request.userInfo.?username.orValue('') != {}",
                cel_string_literal(&settings.controller_user)
            ),
        ),
    ];
    match shape {
        Shape::CompositeResource => conditions.push(condition(
            "something-to-cascade",
            "(has(oldObject.spec) && has(oldObject.spec.crossplane) && has(oldObject.spec.crossplane.resourceRefs) && size(oldObject.spec.crossplane.resourceRefs) > 0) || (has(oldObject.spec) && has(oldObject.spec.resourceRefs) && size(oldObject.spec.resourceRefs) > 0)",
        )),
        Shape::Claim => conditions.push(condition(
            "something-to-cascade",
            "has(oldObject.spec) && has(oldObject.spec.resourceRef)",
        )),
        Shape::Other => {}
    }
    let variables = vec![
        var("uid", "oldObject.metadata.uid"),
        var(
            "generation",
            "string(oldObject.metadata.?generation.orValue(0))",
        ),
        var(
            "ordered",
            &format!(
                "has(params.data) && '{ORDERED_KEY}' in params.data ? params.data['{ORDERED_KEY}'] : ''"
            ),
        ),
        // Why the tree is not ordered, when the controller said.
        var(
            "reason",
            "has(params.data) && variables.uid in params.data ? params.data[variables.uid] : ''",
        ),
        var(
            "target",
            "request.resource.resource + (request.resource.group == '' ? '' : '.' + request.resource.group) + ' ' + oldObject.metadata.name + (request.?namespace.orValue('') == '' ? '' : ' -n ' + request.namespace)",
        ),
    ];
    let why = "(variables.reason != '' ? 'cascade-guard cannot order its tree: ' + variables.reason : variables.ordered.contains(' ' + variables.uid + '=') ? 'its tree changed since cascade-guard last read it (it reads it again within seconds while it runs)' : 'cascade-guard has not read its tree yet (its controller is down, new, or still reading: cascade-guard status)')";
    // Written out, no `spec.variables` (see `inline_variables`).
    let written = |e: &str| inline_variables(e, &variables);
    let validation = Validation {
        expression: written(&format!(
            "variables.ordered.contains(' ' + variables.uid + '=' + variables.generation + ' ') || ({})",
            break_glass_for(settings, "oldObject")
        )),
        message_expression: Some(written(&format!(
            "'cascade-guard refused to delete ' + request.kind.kind + ' ' + oldObject.metadata.name + ': its siblings would not be deleted in order, because ' + {why} + '. It lets the delete through once the tree is ordered; to see the order and what stops it: cascade-guard plan ' + variables.target + '. To delete it now, in no order: kubectl annotate ' + variables.target + ' {BREAK_GLASS_ANNOTATION}=\\\"<why>\\\"'"
        ))),
        message: Some(format!(
            "cascade-guard refused this delete: it has not ordered this tree's siblings (its controller is down or has not read the tree, or cannot hold what the order needs); see cascade-guard plan, or set the annotation {BREAK_GLASS_ANNOTATION} to delete it in no order"
        )),
        reason: Some("Forbidden".to_string()),
    };
    let metadata = sibling_order_metadata(&name);
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_string()),
            param_kind: Some(record_param()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(rules),
                match_policy: Some(MATCH_POLICY.to_string()),
                ..MatchResources::default()
            }),
            match_conditions: Some(conditions),
            validations: Some(vec![validation]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = reading_record(metadata, &name, ORDERED_TREES, namespace, "Deny");
    Compiled { policy, binding }
}

fn condition(name: &str, expression: &str) -> MatchCondition {
    MatchCondition {
        name: name.to_string(),
        expression: expression.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tree_order_round_trips_through_its_value() {
        let cases = [
            (TreeOrder::Ordered { generation: 7 }, "7"),
            (
                TreeOrder::Unordered {
                    reason: "cannot hold Secret a/b: forbidden".into(),
                },
                "cannot hold Secret a/b: forbidden",
            ),
        ];
        for (order, value) in cases {
            assert_eq!(order.value(), value);
            assert_eq!(TreeOrder::parse(value), order);
        }
        // A reason of digits alone would read as a generation.
        let digits = TreeOrder::Unordered {
            reason: "42".into(),
        };
        assert_eq!(digits.value(), "not ordered: 42");
        assert!(matches!(
            TreeOrder::parse(&digits.value()),
            TreeOrder::Unordered { .. }
        ));
        // Signs and spaces are not a generation either.
        for odd in ["-1", "+3", " 3", ""] {
            assert!(
                matches!(TreeOrder::parse(odd), TreeOrder::Unordered { .. }),
                "{odd:?}"
            );
        }
    }

    #[test]
    fn the_gate_state_of_a_root() {
        // (the record's value, the root's generation) -> state
        let cases = [
            (None, 3, GateState::NotRead),
            (Some("3"), 3, GateState::Ordered),
            (Some("2"), 3, GateState::Changed),
            (Some("4"), 3, GateState::Changed),
            (
                Some("cannot hold Secret a/b: forbidden"),
                3,
                GateState::CannotOrder("cannot hold Secret a/b: forbidden".into()),
            ),
        ];
        for (value, generation, want) in cases {
            assert_eq!(
                GateState::of(value, generation),
                want,
                "{value:?} {generation}"
            );
        }
    }

    #[test]
    fn marks_round_trip_through_the_records_encoding() {
        let marks = BTreeMap::from([
            ("a-uid".to_string(), "3".to_string()),
            ("b-uid".to_string(), "12".to_string()),
            ("c-uid".to_string(), "not read: Secret x/y".to_string()),
        ]);
        let data = encode_marks(&marks);
        assert_eq!(
            data,
            BTreeMap::from([
                ("ordered".to_string(), " a-uid=3 b-uid=12 ".to_string()),
                ("c-uid".to_string(), "not read: Secret x/y".to_string()),
            ])
        );
        assert_eq!(decode_marks(&data), marks);
        assert_eq!(
            encode_marks(&BTreeMap::new()),
            BTreeMap::from([("ordered".to_string(), " ".to_string())])
        );
        // What the gate's expression asks of the string: the uid and the
        // generation, each whole.
        let ordered = &data["ordered"];
        assert!(ordered.contains(" a-uid=3 "));
        assert!(!ordered.contains(" a-uid=1 ") && !ordered.contains(" b-uid=1 "));
    }

    #[test]
    fn the_gate_is_pinned_whole() {
        let settings = CompileSettings {
            controller_user: "system:serviceaccount:cg:cascade-guard".into(),
            ..CompileSettings::default()
        };
        let kinds = [
            GatedKind {
                group: "modelplane.ai".into(),
                plural: "inferenceclusters".into(),
                shape: Shape::CompositeResource,
            },
            GatedKind {
                group: "modelplane.ai".into(),
                plural: "servingstacks".into(),
                shape: Shape::CompositeResource,
            },
            GatedKind {
                group: "apps.example.org".into(),
                plural: "apps".into(),
                shape: Shape::Other,
            },
        ];
        let compiled = compile_gate(&kinds, &settings, "cg");
        assert_eq!(compiled.len(), 2, "one pair per shape present");
        let composites = &compiled[0];
        let policy = serde_json::to_value(&composites.policy).expect("policy");
        let binding = serde_json::to_value(&composites.binding).expect("binding");
        let spec = &policy["spec"];
        assert_eq!(
            policy["metadata"],
            json!({"name": "cascade-guard-sibling-order-roots-composites",
                   "labels": {"cascade-guard.dev/sibling-order": "true"}})
        );
        assert_eq!(spec["failurePolicy"], "Fail");
        assert_eq!(
            spec["paramKind"],
            json!({"apiVersion": "v1", "kind": "ConfigMap"})
        );
        assert_eq!(
            spec["matchConstraints"],
            json!({"matchPolicy": "Exact", "resourceRules": [{
                "apiGroups": ["modelplane.ai"], "apiVersions": ["*"],
                "resources": ["inferenceclusters", "servingstacks"],
                "operations": ["DELETE"], "scope": "*"}]})
        );
        let conditions: Vec<&str> = spec["matchConditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .map(|c| c["name"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(
            conditions,
            [
                "a-root",
                "not-deleting-already",
                "not-cascade-guard",
                "something-to-cascade"
            ]
        );
        assert!(
            spec["matchConditions"][2]["expression"]
                .as_str()
                .is_some_and(|e| e.ends_with("!= \"system:serviceaccount:cg:cascade-guard\""))
        );
        let validations = spec["validations"].as_array().expect("validations");
        assert_eq!(validations.len(), 1);
        assert_eq!(validations[0]["reason"], "Forbidden");
        // Written out: no variables (kubernetes/kubernetes#135757).
        assert!(spec.get("variables").is_none(), "{spec}");
        assert!(validations[0]["expression"].as_str().is_some_and(|e| {
            e.starts_with("(has(params.data) && 'ordered' in params.data ? params.data['ordered'] : '').contains(' ' + (oldObject.metadata.uid) + '=' + (string(oldObject.metadata.?generation.orValue(0))) + ' ') || (")
                && e.contains("authorizer.group('cascade-guard.dev')")
        }), "{}", validations[0]["expression"]);
        assert!(!spec.to_string().contains("variables."), "{spec}");
        assert_eq!(
            binding["spec"],
            json!({"policyName": "cascade-guard-sibling-order-roots-composites",
                   "validationActions": ["Deny"],
                   "paramRef": {"name": "cascade-guard-ordered-trees", "namespace": "cg",
                                "parameterNotFoundAction": "Deny"}})
        );
        // Kinds of no shape-specific field: no nothing-to-cascade condition.
        let others = serde_json::to_value(&compiled[1].policy).expect("policy");
        assert_eq!(
            others["metadata"]["name"],
            "cascade-guard-sibling-order-roots-others"
        );
        assert_eq!(
            others["spec"]["matchConditions"].as_array().map(Vec::len),
            Some(3)
        );
        assert!(compile_gate(&[], &settings, "cg").is_empty());
    }
}
