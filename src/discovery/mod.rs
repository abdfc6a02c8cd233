//! Interfaces and their contracts: which interface an attempt belongs to, whether its path
//! is declared, and whether it read a discovery document (DESIGN §3).
//!
//! Core: built once from the configuration, then only read. No I/O, no clock; lookups borrow.

pub mod document;
pub mod loader;

use crate::url::split_url;

use crate::config::{InterfaceConfig, Protocol};
use document::Contract;
use std::collections::HashMap;

/// The discovery paths every interface has (DESIGN §3).
pub const DEFAULT_DISCOVERY_PATHS: &[&str] = &[
    "/.well-known/agent-card.json",
    "/.well-known/agent.json",
    "/.well-known/mcp.json",
    "/.well-known/mcp/server-card.json",
    "/.well-known/api-catalog",
    "/openapi.json",
    "/openapi.yaml",
];

/// The gRPC reflection services.
const REFLECTION_SERVICES: &[&str] = &[
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// Whether a gRPC service is server reflection.
pub fn is_reflection(service: &str) -> bool {
    REFLECTION_SERVICES
        .iter()
        .any(|svc| service.starts_with(svc))
}

/// The name of the interface of attempts that name no server.
pub const UNKNOWN_INTERFACE: &str = "unknown";

/// Whether an interface's contract declares a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// One of its endpoints matches.
    Yes,
    /// It declares endpoints and none matches.
    No,
    /// Nothing is known: an unconfigured interface, or one with no endpoints.
    Unknown,
}

/// Which interface an attempt belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterfaceRef<'a> {
    /// A configured interface, by index.
    Configured(usize),
    /// An unconfigured origin: an interface of its own, named by the origin.
    Origin(&'a str),
    /// The attempt names no server.
    Unknown,
}

/// One configured interface, ready for lookups.
#[derive(Debug, Clone)]
pub struct Interface {
    /// Its name: the `interface` label.
    pub name: String,
    /// What it speaks.
    pub protocol: Protocol,
    /// The (origin, base path) pairs it serves from: its URL's, then its document's.
    pub bases: Vec<(String, String)>,
    /// The paths it declares: its configuration's, then its document's.
    pub paths: Vec<String>,
    endpoints: Vec<Endpoint>,
    discovery_paths: Vec<String>,
    /// Where a SERVER span names its client, when the interface is observed from its side.
    pub client_from: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Endpoint {
    segments: Vec<Segment>,
    /// The methods it lists, upper case; empty: any.
    methods: Vec<String>,
}

/// One path segment of a declared endpoint: a literal, or a template such as `{id}` or
/// `{id}:cancel` (a parameter with a literal prefix and suffix).
#[derive(Debug, Clone)]
enum Segment {
    Literal(String),
    Param { prefix: String, suffix: String },
}

impl Endpoint {
    fn parse(path: &str, methods: &[String]) -> Endpoint {
        let segments = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| match (s.find('{'), s.rfind('}')) {
                (Some(open), Some(close)) if open < close => Segment::Param {
                    prefix: s[..open].to_owned(),
                    suffix: s[close + 1..].to_owned(),
                },
                _ => Segment::Literal(s.to_owned()),
            })
            .collect();
        Endpoint {
            segments,
            methods: methods.iter().map(|m| m.to_ascii_uppercase()).collect(),
        }
    }

    /// Whether it lists `method` (any, when it lists none).
    fn lists(&self, method: &str) -> bool {
        self.methods.is_empty() || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }

    /// Whether a path it matches is one resource, not any of many (no template parameter).
    fn is_literal(&self) -> bool {
        self.segments
            .iter()
            .all(|s| matches!(s, Segment::Literal(_)))
    }

