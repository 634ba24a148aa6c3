//! The classical cache policies the row cache is compared with, replayed on a trace of lookup
//! batches as a lookup uses a cache ([`belady::replay`]: every id looked up, then the distinct
//! misses inserted), each holding at most `capacity` rows. A replay reads nothing; it is the
//! peer column of `bench-io --trace` and `lab/examples/cache_policies`.
//!
//! - [`Policy::Lru`]: least recently used.
//! - [`Policy::Arc`]: Megiddo and Modha's adaptive replacement cache (FAST 2003): recency and
//!   frequency lists with ghosts of each, the split between them learned.
//! - [`Policy::WTinyLfu`]: Einziger, Friedman and Manes' W-TinyLFU (2017), as Caffeine ships it:
//!   a 1% LRU window, a segmented LRU main (20% probation, 80% protected), admission to the main
//!   part by a count-min sketch (4 counters of 4 bits a key, 8 a cached row... here one byte
//!   each, saturating at 15, all halved every 10 x the capacity's requests).
//! - [`Policy::ExactLfu`]: LFU on exact counts of every request since the trace began, no aging,
//!   and a row no more frequent than the least frequent held bypasses the cache: what a perfect
//!   frequency memory gives (not shippable: a count per row ever seen).
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use super::belady::{HitCount, replay};
use super::sketch::FrequencySketch;

/// A policy the row cache is measured against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    Lru,
    Arc,
    WTinyLfu,
    ExactLfu,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Policy::Lru, Policy::Arc, Policy::WTinyLfu, Policy::ExactLfu];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Arc => "arc",
            Policy::WTinyLfu => "w-tinylfu",
            Policy::ExactLfu => "lfu-exact",
        }
    }

    /// The hit count of this policy with room for `capacity` rows on `batches`, counting
    /// batches `counted_from..`.
    pub fn replay(self, batches: &[Vec<i64>], capacity: usize, counted_from: usize) -> HitCount {
        match self {
            Policy::Lru => {
                let c = RefCell::new(Lru::new(capacity));
                replay(
                    batches,
                    counted_from,
                    |id| c.borrow_mut().get(id),
                    |id| c.borrow_mut().insert(id),
                )
            }
            Policy::Arc => {
                let c = RefCell::new(Arc::new(capacity));
                replay(
                    batches,
                    counted_from,
                    |id| c.borrow_mut().get(id),
                    |id| c.borrow_mut().insert(id),
                )
            }
            Policy::WTinyLfu => {
                let c = RefCell::new(WTinyLfu::new(capacity));
                replay(
                    batches,
                    counted_from,
                    |id| c.borrow_mut().get(id),
                    |id| c.borrow_mut().insert(id),
                )
            }
            Policy::ExactLfu => {
                let c = RefCell::new(ExactLfu::new(capacity));
                replay(
                    batches,
                    counted_from,
                    |id| c.borrow_mut().get(id),
                    |id| c.borrow_mut().insert(id),
                )
            }
        }
    }
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    key: i64,
    prev: u32,
    next: u32,
    list: u8,
}

/// Doubly linked lists over one slab of nodes; each list's head is its most recent end.
struct Lists {
    nodes: Vec<Node>,
    free: Vec<u32>,
    head: Vec<u32>,
    tail: Vec<u32>,
    len: Vec<usize>,
}

impl Lists {
    fn new(lists: usize) -> Self {
        Lists {
            nodes: Vec::new(),
            free: Vec::new(),
            head: vec![NIL; lists],
            tail: vec![NIL; lists],
            len: vec![0; lists],
        }
    }

