//! Discovery documents: A2A agent cards (v0.2/v0.3 and v1.0), OpenAPI 3.0/3.1 (JSON or
//! YAML) and MCP server cards, read into one [`Contract`]: the interface's name, the URLs it
//! serves from, and the paths (with methods) it declares.
//!
//! Core: pure. Bytes in, a [`Contract`] or a [`DocumentError`] saying where in the document
//! the problem is. Unknown fields are ignored, as every one of these formats asks.

use crate::url::{self, UrlParts};
use serde_json::{Map, Value};
use std::fmt;

/// Which kind of document it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocumentKind {
    /// An A2A agent card.
    A2aCard,
    /// An OpenAPI 3.x description.
    OpenApi,
    /// An MCP server card.
    McpServerCard,
}

impl DocumentKind {
    /// The protocol an interface described by this kind of document speaks.
    pub fn protocol(self) -> crate::config::Protocol {
        match self {
            DocumentKind::A2aCard => crate::config::Protocol::A2a,
            DocumentKind::OpenApi => crate::config::Protocol::Http,
            DocumentKind::McpServerCard => crate::config::Protocol::Mcp,
        }
    }
}

/// A declared operation: a path (exact or an OpenAPI template) and its methods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredPath {
    /// The path, starting with `/`.
    pub path: String,
    /// Upper-case HTTP methods; empty means any.
    pub methods: Vec<String>,
}

/// What a discovery document says of its interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contract {
    /// The kind of document.
    pub kind: DocumentKind,
    /// The interface's own name (card name, OpenAPI title, server card title), if any.
    pub name: Option<String>,
    /// The origins and base paths it serves from, first the primary one.
    pub bases: Vec<(String, String)>,
    /// The operations it declares.
    pub paths: Vec<DeclaredPath>,
}

impl Contract {
    /// The primary URL, `origin + base path`, when the document names an absolute one.
    pub fn url(&self) -> Option<String> {
        self.bases
            .first()
            .map(|(o, p)| format!("{o}{}", if p == "/" { "" } else { p }))
    }
}

/// Why a document could not be read, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentError {
    /// `line 3 column 7` for syntax errors, a JSON path such as `$.servers[0].url` otherwise.
    pub at: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at {}: {}", self.at, self.problem)
    }
}

impl std::error::Error for DocumentError {}

fn err(at: impl Into<String>, problem: impl Into<String>) -> DocumentError {
    DocumentError {
        at: at.into(),
        problem: problem.into(),
    }
}

/// Parses a document. `base` is the URL it was fetched from or the interface's URL, to
/// resolve relative URLs in it.
///
/// # Errors
/// A [`DocumentError`] naming the line and column of a syntax error, or the JSON path of
/// a field of the wrong shape, or saying the document is of no known kind.
pub fn parse(bytes: &[u8], base: Option<&str>) -> Result<Contract, DocumentError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        err(
            "byte ".to_owned() + &e.valid_up_to().to_string(),
            "not UTF-8",
        )
    })?;
    let trimmed = text.trim_start();
    let root: Value = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::from_str(text).map_err(|e| {
            err(
                format!("line {} column {}", e.line(), e.column()),
                e.to_string(),
            )
        })?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| {
            let at = e.location().map_or_else(
                || "the start".to_owned(),
                |l| format!("line {} column {}", l.line(), l.column()),
            );
            err(at, e.to_string())
        })?
    };
    let Some(doc) = root.as_object() else {
        return Err(err("$", "the document is not an object"));
    };
    let base = base.and_then(|b| url::split_url(b).ok());
    if doc.contains_key("openapi") {
        openapi(doc, base.as_ref())
    } else if doc.contains_key("swagger") {
        Err(err(
            "$.swagger",
            "Swagger 2.0 is not supported: convert it to OpenAPI 3",
        ))
    } else if doc.contains_key("supportedInterfaces")
        || (doc.contains_key("url") && looks_like_agent_card(doc))
    {
        agent_card(doc, base.as_ref())
    } else if ["remotes", "transport", "endpoints", "serverInfo"]
        .iter()
        .any(|k| doc.contains_key(*k))
    {
        server_card(doc, base.as_ref())
    } else {
        Err(err(
            "$",
            "not an A2A agent card (url or supportedInterfaces), an OpenAPI 3 document (openapi) or an MCP server card (remotes)",
        ))
    }
}

