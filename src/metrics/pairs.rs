//! The (client, interface) pairs: each pair's counters as plain atomics, the label caps
//! that admit its names, the expiry of the pairs no attempt was counted for in
//! `series_ttl`, and the collector that makes their series when `/metrics` is written.
//!
//! Edge (the registry's locks and atomics); see the module above for why a pair's counters
//! are not `prometheus` counters.

use super::{Metrics, PairFigures, OVERFLOW};
use crate::classify::Kind;
use crate::openmetrics::Exemplar;
use crate::tracker::Violation;
use foldhash::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// The counters of one (client, interface) pair: plain atomics, read at scrape time by
/// [`PairFamilies`]. A series appears once its count is above zero, as a counter created at
/// its first increment would.
pub(super) struct Pair {
    /// Its id: slot and generation.
    pub(super) id: u32,
    /// Its key in [`Names::pairs`] (hashes, 0 for an overflowed name).
    pub(super) key: (u64, u64),
    pub(super) client: Arc<str>,
    pub(super) interface: Arc<str>,
    /// The coarse clock (seconds) when an attempt of it was last counted.
    pub(super) last_seen: AtomicU64,
    pub(super) attempts: [AtomicU64; Kind::ALL.len()],
    pub(super) violations: [AtomicU64; Violation::ALL.len()],
    pub(super) discovery_reads: AtomicU64,
    pub(super) honored: AtomicU64,
    /// The coarse clock when it last committed a violation (0: never).
    pub(super) last_violation: AtomicU64,
    /// The latest attempt counted in each of its series that carry one (a violation, or a
    /// kind of class `refusal`), for OpenMetrics' exemplars: only the series that have one,
    /// so a pair that never refused costs an empty vector.
    pub(super) exemplars: Mutex<Vec<(Series, Exemplar)>>,
}

/// A series of a pair that carries an exemplar: of `refusal_gate_violations_total`, or of
/// `refusal_gate_attempts_total` (a kind of class `refusal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Series {
    Violation(Violation),
    Attempts(Kind),
}

impl Pair {
    /// Notes `exemplar` as the latest attempt counted in `series`.
    pub(super) fn exemplar(&self, series: Series, exemplar: Exemplar) {
        let mut kept = self
            .exemplars
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match kept.iter_mut().find(|(s, _)| *s == series) {
            Some((_, e)) => *e = exemplar,
            None => {
                // A place for each series seen, no more: most pairs have one or two.
                kept.reserve_exact(1);
                kept.push((series, exemplar));
            }
        }
    }
}

/// Bits of a pair id that name its slot; the rest is the slot's generation.
pub(super) const SLOT_BITS: u32 = 24;

/// A place for a pair; its generation grows each time its pair expires.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) generation: u32,
    pub(super) pair: Option<Arc<Pair>>,
}

/// Which pair each (client, interface) hash has, and each admitted name's copy and how many
/// live pairs use it (a name's place under its cap is freed when the last one expires).
#[derive(Default)]
pub(super) struct Names {
    pub(super) pairs: HashMap<(u64, u64), u32>,
    pub(super) clients: HashMap<u64, Name>,
    pub(super) interfaces: HashMap<u64, Name>,
    /// Slots of expired pairs, to reuse.
    pub(super) free: Vec<u32>,
}

/// An admitted client or interface name: the one copy its pairs' series share, and how many
/// live pairs hold it.
pub(super) struct Name {
    pub(super) text: Arc<str>,
    pub(super) pairs: u32,
    /// A client's: its pairs whose interface was admitted too, as (interface hash, id), for
    /// [`Metrics::client_pairs`]. Empty for an interface.
    pub(super) own: Vec<(u64, u32)>,
}

/// The families of the (client, interface) pairs — `refusal_gate_attempts_total`,
/// `refusal_gate_violations_total`, `refusal_gate_discovery_reads_total` and
/// `refusal_gate_refusals_honored_total` — collected at scrape time from the pairs' atomics.
/// A counter of the `prometheus` crate is an object of its own, with its own copy of its
/// description and label pairs (some 500 bytes; 290 MiB at 10,000 clients each its own
/// series); a pair's counters here are 16 words in the pair, and a series is one only while
/// `/metrics` is written.
pub(super) struct PairFamilies {
    pairs: Arc<RwLock<Vec<Slot>>>,
    /// Attempts, violations, discovery reads, honored refusals.
    descs: [prometheus::core::Desc; 4],
}

