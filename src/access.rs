//! Who may send, and how many requests at once: bearer-token authentication for the
//! receivers and the admin endpoint, and the receivers' concurrency limit.
//!
//! The token checks are pure (parsing the `Authorization` header, comparing in constant
//! time, matching a [`Grant`]'s client patterns); [`Tokens`] is the thin shell that reads
//! token files and swaps the set on reload. A token is granted what its configuration says:
//! to speak for any client or for those whose `service.name` matches its patterns, and (the
//! admin endpoint's) to observe through the Gate or only to read.
//! [`Limit`] is a semaphore: a request over the limit is answered at once with a retryable
//! status instead of waiting, so a flood cannot queue up unbounded memory. It is taken once
//! a request's body has arrived, so that a client that sends headers and then nothing (or
//! trickles its body) holds no slot; what bodies being read hold is bounded apart, in bytes
//! actually received, by [`Reading`].

use crate::config::AuthConfig;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The accepted bearer tokens. With none configured, authentication is off.
#[derive(Debug)]
pub struct Tokens {
    config: AuthConfig,
    base_dir: std::path::PathBuf,
    current: RwLock<Arc<Vec<Granted>>>,
}

/// A token and what it grants.
type Granted = (Vec<u8>, Grant);

/// What a token may do (DESIGN §7): speak for any client, or for those whose `service.name`
/// matches one of its patterns; observe through the Gate, or only read. The default is
/// everything: an unscoped token's, and everyone's when authentication is off.
#[derive(Debug, Clone, Default)]
pub struct Grant {
    clients: Option<Arc<[String]>>,
    read_only: bool,
}

impl Grant {
    /// A grant to speak for the clients `patterns` match (`None`: any), read-only or not.
    pub fn new(patterns: Option<&[String]>, read_only: bool) -> Grant {
        Grant {
            clients: patterns.map(|p| p.iter().map(|p| p.trim().to_owned()).collect()),
            read_only,
        }
    }

    /// Whether it may speak for the client named `service_name`.
    pub fn speaks_for(&self, service_name: &str) -> bool {
        self.clients
            .as_deref()
            .is_none_or(|patterns| patterns.iter().any(|p| matches(p, service_name)))
    }

    /// Whether it may ask the Gate to observe a call as the client named `service_name`.
    pub fn observes_as(&self, service_name: &str) -> bool {
        !self.read_only && self.speaks_for(service_name)
    }
}

/// Whether `name` matches `pattern`, in which `*` stands for any run of characters
/// (none included) and everything else for itself.
pub fn matches(pattern: &str, name: &str) -> bool {
    let Some((first, rest)) = pattern.split_once('*') else {
        return pattern == name;
    };
    let Some(mut left) = name.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = rest.split('*').collect();
    let last = parts.pop().unwrap_or("");
    for part in parts {
        match left.find(part) {
            Some(at) => left = &left[at + part.len()..],
            None => return false,
        }
    }
    left.len() >= last.len() && left.ends_with(last)
}

/// A token file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token file {}: {problem}", path.display())]
pub struct TokenError {
    /// The file.
    pub path: std::path::PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

impl Tokens {
    /// Reads the inline tokens and the token files (relative to `base_dir`).
    ///
    /// # Errors
    /// [`TokenError`] naming the file that cannot be read or holds no token.
    pub fn load(config: &AuthConfig, base_dir: &Path) -> Result<Tokens, TokenError> {
        let tokens = Tokens {
            config: config.clone(),
            base_dir: base_dir.to_path_buf(),
            current: RwLock::new(Arc::new(Vec::new())),
        };
        tokens.reload()?;
        Ok(tokens)
    }