fn looks_like_agent_card(doc: &Map<String, Value>) -> bool {
    [
        "protocolVersion",
        "preferredTransport",
        "skills",
        "additionalInterfaces",
        "capabilities",
        "defaultInputModes",
    ]
    .iter()
    .any(|k| doc.contains_key(*k))
}

fn string<'a>(v: &'a Value, at: &str) -> Result<&'a str, DocumentError> {
    v.as_str().ok_or_else(|| err(at, "expected a string"))
}

fn array<'a>(
    doc: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a [Value], DocumentError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(err(format!("{at}.{key}"), "expected an array")),
    }
}

fn name(doc: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| doc.get(*k).and_then(Value::as_str))
        .filter(|n| !n.trim().is_empty())
        .map(|n| n.trim().to_owned())
}

/// Resolves a URL in a document: absolute, host-relative (`/api`), or relative to the
/// document's own URL. gRPC targets (`host:port`) are taken as `http://host:port`. The
/// origin is `None` when the reference is relative and the document has no URL: its paths
/// still count, on the interface's own origin.
fn resolve(
    reference: &str,
    base: Option<&UrlParts<'_>>,
    at: &str,
) -> Result<(Option<String>, String), DocumentError> {
    let reference = reference.trim();
    if reference.contains("://") {
        let parts = url::split_url(reference).map_err(|p| err(at, p.to_string()))?;
        return Ok((Some(parts.origin), trim_path(parts.path)));
    }
    if !reference.starts_with('/') && !reference.contains('/') && reference.contains(':') {
        return resolve(&format!("http://{reference}"), None, at);
    }
    let path = if reference.starts_with('/') {
        reference.to_owned()
    } else {
        let dir = base.map_or("", |b| b.path.rsplit_once('/').map_or("", |(d, _)| d));
        format!("{dir}/{reference}")
    };
    Ok((
        base.map(|b| b.origin.clone()),
        trim_path(url::path_of(&path)),
    ))
}

/// Adds an (origin, base path) the document serves from, once.
fn add_base(bases: &mut Vec<(String, String)>, origin: Option<String>, path: &str) {
    if let Some(origin) = origin {
        let base = (origin, path.to_owned());
        if !bases.contains(&base) {
            bases.push(base);
        }
    }
}

fn trim_path(path: &str) -> String {
    let p = path.trim_end_matches('/');
    if p.is_empty() {
        "/".to_owned()
    } else {
        p.to_owned()
    }
}

fn join(base: &str, path: &str) -> String {
    let base = base.trim_end_matches('/');
    if path.starts_with('/') {
        format!("{base}{path}")
    } else {
        format!("{base}/{path}")
    }
}

fn methods(list: &[&str]) -> Vec<String> {
    list.iter().map(|m| (*m).to_owned()).collect()
}

/// The A2A HTTP+JSON (REST) operations, relative to the interface URL.
const A2A_REST: &[(&str, &[&str])] = &[
    ("/message:send", &["POST"]),
    ("/message:stream", &["POST"]),
    ("/tasks", &["GET"]),
    ("/tasks/{id}", &["GET"]),
    ("/tasks/{id}:cancel", &["POST"]),
    ("/tasks/{id}:subscribe", &["GET", "POST"]),
    ("/tasks/{id}/pushNotificationConfigs", &["GET", "POST"]),
    (
        "/tasks/{id}/pushNotificationConfigs/{configId}",
        &["GET", "DELETE"],
    ),
    ("/card", &["GET"]),
    ("/extendedAgentCard", &["GET"]),
];