impl PairFamilies {
    pub(super) fn new(pairs: Arc<RwLock<Vec<Slot>>>) -> PairFamilies {
        let desc = |name: &str, help: &str, labels: &[&str]| {
            prometheus::core::Desc::new(
                name.to_owned(),
                help.to_owned(),
                labels.iter().map(|l| (*l).to_owned()).collect(),
                std::collections::HashMap::new(),
            )
            .expect("metric names are valid")
        };
        PairFamilies {
            pairs,
            descs: [
                desc(
                    "refusal_gate_attempts_total",
                    "Client attempts, by class and kind of the decision table.",
                    &["client", "interface", "class", "kind"],
                ),
                desc(
                    "refusal_gate_violations_total",
                    "Attempts a client following the decision boundary would not have sent, and probes.",
                    &["client", "interface", "violation"],
                ),
                desc(
                    "refusal_gate_discovery_reads_total",
                    "Successful reads of an interface's discovery document.",
                    &["client", "interface"],
                ),
                desc(
                    "refusal_gate_refusals_honored_total",
                    "Refusals not retried within probe_window.",
                    &["client", "interface"],
                ),
            ],
        }
    }
}

/// One counter sample of a pair: `client`, `interface` and the `extra` labels, sorted by
/// name as the `prometheus` crate sorts a series' labels.
fn pair_sample(p: &Pair, extra: &[(&str, &str)], value: u64) -> prometheus::proto::Metric {
    let label = |name: &str, value: &str| {
        let mut l = prometheus::proto::LabelPair::default();
        l.set_name(name.to_owned());
        l.set_value(value.to_owned());
        l
    };
    let mut labels: Vec<_> = [("client", &*p.client), ("interface", &*p.interface)]
        .into_iter()
        .chain(extra.iter().copied())
        .map(|(n, v)| label(n, v))
        .collect();
    labels.sort_by(|a, b| a.name().cmp(b.name()));
    let mut counter = prometheus::proto::Counter::default();
    counter.set_value(value as f64);
    let mut m = prometheus::proto::Metric::from_label(labels);
    m.set_counter(counter);
    m
}

impl prometheus::core::Collector for PairFamilies {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families: [Vec<prometheus::proto::Metric>; 4] = Default::default();
        let pairs = self.pairs.read().unwrap_or_else(PoisonError::into_inner);
        for p in pairs.iter().filter_map(|slot| slot.pair.as_deref()) {
            let mut sample = |family: usize, extra: &[(&str, &str)], count: &AtomicU64| {
                let value = count.load(Ordering::Relaxed);
                if value > 0 {
                    families[family].push(pair_sample(p, extra, value));
                }
            };
            for kind in Kind::ALL {
                let extra = [("class", kind.class().as_str()), ("kind", kind.as_str())];
                sample(0, &extra, &p.attempts[kind as usize]);
            }
            for v in Violation::ALL {
                sample(1, &[("violation", v.as_str())], &p.violations[v as usize]);
            }
            sample(2, &[], &p.discovery_reads);
            sample(3, &[], &p.honored);
        }
        drop(pairs);
        self.descs
            .iter()
            .zip(families)
            // (A family with no series is left out by the registry.)
            .map(|(desc, metrics)| {
                let mut family = prometheus::proto::MetricFamily::default();
                family.set_name(desc.fq_name.clone());
                family.set_help(desc.help.clone());
                family.set_field_type(prometheus::proto::MetricType::COUNTER);
                family.set_metric(metrics);
                family
            })
            .collect()
    }
}

