//! Small JSON builders every section of the bootstrap uses: a socket address, a duration, a list to append to,
//! and the compact JSON form of the config document that the filter reads (without the fields only the renderer
//! reads). A leaf: the sections import these,
//! and nothing here knows about any section.

use serde_json::{json, Value};

/// Converts a config document (YAML or JSON) to the compact JSON the filter reads: the same document, less the
/// fields only `llmroute render` reads (`llmroute_core::config::RENDER_ONLY_FIELDS`), which the filter refuses.
pub fn config_json(text: &str) -> Result<String, String> {
    let mut value: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?
    };
    llmroute_core::config::strip_render_only(&mut value);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_document_leaves_out_the_renderers_fields_and_the_filter_takes_it() {
        let doc = "version: 1\nlisten: 127.0.0.1:10001\nlisten_tls: { cert_file: /c.pem, key_file: /k.pem }\n\
                   compress_responses: true\nretries: { attempts: 1 }\naccess_log: { path: /tmp/a.json }\n\
                   backends: [{ name: a, kind: vllm, endpoints: ['127.0.0.1:8000'] }]\n\
                   models: [{ name: m, routes: [{ backend: a }] }]\n";
        assert!(llmroute_core::load_document(doc).is_ok());
        assert!(
            llmroute_core::load_config(doc).is_err(),
            "the whole document is not the filter's"
        );
        let embedded = config_json(doc).unwrap();
        let v: Value = serde_json::from_str(&embedded).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["backends", "models", "version"]);
        assert!(llmroute_core::load_config(&embedded).is_ok());
    }
}