    fn alloc(&mut self, key: i64) -> u32 {
        let n = Node {
            key,
            prev: NIL,
            next: NIL,
            list: u8::MAX,
        };
        match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = n;
                i
            }
            None => {
                self.nodes.push(n);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn key(&self, i: u32) -> i64 {
        self.nodes[i as usize].key
    }

    fn list(&self, i: u32) -> usize {
        usize::from(self.nodes[i as usize].list)
    }

    fn unlink(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        let l = usize::from(n.list);
        if n.prev == NIL {
            self.head[l] = n.next;
        } else {
            self.nodes[n.prev as usize].next = n.next;
        }
        if n.next == NIL {
            self.tail[l] = n.prev;
        } else {
            self.nodes[n.next as usize].prev = n.prev;
        }
        self.len[l] -= 1;
        self.nodes[i as usize].list = u8::MAX;
    }

    /// Puts `i` at the most recent end of list `l`.
    fn push(&mut self, l: usize, i: u32) {
        let h = self.head[l];
        let n = &mut self.nodes[i as usize];
        n.prev = NIL;
        n.next = h;
        n.list = l as u8;
        if h == NIL {
            self.tail[l] = i;
        } else {
            self.nodes[h as usize].prev = i;
        }
        self.head[l] = i;
        self.len[l] += 1;
    }

    fn move_to(&mut self, l: usize, i: u32) {
        self.unlink(i);
        self.push(l, i);
    }

    /// The least recent node of list `l`.
    fn oldest(&self, l: usize) -> Option<u32> {
        let t = self.tail[l];
        (t != NIL).then_some(t)
    }

    fn release(&mut self, i: u32) {
        self.free.push(i);
    }
}

struct Lru {
    capacity: usize,
    at: HashMap<i64, u32>,
    lists: Lists,
}

impl Lru {
    fn new(capacity: usize) -> Self {
        Lru {
            capacity,
            at: HashMap::new(),
            lists: Lists::new(1),
        }
    }

    fn get(&mut self, id: i64) -> bool {
        let Some(&i) = self.at.get(&id) else {
            return false;
        };
        self.lists.move_to(0, i);
        true
    }

    fn insert(&mut self, id: i64) {
        if self.capacity == 0 || self.at.contains_key(&id) {
            return;
        }
        if self.at.len() >= self.capacity
            && let Some(v) = self.lists.oldest(0)
        {
            self.lists.unlink(v);
            self.at.remove(&self.lists.key(v));
            self.lists.release(v);
        }
        let i = self.lists.alloc(id);
        self.lists.push(0, i);
        self.at.insert(id, i);
    }
}

/// ARC's lists: resident recent and frequent, ghosts of each.
const T1: usize = 0;
const T2: usize = 1;
const B1: usize = 2;
const B2: usize = 3;

struct Arc {
    capacity: usize,
    /// The target size of T1.
    p: usize,
    at: HashMap<i64, u32>,
    lists: Lists,
}

impl Arc {
    fn new(capacity: usize) -> Self {
        Arc {
            capacity,
            p: 0,
            at: HashMap::new(),
            lists: Lists::new(4),
        }
    }

    fn get(&mut self, id: i64) -> bool {
        match self.at.get(&id) {
            Some(&i) if self.lists.list(i) <= T2 => {
                self.lists.move_to(T2, i);
                true
            }
            _ => false,
        }
    }

    /// Moves the oldest of T1 or T2 to its ghost list (ARC's REPLACE).
    fn replace(&mut self, hit_in_b2: bool) {
        let t1 = self.lists.len[T1];
        let from = if t1 > 0 && (t1 > self.p || (hit_in_b2 && t1 == self.p)) {
            T1
        } else {
            T2
        };
        let from = if self.lists.len[from] == 0 {
            T1 + T2 - from
        } else {
            from
        };
        if let Some(v) = self.lists.oldest(from) {
            self.lists.move_to(from + 2, v);
        }
    }

    fn drop_oldest(&mut self, l: usize) {
        if let Some(v) = self.lists.oldest(l) {
            self.lists.unlink(v);
            self.at.remove(&self.lists.key(v));
            self.lists.release(v);
        }
    }