impl Metrics {
    /// The id of the (client, interface) pair, by the hashes of their names; the names are
    /// copied only the first time. Applies the label caps: a name past its cap shares the
    /// `__overflow__` pair, and is admitted later if a place frees up.
    pub fn labels(
        &self,
        client_hash: u64,
        client: &str,
        interface_hash: u64,
        interface: &str,
    ) -> u32 {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = names.pairs.get(&(client_hash, interface_hash)) {
            return *id;
        }
        let admit = |set: &HashMap<u64, Name>, hash: u64, cap: usize, label: &str| {
            let ok = set.contains_key(&hash) || set.len() < cap;
            if !ok {
                self.label_overflow.with_label_values(&[label]).inc();
            }
            ok
        };
        let client_ok = admit(
            &names.clients,
            client_hash,
            self.config.max_clients,
            "client",
        );
        let interface_ok = admit(
            &names.interfaces,
            interface_hash,
            self.config.max_interfaces,
            "interface",
        );
        // Overflowed names share the pair of their overflow value and are not remembered
        // one by one, so a flood of new names costs no memory.
        let key = (
            if client_ok { client_hash } else { 0 },
            if interface_ok { interface_hash } else { 0 },
        );
        if let Some(id) = names.pairs.get(&key) {
            return *id;
        }
        // The pairs are capped too: names each under their caps still make their product.
        let (key, client_ok, interface_ok) = if names.pairs.len() >= self.config.max_series {
            self.label_overflow.with_label_values(&["series"]).inc();
            if let Some(id) = names.pairs.get(&(0, 0)) {
                return *id;
            }
            ((0, 0), false, false)
        } else {
            (key, client_ok, interface_ok)
        };
        // A name is copied once however many pairs hold it (a client calls many interfaces).
        let hold = |set: &mut HashMap<u64, Name>, ok: bool, hash: u64, text: &str| {
            if !ok {
                return Arc::from(OVERFLOW);
            }
            let name = set.entry(hash).or_insert_with(|| Name {
                text: Arc::from(text),
                pairs: 0,
                own: Vec::new(),
            });
            name.pairs += 1;
            Arc::clone(&name.text)
        };
        let client = hold(&mut names.clients, client_ok, client_hash, client);
        let interface = hold(
            &mut names.interfaces,
            interface_ok,
            interface_hash,
            interface,
        );
        let mut pairs = self.pairs.write().unwrap_or_else(PoisonError::into_inner);
        let slot = names.free.pop().unwrap_or_else(|| {
            pairs.push(Slot::default());
            u32::try_from(pairs.len() - 1).unwrap_or(u32::MAX)
        });
        let place = &mut pairs[slot as usize];
        let id = slot | (place.generation << SLOT_BITS);
        place.pair = Some(Arc::new(Pair {
            id,
            key,
            client,
            interface,
            last_seen: AtomicU64::new(self.clock.load(Ordering::Relaxed)),
            attempts: Default::default(),
            violations: Default::default(),
            discovery_reads: AtomicU64::new(0),
            honored: AtomicU64::new(0),
            last_violation: AtomicU64::new(0),
            exemplars: Mutex::new(Vec::new()),
        }));
        names.pairs.insert(key, id);
        if client_ok && interface_ok {
            if let Some(name) = names.clients.get_mut(&key.0) {
                name.own.push((key.1, id));
            }
        }
        id
    }

    /// Copies into `into` what [`Metrics::labels`] answers now for the pairs of the client
    /// whose name hashes to `client_hash`, as (interface hash, id), up to its length; returns
    /// how many. One lookup for the client rather than one a pair: at 100,000 pairs each is a
    /// cache miss (issue 66). Pairs of an overflowed name are left out: asked for one by one,
    /// each is counted in `refusal_gate_label_overflow_total`, and admitted once a place frees.
    pub fn client_pairs(&self, client_hash: u64, into: &mut [(u64, u32)]) -> usize {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        let own = names
            .clients
            .get(&client_hash)
            .map_or(&[][..], |n| &n.own[..]);
        let n = own.len().min(into.len());
        into[..n].copy_from_slice(&own[..n]);
        n
    }

    pub(super) fn pair(&self, id: u32) -> Option<Arc<Pair>> {
        self.pairs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get((id & ((1 << SLOT_BITS) - 1)) as usize)
            .and_then(|slot| slot.pair.as_ref())
            .filter(|p| p.id == id)
            .cloned()
    }

    /// Advances the coarse clock pairs are stamped with (Unix seconds).
    fn tick(&self, now_secs: u64) {
        self.clock.store(now_secs, Ordering::Relaxed);
    }

    /// The periodic sweep at `now_secs` (Unix seconds): advances the clock and expires the
    /// pairs with no attempt counted for `series_ttl` (when it is not 0). Returns how many
    /// expired.
    pub fn sweep(&self, now_secs: u64) -> usize {
        self.tick(now_secs);
        let ttl = self.config.series_ttl.as_secs();
        if self.config.series_ttl.is_zero() {
            return 0;
        }
        self.expire_series(ttl.max(1))
    }