    /// The gRPC service this endpoint declares: its first segment, when it is a literal and a
    /// method (or a template) follows it and nothing else. On an interface of another protocol
    /// (an A2A card's gRPC binding), only a qualified `package.Service`: `/v1/{id}` of an HTTP
    /// API declares no service `v1`.
    fn grpc_service(&self, protocol: Protocol) -> Option<&str> {
        match self.segments.as_slice() {
            [Segment::Literal(service), _]
                if protocol == Protocol::Grpc || service.contains('.') =>
            {
                Some(service)
            }
            _ => None,
        }
    }

    fn matches(&self, path: &str) -> bool {
        let mut parts = path.split('/').filter(|s| !s.is_empty());
        for segment in &self.segments {
            match (segment, parts.next()) {
                (Segment::Literal(want), Some(got)) if want == got => {}
                (Segment::Param { prefix, suffix }, Some(got))
                    if got.len() > prefix.len() + suffix.len()
                        && got.starts_with(prefix.as_str())
                        && got.ends_with(suffix.as_str()) => {}
                _ => return false,
            }
        }
        parts.next().is_none()
    }
}

/// The configured interfaces, indexed by origin.
#[derive(Debug, Clone, Default)]
pub struct Interfaces {
    list: Vec<Interface>,
    /// Per origin, the (interface, base path) pairs served from it, in configuration order.
    by_origin: HashMap<String, Vec<(usize, String)>>,
    /// Per gRPC service declared (an endpoint `/package.Service/...`), the interface that
    /// declares it; `None` when more than one does. For attempts that name no server.
    grpc_services: HashMap<String, Option<usize>>,
    /// The one interface of protocol `grpc`, when exactly one is configured.
    grpc_only: Option<usize>,
    /// Per `service.name` observed from the server's side, its interface (DESIGN §9).
    observed: HashMap<String, usize>,
}

impl Interfaces {
    /// Builds the registry from the configuration alone. The configuration has been
    /// validated, so every URL parses.
    pub fn new(configs: &[InterfaceConfig]) -> Interfaces {
        Interfaces::build(configs.iter().map(|c| (c, None)))
    }