    fn insert(&mut self, id: i64) {
        let c = self.capacity;
        if c == 0 {
            return;
        }
        if let Some(&i) = self.at.get(&id) {
            let (b1, b2) = (self.lists.len[B1].max(1), self.lists.len[B2].max(1));
            match self.lists.list(i) {
                B1 => {
                    self.p = (self.p + (b2 / b1).max(1)).min(c);
                    self.replace(false);
                    self.lists.move_to(T2, i);
                }
                B2 => {
                    self.p = self.p.saturating_sub((b1 / b2).max(1));
                    self.replace(true);
                    self.lists.move_to(T2, i);
                }
                _ => {}
            }
            return;
        }
        let l1 = self.lists.len[T1] + self.lists.len[B1];
        if l1 >= c {
            if self.lists.len[T1] < c {
                self.drop_oldest(B1);
                self.replace(false);
            } else {
                self.drop_oldest(T1);
            }
        } else {
            let all = l1 + self.lists.len[T2] + self.lists.len[B2];
            if all >= c {
                if all >= 2 * c {
                    self.drop_oldest(B2);
                }
                self.replace(false);
            }
        }
        let i = self.lists.alloc(id);
        self.lists.push(T1, i);
        self.at.insert(id, i);
    }
}

/// W-TinyLFU's lists: the window, the main part's probation and protected segments.
const WINDOW: usize = 0;
const PROBATION: usize = 1;
const PROTECTED: usize = 2;
/// A 4-bit counter's ceiling.
const COUNT_MAX: u8 = 15;

struct WTinyLfu {
    capacity: usize,
    window: usize,
    protected: usize,
    at: HashMap<i64, u32>,
    lists: Lists,
    sketch: FrequencySketch,
}

impl WTinyLfu {
    fn new(capacity: usize) -> Self {
        let window = (capacity / 100).max(1).min(capacity);
        let main = capacity - window;
        WTinyLfu {
            capacity,
            window,
            protected: main * 4 / 5,
            at: HashMap::new(),
            lists: Lists::new(3),
            sketch: FrequencySketch::new(capacity.max(1) * 8, capacity.max(1) as u64 * 10),
        }
    }

    fn estimate(&self, key: i64) -> u8 {
        self.sketch.estimate(key as u64).min(COUNT_MAX)
    }

    fn get(&mut self, id: i64) -> bool {
        if self.estimate(id) < COUNT_MAX {
            self.sketch.record(id as u64);
        }
        self.sketch.advance(1);
        let Some(&i) = self.at.get(&id) else {
            return false;
        };
        match self.lists.list(i) {
            WINDOW => self.lists.move_to(WINDOW, i),
            PROBATION => {
                self.lists.move_to(PROTECTED, i);
                if self.lists.len[PROTECTED] > self.protected
                    && let Some(v) = self.lists.oldest(PROTECTED)
                {
                    self.lists.move_to(PROBATION, v);
                }
            }
            _ => self.lists.move_to(PROTECTED, i),
        }
        true
    }

    fn evict(&mut self, v: u32) {
        self.lists.unlink(v);
        self.at.remove(&self.lists.key(v));
        self.lists.release(v);
    }

    fn insert(&mut self, id: i64) {
        if self.capacity == 0 || self.at.contains_key(&id) {
            return;
        }
        let i = self.lists.alloc(id);
        self.lists.push(WINDOW, i);
        self.at.insert(id, i);
        if self.lists.len[WINDOW] <= self.window {
            return;
        }
        let Some(candidate) = self.lists.oldest(WINDOW) else {
            return;
        };
        self.lists.move_to(PROBATION, candidate);
        if self.at.len() <= self.capacity {
            return;
        }
        let victim = self
            .lists
            .oldest(PROBATION)
            .filter(|&v| v != candidate)
            .or_else(|| self.lists.oldest(PROTECTED));
        let Some(victim) = victim else {
            self.evict(candidate);
            return;
        };
        // The candidate enters the main part only if the sketch says it is asked for more
        // often than the row it would displace.
        if self.estimate(self.lists.key(candidate)) > self.estimate(self.lists.key(victim)) {
            self.evict(victim);
        } else {
            self.evict(candidate);
        }
    }
}

struct ExactLfu {
    capacity: usize,
    count: HashMap<i64, u32>,
    held: HashMap<i64, (u32, u64)>,
    order: BTreeSet<(u32, u64, i64)>,
    clock: u64,
}

impl ExactLfu {
    fn new(capacity: usize) -> Self {
        ExactLfu {
            capacity,
            count: HashMap::new(),
            held: HashMap::new(),
            order: BTreeSet::new(),
            clock: 0,
        }
    }

