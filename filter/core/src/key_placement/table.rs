//! The remembered keys of one backend, and the in-flight counts, as kept in Envoy shared data.
//!
//! Every worker VM reads and writes the same bytes (with compare-and-swap), so the encoding is fixed and
//! little-endian: the table is a version byte, then entries sorted by key, each `key: u64, host: u32,
//! last_ms: u64, flags: u8` (21 bytes; flag bit 0: established, bit 1: shared).
//!
//! The table has two segments, so that a flood of one-off keys (a client looping over random session ids)
//! cannot push out the keys of real tenants. A key enters *on probation*; the second time it is seen it becomes
//! *established*. Established keys may fill at most [`established_cap`] of `max_keys` (the rest is always
//! room for probation); when a promotion would pass that, the least recently seen established key goes back on
//! probation. When the table is over `max_keys`, the least recently seen key *on probation* is forgotten, never
//! an established one. So a key seen once can only ever displace another key seen once: an established key
//! leaves the table only by idling past the TTL, or by being demoted to make room for a newer established key
//! and then aging out of probation.
//!
//! With a placement store, an entry also says whether the key is *shared*: its placement went through etcd (or
//! came from it), or is waiting to be settled with it. A key placed locally and not shared is one the store has
//! not seen: under `share_keys: returning` a first sighting, or a key over the create budget (see
//! [`super::store`]). A host is named by a hash of its address, not by its place in the config, so adding,
//! removing or reordering endpoints leaves every other key where it was. The in-flight counts are one `u32` per endpoint. Anything malformed decodes to an
//! empty table (or zero counts): placement then starts afresh instead of trusting odd bytes.

/// The encoding's version byte.
const VERSION: u8 = 4;
const ESTABLISHED: u8 = 1;
const SHARED: u8 = 2;
const ENTRY_BYTES: usize = 21;

/// How many of `max_keys` established keys may hold: all but a fifth (at least one place), which stays room
/// for keys on probation, so a new tenant has time for its second request before one-off keys push it out.
pub fn established_cap(max_keys: usize) -> usize {
    let max = max_keys.max(1);
    // `max / 5` is below `max` when it is at least 1, and `max` is at least 1: no underflow.
    max.saturating_sub((max / 5).max(1))
}

/// One remembered key: where it lives and when it was last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The affinity key's hash.
    pub key: u64,
    /// The host's id ([`super::host_id`] of its address).
    pub host: u32,
    pub last_ms: u64,
    /// Seen on more than one request: out of reach of keys seen once.
    pub established: bool,
    /// Placed through the placement store (or read from it, or waiting to be settled with it).
    pub shared: bool,
}

/// The remembered keys, sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyTable {
    entries: Vec<Entry>,
}

impl KeyTable {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn get(&self, key: u64) -> Option<Entry> {
        self.find(key).ok().and_then(|i| self.entries.get(i).copied())
    }

    fn find(&self, key: u64) -> Result<usize, usize> {
        self.entries.binary_search_by_key(&key, |e| e.key)
    }

    /// Marks `key` as seen at `now_ms`.
    pub fn touch(&mut self, key: u64, now_ms: u64) {
        if let Ok(i) = self.find(key) {
            if let Some(e) = self.entries.get_mut(i) {
                e.last_ms = now_ms;
            }
        }
    }

    /// Puts `key` on `host` at `now_ms`. A key new to the table enters on probation, not shared; a key it
    /// already had (seen again, and moved) is established, and stays shared if it was. Then the segments are
    /// brought back within `max_keys` (see the module doc); `key` itself is never the one forgotten.
    pub fn insert(&mut self, key: u64, host: u32, now_ms: u64, max_keys: usize) {
        match self.find(key) {
            Ok(i) => {
                if let Some(e) = self.entries.get_mut(i) {
                    *e = Entry {
                        key,
                        host,
                        last_ms: now_ms,
                        established: true,
                        shared: e.shared,
                    };
                }
            }
            Err(i) => self.entries.insert(
                i,
                Entry {
                    key,
                    host,
                    last_ms: now_ms,
                    established: false,
                    shared: false,
                },
            ),
        }
        self.enforce(key, max_keys);
    }

    /// Moves a key the table already has to `host`, keeping its segment and its `last_ms`. True when it moved.
    pub fn set_host(&mut self, key: u64, host: u32) -> bool {
        let Ok(i) = self.find(key) else { return false };
        match self.entries.get_mut(i) {
            Some(e) if e.host != host => {
                e.host = host;
                true
            }
            _ => false,
        }
    }

    /// Marks `key` as shared through the placement store. True when it was not (the table changed).
    pub fn mark_shared(&mut self, key: u64) -> bool {
        let Ok(i) = self.find(key) else { return false };
        match self.entries.get_mut(i) {
            Some(e) if !e.shared => {
                e.shared = true;
                true
            }
            _ => false,
        }
    }

    /// The same table with only its shared keys: what the placement store knows of (see [`super::store`]).
    pub fn shared_only(&self) -> KeyTable {
        KeyTable {
            entries: self.entries.iter().filter(|e| e.shared).copied().collect(),
        }
    }

    /// Marks `key`, seen again at `now_ms`, as established. True when it was on probation (the table changed).
    pub fn promote(&mut self, key: u64, now_ms: u64, max_keys: usize) -> bool {
        let Ok(i) = self.find(key) else { return false };
        let Some(e) = self.entries.get_mut(i) else { return false };
        if e.established {
            return false;
        }
        e.established = true;
        e.last_ms = now_ms;
        self.enforce(key, max_keys);
        true
    }

