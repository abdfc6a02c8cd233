//! Who may send, and how many requests at once: bearer-token authentication for the
//! receivers and the admin endpoint, and the receivers' concurrency limit.
//!
//! The token checks are pure (parsing the `Authorization` header, comparing in constant
//! time); [`Tokens`] is the thin shell that reads token files and swaps the set on reload.
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
    current: RwLock<Arc<Vec<Vec<u8>>>>,
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
        let mut all: Vec<Vec<u8>> = self
            .config
            .tokens
            .iter()
            .map(|t| t.trim().as_bytes().to_vec())
            .collect();
        for file in &self.config.token_files {
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
            all.push(token.as_bytes().to_vec());
        }
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(all);
        Ok(())
    }

    /// Whether any token is configured.
    pub fn enabled(&self) -> bool {
        !self.config.tokens.is_empty() || !self.config.token_files.is_empty()
    }

    /// Whether a request with this `Authorization` header value may pass: always when
    /// authentication is off, else when it carries one of the tokens.
    pub fn admit(&self, authorization: Option<&[u8]>) -> bool {
        if !self.enabled() {
            return true;
        }
        let current = Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        authorization
            .and_then(bearer)
            .is_some_and(|presented| matches_any(&current, presented))
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
    tokens
        .iter()
        .fold(false, |found, t| found | constant_time_eq(t, presented))
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
        let config = AuthConfig {
            tokens: vec!["inline".into()],
            token_files: vec!["t".into()],
        };
        let tokens = Tokens::load(&config, &dir).expect("loads");
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
