//! cascade-guard's own admission objects, as the API server has them: a pass
//! applies only what is missing or differs, and an edit or delete by anyone
//! else triggers a pass that puts it back.

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::Notify;

use super::sources::WatchCache;
use crate::policy::names::MANAGED_BY_SELECTOR;

pub(crate) struct Managed {
    pub policies: WatchCache<ValidatingAdmissionPolicy>,
    pub bindings: WatchCache<ValidatingAdmissionPolicyBinding>,
}

impl Managed {
    pub(crate) fn start(client: Client, notify: Arc<Notify>) -> Self {
        let managed = watcher::Config::default().labels(MANAGED_BY_SELECTOR);
        let policies = WatchCache::start(
            Api::<ValidatingAdmissionPolicy>::all(client.clone()),
            managed.clone(),
            Default::default(),
            notify.clone(),
            "ValidatingAdmissionPolicies",
        );
        let bindings = WatchCache::start(
            Api::<ValidatingAdmissionPolicyBinding>::all(client),
            managed,
            Default::default(),
            notify,
            "ValidatingAdmissionPolicyBindings",
        );
        Self { policies, bindings }
    }
}
