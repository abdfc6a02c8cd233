//! Loading discovery documents and keeping the interface registry current.
//!
//! Edge. Files (and `interfaces_from` globs) are read at start-up and on reload; a URL
//! document is fetched by a task of its own every `refresh`, with a timeout and
//! `If-None-Match`, under the product's own rule: a 404 or 405 (any 4xx but 408 and 429) is a
//! configuration error, reported and not retried; 5xx, 408, 429, timeouts and connection
//! errors are retried with exponential backoff (from [`FIRST_BACKOFF`], doubling up to
//! [`MAX_BACKOFF`], honouring `Retry-After`); the last good document stays in force
//! meanwhile. The [`Catalog`] swaps in a new [`Interfaces`] whenever a document changes;
//! readers take an `Arc` of it once per request under a read lock, never per span.

use super::document::{self, Contract};
use super::Interfaces;
use crate::config::{Config, DiscoveryConfig, DocumentSource, InterfaceConfig};
use crate::retry::{self, Answer, Backoff};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

/// The first wait before fetching a document again after a retryable failure.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between retries (never longer than the document's `refresh`).
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What became of one attempt to load a document: the `outcome` label of
/// `refusal_gate_discovery_document_loads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadOutcome {
    /// Read and parsed; in force.
    Loaded,
    /// The server said it has not changed (304).
    NotModified,
    /// Read, but not a valid document; the last good one stays in force.
    Invalid,
    /// The source refused (file missing, HTTP 4xx): a configuration error, not retried.
    Refused,
    /// A retryable failure (5xx, 429, timeout, connection error); retried with backoff.
    Failed,
    /// Larger than the document's `max_size_mib`: not read past the limit; tried again at
    /// the next refresh, the last good one in force meanwhile.
    TooLarge,
    /// Redirected to another origin: not followed (a document says what its own origin
    /// serves); a configuration error, not retried.
    RedirectRefused,
}

impl LoadOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadOutcome::Loaded => "loaded",
            LoadOutcome::NotModified => "not_modified",
            LoadOutcome::Invalid => "invalid",
            LoadOutcome::Refused => "refused",
            LoadOutcome::Failed => "failed",
            LoadOutcome::TooLarge => "too_large",
            LoadOutcome::RedirectRefused => "redirect_refused",
        }
    }
}

/// One load, for the caller to log and count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// The interface it is for (or the file, for a glob match that names no interface).
    pub interface: String,
    /// The file or URL.
    pub source: String,
    /// What happened.
    pub outcome: LoadOutcome,
    /// Why, when it did not load.
    pub error: Option<String>,
}

/// The interfaces as configured, with what their documents say.
pub struct Catalog {
    current: RwLock<Arc<Interfaces>>,
    state: Mutex<State>,
    /// Each interface's latest document load and when (Unix seconds): for the console.
    loads: Mutex<HashMap<String, (LoadReport, u64)>>,
}

#[derive(Default)]
struct State {
    configs: Vec<InterfaceConfig>,
    documents: HashMap<String, Contract>,
}

impl State {
    fn build(&self) -> Interfaces {
        Interfaces::build(
            self.configs
                .iter()
                .map(|c| (c, self.documents.get(&c.name))),
        )
    }
}

impl Catalog {
    /// A catalog of these interfaces and documents (by interface name).
    pub fn new(configs: Vec<InterfaceConfig>, documents: HashMap<String, Contract>) -> Catalog {
        let state = State { configs, documents };
        Catalog {
            current: RwLock::new(Arc::new(state.build())),
            state: Mutex::new(state),
            loads: Mutex::new(HashMap::new()),
        }
    }

    /// Keeps `report` as its interface's latest document load, made at `at` (Unix seconds).
    pub fn record_load(&self, report: &LoadReport, at: u64) {
        self.loads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(report.interface.clone(), (report.clone(), at));
    }

    /// The latest document load of `interface` and when it was made, if any.
    pub fn last_load(&self, interface: &str) -> Option<(LoadReport, u64)> {
        self.loads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(interface)
            .cloned()
    }