    /// Reads the token files again (rotation without restart). On error the previous
    /// tokens stay in force.
    ///
    /// # Errors
    /// As [`Tokens::load`].
    pub fn reload(&self) -> Result<(), TokenError> {
        let mut all: Vec<Granted> = self
            .config
            .tokens
            .iter()
            .map(|t| (t.trim().as_bytes().to_vec(), Grant::default()))
            .collect();
        for file in &self.config.token_files {
            all.push((self.read_file(file)?, Grant::default()));
        }
        for scoped in &self.config.scoped {
            let token = match (&scoped.token, &scoped.token_file) {
                (Some(t), _) => t.trim().as_bytes().to_vec(),
                (None, Some(file)) => self.read_file(file)?,
                // `validate` refuses it; should one come, it admits no one.
                (None, None) => continue,
            };
            all.push((
                token,
                Grant::new(scoped.clients.as_deref(), scoped.read_only),
            ));
        }
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(all);
        Ok(())
    }

    /// One token file's token, trimmed.
    fn read_file(&self, file: &Path) -> Result<Vec<u8>, TokenError> {
        let path = self.base_dir.join(file);
        let text = std::fs::read_to_string(&path).map_err(|e| TokenError {
            path: path.clone(),
            problem: e.to_string(),
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenError {
                path,
                problem: "holds no token".into(),
            });
        }
        Ok(token.as_bytes().to_vec())
    }

    /// Whether any token is configured.
    pub fn enabled(&self) -> bool {
        !self.config.tokens.is_empty()
            || !self.config.token_files.is_empty()
            || !self.config.scoped.is_empty()
    }

    /// Whether a request with this `Authorization` header value may pass: always when
    /// authentication is off, else when it carries one of the tokens.
    pub fn admit(&self, authorization: Option<&[u8]>) -> bool {
        self.grant(authorization).is_some()
    }