    /// Builds the registry from the configuration and, where an interface has one, what its
    /// discovery document says: the declared endpoints are the union of both, and the
    /// interface serves from its URL's origin and every origin its document names.
    pub fn build<'a>(
        interfaces: impl IntoIterator<Item = (&'a InterfaceConfig, Option<&'a Contract>)>,
    ) -> Interfaces {
        let mut registry = Interfaces::default();
        for (config, contract) in interfaces {
            let mut bases: Vec<(String, String)> = Vec::new();
            if let Some(parts) = config.url.as_deref().and_then(|u| split_url(u).ok()) {
                let base = parts.path.trim_end_matches('/');
                bases.push((
                    parts.origin,
                    if base.is_empty() { "/" } else { base }.to_owned(),
                ));
            }
            let mut paths: Vec<(&str, &[String])> = config
                .endpoints
                .iter()
                .map(|e| (e.path.as_str(), e.methods.as_slice()))
                .collect();
            if let Some(contract) = contract {
                for base in &contract.bases {
                    if !bases.contains(base) {
                        bases.push(base.clone());
                    }
                }
                paths.extend(
                    contract
                        .paths
                        .iter()
                        .map(|p| (p.path.as_str(), p.methods.as_slice())),
                );
            }
            let mut discovery_paths = config.discovery.paths.clone();
            discovery_paths.extend(
                paths
                    .iter()
                    .map(|(p, _)| format!("{}/server-card", p.trim_end_matches('/'))),
            );
            let index = registry.list.len();
            let endpoints: Vec<Endpoint> = paths
                .iter()
                .map(|(p, methods)| Endpoint::parse(p, methods))
                .collect();
            for service in endpoints
                .iter()
                .filter_map(|e| e.grpc_service(config.protocol))
            {
                registry
                    .grpc_services
                    .entry(service.to_owned())
                    .and_modify(|owner| {
                        if *owner != Some(index) {
                            *owner = None;
                        }
                    })
                    .or_insert(Some(index));
            }
            for (origin, base) in &bases {
                registry
                    .by_origin
                    .entry(origin.clone())
                    .or_default()
                    .push((index, base.clone()));
            }
            if let Some(server) = &config.server {
                for service in &server.service_names {
                    registry.observed.entry(service.clone()).or_insert(index);
                }
            }
            registry.list.push(Interface {
                name: config.name.clone(),
                protocol: config.protocol,
                bases,
                paths: paths.iter().map(|(p, _)| (*p).to_owned()).collect(),
                endpoints,
                discovery_paths,
                client_from: config.server.as_ref().map(|s| s.client_from.clone()),
            });
        }
        let mut grpc = registry
            .list
            .iter()
            .enumerate()
            .filter(|(_, i)| i.protocol == Protocol::Grpc);
        registry.grpc_only = match (grpc.next(), grpc.next()) {
            (Some((only, _)), None) => Some(only),
            _ => None,
        };
        registry
    }

    /// How many interfaces are configured.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether no interface is configured.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The configured interface at `index`.
    pub fn get(&self, index: usize) -> Option<&Interface> {
        self.list.get(index)
    }

    /// The interface an attempt on `origin` and `path` belongs to: the configured one on that
    /// origin whose base path is the longest prefix of the path (segment-wise), else the
    /// first configured on that origin, else the origin itself.
    pub fn resolve<'a>(&self, origin: Option<&'a str>, path: Option<&str>) -> InterfaceRef<'a> {
        let Some(origin) = origin else {
            return InterfaceRef::Unknown;
        };
        let Some(candidates) = self.by_origin.get(origin) else {
            return InterfaceRef::Origin(origin);
        };
        let path = path.unwrap_or("/");
        let best = candidates
            .iter()
            .filter(|(_, base)| has_path_prefix(path, base))
            // The longest base wins; among equals, the first configured.
            .min_by_key(|(i, base)| (std::cmp::Reverse(base.len()), *i))
            .map(|(i, _)| *i);
        InterfaceRef::Configured(best.unwrap_or(candidates[0].0))
    }

    /// The interface of a gRPC attempt that names no server (gRPC instrumentations often
    /// record none), by its service: the configured interface that declares the service, when
    /// exactly one does; for server reflection, which every server serves, and for a service
    /// no interface declares (contract 4: so that a client's reflection read and its calls
    /// land on the same interface), the one configured `grpc` interface when there is exactly
    /// one; else `unknown`.
    pub fn resolve_grpc(&self, service: &str) -> InterfaceRef<'static> {
        let owner = if is_reflection(service) {
            self.grpc_only
        } else {
            match self.grpc_services.get(service) {
                Some(owner) => *owner,
                None => self.grpc_only,
            }
        };
        owner.map_or(InterfaceRef::Unknown, InterfaceRef::Configured)
    }

    /// The interface whose SERVER spans a resource named `service` sends, when one is
    /// observed from its side (DESIGN §9).
    pub fn observed_by(&self, service: &str) -> Option<usize> {
        if self.observed.is_empty() {
            return None;
        }
        self.observed.get(service).copied()
    }

    /// Where a SERVER span of `interface` names its client: `None` when the interface is
    /// not observed from its side.
    pub fn client_from(&self, interface: InterfaceRef<'_>) -> Option<&[String]> {
        match interface {
            InterfaceRef::Configured(i) => self.list[i].client_from.as_deref(),
            _ => None,
        }
    }

    /// Every configured interface, in configuration order.
    pub fn iter(&self) -> impl Iterator<Item = &Interface> {
        self.list.iter()
    }

    /// Whether any interface is observed from its side.
    pub fn any_observed(&self) -> bool {
        !self.observed.is_empty()
    }

    /// The name of an interface: its configured name, its origin, or `unknown`.
    pub fn name<'a>(&'a self, interface: InterfaceRef<'a>) -> &'a str {
        match interface {
            InterfaceRef::Configured(i) => &self.list[i].name,
            InterfaceRef::Origin(origin) => origin,
            InterfaceRef::Unknown => UNKNOWN_INTERFACE,
        }
    }

    /// Whether `interface` declares `path`. Methods do not matter: a declared path with an
    /// unlisted method is still declared (the server answers 405, not 404).
    pub fn declared(&self, interface: InterfaceRef<'_>, path: Option<&str>) -> Declared {
        let (InterfaceRef::Configured(i), Some(path)) = (interface, path) else {
            return Declared::Unknown;
        };
        let endpoints = &self.list[i].endpoints;
        if endpoints.is_empty() {
            Declared::Unknown
        } else if endpoints.iter().any(|e| e.matches(path)) {
            Declared::Yes
        } else {
            Declared::No
        }
    }

    /// What `interface` declares of `method` on `path`, as DESIGN §13 asks of a refusal of
    /// it: (the method is listed by an endpoint matching the path — any method, when it lists
    /// none —, such an endpoint is one resource, with no template parameter). Both false when
    /// the path is not declared.
    pub fn declares(
        &self,
        interface: InterfaceRef<'_>,
        path: Option<&str>,
        method: Option<&str>,
    ) -> (bool, bool) {
        let (InterfaceRef::Configured(i), Some(path)) = (interface, path) else {
            return (false, false);
        };
        let matching = self.list[i].endpoints.iter().filter(|e| e.matches(path));
        matching.fold((false, false), |(listed, literal), e| {
            (
                listed || method.is_none_or(|m| e.lists(m)),
                literal || e.is_literal(),
            )
        })
    }

    /// The other configured interfaces that declare `path`: where an attempt refused by
    /// `interface` could go instead, as (name, URL of the path on it, protocol).
    pub fn alternatives(
        &self,
        interface: InterfaceRef<'_>,
        path: &str,
    ) -> Vec<(String, String, Protocol)> {
        self.list
            .iter()
            .enumerate()
            .filter(|(i, _)| interface != InterfaceRef::Configured(*i))
            .filter(|(_, candidate)| candidate.endpoints.iter().any(|e| e.matches(path)))
            .filter_map(|(_, candidate)| {
                let (origin, _) = candidate.bases.first()?;
                Some((
                    candidate.name.clone(),
                    format!("{origin}{path}"),
                    candidate.protocol,
                ))
            })
            .collect()
    }

    /// The discovery document path to read for `interface`: its first configured one, else
    /// the default for its protocol (none for gRPC, whose contract is read by reflection).
    pub fn discovery_path<'a>(&'a self, interface: InterfaceRef<'_>) -> Option<&'a str> {
        let InterfaceRef::Configured(i) = interface else {
            return None;
        };
        let it = &self.list[i];
        it.discovery_paths
            .first()
            .map(String::as_str)
            .or(match it.protocol {
                Protocol::A2a => Some("/.well-known/agent-card.json"),
                Protocol::Mcp => Some("/.well-known/mcp/server-card.json"),
                Protocol::Http => Some("/openapi.json"),
                Protocol::Grpc => None,
            })
    }

    /// Whether `path` is a discovery path of `interface`: a default one, one configured for
    /// it, or `<endpoint>/server-card`. Unconfigured interfaces accept any `.../server-card`.
    pub fn is_discovery_path(&self, interface: InterfaceRef<'_>, path: &str) -> bool {
        let path = if path.len() > 1 {
            path.trim_end_matches('/')
        } else {
            path
        };
        if DEFAULT_DISCOVERY_PATHS.contains(&path) {
            return true;
        }
        match interface {
            InterfaceRef::Configured(i) => self.list[i].discovery_paths.iter().any(|p| p == path),
            _ => path.ends_with("/server-card"),
        }
    }
}