    /// The registry in force.
    pub fn current(&self) -> Arc<Interfaces> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn publish(&self, state: &State) {
        let built = Arc::new(state.build());
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = built;
    }

    /// Puts a newly loaded document in force for the interface `name`.
    pub fn set_document(&self, name: &str, contract: Contract) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.documents.get(name) == Some(&contract) {
            return;
        }
        state.documents.insert(name.to_owned(), contract);
        self.publish(&state);
    }

    /// Replaces the interfaces (a reload). Documents given win; the last good document of
    /// an interface whose URL source is unchanged stays in force until its next fetch.
    pub fn replace(&self, configs: Vec<InterfaceConfig>, mut documents: HashMap<String, Contract>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for config in &configs {
            let same_source = state
                .configs
                .iter()
                .find(|old| old.name == config.name)
                .is_some_and(|old| {
                    old.discovery.document == config.discovery.document
                        && config
                            .discovery
                            .document
                            .as_ref()
                            .is_some_and(|d| d.url.is_some())
                });
            if same_source && !documents.contains_key(&config.name) {
                if let Some(kept) = state.documents.get(&config.name) {
                    documents.insert(config.name.clone(), kept.clone());
                }
            }
        }
        *state = State { configs, documents };
        self.publish(&state);
    }

    /// The interfaces whose document is fetched from a URL: (name, source).
    pub fn url_documents(&self) -> Vec<(String, DocumentSource)> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .configs
            .iter()
            .filter_map(|c| {
                let doc = c.discovery.document.as_ref()?;
                doc.url.as_ref()?;
                Some((c.name.clone(), doc.clone()))
            })
            .collect()
    }
}

fn resolve(base_dir: &Path, file: &Path) -> PathBuf {
    if file.is_absolute() {
        file.to_path_buf()
    } else {
        base_dir.join(file)
    }
}

/// Reads and parses one document file: a regular file alone (a FIFO or a device would block
/// or never end), at most `max_bytes` of it, within `timeout` (a file under `/proc` can block
/// on read: the reading thread is then left to finish on its own, and the load fails).
fn read_file(
    path: &Path,
    base_url: Option<&str>,
    max_bytes: usize,
    timeout: Duration,
) -> Result<Contract, (LoadOutcome, String)> {
    let meta = std::fs::metadata(path).map_err(|e| (LoadOutcome::Refused, e.to_string()))?;
    if !meta.is_file() {
        return Err((LoadOutcome::Refused, "not a regular file".to_owned()));
    }
    if meta.len() > max_bytes as u64 {
        return Err(too_large(max_bytes));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = path.to_path_buf();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut bytes = Vec::new();
        let read = std::fs::File::open(&owned)
            .and_then(|f| f.take(max_bytes as u64 + 1).read_to_end(&mut bytes));
        let _ = tx.send(read.map(|_| bytes));
    });
    let bytes = match rx.recv_timeout(timeout) {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => return Err((LoadOutcome::Refused, e.to_string())),
        Err(_) => {
            return Err((
                LoadOutcome::Failed,
                format!("reading it took longer than {timeout:?}"),
            ))
        }
    };
    if bytes.len() > max_bytes {
        return Err(too_large(max_bytes));
    }
    document::parse(&bytes, base_url).map_err(|e| (LoadOutcome::Invalid, e.to_string()))
}

fn too_large(max_bytes: usize) -> (LoadOutcome, String) {
    (
        LoadOutcome::TooLarge,
        format!("larger than max_size_mib ({} MiB)", max_bytes >> 20),
    )
}

