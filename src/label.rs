//! Label values cut to a length: a `client` name (`service.name`, whatever a client sends) or
//! an `interface` name longer than `metrics.max_label_bytes` is cut and given a hash of the
//! whole value, so that every place a name is shown — `/metrics`, alerts, logs, the console
//! and its API, forwarded tags, replay — shows the same short value, and distinct values stay
//! distinct.
//!
//! Core: pure, no allocation for a value within the bound.

use std::borrow::Cow;

/// Between the cut value and its hash.
const MARK: char = '~';
/// The hash: 16 hex digits.
const HASH_DIGITS: usize = 16;
/// What the hash adds to the cut value: the mark and the digits.
pub const SUFFIX_BYTES: usize = 1 + HASH_DIGITS;
/// The least `max_label_bytes` allowed: the suffix and 15 bytes of the value.
pub const MIN_BYTES: usize = SUFFIX_BYTES + 15;

/// `value` itself when it is at most `max` bytes long; otherwise its longest prefix that ends
/// on a character boundary and leaves room for the suffix, then `~` and the 16 hex digits of
/// its FNV-1a hash (64 bits, the same in every process and release, so that replicas and
/// restarts cut a value alike), at most `max` bytes in all. `max` is at least [`MIN_BYTES`]
/// (the configuration checks it); below that the result is the suffix alone.
pub fn shorten(value: &str, max: usize) -> Cow<'_, str> {
    if value.len() <= max {
        return Cow::Borrowed(value);
    }
    let mut keep = max.saturating_sub(SUFFIX_BYTES);
    while !value.is_char_boundary(keep) {
        keep -= 1;
    }
    let mut out = String::with_capacity(keep + SUFFIX_BYTES);
    out.push_str(&value[..keep]);
    out.push(MARK);
    out.push_str(&format!("{:016x}", fnv1a(value.as_bytes())));
    Cow::Owned(out)
}

/// The 64-bit FNV-1a hash of `bytes`: small, fixed for ever, and good enough to keep
/// distinct names apart (a client can name itself as another anyway: names are not secrets).
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_within_the_bound_is_itself_and_borrowed() {
        for value in ["", "planner", &"a".repeat(64)] {
            assert!(matches!(shorten(value, 64), Cow::Borrowed(v) if v == value));
        }
    }

    #[test]
    fn a_longer_value_is_cut_to_the_bound_with_its_hash() {
        let value = "b".repeat(65);
        let short = shorten(&value, 64);
        assert_eq!(short.len(), 64);
        assert_eq!(
            short,
            format!("{}~{:016x}", "b".repeat(47), fnv1a(value.as_bytes()))
        );
    }

    #[test]
    fn distinct_long_values_stay_distinct_and_one_value_is_always_cut_alike() {
        let a = format!("{}a", "x".repeat(100_000));
        let b = format!("{}b", "x".repeat(100_000));
        assert_ne!(shorten(&a, 128), shorten(&b, 128));
        assert_eq!(shorten(&a, 128), shorten(&a.clone(), 128));
    }

    #[test]
    fn a_cut_ends_on_a_character_boundary() {
        // 'é' is two bytes: 24 of them are 48, and a cut at 47 would split one.
        let value = "é".repeat(40);
        let short = shorten(&value, 64);
        assert!(short.len() <= 64, "{}", short.len());
        assert!(short.starts_with(&"é".repeat(23)));
        assert_eq!(short.len(), 46 + SUFFIX_BYTES);
    }

    #[test]
    fn the_hash_is_fnv1a_as_published() {
        // The reference values of the FNV-1a 64-bit hash.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
