//! A group's keys by operation hash, sized to what they hold. A group has a handful of
//! operations (the load generator's fleet 4.5 on average), and a hash table rounds that up to
//! 8 slots of a whole key each: at a million keys, 146 bytes a key of table where the keys
//! themselves take 88 (issue 31). Here the hashes and the keys are two vectors grown one at a
//! time, searched in place while there are at most [`SMALL`]; past that a hash index joins
//! them and they grow as vectors do, so a group of many operations (a client probing a
//! thousand paths) still finds a key at once. Pure.

use foldhash::HashMap;

/// The most keys found by reading the hashes in a row (two cache lines); past this, an index.
const SMALL: usize = 16;

/// Values by `u64` hash, in vectors; see the module's comment.
#[derive(Debug)]
pub(super) struct KeyMap<V> {
    ops: Vec<u64>,
    values: Vec<V>,
    /// Where each hash is in `ops`, once there are more than [`SMALL`].
    index: Option<Box<HashMap<u64, u32>>>,
}

impl<V> Default for KeyMap<V> {
    fn default() -> Self {
        KeyMap {
            ops: Vec::new(),
            values: Vec::new(),
            index: None,
        }
    }
}

impl<V> KeyMap<V> {
    fn position(&self, op: u64) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(&op).map(|&i| i as usize),
            None => self.ops.iter().position(|&o| o == op),
        }
    }

    /// The value of `op`.
    pub(super) fn get(&self, op: &u64) -> Option<&V> {
        self.position(*op).map(|i| &self.values[i])
    }

    /// The value of `op`, to change.
    pub(super) fn get_mut(&mut self, op: &u64) -> Option<&mut V> {
        self.position(*op).map(|i| &mut self.values[i])
    }

    /// Sets the value of `op`.
    pub(super) fn insert(&mut self, op: u64, value: V) {
        if let Some(i) = self.position(op) {
            self.values[i] = value;
            return;
        }
        if self.ops.len() < SMALL {
            // One more key's place, no more: a small group's room is what it holds. The
            // hashes, 8 bytes each, double instead: a group opening its keys one by one
            // then moves its hashes through the allocator 3 times in 8, not 8.
            self.values.reserve_exact(1);
            if self.ops.len() == self.ops.capacity() {
                self.ops.reserve_exact(self.ops.len().max(1));
            }
        }
        self.ops.push(op);
        self.values.push(value);
        let len = self.ops.len();
        if let Some(index) = &mut self.index {
            index.insert(op, (len - 1) as u32);
        } else if len > SMALL {
            let index = self.ops.iter().enumerate().map(|(i, &o)| (o, i as u32));
            self.index = Some(Box::new(index.collect()));
        }
    }

    /// Takes the value of `op` out.
    pub(super) fn remove(&mut self, op: &u64) -> Option<V> {
        let i = self.position(*op)?;
        self.ops.swap_remove(i);
        let value = self.values.swap_remove(i);
        if let Some(index) = &mut self.index {
            index.remove(op);
            if let Some(&moved) = self.ops.get(i) {
                index.insert(moved, i as u32);
            }
        }
        Some(value)
    }

    /// How many values it holds.
    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether it holds none.
    pub(super) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Every (hash, value).
    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &V)> {
        self.ops.iter().zip(&self.values)
    }

    /// Every (hash, value), the values to change.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&u64, &mut V)> {
        self.ops.iter().zip(&mut self.values)
    }

    /// Every value.
    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.values.iter()
    }

    /// Every value, to change.
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.values.iter_mut()
    }
}

impl<V> std::ops::Index<&u64> for KeyMap<V> {
    type Output = V;

    fn index(&self, op: &u64) -> &V {
        self.get(op).expect("a key the map holds")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The map holds what a `BTreeMap` fed the same holds.
    fn same(map: &KeyMap<u64>, model: &BTreeMap<u64, u64>) {
        assert_eq!(map.len(), model.len());
        assert_eq!(map.is_empty(), model.is_empty());
        let mut held: Vec<(u64, u64)> = map.iter().map(|(o, v)| (*o, *v)).collect();
        held.sort_unstable();
        assert_eq!(
            held,
            model.iter().map(|(o, v)| (*o, *v)).collect::<Vec<_>>()
        );
        for (op, v) in model {
            assert_eq!(map.get(op), Some(v), "{op}");
            assert_eq!(map[op], *v);
        }
        assert_eq!(map.values().sum::<u64>(), model.values().sum::<u64>());
    }

    #[test]
    fn it_holds_what_a_map_holds_small_and_indexed_through_inserts_and_removals() {
        let mut map = KeyMap::default();
        let mut model = BTreeMap::new();
        // Spread hashes, some inserted twice, in and out across the index's threshold.
        for round in 0..3u64 {
            for n in 0..40u64 {
                let op = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                map.insert(op, n + round);
                model.insert(op, n + round);
                same(&map, &model);
            }
            for n in (0..40u64).filter(|n| n % 3 != round) {
                let op = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                assert_eq!(map.remove(&op), model.remove(&op));
                assert_eq!(map.remove(&op), None, "gone");
                same(&map, &model);
            }
        }
        for v in map.values_mut() {
            *v += 1;
        }
        for (_, v) in map.iter_mut() {
            *v += 1;
        }
        for v in model.values_mut() {
            *v += 2;
        }
        same(&map, &model);
        assert_eq!(map.get(&12345), None);
        assert_eq!(map.get_mut(&12345), None);
        let ops: Vec<u64> = model.keys().copied().collect();
        for op in ops {
            assert_eq!(map.remove(&op), model.remove(&op));
        }
        assert!(map.is_empty(), "emptied");
        assert_eq!(map.len(), 0);
        same(&map, &model);
    }

    #[test]
    fn a_small_map_takes_the_room_it_holds_and_an_index_only_past_sixteen() {
        let mut map = KeyMap::default();
        for op in 0..SMALL as u64 {
            map.insert(op, op);
            assert_eq!(map.values.capacity(), map.len(), "grown one at a time");
            assert_eq!(
                map.ops.capacity(),
                map.len().next_power_of_two(),
                "the hashes doubled"
            );
        }
        assert!(map.index.is_none());
        map.insert(SMALL as u64, 0);
        assert_eq!(map.index.as_ref().map(|i| i.len()), Some(SMALL + 1));
        assert_eq!(
            map.ops.capacity(),
            2 * SMALL,
            "past SMALL, grown as a vector grows"
        );
        map.insert(3, 33);
        assert_eq!(
            map.len(),
            SMALL + 1,
            "the same hash again replaces its value"
        );
        assert_eq!(map[&3], 33);
    }
}
