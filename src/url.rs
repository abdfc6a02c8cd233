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
    // substring search is kept for the rest. Every delimiter is ASCII, so searching bytes
    // finds char boundaries.
    let (scheme, rest) = match first_of(url.as_bytes(), b":") {
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
    // The authority ends at the first `/`, `?` or `#`; the host follows its last `@`.
    let bytes = rest.as_bytes();
    let mut authority_end = rest.len();
    let mut host_start = 0;
    while let Some(i) = first_of(&bytes[host_start..], b"/?#@") {
        let i = host_start + i;
        if bytes[i] != b'@' {
            authority_end = i;
            break;
        }
        host_start = i + 1;
    }
    let (host, port) = split_host_port(&rest[host_start..authority_end]);
    if host.is_empty() {
        return Err(UrlProblem::NoHost);
    }
    let port = match port {
        None => None,
        Some(p) => Some(port_number(p).ok_or(UrlProblem::BadPort)?),
    };
    Ok((scheme, host, port, path_of(&rest[authority_end..])))
}

/// A port's number, as `str::parse::<u16>` reads it: the usual one to five digits read
/// without its general set-up.
fn port_number(p: &str) -> Option<u16> {
    let digits = p.as_bytes();
    if (1..=5).contains(&digits.len()) && digits.iter().all(u8::is_ascii_digit) {
        let n = digits
            .iter()
            .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
        return u16::try_from(n).ok();
    }
    p.parse().ok()
}

/// Where the first byte of `hay` that is one of `set` (distinct bytes) stands, read eight
/// bytes a word. A URL's pieces are short: a vector search (memchr) spent more setting up
/// than searching: [`parts`] took 625 instructions a URL of the load generator's with it,
/// 466 with this (callgrind over a loop of them), and `extract::read` went from 3,167 to
/// 3,045 instructions a span (`benches/instructions.sh 4`).
fn first_of(hay: &[u8], set: &[u8]) -> Option<usize> {
    let mut words = hay.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let found = set.iter().fold(0, |found, &b| found | equal_bytes(word, b));
        if found != 0 {
            return Some(at + found.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    let rest = words.remainder();
    rest.iter().position(|b| set.contains(b)).map(|i| at + i)
}

/// The top bit of each byte of `word` equal to `byte`, and no other bit: exact, with no
/// carry from one byte into the next.
fn equal_bytes(word: u64, byte: u8) -> u64 {
    const LOW: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let x = word ^ (u64::from(byte) * 0x0101_0101_0101_0101);
    !(((x & LOW) + LOW) | x | LOW)
}

/// The path part of a path-and-query: query and fragment removed, `/` when empty.
pub fn path_of(target: &str) -> &str {
    let end = first_of(target.as_bytes(), b"?#").unwrap_or(target.len());
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
        o.try_push_str("://").ok()?;
        o.try_push_str(host).ok()?;
        // `://` has no letter: one pass lower-cases the scheme and the host.
        o.make_ascii_lowercase();
        let default_port = match &o[..scheme.len()] {
            "http" | "ws" => Some(80),
            "https" | "wss" => Some(443),
            _ => None,
        };
        if let Some(mut n) = port.filter(|p| Some(*p) != default_port) {
            // `:` and the digits, written from the end.
            let mut text = [b':'; 6];
            let mut i = text.len();
            loop {
                i -= 1;
                text[i] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            for &c in &text[i - 1..] {
                o.try_push(char::from(c)).ok()?;
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
    match host_port.bytes().rposition(|b| b == b':') {
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

    /// `parts` as the standard library's string searches read it: what the word-at-a-time
    /// searches must agree with.
    fn parts_by_str(url: &str) -> Result<(&str, &str, Option<u16>, &str), UrlProblem> {
        let (scheme, rest) = match url.find(':') {
            Some(i) if url[i..].starts_with("://") => (&url[..i], &url[i + 3..]),
            _ => url.split_once("://").ok_or(UrlProblem::NotAbsolute)?,
        };
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        {
            return Err(UrlProblem::NoScheme);
        }
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        let host_port = authority
            .rfind('@')
            .map_or(authority, |at| &authority[at + 1..]);
        let (host, port) = split_host_port(host_port);
        if host.is_empty() {
            return Err(UrlProblem::NoHost);
        }
        let port = match port {
            None => None,
            Some(p) => Some(p.parse::<u16>().map_err(|_| UrlProblem::BadPort)?),
        };
        let target = &rest[end..];
        let path = &target[..target.find(['?', '#']).unwrap_or(target.len())];
        Ok((scheme, host, port, if path.is_empty() { "/" } else { path }))
    }

    #[test]
    fn urls_split_as_the_standard_librarys_searches_split_them() {
        // Pieces of every length around a word's eight bytes, with the delimiters at every
        // place, and characters whose bytes differ from a delimiter only in the top bit
        // (º ¿ £ ï: C2 BA, C2 BF, C2 A3, C3 AF against : ? # /).
        let schemes = ["http", "HTTPS", "h", "a+b-c.d", "htt p", "", "é"];
        let separators = ["://", ":/", ":", "//", ":://"];
        let hosts = [
            "h",
            "api3.example",
            "u:pw@h",
            "a@b@host.example",
            "[::1]",
            "[::1]:9000",
            "º¿£ï.example",
            "h:8080",
            "h:",
            "h:+80",
            "h:65535",
            "h:65536",
            "h:00080",
            "h:000080",
            "h:8a",
            "verylonghostname.example:1",
            "",
            ":80",
        ];
        let tails = [
            "",
            "/",
            "/v1/items/7",
            "/a?b=c#d",
            "?q",
            "#f",
            "/º¿£ï/x?y",
            "/path/that/is/longer/than/two/words/of/eight#x",
            "/a@b:c",
        ];
        let mut checked = 0;
        for scheme in schemes {
            for sep in separators {
                for host in hosts {
                    for tail in tails {
                        let url = format!("{scheme}{sep}{host}{tail}");
                        assert_eq!(parts(&url), parts_by_str(&url), "{url}");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 7 * 5 * 18 * 9);
    }

    #[test]
    fn the_first_of_a_set_is_found_at_every_place_in_and_after_the_words() {
        for len in 0..24 {
            for at in 0..len {
                for needle in [b':', b'/', b'?'] {
                    // Bytes one bit from the needle everywhere else: no carry, no top bit.
                    let mut hay = vec![needle ^ 0x80; len];
                    hay.iter_mut().step_by(2).for_each(|b| *b = needle ^ 1);
                    assert_eq!(first_of(&hay, b":/?"), None, "{len}");
                    hay[at] = needle;
                    if at + 1 < len {
                        hay[at + 1] = needle;
                    }
                    assert_eq!(first_of(&hay, b":/?"), Some(at), "{len} {at}");
                    assert_eq!(first_of(&hay, b"#"), None);
                }
            }
        }
    }

    #[test]
    fn ports_are_read_as_str_parse_reads_them() {
        for p in [
            "0", "80", "8080", "65535", "65536", "99999", "00080", "000080", "+80", "-1", "8a", "",
            "123456", "0x50",
        ] {
            assert_eq!(port_number(p), p.parse::<u16>().ok(), "{p}");
        }
    }

    #[test]
    fn malformed_urls_are_errors() {
        for url in ["mcp.test/x", "://x", "http:///x", "http://h:notaport/"] {
            assert!(split_url(url).is_err(), "{url}");
        }
    }
}