    /// Expires the pairs with no attempt counted for `ttl` seconds: removes their series,
    /// frees their names' places under the caps and their ids. Returns how many expired.
    fn expire_series(&self, ttl: u64) -> usize {
        let now = self.clock.load(Ordering::Relaxed);
        let mut guard = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        let names = &mut *guard;
        let mut pairs = self.pairs.write().unwrap_or_else(PoisonError::into_inner);
        let mut expired = 0;
        for (slot, place) in pairs.iter_mut().enumerate() {
            let Some(p) = place.pair.as_ref() else {
                continue;
            };
            if p.last_seen.load(Ordering::Relaxed).saturating_add(ttl) > now {
                continue;
            }
            // Its series leave `/metrics` with it (see PairFamilies).
            let p = Arc::clone(p);
            names.pairs.remove(&p.key);
            if let Some(client) = names.clients.get_mut(&p.key.0) {
                client.own.retain(|&(_, id)| id != p.id);
            }
            for (set, hash) in [
                (&mut names.clients, p.key.0),
                (&mut names.interfaces, p.key.1),
            ] {
                if let Some(n) = set.get_mut(&hash) {
                    n.pairs -= 1;
                    if n.pairs == 0 {
                        set.remove(&hash);
                    }
                }
            }
            // The next pair in this slot has a new id: a stale id finds nothing.
            place.pair = None;
            place.generation = (place.generation + 1) & ((1 << (32 - SLOT_BITS)) - 1);
            names.free.push(u32::try_from(slot).unwrap_or(u32::MAX));
            expired += 1;
        }
        self.series_expired.inc_by(expired as u64);
        expired
    }

    /// What every live (client, interface) pair has counted: the console's fleet.
    pub fn fleet(&self) -> Vec<PairFigures> {
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.pairs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|slot| slot.pair.as_ref())
            .map(|p| PairFigures {
                labels: p.id,
                client: Arc::clone(&p.client),
                interface: Arc::clone(&p.interface),
                attempts: std::array::from_fn(|k| count(&p.attempts[k])),
                violations: std::array::from_fn(|v| count(&p.violations[v])),
                reads: count(&p.discovery_reads),
                honored: count(&p.honored),
                last_seen: p.last_seen.load(Ordering::Relaxed),
                last_violation: p.last_violation.load(Ordering::Relaxed),
                last_violation_trace: p
                    .exemplars
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .filter(|(s, _)| matches!(s, Series::Violation(_)))
                    .max_by_key(|(_, e)| e.at)
                    .map(|(_, e)| e.trace_id),
            })
            .collect()
    }

    /// The most bytes one (client, interface) pair can add to `/metrics` with label values of
    /// at most `max_label_bytes`: one line for each kind of attempt and each violation, one
    /// for discovery reads and one for honored refusals, every label value as long as it may
    /// be with each of its bytes escaped to two (`\\`, `\"`), every count 20 digits long. With
    /// the default caps (128 bytes, 10,000 pairs and the overflow pair) `/metrics` is at most
    /// 10,001 times this (10,522 bytes): 105.2 MB (100.4 MiB), and the other families' few
    /// kilobytes.
    pub fn max_pair_bytes(max_label_bytes: usize) -> usize {
        // `name{client="…",interface="…"` and ` 18446744073709551615\n`.
        let line = |name: &str| name.len() + r#"{client="",interface=""} "#.len() + 20 + 1;
        let values = 2 * 2 * max_label_bytes;
        let attempts: usize = Kind::ALL
            .iter()
            .map(|k| {
                let (class, kind) = (k.class().as_str(), k.as_str());
                let extra = format!(",class=\"{class}\",kind=\"{kind}\"");
                line("refusal_gate_attempts_total") + extra.len() + values
            })
            .sum();
        let violations: usize = Violation::ALL
            .iter()
            .map(|v| {
                let extra = format!(",violation=\"{}\"", v.as_str());
                line("refusal_gate_violations_total") + extra.len() + values
            })
            .sum();
        attempts
            + violations
            + line("refusal_gate_discovery_reads_total")
            + values
            + line("refusal_gate_refusals_honored_total")
            + values
    }

    /// The (client, interface) label values of a pair id.
    pub fn label_names(&self, id: u32) -> Option<(Arc<str>, Arc<str>)> {
        self.pair(id)
            .map(|p| (p.client.clone(), p.interface.clone()))
    }
}