fn agent_card(
    doc: &Map<String, Value>,
    base: Option<&UrlParts<'_>>,
) -> Result<Contract, DocumentError> {
    // v1.0 lists its bindings in supportedInterfaces; v0.2/v0.3 have url + preferredTransport
    // and additionalInterfaces. v0.x REST paths carry a /v1 prefix; v1.0's do not.
    let mut bindings: Vec<(String, String, String)> = Vec::new();
    let v1 = doc.contains_key("supportedInterfaces");
    if v1 {
        for (i, entry) in array(doc, "supportedInterfaces", "$")?.iter().enumerate() {
            let at = format!("$.supportedInterfaces[{i}]");
            let url = string(
                entry.get("url").unwrap_or(&Value::Null),
                &format!("{at}.url"),
            )?;
            let binding = entry
                .get("protocolBinding")
                .or_else(|| entry.get("transport"))
                .and_then(Value::as_str)
                .unwrap_or("JSONRPC");
            bindings.push((url.to_owned(), binding.to_owned(), at));
        }
    } else {
        let url = string(doc.get("url").unwrap_or(&Value::Null), "$.url")?;
        let preferred = doc
            .get("preferredTransport")
            .and_then(Value::as_str)
            .unwrap_or("JSONRPC");
        bindings.push((url.to_owned(), preferred.to_owned(), "$.url".to_owned()));
        for (i, entry) in array(doc, "additionalInterfaces", "$")?.iter().enumerate() {
            let at = format!("$.additionalInterfaces[{i}]");
            let url = string(
                entry.get("url").unwrap_or(&Value::Null),
                &format!("{at}.url"),
            )?;
            let transport = string(
                entry.get("transport").unwrap_or(&Value::Null),
                &format!("{at}.transport"),
            )?;
            bindings.push((url.to_owned(), transport.to_owned(), at));
        }
    }
    let mut contract = Contract {
        kind: DocumentKind::A2aCard,
        name: name(doc, &["name"]),
        bases: Vec::new(),
        paths: Vec::new(),
    };
    for (url, binding, at) in bindings {
        let (origin, path) = resolve(&url, base, &at)?;
        match binding.to_ascii_uppercase().as_str() {
            "JSONRPC" => contract.paths.push(DeclaredPath {
                path: path.clone(),
                methods: methods(&["POST"]),
            }),
            "HTTP+JSON" | "REST" => {
                let prefix = if v1 { path.clone() } else { join(&path, "/v1") };
                for (rest, m) in A2A_REST {
                    contract.paths.push(DeclaredPath {
                        path: join(&prefix, rest),
                        methods: methods(m),
                    });
                }
            }
            "GRPC" => contract.paths.push(DeclaredPath {
                path: "/a2a.v1.A2AService/{method}".to_owned(),
                methods: methods(&["POST"]),
            }),
            other => {
                return Err(err(
                    at,
                    format!("unknown A2A transport `{other}`: expected JSONRPC, GRPC or HTTP+JSON"),
                ))
            }
        }
        add_base(&mut contract.bases, origin, &path);
    }
    Ok(contract)
}

const OPENAPI_METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn openapi(
    doc: &Map<String, Value>,
    base: Option<&UrlParts<'_>>,
) -> Result<Contract, DocumentError> {
    let version = string(&doc["openapi"], "$.openapi")?;
    if !version.starts_with("3.") {
        return Err(err(
            "$.openapi",
            format!("OpenAPI {version} is not supported: expected 3.0 or 3.1"),
        ));
    }
    let mut contract = Contract {
        kind: DocumentKind::OpenApi,
        name: doc
            .get("info")
            .and_then(Value::as_object)
            .and_then(|i| name(i, &["title"])),
        bases: Vec::new(),
        paths: Vec::new(),
    };
    let servers = array(doc, "servers", "$")?;
    let default_server = [serde_json::json!({ "url": "/" })];
    let servers = if servers.is_empty() {
        &default_server[..]
    } else {
        servers
    };
    let mut server_paths: Vec<String> = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let at = format!("$.servers[{i}].url");
        let mut url = string(server.get("url").unwrap_or(&Value::Null), &at)?.to_owned();
        if let Some(vars) = server.get("variables").and_then(Value::as_object) {
            for (var, spec) in vars {
                let default = spec.get("default").and_then(Value::as_str).unwrap_or("");
                url = url.replace(&format!("{{{var}}}"), default);
            }
        }
        let (origin, path) = resolve(&url, base, &at)?;
        add_base(&mut contract.bases, origin, &path);
        server_paths.push(path);
    }
    let paths = match doc.get("paths") {
        None | Some(Value::Null) => return Ok(contract),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(err("$.paths", "expected an object of paths")),
    };
    for (path, item) in paths {
        if !path.starts_with('/') {
            return Err(err(
                format!("$.paths['{path}']"),
                "a path must start with /",
            ));
        }
        let Some(item) = item.as_object() else {
            return Err(err(
                format!("$.paths['{path}']"),
                "expected a path item object",
            ));
        };
        let found: Vec<String> = OPENAPI_METHODS
            .iter()
            .filter(|m| item.contains_key(**m))
            .map(|m| m.to_ascii_uppercase())
            .collect();
        for base_path in &server_paths {
            contract.paths.push(DeclaredPath {
                path: join(base_path, path),
                methods: found.clone(),
            });
        }
    }
    Ok(contract)
}

