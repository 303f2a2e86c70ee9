//! Small JSON builders every section of the bootstrap uses: a socket address, a duration, a list to append to,
//! and the compact JSON form of the config document that the filter reads. A leaf: the sections import these,
//! and nothing here knows about any section.

use serde_json::{json, Value};

/// Converts a config document (YAML or JSON) to the compact JSON the filter reads.
pub fn config_json(text: &str) -> Result<String, String> {
    let value: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?
    };
    Ok(value.to_string())
}

/// Appends `item` to the JSON list `list`, which becomes a list first if it is not one.
pub(crate) fn push(list: &mut Value, item: Value) {
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(items) = list.as_array_mut() {
        items.push(item);
    }
}

pub(crate) fn socket(address: &str, port: u16) -> Value {
    json!({ "socket_address": { "address": address, "port_value": port } })
}

pub(crate) fn duration_ms(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}
