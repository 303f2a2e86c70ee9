//! `--paste-into TEMPLATE`: an Envoy config of your own, with markers where each section of `--target filter`
//! goes, filled in. The same pasting a person does by hand, done by the renderer, so a template can be checked
//! (`envoy --mode validate`) and tested.
//!
//! A marker is the string `"@llmroute SECTION"` (a section of [`target::SECTIONS`](super::target::SECTIONS)):
//! - as a list item, it becomes that section's items (a list section) or its value; an absent section adds
//!   nothing;
//! - as a mapping's value, it becomes the section (`failover_route` gives its RouteAction, since the template
//!   writes the route's own match); an absent section is an error;
//! - as a mapping's key (with any value, say `merge`), the section's fields join that mapping; an absent section
//!   adds nothing, and a field the mapping already has is an error.
//!
//! Every marker must name a known section, and no marker may be left.

use serde_json::{Map, Value};

use super::target::SECTIONS;

const MARK: &str = "@llmroute ";

/// The template (YAML or JSON) with every marker replaced from `sections` (the `--target filter` document), as
/// a JSON value.
pub fn paste(template: &str, sections: &Value) -> Result<Value, String> {
    let mut v: Value = serde_yaml_ng::from_str(template).map_err(|e| format!("the template is not YAML: {e}"))?;
    splice(&mut v, sections)?;
    Ok(v)
}

fn section(key: &str) -> Result<&str, String> {
    SECTIONS.iter().map(|(k, _)| *k).find(|k| *k == key).ok_or_else(|| {
        let known: Vec<&str> = SECTIONS.iter().map(|(k, _)| *k).collect();
        format!(
            "\"{MARK}{key}\": no such section; the sections are {}",
            known.join(", ")
        )
    })
}

fn marker(v: &str) -> Option<&str> {
    v.strip_prefix(MARK)
}

fn splice(v: &mut Value, sections: &Value) -> Result<(), String> {
    match v {
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for mut item in std::mem::take(items) {
                match item.as_str().and_then(marker) {
                    Some(key) => match sections.get(section(key)?) {
                        Some(Value::Array(list)) => out.extend(list.iter().cloned()),
                        Some(other) => out.push(other.clone()),
                        None => {}
                    },
                    None => {
                        splice(&mut item, sections)?;
                        out.push(item);
                    }
                }
            }
            *items = out;
        }
        Value::Object(map) => {
            let mut merged = Map::new();
            for (k, mut item) in std::mem::take(map) {
                if let Some(key) = marker(&k) {
                    match sections.get(section(key)?) {
                        Some(Value::Object(fields)) => {
                            merged.extend(fields.iter().map(|(f, x)| (f.clone(), x.clone())))
                        }
                        Some(_) => return Err(format!("\"{MARK}{key}\" as a key: that section is not a mapping")),
                        None => {}
                    }
                    continue;
                }
                match item.as_str().and_then(marker) {
                    Some(key) => {
                        let name = section(key)?;
                        item = match (name, sections.get(name)) {
                            ("failover_route", Some(f)) => f["route"].clone(),
                            (_, Some(s)) => s.clone(),
                            (_, None) => {
                                return Err(format!(
                                    "\"{MARK}{key}\" at `{k}`: the config renders no {name} (leave the marker out)"
                                ))
                            }
                        };
                    }
                    None => splice(&mut item, sections)?,
                }
                map.insert(k, item);
            }
            for (f, x) in merged {
                if map.contains_key(&f) {
                    return Err(format!(
                        "`{f}` is both in the template and in a pasted section; remove it from the template"
                    ));
                }
                map.insert(f, x);
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sections() -> Value {
        json!({
            "http_filters": [{ "name": "a" }, { "name": "b" }],
            "route": { "cluster_header": "x" },
            "connection_manager": { "access_log": [1], "stat_prefix": "theirs" },
            "listener": { "per_connection_buffer_limit_bytes": 9 },
        })
    }

    #[test]
    fn list_items_values_and_keys_are_filled() {
        let t = "filters: ['@llmroute http_filters', { name: router }]\nroute: '@llmroute route'\nl:\n  '@llmroute listener': merge\n  name: mine\nsecrets: ['@llmroute secrets']\n";
        let v = paste(t, &sections()).unwrap();
        assert_eq!(
            v,
            json!({
                "filters": [{ "name": "a" }, { "name": "b" }, { "name": "router" }],
                "route": { "cluster_header": "x" },
                "l": { "name": "mine", "per_connection_buffer_limit_bytes": 9 },
                "secrets": [],
            })
        );
    }

    #[test]
    fn unknown_sections_missing_values_and_clashes_are_errors() {
        let err = paste("a: '@llmroute routes'\n", &sections()).unwrap_err();
        assert!(
            err.contains("no such section") && err.contains("failover_route"),
            "{err}"
        );
        let err = paste("a: '@llmroute failover_route'\n", &sections()).unwrap_err();
        assert!(err.contains("renders no failover_route"), "{err}");
        let err = paste(
            "hcm:\n  stat_prefix: mine\n  '@llmroute connection_manager': merge\n",
            &sections(),
        )
        .unwrap_err();
        assert!(err.contains("`stat_prefix` is both"), "{err}");
    }
}