    fn get(&mut self, id: i64) -> bool {
        self.clock += 1;
        let n = self.count.entry(id).or_insert(0);
        *n += 1;
        let (n, clock) = (*n, self.clock);
        let Some(key) = self.held.get_mut(&id) else {
            return false;
        };
        self.order.remove(&(key.0, key.1, id));
        *key = (n, clock);
        self.order.insert((n, clock, id));
        true
    }

    fn insert(&mut self, id: i64) {
        if self.capacity == 0 || self.held.contains_key(&id) {
            return;
        }
        let n = self.count.get(&id).copied().unwrap_or(0);
        if self.held.len() >= self.capacity {
            match self.order.first().copied() {
                Some((least, _, victim)) if n > least => {
                    self.order.pop_first();
                    self.held.remove(&victim);
                }
                _ => return,
            }
        }
        self.held.insert(id, (n, self.clock));
        self.order.insert((n, self.clock, id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::belady::belady;

    fn one_per_batch(ids: &[i64]) -> Vec<Vec<i64>> {
        ids.iter().map(|&x| vec![x]).collect()
    }

    #[test]
    fn lru_evicts_the_least_recent() {
        // Capacity 2: 1 2 1 3 (evicts 2) 1 (hit) 2 (miss).
        let t = one_per_batch(&[1, 2, 1, 3, 1, 2]);
        assert_eq!(Policy::Lru.replay(&t, 2, 0).hits, 2);
    }

    #[test]
    fn lfu_keeps_the_frequent_and_bypasses_the_rare() {
        // Capacity 1: 1 1 1 then 2 (count 1, not above 1's 3: bypassed) then 1 hits.
        let t = one_per_batch(&[1, 1, 1, 2, 1]);
        assert_eq!(Policy::ExactLfu.replay(&t, 1, 0).hits, 3);
    }

    #[test]
    fn arc_survives_a_scan() {
        // A hot pair asked twice, then a scan of new rows, then the pair again: ARC keeps the
        // pair in T2 while the scan passes through T1; LRU loses it.
        let mut ids = vec![1, 2, 1, 2];
        ids.extend(10..20);
        ids.extend([1, 2]);
        let t = one_per_batch(&ids);
        let arc = Policy::Arc.replay(&t, 4, 0).hits;
        assert!(arc > Policy::Lru.replay(&t, 4, 0).hits);
        assert_eq!(arc, 4);
    }

    #[test]
    fn no_policy_beats_belady_and_none_holds_more_than_its_capacity() {
        use rand::rngs::SmallRng;
        use rand::{RngExt, SeedableRng};
        let mut rng = SmallRng::seed_from_u64(5);
        for _ in 0..20 {
            let t: Vec<Vec<i64>> = (0..300)
                .map(|_| (0..4).map(|_| rng.random_range(0..40)).collect())
                .collect();
            let cap = rng.random_range(1..20usize);
            let opt = belady(&t, cap, 100).hits;
            for p in Policy::ALL {
                assert!(p.replay(&t, cap, 100).hits <= opt, "{p:?} beat Belady");
            }
            // Zero capacity never hits.
            for p in Policy::ALL {
                assert_eq!(p.replay(&t, 0, 0).hits, 0, "{p:?}");
            }
        }
    }
}
