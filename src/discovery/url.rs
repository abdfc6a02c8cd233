//! URL pieces as DESIGN §3 defines them: an *origin* (`scheme://host[:port]`, host
//! lower-cased, default port dropped) and a *path* (query and fragment removed).
//!
//! Core: pure string functions. Only the origin is allocated; the path borrows the input.

/// The parts of a URL that extraction needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlParts<'a> {
    /// `scheme://host[:port]`, normalised.
    pub origin: String,
    /// The path, starting with `/` (`/` when the URL has none).
    pub path: &'a str,
}

/// Splits an absolute URL into origin and path.
///
/// # Errors
/// A message saying what is missing when the text is not `scheme://host...`.
pub fn split_url(url: &str) -> Result<UrlParts<'_>, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("`{url}` is not an absolute URL such as http://host:8080/path"))?;
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.')
    {
        return Err(format!("`{url}` has no valid scheme"));
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = split_host_port(host_port);
    if host.is_empty() {
        return Err(format!("`{url}` names no host"));
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| format!("`{url}` has an invalid port `{p}`"))?,
        ),
    };
    let after = &rest[authority_end..];
    Ok(UrlParts {
        origin: origin(scheme, host, port),
        path: path_of(after),
    })
}

/// The path part of a path-and-query: query and fragment removed, `/` when empty.
pub fn path_of(target: &str) -> &str {
    let end = target.find(['?', '#']).unwrap_or(target.len());
    let path = &target[..end];
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

/// Builds a normalised origin: scheme and host lower-cased, the scheme's default port dropped.
pub fn origin(scheme: &str, host: &str, port: Option<u16>) -> String {
    let scheme_lower = scheme.bytes().all(|b| !b.is_ascii_uppercase());
    let host_lower = host.bytes().all(|b| !b.is_ascii_uppercase());
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    };
    let port = port.filter(|p| Some(*p) != default_port);
    let mut out = String::with_capacity(scheme.len() + host.len() + 9);
    if scheme_lower {
        out.push_str(scheme);
    } else {
        out.push_str(&scheme.to_ascii_lowercase());
    }
    out.push_str("://");
    if host_lower {
        out.push_str(host);
    } else {
        out.push_str(&host.to_ascii_lowercase());
    }
    if let Some(p) = port {
        out.push(':');
        out.push_str(&p.to_string());
    }
    out
}

fn split_host_port(host_port: &str) -> (&str, Option<&str>) {
    if let Some(rest) = host_port.strip_prefix('[') {
        // An IPv6 literal: [::1]:8080.
        return match rest.split_once(']') {
            Some((_, tail)) => {
                let host = &host_port[..host_port.len() - tail.len()];
                (host, tail.strip_prefix(':').filter(|p| !p.is_empty()))
            }
            None => (host_port, None),
        };
    }
    match host_port.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() => (h, Some(p)),
        Some((h, _)) => (h, None),
        None => (host_port, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_and_paths_are_normalised() {
        let cases = [
            ("http://mcp.test:8080/mcp", "http://mcp.test:8080", "/mcp"),
            ("HTTP://MCP.Test:80/a?b=c#d", "http://mcp.test", "/a"),
            ("https://api.test:443", "https://api.test", "/"),
            (
                "https://user:pw@api.test:8443/x",
                "https://api.test:8443",
                "/x",
            ),
            ("http://[::1]:9000/p", "http://[::1]:9000", "/p"),
            ("http://h?q", "http://h", "/"),
        ];
        for (url, origin, path) in cases {
            let parts = split_url(url).expect(url);
            assert_eq!(parts.origin, origin, "{url}");
            assert_eq!(parts.path, path, "{url}");
        }
    }

    #[test]
    fn malformed_urls_are_errors() {
        for url in ["mcp.test/x", "://x", "http:///x", "http://h:notaport/"] {
            assert!(split_url(url).is_err(), "{url}");
        }
    }
}