/// The HTTP client of discovery fetches and alert pushes: it follows redirects only within
/// the origin it was sent to (another origin's answer is not the document asked for, and a
/// redirect to `localhost` must not put a local service's answer in force).
///
/// # Errors
/// When the TLS backend cannot be set up.
pub fn http_client() -> reqwest::Result<reqwest::Client> {
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = |a: &reqwest::Url, b: &reqwest::Url| {
            a.scheme() == b.scheme()
                && a.host_str() == b.host_str()
                && a.port_or_known_default() == b.port_or_known_default()
        };
        let first = attempt.previous().first().cloned();
        match first {
            _ if attempt.previous().len() > 10 => attempt.error("more than 10 redirects"),
            Some(first) if !same_origin(&first, attempt.url()) => {
                let to = attempt.url().to_string();
                attempt.error(CrossOrigin(to))
            }
            _ => attempt.follow(),
        }
    });
    reqwest::Client::builder()
        .user_agent(concat!("refusal-gate/", env!("CARGO_PKG_VERSION")))
        .redirect(policy)
        .build()
}

/// A redirect to another origin, refused.
#[derive(Debug)]
struct CrossOrigin(String);

impl std::fmt::Display for CrossOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redirected to another origin ({})", self.0)
    }
}

impl std::error::Error for CrossOrigin {}

/// Everything that can be loaded without the network: the interfaces of `interfaces_from`
/// and every file document. Returns the interfaces (configured first, then found), the
/// documents by interface name, and a report of every load.
pub fn load_local(
    config: &Config,
) -> (
    Vec<InterfaceConfig>,
    HashMap<String, Contract>,
    Vec<LoadReport>,
) {
    let mut configs = config.interfaces.clone();
    let mut documents = HashMap::new();
    let mut reports = Vec::new();
    load_configured_files(config, &mut documents, &mut reports);
    load_found(config, &mut configs, &mut documents, &mut reports);
    (configs, documents, reports)
}

/// The file documents of the configured interfaces, each put in `documents` by interface
/// name, each load reported.
fn load_configured_files(
    config: &Config,
    documents: &mut HashMap<String, Contract>,
    reports: &mut Vec<LoadReport>,
) {
    for interface in &config.interfaces {
        let Some(file) = interface
            .discovery
            .document
            .as_ref()
            .and_then(|d| d.file.as_ref())
        else {
            continue;
        };
        let path = resolve(&config.base_dir, file);
        let report = |outcome, error| LoadReport {
            interface: interface.name.clone(),
            source: path.display().to_string(),
            outcome,
            error,
        };
        let source = interface.discovery.document.as_ref();
        let (max_bytes, timeout) = source.map_or(
            (
                usize::try_from(crate::config::DEFAULT_DOCUMENT_MAX_MIB << 20)
                    .unwrap_or(usize::MAX),
                Duration::from_secs(10),
            ),
            |d| (d.max_bytes(), d.timeout),
        );
        match read_file(&path, interface.url.as_deref(), max_bytes, timeout) {
            Ok(contract) => {
                documents.insert(interface.name.clone(), contract);
                reports.push(report(LoadOutcome::Loaded, None));
            }
            Err((outcome, e)) => reports.push(report(outcome, Some(e))),
        }
    }
}

/// The interfaces found by `interfaces_from`'s globs: each document that names an interface
/// no other has is one (added to `configs`, its document to `documents`), each load reported.
fn load_found(
    config: &Config,
    configs: &mut Vec<InterfaceConfig>,
    documents: &mut HashMap<String, Contract>,
    reports: &mut Vec<LoadReport>,
) {
    for pattern in &config.interfaces_from {
        let full = resolve(&config.base_dir, Path::new(pattern));
        let paths = match glob::glob(&full.to_string_lossy()) {
            Ok(paths) => paths.filter_map(Result::ok).collect::<Vec<_>>(),
            Err(e) => {
                reports.push(LoadReport {
                    interface: pattern.clone(),
                    source: pattern.clone(),
                    outcome: LoadOutcome::Refused,
                    error: Some(format!("invalid glob: {e}")),
                });
                continue;
            }
        };
        for path in paths {
            let source = path.display().to_string();
            let max_bytes = usize::try_from(crate::config::DEFAULT_DOCUMENT_MAX_MIB << 20)
                .unwrap_or(usize::MAX);
            let read = read_file(&path, None, max_bytes, Duration::from_secs(10));
            let (interface, outcome, error) = match read {
                Err((outcome, e)) => (source.clone(), outcome, Some(e)),
                Ok(contract) => match contract.name.clone() {
                    None => (
                        source.clone(),
                        LoadOutcome::Invalid,
                        Some("the document names no interface (name or title)".to_owned()),
                    ),
                    Some(name) if configs.iter().any(|c| c.name == name) => (
                        name.clone(),
                        LoadOutcome::Invalid,
                        Some(format!("another interface is already named `{name}`")),
                    ),
                    Some(name) => {
                        configs.push(InterfaceConfig {
                            name: name.clone(),
                            protocol: contract.kind.protocol(),
                            url: contract.url(),
                            endpoints: Vec::new(),
                            discovery: DiscoveryConfig {
                                paths: Vec::new(),
                                document: Some(DocumentSource {
                                    file: Some(path.clone()),
                                    url: None,
                                    refresh: Duration::from_secs(300),
                                    timeout: Duration::from_secs(10),
                                    max_size_mib: crate::config::DEFAULT_DOCUMENT_MAX_MIB,
                                }),
                            },
                            server: None,
                        });
                        documents.insert(name.clone(), contract);
                        (name, LoadOutcome::Loaded, None)
                    }
                },
            };
            reports.push(LoadReport {
                interface,
                source,
                outcome,
                error,
            });
        }
    }
}

