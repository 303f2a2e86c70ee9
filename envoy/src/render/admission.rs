//! What admission needs from Envoy: the API keys' variable, visible inside the Wasm VM.
//!
//! Envoy gives a VM none of its own environment unless the plugin's `vm_config.environment_variables` lists the
//! names in `host_env_keys`; the filter then reads the keys with `std::env::var` (WASI `environ_get`). Only the
//! variable's *name* is rendered, never its value.

use serde_json::{json, Value};

/// The variable `auth.keys_env` names in a plugin configuration (the JSON form of llmroute.yaml), if any.
pub fn keys_env(plugin_config: &str) -> Option<String> {
    let v: Value = serde_json::from_str(plugin_config).ok()?;
    v.pointer("/auth/keys_env")?.as_str().map(str::to_string)
}

/// Adds `environment_variables.host_env_keys` to a wasm filter's `vm_config` when the config has `auth`.
pub fn expose_keys(filter: &mut Value, plugin_config: &str) {
    let Some(var) = keys_env(plugin_config) else { return };
    if let Some(vm) = filter.pointer_mut("/typed_config/config/vm_config") {
        vm["environment_variables"] = json!({ "host_env_keys": [var] });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_name_is_rendered() {
        let cfg = r#"{"auth":{"keys_env":"LLMROUTE_KEYS"}}"#;
        let mut f = json!({"typed_config": {"config": {"vm_config": {"vm_id": "x"}}}});
        expose_keys(&mut f, cfg);
        assert_eq!(
            f["typed_config"]["config"]["vm_config"]["environment_variables"],
            json!({"host_env_keys": ["LLMROUTE_KEYS"]})
        );
        let mut plain = json!({"typed_config": {"config": {"vm_config": {"vm_id": "x"}}}});
        expose_keys(&mut plain, "{}");
        assert!(plain["typed_config"]["config"]["vm_config"]
            .get("environment_variables")
            .is_none());
    }
}
