//! Fetches a batch of a tree's objects: by kind with lists where enough of
//! a kind are wanted ([`by_kind`]), the rest by a GET each, every request
//! of the batch in flight at once up to FETCHES_AT_ONCE. A GET after
//! another, `plan` of 5,000 objects took seven seconds; 16 at once, 2.4.
//!
//! A list the reader may not make (the chart grants the controller only
//! `get` on composed resources and ConfigMaps, and nothing on Secrets) or
//! that fails is never taken as "not there": its objects are fetched by
//! GETs instead, each answering for itself (a Secret then forbidden is
//! known by name only, as before), and the kind is not listed again in
//! this read. A list stopped early (it brought more than GETs would have
//! cost) leaves the rest to GETs too; only a list read to its end says an
//! object is gone.

use std::collections::{HashMap, HashSet};

use futures::StreamExt;
use kube::api::{DynamicObject, ListParams, TypeMeta};
use kube::{Client, ResourceExt};
use tokio::sync::Semaphore;

use super::by_kind::{self, Read, Wanted};
use crate::cluster::kinds::{Served, ServedKinds};

/// How many requests are in flight at once while a tree is read.
const FETCHES_AT_ONCE: usize = 16;
/// List pages in flight at once in the process, whatever the trees read at
/// once (the controller reads 8): each holds up to a page of objects in
/// memory, which a crowded namespace fills with others.
static PAGES_AT_ONCE: Semaphore = Semaphore::const_new(4);

/// An object as fetched: there, gone, or why not.
pub(super) type Fetched = Result<Option<DynamicObject>, kube::Error>;

/// One object to fetch: its served kind, the namespace to look in (ignored
/// for a cluster-scoped kind) and its name.
pub(super) struct Request<'k> {
    pub served: &'k Served,
    pub namespace: Option<String>,
    pub name: String,
}

/// A kind, as its lists are told apart: apiVersion and kind.
type KindId = (String, String);
/// Where an object is, as a list item names it.
type Place = (Option<String>, String);

/// What one list brought: the objects wanted, and whether it was read to
/// its end (then what it did not bring is not there).
struct Listed {
    found: HashMap<Place, DynamicObject>,
    whole: bool,
}

/// What one request of the batch came back with.
enum Done {
    Listed {
        kind: KindId,
        members: Vec<usize>,
        listed: Result<Listed, kube::Error>,
    },
    Got(usize, Box<Fetched>),
}

/// Fetches for one tree's read, remembering the kinds it may not list.
pub(super) struct Fetcher<'a> {
    client: &'a Client,
    unlisted: HashSet<KindId>,
}

impl<'a> Fetcher<'a> {
    pub fn new(client: &'a Client) -> Self {
        Self {
            client,
            unlisted: HashSet::new(),
        }
    }

    /// Fetches every request; the answers in the order asked.
    pub async fn fetch(&mut self, requests: &[Request<'_>]) -> Vec<Fetched> {
        let wanted: Vec<Wanted<KindId>> = requests.iter().map(wanted).collect();
        let reads = by_kind::reads(&wanted, |k| !self.unlisted.contains(k));
        let (client, wanted) = (self.client, &wanted);
        let done: Vec<Done> = futures::stream::iter(reads.into_iter().map(|read| async move {
            match read {
                Read::List {
                    kind,
                    namespace,
                    members,
                } => {
                    let served = requests[members[0]].served;
                    let places = members.iter().map(|&i| place(&wanted[i])).collect();
                    let listed = list(client, served, namespace.as_deref(), places).await;
                    Done::Listed {
                        kind,
                        members,
                        listed,
                    }
                }
                Read::Get(i) => Done::Got(i, Box::new(get(client, &requests[i]).await)),
            }
        }))
        .buffer_unordered(FETCHES_AT_ONCE)
        .collect()
        .await;
        let mut answers: Vec<Option<Fetched>> = requests.iter().map(|_| None).collect();
        for d in done {
            match d {
                Done::Got(i, got) => answers[i] = Some(*got),
                Done::Listed {
                    members,
                    listed: Ok(listed),
                    ..
                } => {
                    for i in members {
                        answers[i] = match listed.found.get(&place(&wanted[i])) {
                            Some(object) => Some(Ok(Some(object.clone()))),
                            None if listed.whole => Some(Ok(None)),
                            None => None,
                        };
                    }
                }
                // Refused or failed: GETs say what each object is.
                Done::Listed {
                    kind,
                    listed: Err(_),
                    ..
                } => {
                    self.unlisted.insert(kind);
                }
            }
        }
        self.get_the_rest(requests, answers).await
    }

    /// GETs what the lists did not answer for; every answer, in order.
    async fn get_the_rest(
        &self,
        requests: &[Request<'_>],
        answers: Vec<Option<Fetched>>,
    ) -> Vec<Fetched> {
        let client = self.client;
        futures::stream::iter(answers.into_iter().enumerate().map(|(i, a)| async move {
            match a {
                Some(fetched) => fetched,
                None => get(client, &requests[i]).await,
            }
        }))
        .buffered(FETCHES_AT_ONCE)
        .collect()
        .await
    }
}

fn wanted(r: &Request<'_>) -> Wanted<KindId> {
    let (resource, namespaced) = r.served;
    Wanted {
        kind: (resource.api_version.clone(), resource.kind.clone()),
        namespaced: *namespaced,
        namespace: r.namespace.clone().filter(|_| *namespaced),
        name: r.name.clone(),
    }
}

fn place(w: &Wanted<KindId>) -> Place {
    (w.namespace.clone(), w.name.clone())
}

async fn get(client: &Client, r: &Request<'_>) -> Fetched {
    ServedKinds::api(client, r.served, r.namespace.as_deref())
        .get_opt(&r.name)
        .await
}

/// Lists `served` in `namespace` (None: every namespace, or a cluster-scoped
/// kind) a page at a time for the objects at `places`, while it pays. An
/// error on the first page is the list's; one later leaves the rest to GETs.
async fn list(
    client: &Client,
    served: &Served,
    namespace: Option<&str>,
    places: HashSet<Place>,
) -> Result<Listed, kube::Error> {
    let api = ServedKinds::api(client, served, namespace);
    let wanted = places.len();
    let limit = u32::try_from(by_kind::page_size(wanted)).unwrap_or(u32::MAX);
    let mut params = ListParams::default().limit(limit);
    let mut found = HashMap::new();
    let mut listed = 0;
    let mut first = true;
    loop {
        let permit = PAGES_AT_ONCE.acquire().await;
        let page = match api.list(&params).await {
            Ok(page) => page,
            Err(e) if first => return Err(e),
            Err(_) => {
                return Ok(Listed {
                    found,
                    whole: false,
                });
            }
        };
        first = false;
        listed += page.items.len();
        for mut object in page.items {
            let at = (object.namespace(), object.name_any());
            if places.contains(&at) {
                // The items of a core kind's list carry no apiVersion or
                // kind; a GET's object does, and the graph reads them.
                if object.types.is_none() {
                    object.types = Some(TypeMeta {
                        api_version: served.0.api_version.clone(),
                        kind: served.0.kind.clone(),
                    });
                }
                found.insert(at, object);
            }
        }
        drop(permit);
        let next = page.metadata.continue_.filter(|c| !c.is_empty());
        match next {
            None => return Ok(Listed { found, whole: true }),
            Some(next) if by_kind::list_on(listed, wanted, wanted - found.len()) => {
                params = params.continue_token(&next);
            }
            Some(_) => {
                return Ok(Listed {
                    found,
                    whole: false,
                });
            }
        }
    }
}