/// One fetch's result.
#[derive(Debug)]
pub enum Fetched {
    /// A new document, with its ETag.
    Document(Contract, Option<String>),
    /// 304: unchanged.
    NotModified,
    /// A failure, its outcome, why, and how long the server asked us to wait.
    Failure(LoadOutcome, String, Option<Duration>),
}

/// Fetches a URL document once, with `If-None-Match` when an ETag is known.
pub async fn fetch(
    client: &reqwest::Client,
    source: &DocumentSource,
    etag: Option<&str>,
) -> Fetched {
    let Some(url) = source.url.as_deref() else {
        return Fetched::Failure(LoadOutcome::Refused, "no url".to_owned(), None);
    };
    let mut request = client.get(url).timeout(source.timeout);
    if let Some(etag) = etag {
        request = request.header(reqwest::header::IF_NONE_MATCH, etag);
    }
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) if e.is_redirect() => {
            let why = std::error::Error::source(&e).map_or(e.to_string(), ToString::to_string);
            return Fetched::Failure(LoadOutcome::RedirectRefused, why, None);
        }
        Err(e) => {
            let why = if e.is_timeout() {
                format!("timed out after {:?}", source.timeout)
            } else {
                format!("{e}")
            };
            return Fetched::Failure(LoadOutcome::Failed, why, None);
        }
    };
    let status = response.status();
    if status == reqwest::StatusCode::NOT_MODIFIED {
        return Fetched::NotModified;
    }
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok());
    match retry::judge(status.as_u16(), retry_after, crate::clock::now()) {
        Answer::Success => {}
        Answer::Retry(after) => {
            return Fetched::Failure(LoadOutcome::Failed, format!("HTTP {status}"), after)
        }
        Answer::Final => {
            return Fetched::Failure(LoadOutcome::Refused, format!("HTTP {status}"), None)
        }
    }
    let etag = response
        .headers()
        .get(reqwest::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let max = source.max_bytes();
    if response.content_length().is_some_and(|n| n > max as u64) {
        let (outcome, why) = too_large(max);
        return Fetched::Failure(outcome, why, None);
    }
    // Read chunk by chunk, and no further than the limit: a server that says nothing of the
    // length (or lies about it) cannot make the document larger than that.
    let mut body = Vec::new();
    let mut response = response;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > max {
                    let (outcome, why) = too_large(max);
                    return Fetched::Failure(outcome, why, None);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => {
                return Fetched::Failure(
                    LoadOutcome::Failed,
                    format!("reading the body: {e}"),
                    None,
                )
            }
        }
    }
    match document::parse(&body, Some(url)) {
        Ok(contract) => Fetched::Document(contract, etag),
        Err(e) => Fetched::Failure(LoadOutcome::Invalid, e.to_string(), None),
    }
}

