//! A lease in shared data, so that one root context among all the workers' VMs runs each periodic job (the status
//! poll, the `/props` check) per interval. The value is the time the job was last claimed, 8 bytes little-endian
//! milliseconds; a claim is a compare-and-swap on it, so two workers that see the same due job cannot both win.

use crate::host::Envoy;

/// Claims the job stored under `key` at `now` if `due(last, now)` says it is due and no other root context claimed
/// it first. A missing or malformed value counts as never claimed.
pub fn claim(envoy: &Envoy, key: &str, now: u64, due: impl Fn(u64, u64) -> bool) -> bool {
    let (value, cas) = envoy.shared_data(key);
    let last = value
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map_or(0, u64::from_le_bytes);
    due(last, now) && envoy.set_shared_data(key, &now.to_le_bytes(), cas)
}