fn server_card(
    doc: &Map<String, Value>,
    base: Option<&UrlParts<'_>>,
) -> Result<Contract, DocumentError> {
    // The shapes proposed so far: `remotes[]{type,url}` (SEP-2127, as the registry's
    // server.json), `transport{type,endpoint|url}` and `endpoints{type: url}`.
    let mut remotes: Vec<(String, String, String)> = Vec::new();
    for (i, remote) in array(doc, "remotes", "$")?.iter().enumerate() {
        let at = format!("$.remotes[{i}]");
        let kind = remote
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("streamable-http");
        let url = string(
            remote.get("url").unwrap_or(&Value::Null),
            &format!("{at}.url"),
        )?;
        remotes.push((kind.to_owned(), url.to_owned(), format!("{at}.url")));
    }
    if let Some(t) = doc.get("transport").and_then(Value::as_object) {
        let kind = t
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("streamable-http");
        let (key, url) = match (t.get("endpoint"), t.get("url")) {
            (Some(e), _) => ("endpoint", e),
            (None, Some(u)) => ("url", u),
            (None, None) => return Err(err("$.transport", "expected an endpoint or url")),
        };
        remotes.push((
            kind.to_owned(),
            string(url, &format!("$.transport.{key}"))?.to_owned(),
            format!("$.transport.{key}"),
        ));
    }
    if let Some(e) = doc.get("endpoints").and_then(Value::as_object) {
        for (kind, url) in e {
            remotes.push((
                kind.clone(),
                string(url, &format!("$.endpoints.{kind}"))?.to_owned(),
                format!("$.endpoints.{kind}"),
            ));
        }
    }
    let server_info = doc.get("serverInfo").and_then(Value::as_object);
    let mut contract = Contract {
        kind: DocumentKind::McpServerCard,
        name: name(doc, &["title", "name"])
            .or_else(|| server_info.and_then(|s| name(s, &["title", "name"]))),
        bases: Vec::new(),
        paths: Vec::new(),
    };
    for (kind, url, at) in remotes {
        let (origin, path) = resolve(&url, base, &at)?;
        let m: &[&str] = match kind.to_ascii_lowercase().replace('_', "-").as_str() {
            "streamable-http" | "http" => &["POST", "GET", "DELETE"],
            "sse" => &["GET"],
            _ => continue,
        };
        contract.paths.push(DeclaredPath {
            path: path.clone(),
            methods: methods(m),
        });
        add_base(&mut contract.bases, origin, &path);
    }
    if contract.paths.is_empty() {
        return Err(err("$.remotes", "no streamable-http or sse endpoint"));
    }
    Ok(contract)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/discovery/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn declared(c: &Contract) -> Vec<String> {
        c.paths
            .iter()
            .map(|p| format!("{} {}", p.methods.join(","), p.path))
            .collect()
    }

    #[test]
    fn a2a_v03_card_declares_each_binding() {
        let c = parse(&fixture("a2a-v0.3.json"), None).expect("valid");
        assert_eq!(c.kind, DocumentKind::A2aCard);
        assert_eq!(c.name.as_deref(), Some("Travel Planner"));
        assert_eq!(c.url().as_deref(), Some("http://agent.fixture.test/a2a/v1"));
        let d = declared(&c);
        assert!(d.contains(&"POST /a2a/v1".to_owned()), "{d:?}");
        assert!(
            d.contains(&"POST /a2a/rest/v1/message:send".to_owned()),
            "{d:?}"
        );
        assert!(
            d.contains(&"GET /a2a/rest/v1/tasks/{id}".to_owned()),
            "{d:?}"
        );
        assert!(
            d.contains(&"POST /a2a.v1.A2AService/{method}".to_owned()),
            "{d:?}"
        );
        assert!(c
            .bases
            .contains(&("http://agent.fixture.test:50051".to_owned(), "/".to_owned())));
    }

    #[test]
    fn a2a_v10_card_uses_supported_interfaces_without_v1_prefix() {
        let c = parse(&fixture("a2a-v1.0.json"), None).expect("valid");
        assert_eq!(c.name.as_deref(), Some("Inventory Agent"));
        let d = declared(&c);
        assert!(d.contains(&"POST /a2a/message:send".to_owned()), "{d:?}");
        assert!(
            d.contains(&"POST /a2a/tasks/{id}:cancel".to_owned()),
            "{d:?}"
        );
        assert!(d.contains(&"POST /jsonrpc".to_owned()), "{d:?}");
        assert_eq!(c.url().as_deref(), Some("http://stock.fixture.test/a2a"));
    }

    #[test]
    fn openapi_30_json_with_server_variables() {
        let c = parse(&fixture("openapi-3.0.json"), None).expect("valid");
        assert_eq!(c.kind, DocumentKind::OpenApi);
        assert_eq!(c.name.as_deref(), Some("Pet Store"));
        assert_eq!(c.url().as_deref(), Some("http://pets.fixture.test/api/v2"));
        assert_eq!(
            declared(&c),
            vec!["GET,POST /api/v2/pets", "GET,DELETE /api/v2/pets/{petId}"]
        );
        // serde_json keeps object keys sorted, so paths come out in key order.
    }

    #[test]
    fn openapi_31_yaml_with_a_relative_server() {
        let c = parse(
            &fixture("openapi-3.1.yaml"),
            Some("http://weather.fixture.test:8080/docs/openapi.yaml"),
        )
        .expect("valid");
        assert_eq!(c.name.as_deref(), Some("Weather API"));
        assert_eq!(
            c.url().as_deref(),
            Some("http://weather.fixture.test:8080/weather")
        );
        assert_eq!(
            declared(&c),
            vec!["GET /weather/alerts", "GET /weather/forecast/{city}"]
        );
        // Without a URL to resolve against, the paths still count, on the interface's origin.
        let c = parse(&fixture("openapi-3.1.yaml"), None).expect("valid");
        assert_eq!(c.url(), None);
        assert_eq!(
            declared(&c),
            vec!["GET /weather/alerts", "GET /weather/forecast/{city}"]
        );
    }

    #[test]
    fn mcp_server_card_declares_its_remotes() {
        let c = parse(&fixture("mcp-server-card.json"), None).expect("valid");
        assert_eq!(c.kind, DocumentKind::McpServerCard);
        assert_eq!(c.name.as_deref(), Some("Notes"));
        assert_eq!(declared(&c), vec!["POST,GET,DELETE /mcp", "GET /sse"]);
        assert_eq!(c.url().as_deref(), Some("http://notes.fixture.test/mcp"));
        let older = br#"{"serverInfo": {"name": "old"}, "transport": {"type": "streamable-http", "endpoint": "/mcp"}}"#;
        let c = parse(older, Some("http://old.test/.well-known/mcp.json")).expect("valid");
        assert_eq!(c.name.as_deref(), Some("old"));
        assert_eq!(c.url().as_deref(), Some("http://old.test/mcp"));
    }

    #[test]
    fn invalid_documents_say_where() {
        let cases: [(&[u8], &str); 7] = [
            (b"{\"openapi\": \"3.0.0\",\n \"paths\": [}", "line 2 column"),
            (b"openapi: 3.1.0\npaths: [unclosed\n", "line"),
            (b"{\"openapi\": \"3.0.0\", \"paths\": []}", "$.paths"),
            (
                b"{\"openapi\": \"3.0.0\", \"servers\": [{\"url\": 7}]}",
                "$.servers[0].url",
            ),
            (b"{\"swagger\": \"2.0\"}", "$.swagger"),
            (
                b"{\"supportedInterfaces\": [{\"protocolBinding\": \"JSONRPC\"}]}",
                "$.supportedInterfaces[0].url",
            ),
            (b"{\"hello\": 1}", "$"),
        ];
        for (text, at) in cases {
            let e = parse(text, None).expect_err(std::str::from_utf8(text).unwrap_or("?"));
            assert!(e.to_string().contains(at), "{e} does not say {at}");
        }
    }
}
