//! The checks a configuration must pass beyond its shape: addresses, URLs, limits and
//! names that parse but cannot work, each refused with its key's path.
//!
//! Core: pure.

use super::{Config, ConfigError};

impl Config {
    /// Every check, section by section; the first that fails is the error.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.check_receivers()?;
        self.check_tracker()?;
        self.check_metrics_and_alerting()?;
        self.check_exporters()?;
        self.check_admin()?;
        check_scoped("receivers.otlp.auth", &self.receivers.otlp.auth, false)?;
        check_scoped("admin.auth", &self.admin.auth, true)?;
        self.check_interfaces()
    }

    /// `receivers:` and the listeners' limits.
    fn check_receivers(&self) -> Result<(), ConfigError> {
        if self.receivers.otlp.http.max_request_body_size_mib == 0 {
            return invalid(
                "receivers.otlp.http.max_request_body_size_mib".into(),
                "must be at least 1",
            );
        }
        if self.receivers.otlp.grpc.max_recv_msg_size_mib == 0 {
            return invalid(
                "receivers.otlp.grpc.max_recv_msg_size_mib".into(),
                "must be at least 1",
            );
        }
        if self.receivers.otlp.grpc.max_reading_mib < self.receivers.otlp.grpc.max_recv_msg_size_mib
        {
            return invalid(
                "receivers.otlp.grpc.max_reading_mib".into(),
                "must be at least max_recv_msg_size_mib: a message of that size could never be read",
            );
        }
        if self.receivers.otlp.http.max_reading_mib
            < self.receivers.otlp.http.max_request_body_size_mib
        {
            return invalid(
                "receivers.otlp.http.max_reading_mib".into(),
                "must be at least max_request_body_size_mib: a body of that size could never be read",
            );
        }
        for (key, n) in [
            (
                "receivers.otlp.grpc.max_concurrent_requests",
                self.receivers.otlp.grpc.max_concurrent_requests,
            ),
            (
                "receivers.otlp.http.max_concurrent_requests",
                self.receivers.otlp.http.max_concurrent_requests,
            ),
            (
                "receivers.otlp.grpc.max_connections",
                self.receivers.otlp.grpc.max_connections,
            ),
            (
                "receivers.otlp.http.max_connections",
                self.receivers.otlp.http.max_connections,
            ),
            ("admin.max_connections", self.admin.max_connections),
            (
                "receivers.otlp.grpc.max_concurrent_streams",
                self.receivers.otlp.grpc.max_concurrent_streams as usize,
            ),
        ] {
            if n == 0 {
                return invalid(key.into(), "must be at least 1");
            }
        }
        let grpc = &self.receivers.otlp.grpc;
        if !grpc.keepalive_time.is_zero() && grpc.keepalive_timeout.is_zero() {
            return invalid(
                "receivers.otlp.grpc.keepalive_timeout".into(),
                "must be longer than 0 when keepalive_time is (0s keepalive_time turns pings off)",
            );
        }
        if self.receivers.otlp.max_attributes_per_span == 0 {
            return invalid(
                "receivers.otlp.max_attributes_per_span".into(),
                "must be at least 1",
            );
        }
        Ok(())
    }

    /// `tracker:`.
    fn check_tracker(&self) -> Result<(), ConfigError> {
        if self.tracker.max_keys == 0 {
            return invalid("tracker.max_keys".into(), "must be at least 1");
        }
        if self.tracker.max_retries > 64 {
            return invalid("tracker.max_retries".into(), "must be at most 64");
        }
        if self.tracker.probe_window.is_zero() {
            return invalid("tracker.probe_window".into(), "must be longer than 0");
        }
        if self.tracker.honesty_window.is_zero() {
            return invalid("tracker.honesty_window".into(), "must be longer than 0");
        }
        if self.tracker.key_ttl < self.tracker.probe_window {
            return invalid(
                "tracker.key_ttl".into(),
                "must be at least tracker.probe_window, or refusals expire before they can be honored",
            );
        }
        Ok(())
    }

    /// `metrics:` and `alerting:`.
    fn check_metrics_and_alerting(&self) -> Result<(), ConfigError> {
        if self.metrics.max_clients == 0 {
            return invalid("metrics.max_clients".into(), "must be at least 1");
        }
        if self.metrics.max_interfaces == 0 {
            return invalid("metrics.max_interfaces".into(), "must be at least 1");
        }
        if self.metrics.max_label_bytes < crate::label::MIN_BYTES {
            return invalid(
                "metrics.max_label_bytes".into(),
                &format!("must be at least {}", crate::label::MIN_BYTES),
            );
        }
        if self.alerting.resolve_after.is_zero() {
            return invalid("alerting.resolve_after".into(), "must be longer than 0");
        }
        if self.alerting.queue_size == 0 {
            return invalid("alerting.queue_size".into(), "must be at least 1");
        }
        if let Some(am) = &self.alerting.alertmanager {
            if !(am.url.starts_with("http://") || am.url.starts_with("https://"))
                || crate::url::split_url(&am.url).is_err()
            {
                return invalid(
                    "alerting.alertmanager.url".into(),
                    "must be an http:// or https:// URL such as http://127.0.0.1:9093",
                );
            }
            if am.timeout.is_zero() {
                return invalid(
                    "alerting.alertmanager.timeout".into(),
                    "must be longer than 0",
                );
            }
        }
        Ok(())
    }

    /// `exporters:`: each next hop and its queue.
    fn check_exporters(&self) -> Result<(), ConfigError> {
        if self.tracker.role == super::Role::Join && self.exporters.otlp.is_none() {
            return invalid(
                "tracker.role".into(),
                "join forwards every span to the second tier: it needs exporters.otlp",
            );
        }
        if let Some(otlp) = &self.exporters.otlp {
            check_next_hop("exporters.otlp", &otlp.endpoint, otlp.tls.as_ref())?;
            if otlp.queue_size == 0
                || otlp.batch_size == 0
                || otlp.queue_size_mib == 0
                || otlp.batch_size_mib == 0
            {
                return invalid(
                    "exporters.otlp".into(),
                    "queue_size, queue_size_mib, batch_size and batch_size_mib must be at least 1",
                );
            }
            if otlp.timeout.is_zero() || otlp.batch_interval.is_zero() {
                return invalid(
                    "exporters.otlp".into(),
                    "timeout and batch_interval must be longer than 0",
                );
            }
        }
        if let Some(push) = &self.exporters.otlp_metrics {
            check_next_hop("exporters.otlp_metrics", &push.endpoint, push.tls.as_ref())?;
            if push.timeout.is_zero() || push.interval.is_zero() {
                return invalid(
                    "exporters.otlp_metrics".into(),
                    "timeout and interval must be longer than 0",
                );
            }
        }
        Ok(())
    }

    /// `admin.ui`.
    fn check_admin(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.admin.ui.trace_url {
            // The console renders it as a link: a `javascript:` or `data:` template would be
            // a script a click runs.
            let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
            if !matches!(scheme.as_deref(), Some("http" | "https")) {
                return invalid(
                    "admin.ui.trace_url".into(),
                    "must be an http:// or https:// URL",
                );
            }
            if !url.contains("{trace_id}") {
                return invalid(
                    "admin.ui.trace_url".into(),
                    "must contain {trace_id}, where the trace's id goes",
                );
            }
        }
        Ok(())
    }

    /// `interfaces:`: names, URLs, documents, endpoints and observed servers, each unique where it must be.
    fn check_interfaces(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::HashSet::new();
        let mut observed = std::collections::HashSet::new();
        for (i, interface) in self.interfaces.iter().enumerate() {
            let at = |field: &str| format!("interfaces[{i}].{field}");
            if interface.name.is_empty() {
                return invalid(at("name"), "must not be empty");
            }
            if interface.name.len() > self.metrics.max_label_bytes {
                return invalid(
                    at("name"),
                    "is longer than metrics.max_label_bytes: it is the `interface` label",
                );
            }
            if !names.insert(interface.name.as_str()) {
                return invalid(at("name"), "another interface has this name");
            }
            match (&interface.url, &interface.discovery.document) {
                (Some(url), _) => {
                    if let Err(problem) = crate::url::split_url(url) {
                        return invalid(at("url"), &problem.to_string());
                    }
                }
                (None, None) => {
                    return invalid(at("url"), "is required unless discovery.document names it")
                }
                (None, Some(_)) => {}
            }
            if let Some(doc) = &interface.discovery.document {
                match (&doc.file, &doc.url) {
                    (Some(_), None) => {}
                    (None, Some(url)) => {
                        if !(url.starts_with("http://") || url.starts_with("https://"))
                            || crate::url::split_url(url).is_err()
                        {
                            return invalid(
                                at("discovery.document.url"),
                                "must be an http:// or https:// URL",
                            );
                        }
                    }
                    _ => {
                        return invalid(
                            at("discovery.document"),
                            "needs exactly one of file or url",
                        )
                    }
                }
                if doc.refresh.is_zero() || doc.timeout.is_zero() {
                    return invalid(
                        at("discovery.document"),
                        "refresh and timeout must be longer than 0",
                    );
                }
            }
            for (j, endpoint) in interface.endpoints.iter().enumerate() {
                if !endpoint.path.starts_with('/') {
                    return invalid(at(&format!("endpoints[{j}].path")), "must start with /");
                }
                for method in &endpoint.methods {
                    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                        return invalid(
                            at(&format!("endpoints[{j}].methods")),
                            "each method must be an HTTP method such as GET or POST",
                        );
                    }
                }
            }
            if let Some(server) = &interface.server {
                if server.service_names.is_empty() {
                    return invalid(at("server.service_names"), "must name at least one service");
                }
                if server.client_from.iter().any(String::is_empty) {
                    return invalid(at("server.client_from"), "must not hold an empty name");
                }
                for name in &server.service_names {
                    if !observed.insert(name.as_str()) {
                        return invalid(
                            at("server.service_names"),
                            &format!("{name} is observed by another interface too"),
                        );
                    }
                }
            }
            for (j, path) in interface.discovery.paths.iter().enumerate() {
                if !path.starts_with('/') {
                    return invalid(at(&format!("discovery.paths[{j}]")), "must start with /");
                }
            }
        }
        Ok(())
    }
}