    /// What a request with this `Authorization` header value may do: everything when
    /// authentication is off, its token's [`Grant`] when it carries one of the tokens,
    /// `None` (not admitted) otherwise.
    pub fn grant(&self, authorization: Option<&[u8]>) -> Option<Grant> {
        if !self.enabled() {
            return Some(Grant::default());
        }
        let current = Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let presented = authorization.and_then(bearer)?;
        let at = position(current.iter().map(|(t, _)| t.as_slice()), presented)?;
        current.get(at).map(|(_, grant)| grant.clone())
    }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive).
pub fn bearer(header: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = header.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.starts_with(b" ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Whether `presented` equals one of `tokens`, comparing every token in full so that the
/// time taken does not tell an attacker how much of a guess was right.
pub fn matches_any(tokens: &[Vec<u8>], presented: &[u8]) -> bool {
    position(tokens.iter().map(Vec::as_slice), presented).is_some()
}

/// Which of `tokens` `presented` equals (the first), comparing every token in full.
fn position<'a>(tokens: impl Iterator<Item = &'a [u8]>, presented: &[u8]) -> Option<usize> {
    tokens.enumerate().fold(None, |found, (i, t)| {
        let equal = constant_time_eq(t, presented);
        found.or(equal.then_some(i))
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The receivers' concurrency limit: at most `n` requests handled at once, each from the
/// moment its body has arrived to its answer.
#[derive(Debug, Clone)]
pub struct Limit(Arc<Semaphore>);

impl Limit {
    /// A limit of `n` requests at once.
    pub fn new(n: usize) -> Limit {
        Limit(Arc::new(Semaphore::new(n)))
    }

    /// A permit for one request, or `None` when `n` are already in flight.
    pub fn try_enter(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.0).try_acquire_owned().ok()
    }
}

/// A receiver's places: `requests` handled at once ([`Limit`]) and `reading_mib` MiB of
/// bodies still arriving ([`Reading`]).
pub fn places(requests: usize, reading_mib: u64) -> (Limit, Reading) {
    let bytes = usize::try_from(reading_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    (Limit::new(requests), Reading::new(bytes))
}

/// The bytes of request bodies a receiver holds while they are still arriving, over all its
/// connections: `max_reading_mib`. Charged as the bytes come, not as a request declares
/// them, so a client that trickles its body or sends none holds next to nothing.
#[derive(Debug, Clone)]
pub struct Reading(Arc<ReadingBytes>);

#[derive(Debug)]
struct ReadingBytes {
    held: AtomicUsize,
    cap: usize,
}

impl Reading {
    /// A budget of `cap` bytes.
    pub fn new(cap: usize) -> Reading {
        Reading(Arc::new(ReadingBytes {
            held: AtomicUsize::new(0),
            cap,
        }))
    }

    /// A request's share of the budget, empty at first; what it took is given back when it
    /// is dropped.
    pub fn share(&self) -> Share {
        Share {
            reading: self.clone(),
            bytes: 0,
        }
    }

    /// The bytes held now.
    pub fn held(&self) -> usize {
        self.0.held.load(Ordering::Relaxed)
    }
}

/// What one request's body holds of a [`Reading`] budget.
#[derive(Debug)]
pub struct Share {
    reading: Reading,
    bytes: usize,
}

impl Share {
    /// Takes `n` more bytes; false, and nothing taken, when the budget has not that much left.
    pub fn take(&mut self, n: usize) -> bool {
        let budget = &self.reading.0;
        let taken = budget
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&after| after <= budget.cap)
            })
            .is_ok();
        if taken {
            self.bytes += n;
        }
        taken
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.reading.0.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_matches_with_its_stars_standing_for_any_run() {
        for (pattern, name, expected) in [
            ("billing-agent", "billing-agent", true),
            ("billing-agent", "billing-agent2", false),
            ("billing-agent", "billing-agen", false),
            ("billing-*", "billing-agent", true),
            ("billing-*", "billing-", true),
            ("billing-*", "xbilling-agent", false),
            ("*-agent", "billing-agent", true),
            ("*-agent", "billing-agentx", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXc", false),
            ("a*b*c", "acb", false),
            ("*", "", true),
            ("a*a", "a", false),
            ("ab*ba", "aba", false),
            ("*b*", "abc", true),
            ("*b*", "ac", false),
            ("*ab*b", "ab", false),
            ("*ab*b", "abb", true),
        ] {
            assert_eq!(matches(pattern, name), expected, "{pattern} ~ {name}");
        }
    }

    #[test]
    fn a_grant_speaks_for_its_clients_and_observes_unless_read_only() {
        let anyone = Grant::default();
        assert!(anyone.speaks_for("x") && anyone.observes_as("x"));
        let patterns = vec![" billing-* ".to_owned(), "checkout".to_owned()];
        let billing = Grant::new(Some(&patterns), false);
        assert!(billing.speaks_for("billing-agent") && billing.observes_as("checkout"));
        assert!(!billing.speaks_for("checkout-2") && !billing.observes_as("other"));
        let reader = Grant::new(None, true);
        assert!(reader.speaks_for("x") && !reader.observes_as("x"));
    }

    #[test]
    fn each_token_brings_its_own_grant() {
        let config = AuthConfig {
            tokens: vec!["open".into()],
            token_files: Vec::new(),
            scoped: vec![crate::config::ScopedToken {
                token: Some(" bound ".into()),
                token_file: None,
                clients: Some(vec!["billing-*".into()]),
                read_only: false,
            }],
        };
        let tokens = Tokens::load(&config, Path::new(".")).expect("inline tokens");
        assert!(tokens.enabled());
        let grant = |header: &[u8]| tokens.grant(Some(header));
        assert!(grant(b"Bearer open").is_some_and(|g| g.speaks_for("anyone")));
        let bound = grant(b"Bearer bound").expect("admitted");
        assert!(bound.speaks_for("billing-agent") && !bound.speaks_for("anyone"));
        assert!(grant(b"Bearer other").is_none() && tokens.grant(None).is_none());
        let off = Tokens::load(&AuthConfig::default(), Path::new(".")).expect("none");
        assert!(!off.enabled() && off.grant(None).is_some_and(|g| g.observes_as("x")));
        let only_scoped = AuthConfig {
            tokens: Vec::new(),
            ..config
        };
        let tokens = Tokens::load(&only_scoped, Path::new(".")).expect("inline tokens");
        assert!(
            tokens.enabled() && tokens.grant(None).is_none(),
            "scoped tokens alone guard"
        );
    }

    #[test]
    fn places_are_requests_and_mebibytes() {
        let (limit, reading) = places(1, 2);
        let _first = limit.try_enter().expect("one place");
        assert!(limit.try_enter().is_none());
        let mut share = reading.share();
        assert!(share.take(2 << 20) && !share.take(1), "two MiB exactly");
    }

    #[test]
    fn a_share_takes_what_fits_and_gives_it_all_back() {
        let reading = Reading::new(10);
        let mut one = reading.share();
        assert!(one.take(6));
        let mut two = reading.share();
        assert!(!two.take(5), "6 + 5 is past 10");
        assert!(two.take(4), "6 + 4 is 10 exactly");
        assert!(!two.take(1));
        assert_eq!(reading.held(), 10);
        drop(one);
        assert_eq!(reading.held(), 4);
        assert!(two.take(6));
        drop(two);
        assert_eq!(reading.held(), 0);
        assert!(!reading.share().take(usize::MAX), "no overflow");
    }

    #[test]
    fn the_bearer_scheme_is_parsed_strictly() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearerabc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bear"), None);
    }

    #[test]
    fn any_of_several_tokens_is_accepted_and_nothing_else() {
        let tokens = vec![b"one".to_vec(), b"two-longer".to_vec()];
        assert!(matches_any(&tokens, b"one"));
        assert!(matches_any(&tokens, b"two-longer"));
        assert!(!matches_any(&tokens, b"on"));
        assert!(!matches_any(&tokens, b"two-longeR"));
        assert!(!matches_any(&[], b"one"));
    }

    #[test]
    fn token_files_are_read_and_reread() {
        let dir = std::env::temp_dir().join(format!("rg-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        std::fs::write(dir.join("t"), "first\n").expect("written");
        std::fs::write(dir.join("s"), "scoped\n").expect("written");
        let config = AuthConfig {
            tokens: vec!["inline".into()],
            token_files: vec!["t".into()],
            scoped: vec![crate::config::ScopedToken {
                token: None,
                token_file: Some("s".into()),
                clients: None,
                read_only: true,
            }],
        };
        let tokens = Tokens::load(&config, &dir).expect("loads");
        let reader = tokens.grant(Some(b"Bearer scoped")).expect("from its file");
        assert!(!reader.observes_as("x"), "read-only");
        assert!(tokens.admit(Some(b"Bearer first")));
        assert!(tokens.admit(Some(b"Bearer inline")));
        assert!(!tokens.admit(None));
        std::fs::write(dir.join("t"), "second").expect("written");
        tokens.reload().expect("reloads");
        assert!(
            !tokens.admit(Some(b"Bearer first")),
            "a rotated token is gone"
        );
        assert!(tokens.admit(Some(b"Bearer second")));
        std::fs::write(dir.join("t"), "  ").expect("written");
        assert!(tokens.reload().is_err(), "an empty file is an error");
        assert!(
            tokens.admit(Some(b"Bearer second")),
            "and the old tokens stay"
        );
        let open = Tokens::load(&AuthConfig::default(), &dir).expect("loads");
        assert!(open.admit(None), "no token configured: no authentication");
        std::fs::write(dir.join("t"), "only").expect("written");
        let only_files = AuthConfig {
            token_files: vec!["t".into()],
            ..AuthConfig::default()
        };
        let files = Tokens::load(&only_files, &dir).expect("loads");
        assert!(!files.admit(None), "token files alone guard");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_limit_admits_n_at_once() {
        let limit = Limit::new(2);
        let a = limit.try_enter().expect("first");
        let _b = limit.try_enter().expect("second");
        assert!(limit.try_enter().is_none(), "third is over the limit");
        drop(a);
        assert!(
            limit.try_enter().is_some(),
            "a finished request frees its place"
        );
    }
}
