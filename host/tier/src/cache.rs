//! A bounded least-recently-used map for the catalog's caches (opened files, loaded block
//! lists). Each entry has a weight; past the capacity the least recently used entries go until a
//! quarter of it is free again, so eviction costs O(1) per insert amortized.

use std::collections::HashMap;
use std::hash::Hash;

#[derive(Debug)]
pub struct Lru<K, V> {
    map: HashMap<K, (V, u64, usize)>,
    tick: u64,
    weight: usize,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Lru<K, V> {
    /// A cache holding entries of total weight up to `capacity` (at least 1).
    pub fn new(capacity: usize) -> Lru<K, V> {
        Lru { map: HashMap::new(), tick: 0, weight: 0, capacity: capacity.max(1) }
    }

    /// The entry of `key`, marked as used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(key).map(|e| {
            e.1 = tick;
            e.0.clone()
        })
    }

    /// Stores `value` under `key` with `weight`, evicting old entries past the capacity.
    pub fn insert(&mut self, key: K, value: V, weight: usize) {
        self.tick += 1;
        if let Some((_, _, w)) = self.map.insert(key, (value, self.tick, weight)) {
            self.weight -= w;
        }
        self.weight += weight;
        if self.weight > self.capacity {
            let mut ages: Vec<(u64, K)> = self.map.iter().map(|(k, e)| (e.1, k.clone())).collect();
            ages.sort_unstable_by_key(|a| a.0);
            let target = self.capacity - self.capacity / 4;
            for (_, k) in ages {
                if self.weight <= target {
                    break;
                }
                if let Some((_, _, w)) = self.map.remove(&k) {
                    self.weight -= w;
                }
            }
        }
    }

    /// Drops the entries `keep` rejects.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let mut freed = 0;
        self.map.retain(|k, e| {
            let kept = keep(k);
            if !kept {
                freed += e.2;
            }
            kept
        });
        self.weight -= freed;
    }

    /// Entries held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = Lru::new(4);
        for k in 0..4 {
            c.insert(k, k * 10, 1);
        }
        assert_eq!(c.get(&0), Some(0));
        c.insert(4, 40, 1);
        // Over capacity: evicted down to 3, oldest first (1 and 2), keeping 0 (used) and 3, 4.
        assert_eq!(c.len(), 3);
        assert_eq!((c.get(&1), c.get(&2)), (None, None));
        assert_eq!((c.get(&0), c.get(&3), c.get(&4)), (Some(0), Some(30), Some(40)));
        c.retain(|k| *k != 3);
        assert_eq!(c.len(), 2);
        c.insert(0, 1, 2);
        assert_eq!(c.get(&0), Some(1));
    }
}