/// The error for `key`, which has `problem`.
/// The checks of `section.scoped`: each a token inline or in a file (not both), patterns that
/// are not empty, and `read_only` only where it means something (`read_only_allowed`: the
/// admin endpoint).
fn check_scoped(
    section: &str,
    auth: &super::AuthConfig,
    read_only_allowed: bool,
) -> Result<(), ConfigError> {
    for (i, scoped) in auth.scoped.iter().enumerate() {
        let key = format!("{section}.scoped[{i}]");
        let inline = scoped.token.as_deref().map(str::trim);
        match (inline, &scoped.token_file) {
            (Some(t), None) if !t.is_empty() => {}
            (None, Some(_)) => {}
            (Some(_), Some(_)) => return invalid(key, "give token or token_file, not both"),
            _ => return invalid(key, "give a token or a token_file"),
        }
        if let Some(clients) = &scoped.clients {
            if clients.is_empty() || clients.iter().any(|p| p.trim().is_empty()) {
                return invalid(
                    format!("{key}.clients"),
                    "name at least one pattern, none empty (absent: any client)",
                );
            }
        }
        if scoped.read_only && !read_only_allowed {
            return invalid(
                format!("{key}.read_only"),
                "only the admin endpoint's tokens can be read-only",
            );
        }
    }
    Ok(())
}

fn invalid(key: String, problem: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        key,
        problem: problem.to_owned(),
    })
}

/// The checks of an exporter's next hop (`key` is its section): an `http://` or `https://`
/// URL, and TLS files only for `https://`, a certificate and its key together.
fn check_next_hop(
    key: &str,
    endpoint: &str,
    tls: Option<&super::ExporterTlsConfig>,
) -> Result<(), ConfigError> {
    let invalid = |key: String, problem: &str| {
        Err(ConfigError::Invalid {
            key,
            problem: problem.to_owned(),
        })
    };
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        || crate::url::split_url(endpoint).is_err()
    {
        return invalid(
            format!("{key}.endpoint"),
            "must be an http:// or https:// URL such as http://127.0.0.1:4317",
        );
    }
    if let Some(tls) = tls {
        if !endpoint.starts_with("https://") {
            return invalid(
                format!("{key}.tls"),
                "is for an https:// endpoint; this endpoint is plain http://",
            );
        }
        if tls.cert_file.is_some() != tls.key_file.is_some() {
            return invalid(
                format!("{key}.tls"),
                "cert_file and key_file go together: set both or neither",
            );
        }
    }
    Ok(())
}
