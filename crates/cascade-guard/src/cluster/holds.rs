//! What sibling order holds now: every object, of any served kind, that
//! carries the hold label, read by its metadata alone.

use kube::api::{DynamicObject, ListParams, PartialObjectMeta};

use crate::cluster::kinds::{Served, ServedKinds};
use crate::policy::hold::HOLD_LABEL;

/// Held objects with the kind they are of, and the kinds that could not be
/// listed (what they hold is not known).
pub struct Holds<'a> {
    pub held: Vec<(&'a Served, PartialObjectMeta<DynamicObject>)>,
    pub unreadable: Vec<String>,
}

pub async fn list<'a>(client: &kube::Client, kinds: &'a ServedKinds) -> Holds<'a> {
    let labelled = ListParams::default().labels(HOLD_LABEL);
    let mut holds = Holds {
        held: Vec::new(),
        unreadable: Vec::new(),
    };
    for served in kinds.listable() {
        match ServedKinds::api(client, served, None)
            .list_metadata(&labelled)
            .await
        {
            Ok(list) => holds
                .held
                .extend(list.items.into_iter().map(|o| (served, o))),
            Err(_) => holds
                .unreadable
                .push(format!("{}.{}", served.0.plural, served.0.group)),
        }
    }
    holds
}
