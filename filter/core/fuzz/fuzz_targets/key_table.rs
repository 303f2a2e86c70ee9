//! Key-table decode: the bytes `filter/src/key_placement.rs` reads from Envoy shared data (the key table, the
//! in-flight counts, the down list), which any worker may have written, then one placement on the decoded table.
//!
//! Input: a selector byte (how many hosts, which are down), eight bytes of key, then the table bytes.
//! Beyond "no panic": a table that decodes re-encodes to the same bytes; placement picks a host that exists and
//! leaves a table that decodes to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llmroute_core::config::BoundedKeys;
use llmroute_core::key_placement::{self, table, Bounds, HostView, KeyTable};

fuzz_target!(|data: &[u8]| {
    let [selector, k0, k1, k2, k3, k4, k5, k6, k7, bytes @ ..] = data else {
        return;
    };
    let selector = *selector;
    let key = u64::from_le_bytes([*k0, *k1, *k2, *k3, *k4, *k5, *k6, *k7]);
    let mut t = KeyTable::decode(bytes);
    if !t.is_empty() {
        assert_eq!(t.encode(), bytes, "a decoded table does not re-encode to its bytes");
    }
    let hosts_n = usize::from(selector % 4) + 1;
    let in_flight = table::decode_host_counts(bytes, hosts_n);
    assert_eq!(in_flight.len(), hosts_n);
    let _ = table::decode_down_hosts(bytes);
    let hosts: Vec<HostView> = (0..hosts_n)
        .map(|i| HostView {
            address: format!("127.0.0.1:{}", 8081 + i),
            up: selector >> (2 + i) & 1 == 0,
            weight: u32::try_from(i).unwrap_or(0) + 1,
            in_flight: in_flight.get(i).copied().unwrap_or(0),
        })
        .collect();
    let _ = key_placement::live_keys(&t, &hosts);
    let now = t
        .entries()
        .iter()
        .map(|e| e.last_ms)
        .max()
        .unwrap_or(0)
        .saturating_add(u64::from(selector) * 10_000);
    let bounds = Bounds::new(&BoundedKeys::default(), 150);
    if let Some(c) = key_placement::choose(&mut t, &hosts, key, now, &bounds) {
        assert!(
            c.host < hosts.len(),
            "placement chose host {} of {}",
            c.host,
            hosts.len()
        );
        if let Some(h) = hosts.get(c.host) {
            let _ = key_placement::session_header_value(&h.address);
        }
    }
    assert_eq!(
        KeyTable::decode(&t.encode()),
        t,
        "placement left a table that does not decode to itself"
    );
});
