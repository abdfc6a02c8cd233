//! The operation names of one shard's keys, each held once however many keys share it: a
//! fleet's clients call the same few operations, and a name per key was a tenth of a key's
//! memory (issue 31). Pure.

use super::group::OPERATION_MAX;
use foldhash::HashSet;
use std::fmt::{Display, Write};
use std::sync::Arc;

/// The fewest removed keys that make [`Names::removed`] look for unused names.
const SWEEP_AFTER: usize = 64;

/// A shard's operation names. A name is dropped once no key holds it, at the latest when
/// keys removed since the last look number half the names kept (so a look, which reads
/// every name, costs at most two names' reading per key removed).
#[derive(Debug, Default)]
pub(super) struct Names {
    set: HashSet<Arc<str>>,
    /// Keys removed since unused names were last dropped.
    removed: usize,
    /// Where [`Names::intern_display`] writes a name to look it up: one buffer for the
    /// shard, not a fresh string for each key it opens.
    scratch: String,
}

impl Names {
    /// The shard's copy of `name`, cut to [`OPERATION_MAX`] bytes on a character boundary.
    pub(super) fn intern(&mut self, name: &str) -> Arc<str> {
        let mut cut = name.len().min(OPERATION_MAX);
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        let name = &name[..cut];
        if let Some(kept) = self.set.get(name) {
            return Arc::clone(kept);
        }
        let kept: Arc<str> = Arc::from(name);
        self.set.insert(Arc::clone(&kept));
        kept
    }

    /// The shard's copy of the name `name` displays as (see [`Names::intern`]), written into
    /// a buffer the shard keeps.
    pub(super) fn intern_display(&mut self, name: &dyn Display) -> Arc<str> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        // Writing into a String cannot fail.
        let _ = write!(scratch, "{name}");
        let kept = self.intern(&scratch);
        self.scratch = scratch;
        kept
    }

    /// Notes that `keys` keys left the shard, dropping the names no key holds when enough
    /// have (see [`Names`]).
    pub(super) fn removed(&mut self, keys: usize) {
        self.removed += keys;
        if self.removed >= SWEEP_AFTER.max(self.set.len() / 2) {
            self.set.retain(|name| Arc::strong_count(name) > 1);
            self.removed = 0;
        }
    }

    /// How many names are kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.set.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_operation_share_one_copy_of_its_name() {
        let mut names = Names::default();
        let a = names.intern("tools/call search");
        let b = names.intern("tools/call search");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(names.len(), 1);
        let shown = names.intern_display(&format_args!("tools/call {}", "search"));
        assert!(Arc::ptr_eq(&a, &shown), "a displayed name is the same name");
        let other = names.intern_display(&"tools/list");
        assert_eq!(
            &*other, "tools/list",
            "the buffer holds only the name written last"
        );
        assert_eq!(names.len(), 2);
        let long = "é".repeat(40);
        let cut = names.intern(&long);
        assert_eq!(
            cut.len(),
            64,
            "cut on a character boundary within OPERATION_MAX"
        );
        assert!(Arc::ptr_eq(&cut, &names.intern(&long[..64])));
        assert_eq!(
            &*names.intern(&"a".repeat(65)),
            "a".repeat(64),
            "cut at exactly OPERATION_MAX"
        );
        let odd = format!("a{}", "é".repeat(40));
        assert_eq!(
            names.intern(&odd).len(),
            63,
            "byte 64 is within a character: cut before it"
        );
    }

    #[test]
    fn a_name_no_key_holds_is_dropped_once_enough_keys_left() {
        let mut names = Names::default();
        let held: Vec<Arc<str>> = (0..10)
            .map(|i| names.intern(&format!("held {i}")))
            .collect();
        for i in 0..200 {
            names.intern(&format!("gone {i}"));
        }
        assert_eq!(names.len(), 210);
        names.removed(SWEEP_AFTER);
        assert_eq!(
            names.len(),
            210,
            "64 removals among 210 names: not yet (half is 105)"
        );
        names.removed(105 - SWEEP_AFTER - 1);
        assert_eq!(names.len(), 210, "one short of half");
        names.removed(1);
        assert_eq!(names.len(), 10, "only the names keys hold stay");
        assert!(Arc::ptr_eq(&held[3], &names.intern("held 3")));
        names.removed(SWEEP_AFTER - 1);
        names.intern("gone 1");
        assert_eq!(names.len(), 11, "the count starts over after a look");
        names.removed(1);
        assert_eq!(
            names.len(),
            10,
            "64 since the last look, more than half of 11"
        );
    }
}
