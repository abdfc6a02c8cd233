//! URL pieces as DESIGN §3 defines them: an *origin* (`scheme://host[:port]`, host
//! lower-cased, default port dropped) and a *path* (query and fragment removed).
//!
//! Core: pure string functions. Only the origin is allocated; the path borrows the input.

use arrayvec::ArrayString;

/// The parts of a URL that extraction needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlParts<'a> {
    /// `scheme://host[:port]`, normalised.
    pub origin: String,
    /// The path, starting with `/` (`/` when the URL has none).
    pub path: &'a str,
}

/// What is wrong with a URL that is not `scheme://host[:port]...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    /// No `://`.
    #[error("is not an absolute URL such as http://host:8080/path")]
    NotAbsolute,
    /// An empty scheme, or one with other characters than letters, digits, `+`, `-`, `.`.
    #[error("has no valid scheme")]
    NoScheme,
    /// An empty host.
    #[error("names no host")]
    NoHost,
    /// A port that is not a number up to 65535.
    #[error("has an invalid port")]
    BadPort,
}

/// A URL and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{url}` {problem}")]
pub struct UrlError {
    /// The URL as given.
    pub url: String,
    /// What is wrong with it.
    pub problem: UrlProblem,
}

/// Splits an absolute URL into origin and path.
///
/// # Errors
/// [`UrlError`] when the text is not `scheme://host...`.
pub fn split_url(url: &str) -> Result<UrlParts<'_>, UrlError> {
    let (scheme, host, port, path) = parts(url).map_err(|problem| UrlError {
        url: url.to_owned(),
        problem,
    })?;
    Ok(UrlParts {
        origin: origin(scheme, host, port),
        path,
    })
}

/// The pieces of an absolute URL, borrowed: scheme, host, port and path (query and
/// fragment removed). What extraction uses per span: it allocates nothing.
///
/// # Errors
/// The [`UrlProblem`], without allocating.
pub fn parts(url: &str) -> Result<(&str, &str, Option<u16>, &str), UrlProblem> {
    // The first `:` starts the `://` of every URL this is given per span; a general
    // substring search is kept for the rest. Every delimiter here is ASCII, so searching
    // bytes finds char boundaries; memchr searches a word or a vector at a time, where a
    // byte loop costs a few instructions a byte.
    let (scheme, rest) = match memchr::memchr(b':', url.as_bytes()) {
        Some(i) if url[i..].starts_with("://") => (&url[..i], &url[i + 3..]),
        _ => url.split_once("://").ok_or(UrlProblem::NotAbsolute)?,
    };
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.')
    {
        return Err(UrlProblem::NoScheme);
    }
    let authority_end = memchr::memchr3(b'/', b'?', b'#', rest.as_bytes()).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host_port =
        memchr::memrchr(b'@', authority.as_bytes()).map_or(authority, |at| &authority[at + 1..]);
    let (host, port) = split_host_port(host_port);
    if host.is_empty() {
        return Err(UrlProblem::NoHost);
    }
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().map_err(|_| UrlProblem::BadPort)?),
    };
    Ok((scheme, host, port, path_of(&rest[authority_end..])))
}

/// The path part of a path-and-query: query and fragment removed, `/` when empty.
pub fn path_of(target: &str) -> &str {
    let end = memchr::memchr2(b'?', b'#', target.as_bytes()).unwrap_or(target.len());
    let path = &target[..end];
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

/// A normalised origin on the stack: built per span without touching the heap, and text
/// already (it is made of `&str` pieces), so that reading it back checks nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Origin(ArrayString<{ Origin::MAX }>);

impl Origin {
    /// The longest origin kept; a span naming a longer one is taken as naming no server.
    pub const MAX: usize = 192;

    /// Builds a normalised origin: scheme and host lower-cased, the scheme's default port
    /// dropped. `None` when it would not fit.
    pub fn new(scheme: &str, host: &str, port: Option<u16>) -> Option<Origin> {
        let mut o = ArrayString::new();
        o.try_push_str(scheme).ok()?;
        o.make_ascii_lowercase();
        let default_port = match o.as_str() {
            "http" | "ws" => Some(80),
            "https" | "wss" => Some(443),
            _ => None,
        };
        let port = port.filter(|p| Some(*p) != default_port);
        o.try_push_str("://").ok()?;
        let at = o.len();
        o.try_push_str(host).ok()?;
        // `at` follows the ASCII `://`: a boundary between characters.
        o[at..].make_ascii_lowercase();
        if let Some(p) = port {
            o.try_push(':').ok()?;
            let mut digits = [0u8; 5];
            let mut n = p;
            let mut i = digits.len();
            loop {
                i -= 1;
                digits[i] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            for d in &digits[i..] {
                o.try_push(char::from(*d)).ok()?;
            }
        }
        Some(Origin(o))
    }

    /// The origin text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Builds a normalised origin: scheme and host lower-cased, the scheme's default port dropped.
pub fn origin(scheme: &str, host: &str, port: Option<u16>) -> String {
    match Origin::new(scheme, host, port) {
        Some(o) => o.as_str().to_owned(),
        None => {
            let mut out = format!("{scheme}://{host}").to_ascii_lowercase();
            if let Some(p) = port {
                out.push_str(&format!(":{p}"));
            }
            out
        }
    }
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
    match memchr::memrchr(b':', host_port.as_bytes()) {
        Some(at) if at + 1 < host_port.len() => (&host_port[..at], Some(&host_port[at + 1..])),
        Some(at) => (&host_port[..at], None),
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
    fn origins_are_built_in_place() {
        let o = Origin::new("HTTP", "Api.Test", Some(8080)).expect("fits");
        assert_eq!(o.as_str(), "http://api.test:8080");
        assert_eq!(
            format!("{o:?}"),
            "http://api.test:8080",
            "shown as its text"
        );
        assert_eq!(
            Origin::new("https", "h", Some(443)).expect("fits").as_str(),
            "https://h"
        );
        assert_eq!(
            Origin::new("http", "h", Some(0)).expect("fits").as_str(),
            "http://h:0"
        );
        assert!(Origin::new("http", &"x".repeat(400), None).is_none());
        // 192 bytes fit, 193 do not, the port counted; only ASCII letters are lower-cased.
        let fits = "h".repeat(Origin::MAX - "http://".len());
        assert_eq!(
            Origin::new("http", &fits, None)
                .expect("fits")
                .as_str()
                .len(),
            192
        );
        assert!(Origin::new("http", &format!("{fits}h"), None).is_none());
        let room_for_port = &fits[..fits.len() - 5];
        let o = Origin::new("http", room_for_port, Some(8080)).expect("fits");
        assert!(o.as_str().ends_with("hhh:8080"));
        assert!(Origin::new("http", &fits[..fits.len() - 4], Some(8080)).is_none());
        let o = Origin::new("HTTPS", "Bücher.Example", Some(8443)).expect("fits");
        assert_eq!(o.as_str(), "https://bücher.example:8443");
        assert_eq!(origin("http", "H", Some(65535)), "http://h:65535");
    }

    #[test]
    fn malformed_urls_are_errors() {
        for url in ["mcp.test/x", "://x", "http:///x", "http://h:notaport/"] {
            assert!(split_url(url).is_err(), "{url}");
        }
    }
}
