//! What sibling order holds: the entries of its record
//! ([`HOLDS`](crate::policy::sibling::holds_record::HOLDS)) in the controller's namespace,
//! and, from before it kept them there, objects that still carry the old
//! hold label (they hold nothing now; the controller takes it off).

use kube::api::{DynamicObject, ListParams, PartialObjectMeta};
use kube::{Api, Client};

use crate::cluster::kinds::{Served, ServedKinds};
use crate::policy::sibling::holds_record::{
    HOLD_LABEL, HOLDS, HoldEntry, decode_holds, parse_hold_key,
};
use crate::policy::sibling::object::ObjectRef;
use k8s_openapi::api::core::v1::ConfigMap;

/// Every object held, with its entry, as the record in `namespace` says;
/// none when there is no record.
pub async fn read(
    client: &Client,
    namespace: &str,
) -> Result<Vec<(ObjectRef, HoldEntry)>, kube::Error> {
    let found = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(HOLDS)
        .await?;
    Ok(
        decode_holds(&found.and_then(|c| c.data).unwrap_or_default())
            .iter()
            .filter_map(|(key, value)| Some((parse_hold_key(key)?, HoldEntry::parse(value))))
            .collect(),
    )
}

/// Objects with the old hold label, with the kind they are of, and the kinds
/// that could not be listed.
pub struct Labelled<'a> {
    pub objects: Vec<(&'a Served, PartialObjectMeta<DynamicObject>)>,
    pub unreadable: Vec<String>,
}

pub async fn labelled<'a>(client: &kube::Client, kinds: &'a ServedKinds) -> Labelled<'a> {
    let selector = ListParams::default().labels(HOLD_LABEL);
    let mut found = Labelled {
        objects: Vec::new(),
        unreadable: Vec::new(),
    };
    for served in kinds.listable() {
        match ServedKinds::api(client, served, None)
            .list_metadata(&selector)
            .await
        {
            Ok(list) => found
                .objects
                .extend(list.items.into_iter().map(|o| (served, o))),
            Err(_) => found
                .unreadable
                .push(format!("{}.{}", served.0.plural, served.0.group)),
        }
    }
    found
}
