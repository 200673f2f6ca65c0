//! An in-process stand-in for the API server, for request-level tests: a
//! test scripts the requests it expects, with the answers the API server
//! gives; the fake checks each request as it comes and fails the test on any
//! request out of script, and on any scripted request never sent.
//!
//! A request is matched to the first unused exchange of the script with its
//! method and path: requests to one path are answered in script order, while
//! lookups that run side by side may come in any order.

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tower_test::mock;

/// One request the test expects, and the answer to give.
pub struct Exchange {
    method: Method,
    /// Path and query, as the client sends them.
    uri: String,
    headers: Vec<(&'static str, &'static str)>,
    body: Expected,
    status: StatusCode,
    /// None: the object sent, as a create answers.
    answer: Option<Value>,
}

/// What the request's body must be.
enum Expected {
    Nothing,
    /// This JSON, exactly.
    Exactly(Value),
    /// JSON with at least these fields (objects compare field by field,
    /// arrays element by element).
    Containing(Value),
}

impl Exchange {
    fn new(method: Method, uri: &str) -> Self {
        Self {
            method,
            uri: uri.into(),
            headers: Vec::new(),
            body: Expected::Nothing,
            status: StatusCode::OK,
            answer: Some(json!({})),
        }
    }

    pub fn get(uri: &str) -> Self {
        Self::new(Method::GET, uri)
    }

    pub fn patch(uri: &str) -> Self {
        Self::new(Method::PATCH, uri)
    }

    pub fn delete(uri: &str) -> Self {
        Self::new(Method::DELETE, uri)
    }

    pub fn post(uri: &str) -> Self {
        Self::new(Method::POST, uri)
    }

    pub fn put(uri: &str) -> Self {
        Self::new(Method::PUT, uri)
    }

    /// A server-side apply of `object` to `path`, forced, as cascade-guard's
    /// field manager: how the controller writes its admission policies.
    pub fn apply(path: &str, object: &impl serde::Serialize) -> Self {
        let object = serde_json::to_value(object).expect("the object serialises");
        Self::patch(&format!("{path}?&force=true&fieldManager=cascade-guard"))
            .header("content-type", "application/apply-patch+yaml")
            .body(object)
    }

    pub fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers.push((name, value));
        self
    }

    pub fn body(mut self, body: Value) -> Self {
        self.body = Expected::Exactly(body);
        self
    }

    pub fn body_containing(mut self, body: Value) -> Self {
        self.body = Expected::Containing(body);
        self
    }

    /// Answers 200 with `object`.
    pub fn ok(mut self, object: Value) -> Self {
        self.status = StatusCode::OK;
        self.answer = Some(object);
        self
    }

    /// Answers 200 with the object sent, as an apply or replace that
    /// changes nothing else does.
    pub fn echoes(mut self) -> Self {
        self.status = StatusCode::OK;
        self.answer = None;
        self
    }

    /// Answers 201 with the object sent, as a create does.
    pub fn created(mut self) -> Self {
        self.status = StatusCode::CREATED;
        self.answer = None;
        self
    }

    /// Answers with a failure Status, as the API server words them.
    pub fn fails(mut self, (code, reason): (u16, &str), message: &str) -> Self {
        self.status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        self.answer = Some(json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }));
        self
    }
}

/// A client whose every request goes to the script; await the handle after
/// dropping every clone of the client, to learn whether the script was kept.
pub fn serve(script: Vec<Exchange>) -> (Client, JoinHandle<()>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(answer(handle, script));
    (Client::new(service, "default"), server)
}

/// Runs `requests` against the script, and fails unless the script was kept
/// (every client `requests` makes must be dropped by the time it returns).
pub async fn against<T>(script: Vec<Exchange>, requests: impl AsyncFnOnce(Client) -> T) -> T {
    let (client, server) = serve(script);
    let out = requests(client).await;
    server.await.expect("the API server's script is kept");
    out
}