fn has_path_prefix(path: &str, base: &str) -> bool {
    base == "/"
        || path == base
        || (path.starts_with(base) && path.as_bytes().get(base.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DiscoveryConfig, EndpointConfig};

    fn interface(name: &str, url: &str, endpoints: &[&str]) -> InterfaceConfig {
        InterfaceConfig {
            name: name.into(),
            protocol: Protocol::Http,
            url: Some(url.into()),
            endpoints: endpoints
                .iter()
                .map(|p| EndpointConfig {
                    path: (*p).into(),
                    methods: vec![],
                })
                .collect(),
            discovery: DiscoveryConfig {
                paths: vec!["/docs/contract.json".into()],
                document: None,
            },
            server: None,
        }
    }

    fn registry() -> Interfaces {
        Interfaces::new(&[
            interface(
                "a2a",
                "http://agent.test/a2a/v1",
                &["/a2a/v1", "/a2a/tasks/{id}", "/a2a/v1/message:send"],
            ),
            interface(
                "admin",
                "http://agent.test/admin",
                &["/admin/users/{id}/roles"],
            ),
            interface("bare", "http://bare.test:8080", &[]),
        ])
    }

    #[test]
    fn resolution_takes_the_longest_base_path_then_the_first() {
        let r = registry();
        let origin = Some("http://agent.test");
        assert_eq!(
            r.resolve(origin, Some("/a2a/v1/x")),
            InterfaceRef::Configured(0)
        );
        assert_eq!(
            r.resolve(origin, Some("/admin/users")),
            InterfaceRef::Configured(1)
        );
        assert_eq!(
            r.resolve(origin, Some("/adminx")),
            InterfaceRef::Configured(0)
        );
        assert_eq!(
            r.resolve(origin, Some("/.well-known/agent-card.json")),
            InterfaceRef::Configured(0)
        );
        assert_eq!(
            r.resolve(Some("http://other.test"), Some("/")),
            InterfaceRef::Origin("http://other.test")
        );
        assert_eq!(r.resolve(None, Some("/x")), InterfaceRef::Unknown);
        assert_eq!(r.name(InterfaceRef::Unknown), "unknown");
        assert_eq!(r.name(InterfaceRef::Origin("http://o")), "http://o");
        assert_eq!(r.name(InterfaceRef::Configured(1)), "admin");
    }

    #[test]
    fn declared_paths_match_exactly_or_by_template() {
        let r = registry();
        let a2a = InterfaceRef::Configured(0);
        let cases = [
            (a2a, Some("/a2a/v1"), Declared::Yes),
            (a2a, Some("/a2a/v1/"), Declared::Yes),
            (a2a, Some("/a2a/tasks/t-17"), Declared::Yes),
            (a2a, Some("/a2a/tasks"), Declared::No),
            (a2a, Some("/a2a/tasks/t-17/cancel"), Declared::No),
            (a2a, Some("/a2a/tasks/t-17:cancel"), Declared::Yes),
            (a2a, Some("/a2a/v1/message:send"), Declared::Yes),
            (a2a, Some("/a2a/v1/message:stream"), Declared::No),
            (a2a, Some("/a2a/v2"), Declared::No),
            (
                InterfaceRef::Configured(1),
                Some("/admin/users/7/roles"),
                Declared::Yes,
            ),
            (
                InterfaceRef::Configured(2),
                Some("/anything"),
                Declared::Unknown,
            ),
            (
                InterfaceRef::Origin("http://o"),
                Some("/x"),
                Declared::Unknown,
            ),
            (InterfaceRef::Unknown, Some("/x"), Declared::Unknown),
            (a2a, None, Declared::Unknown),
        ];
        for (interface, path, want) in cases {
            assert_eq!(r.declared(interface, path), want, "{interface:?} {path:?}");
        }
    }

    #[test]
    fn grpc_attempts_without_a_server_go_to_the_interface_declaring_their_service() {
        let grpc = |name: &str, url: &str, endpoints: &[&str]| InterfaceConfig {
            protocol: Protocol::Grpc,
            ..interface(name, url, endpoints)
        };
        let a2a = InterfaceConfig {
            protocol: Protocol::A2a,
            ..interface(
                "agent",
                "http://agent.test",
                &["/a2a.v1.A2AService/{method}"],
            )
        };
        let r = Interfaces::new(&[
            grpc(
                "weather",
                "http://w.test:50051",
                &["/weather.Forecast/Get", "/Greeter/Hi"],
            ),
            grpc(
                "stock",
                "http://s.test:50051",
                &["/stock.Quotes/{m}", "/shared.S/A"],
            ),
            interface("api", "http://api.test", &["/v1/{id}", "/shared.S/B"]),
            a2a,
            interface("other", "http://o.test", &["/shared.S/C"]),
        ]);
        let cases = [
            ("weather.Forecast", InterfaceRef::Configured(0)),
            ("Greeter", InterfaceRef::Configured(0)),
            ("stock.Quotes", InterfaceRef::Configured(1)),
            ("a2a.v1.A2AService", InterfaceRef::Configured(3)),
            // An HTTP API's /v1/{id} declares no gRPC service v1.
            ("v1", InterfaceRef::Unknown),
            // Declared by more than one: no telling which.
            ("shared.S", InterfaceRef::Unknown),
            ("pkg.Nobody", InterfaceRef::Unknown),
            // Reflection: two gRPC interfaces, so none.
            ("grpc.reflection.v1.ServerReflection", InterfaceRef::Unknown),
        ];
        for (service, want) in cases {
            assert_eq!(r.resolve_grpc(service), want, "{service}");
        }
        let one = Interfaces::new(&[
            grpc("weather", "http://w.test:50051", &["/weather.Forecast/Get"]),
            interface("api", "http://api.test", &[]),
        ]);
        for service in [
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
            // Contract 4: a service no interface declares goes to the only gRPC interface,
            // where the client's reflection read went.
            "pkg.Nobody",
        ] {
            assert_eq!(one.resolve_grpc(service), InterfaceRef::Configured(0));
        }
        let shared = Interfaces::new(&[
            grpc("weather", "http://w.test:50051", &["/shared.S/A"]),
            interface("api", "http://api.test", &["/shared.S/B"]),
        ]);
        assert_eq!(shared.resolve_grpc("shared.S"), InterfaceRef::Unknown);
        assert_eq!(
            shared.resolve_grpc("pkg.Nobody"),
            InterfaceRef::Configured(0)
        );
        let path = Some("/weather.Forecast/GetHistory");
        assert_eq!(
            one.declared(InterfaceRef::Configured(0), path),
            Declared::No
        );
    }

    #[test]
    fn template_segments_match_with_prefix_and_suffix() {
        let e = Endpoint::parse("/tasks/{id}:cancel", &[]);
        assert!(e.matches("/tasks/t-1:cancel"));
        assert!(
            !e.matches("/tasks/:cancel"),
            "the parameter must not be empty"
        );
        assert!(!e.matches("/tasks/t-1"));
        assert!(!e.matches("/tasks/t-1:cancel/x"));
        let e = Endpoint::parse("/files/v{n}.json", &[]);
        assert!(e.matches("/files/v2.json"));
        assert!(!e.matches("/files/v2.yaml"));
    }

    #[test]
    fn discovery_paths_are_defaults_configured_and_server_cards() {
        let r = registry();
        let a2a = InterfaceRef::Configured(0);
        assert!(r.is_discovery_path(a2a, "/.well-known/agent-card.json"));
        assert!(r.is_discovery_path(a2a, "/openapi.yaml"));
        assert!(r.is_discovery_path(a2a, "/docs/contract.json"));
        assert!(r.is_discovery_path(a2a, "/a2a/v1/server-card"));
        assert!(!r.is_discovery_path(a2a, "/a2a/v2/server-card"));
        assert!(!r.is_discovery_path(a2a, "/a2a/v1"));
        assert!(r.is_discovery_path(InterfaceRef::Origin("http://o"), "/mcp/server-card"));
        assert!(!r.is_discovery_path(InterfaceRef::Origin("http://o"), "/docs/contract.json"));
    }
}