/// How long to wait after a load: `refresh` after a success (or an invalid document),
/// the backoff after a retryable failure, and never again after a refusal.
pub fn next_wait(
    outcome: LoadOutcome,
    backoff: &mut Backoff,
    retry_after: Option<Duration>,
    refresh: Duration,
) -> Option<Duration> {
    match outcome {
        LoadOutcome::Loaded
        | LoadOutcome::NotModified
        | LoadOutcome::Invalid
        | LoadOutcome::TooLarge => {
            backoff.reset();
            Some(refresh)
        }
        LoadOutcome::Refused | LoadOutcome::RedirectRefused => None,
        LoadOutcome::Failed => Some(backoff.wait(retry_after)),
    }
}

/// Keeps one URL document current until the task is aborted: fetches it, puts each new
/// version in force, reports every load, and after a refusal fetches no more (it waits,
/// never ending by itself, for a reload to replace it: the task is supervised).
pub async fn watch(
    catalog: Arc<Catalog>,
    client: reqwest::Client,
    name: String,
    source: DocumentSource,
    report: Arc<dyn Fn(&LoadReport) + Send + Sync>,
) {
    let url = source.url.clone().unwrap_or_default();
    let mut etag: Option<String> = None;
    let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF.min(source.refresh));
    loop {
        let (outcome, error, retry_after) = match fetch(&client, &source, etag.as_deref()).await {
            Fetched::Document(contract, new_etag) => {
                catalog.set_document(&name, contract);
                etag = new_etag;
                (LoadOutcome::Loaded, None, None)
            }
            Fetched::NotModified => (LoadOutcome::NotModified, None, None),
            Fetched::Failure(outcome, why, retry_after) => (outcome, Some(why), retry_after),
        };
        report(&LoadReport {
            interface: name.clone(),
            source: url.clone(),
            outcome,
            error,
        });
        match next_wait(outcome, &mut backoff, retry_after, source.refresh) {
            Some(wait) => tokio::time::sleep(wait).await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_follow_the_product_rule() {
        let refresh = Duration::from_secs(300);
        let mut b = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        assert_eq!(
            next_wait(LoadOutcome::Failed, &mut b, None, refresh),
            Some(FIRST_BACKOFF)
        );
        assert_eq!(
            next_wait(LoadOutcome::Failed, &mut b, None, refresh),
            Some(FIRST_BACKOFF * 2)
        );
        assert_eq!(
            next_wait(LoadOutcome::Refused, &mut b, None, refresh),
            None,
            "refusals are final"
        );
        assert_eq!(
            next_wait(LoadOutcome::Loaded, &mut b, None, refresh),
            Some(refresh)
        );
        assert_eq!(
            next_wait(LoadOutcome::Failed, &mut b, None, refresh),
            Some(FIRST_BACKOFF),
            "a success resets the backoff"
        );
    }

    #[test]
    fn a_reload_keeps_the_last_good_url_document() {
        let source = DocumentSource {
            file: None,
            url: Some("http://cards.test/a.json".into()),
            refresh: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
            max_size_mib: 4,
        };
        let config = InterfaceConfig {
            name: "a".into(),
            protocol: crate::config::Protocol::Mcp,
            url: Some("http://a.test/mcp".into()),
            endpoints: Vec::new(),
            discovery: DiscoveryConfig {
                paths: Vec::new(),
                document: Some(source),
            },
            server: None,
        };
        let contract = document::parse(
            br#"{"remotes": [{"type": "streamable-http", "url": "http://a.test/mcp"}]}"#,
            None,
        )
        .expect("valid");
        let catalog = Catalog::new(vec![config.clone()], HashMap::new());
        catalog.set_document("a", contract);
        let r = catalog.current();
        let a = super::super::InterfaceRef::Configured(0);
        assert_eq!(r.declared(a, Some("/mcp")), super::super::Declared::Yes);
        catalog.replace(vec![config], HashMap::new());
        let r = catalog.current();
        assert_eq!(r.declared(a, Some("/mcp")), super::super::Declared::Yes);
    }
}