async fn answer(mut handle: mock::Handle<Request<Body>, Response<Body>>, script: Vec<Exchange>) {
    let mut script: Vec<Option<Exchange>> = script.into_iter().map(Some).collect();
    while script.iter().any(Option::is_some) {
        let Some((request, send)) = handle.next_request().await else {
            let never: Vec<String> = script
                .iter()
                .flatten()
                .map(|e| format!("{} {}", e.method, e.uri))
                .collect();
            panic!("scripted requests never came: {never:?}");
        };
        let what = format!("{} {}", request.method(), request.uri());
        let expected = script
            .iter_mut()
            .find(|e| {
                e.as_ref().is_some_and(|e| {
                    e.method == request.method() && e.uri == request.uri().to_string()
                })
            })
            .and_then(Option::take)
            .unwrap_or_else(|| panic!("request out of script: {what}"));
        for (name, value) in &expected.headers {
            let sent = request.headers().get(*name).and_then(|v| v.to_str().ok());
            assert_eq!(sent, Some(*value), "{what}: header {name}");
        }
        let bytes = request
            .into_body()
            .collect()
            .await
            .expect("the client's body reads")
            .to_bytes();
        match &expected.body {
            Expected::Nothing => assert!(bytes.is_empty(), "{what}: a body was sent"),
            Expected::Exactly(want) => {
                let sent: Value = serde_json::from_slice(&bytes).expect("a JSON body");
                assert_eq!(&sent, want, "{what}");
            }
            Expected::Containing(want) => {
                let sent: Value = serde_json::from_slice(&bytes).expect("a JSON body");
                assert!(contains(&sent, want), "{what}: {sent:#} lacks {want:#}");
            }
        }
        let body = match &expected.answer {
            Some(answer) => serde_json::to_vec(answer).expect("JSON serialises"),
            None => bytes.to_vec(),
        };
        let response = Response::builder()
            .status(expected.status)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("a well-formed response");
        send.send_response(response);
    }
    if let Some((request, _)) = handle.next_request().await {
        panic!(
            "request out of script: {} {}",
            request.method(),
            request.uri()
        );
    }
}

fn contains(sent: &Value, want: &Value) -> bool {
    match (sent, want) {
        (Value::Object(sent), Value::Object(want)) => want
            .iter()
            .all(|(k, w)| sent.get(k).is_some_and(|s| contains(s, w))),
        (Value::Array(sent), Value::Array(want)) => {
            sent.len() == want.len() && sent.iter().zip(want).all(|(s, w)| contains(s, w))
        }
        _ => sent == want,
    }
}

/// Where the admission policies are.
pub const POLICIES: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
/// Where their bindings are.
pub const BINDINGS: &str =
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings";

/// A failure Status's words, as the API server gives them.
pub mod says {
    pub const NOT_FOUND: (u16, &str) = (404, "NotFound");
    pub const CONFLICT: (u16, &str) = (409, "Conflict");
    pub const INVALID: (u16, &str) = (422, "Invalid");
    pub const FORBIDDEN: (u16, &str) = (403, "Forbidden");
    pub const INTERNAL: (u16, &str) = (500, "InternalError");
}

/// The kind the tests hold: a namespaced XR kind.
pub fn resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "example.org".into(),
        version: "v1".into(),
        api_version: "example.org/v1".into(),
        kind: "XDatabase".into(),
        plural: "xdatabases".into(),
    }
}

/// The path of the test kind's object `name` in namespace `team-a`.
pub const OBJECT: &str = "/apis/example.org/v1/namespaces/team-a/xdatabases/db";

/// An object of the test kind as the API server gives its metadata: `db` in
/// `team-a`, with `uid`, `resource_version` and `finalizers`, being deleted
/// when `deleting`.
pub fn metadata(uid: &str, resource_version: &str, finalizers: &[&str], deleting: bool) -> Value {
    let mut meta = json!({
        "name": "db",
        "namespace": "team-a",
        "uid": uid,
        "resourceVersion": resource_version,
        "finalizers": finalizers,
    });
    if finalizers.is_empty()
        && let Some(m) = meta.as_object_mut()
    {
        // An object without finalizers has none listed at all.
        m.remove("finalizers");
    }
    if deleting {
        meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": meta,
    })
}

/// The same object, as the controller's cache holds it.
pub fn object(
    uid: &str,
    resource_version: &str,
    finalizers: &[&str],
    deleting: bool,
) -> kube::api::PartialObjectMeta<kube::api::DynamicObject> {
    serde_json::from_value(metadata(uid, resource_version, finalizers, deleting))
        .expect("test metadata parses")
}