    /// Keys established, in the table.
    pub fn established(&self) -> usize {
        self.entries.iter().filter(|e| e.established).count()
    }

    /// Demotes the least recently seen established keys past [`established_cap`], then forgets the least recently
    /// seen keys on probation past `max_keys`; `keep` is spared both.
    fn enforce(&mut self, keep: u64, max_keys: usize) {
        let max = max_keys.max(1);
        let mut established = self.established();
        while established > established_cap(max) {
            match self.least_recent(|e| e.established && e.key != keep) {
                Some(i) => {
                    if let Some(e) = self.entries.get_mut(i) {
                        e.established = false;
                    }
                    established = established.saturating_sub(1);
                }
                None => break,
            }
        }
        while self.entries.len() > max {
            // With established keys capped below `max`, a key on probation other than `keep` always exists here;
            // the fallback only serves tables decoded from foreign bytes.
            let victim = self
                .least_recent(|e| !e.established && e.key != keep)
                .or_else(|| self.least_recent(|e| e.key != keep));
            match victim {
                Some(i) => {
                    self.entries.remove(i);
                }
                None => break,
            }
        }
    }

    /// The least recently seen entry that `pick` accepts (ties: the smallest key).
    fn least_recent(&self, pick: impl Fn(&Entry) -> bool) -> Option<usize> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| pick(e))
            .min_by_key(|(_, e)| (e.last_ms, e.key))
            .map(|(i, _)| i)
    }

    /// Forgets keys not seen for `ttl_ms` or more. True if any was forgotten.
    pub fn expire(&mut self, now_ms: u64, ttl_ms: u64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| now_ms.saturating_sub(e.last_ms) < ttl_ms);
        self.entries.len() != before
    }

    /// Live keys per host, for the hosts with these `ids` in that order (keys on other hosts are not counted).
    pub fn counts(&self, ids: &[u32]) -> Vec<u64> {
        let mut counts = vec![0u64; ids.len()];
        for e in &self.entries {
            if let Some(c) = ids.iter().position(|id| *id == e.host).and_then(|i| counts.get_mut(i)) {
                *c = c.saturating_add(1);
            }
        }
        counts
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len().saturating_mul(ENTRY_BYTES).saturating_add(1));
        out.push(VERSION);
        for e in &self.entries {
            out.extend_from_slice(&e.key.to_le_bytes());
            out.extend_from_slice(&e.host.to_le_bytes());
            out.extend_from_slice(&e.last_ms.to_le_bytes());
            let shared = if e.shared { SHARED } else { 0 };
            out.push(u8::from(e.established) | shared);
        }
        out
    }

    /// Reads [`KeyTable::encode`]'s bytes; anything malformed (wrong version, ragged length, unsorted or
    /// repeated keys, a flag byte with a bit other than the two flags) gives an empty table.
    pub fn decode(bytes: &[u8]) -> KeyTable {
        let Some((&VERSION, body)) = bytes.split_first() else {
            return KeyTable::default();
        };
        if body.len() % ENTRY_BYTES != 0 {
            return KeyTable::default();
        }
        let mut entries = Vec::with_capacity(body.len() / ENTRY_BYTES);
        for chunk in body.chunks_exact(ENTRY_BYTES) {
            let (key, rest) = chunk.split_at(8);
            let (host, rest) = rest.split_at(4);
            let (last, flag) = rest.split_at(8);
            let flags = match flag {
                [f] if f & !(ESTABLISHED | SHARED) == 0 => *f,
                _ => return KeyTable::default(),
            };
            let entry = Entry {
                key: u64::from_le_bytes(key.try_into().unwrap_or_default()),
                host: u32::from_le_bytes(host.try_into().unwrap_or_default()),
                last_ms: u64::from_le_bytes(last.try_into().unwrap_or_default()),
                established: flags & ESTABLISHED != 0,
                shared: flags & SHARED != 0,
            };
            if entries.last().is_some_and(|p: &Entry| p.key >= entry.key) {
                return KeyTable::default();
            }
            entries.push(entry);
        }
        KeyTable { entries }
    }
}

/// One count per endpoint of a backend, as kept in shared data: one little-endian `u32` each (requests in
/// flight, configured slots, work in flight in tokens). Missing or ragged bytes read as zeros, resized to `hosts`.
pub fn decode_host_counts(bytes: &[u8], hosts: usize) -> Vec<u32> {
    let mut counts = vec![0u32; hosts];
    if hosts.checked_mul(4) == Some(bytes.len()) {
        for (c, chunk) in counts.iter_mut().zip(bytes.chunks_exact(4)) {
            *c = u32::from_le_bytes(chunk.try_into().unwrap_or_default());
        }
    }
    counts
}

/// Writes counts in the form [`decode_host_counts`] reads.
pub fn encode_host_counts(counts: &[u32]) -> Vec<u8> {
    counts.iter().flat_map(|c| c.to_le_bytes()).collect()
}

/// The hosts of one backend that Envoy would not route to, as the status poll saw them at `taken_at_ms`, in the
/// form the poll stores for placement: the time, a newline, then the `IP:PORT`s separated by commas.
pub fn encode_down_hosts(taken_at_ms: u64, down: &[String]) -> Vec<u8> {
    format!("{taken_at_ms}\n{}", down.join(",")).into_bytes()
}

/// Reads [`encode_down_hosts`]'s bytes: `(taken_at_ms, addresses)`, or `None` when malformed.
pub fn decode_down_hosts(bytes: &[u8]) -> Option<(u64, Vec<String>)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (at, list) = text.split_once('\n')?;
    let down = list.split(',').filter(|a| !a.is_empty()).map(str::to_string).collect();
    Some((at.parse().ok()?, down))
}
