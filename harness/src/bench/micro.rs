//! Reads what `make bench-micro` left behind, for the results file:
//! - criterion's estimates, `target/criterion/<group>/<size>/new/estimates.json` (median time per iteration);
//! - the allocation counter's table, `bench/out/alloc.md`.
//!
//! Both are optional: when `bench-micro` has not run, the results file says so.

use std::path::Path;

use serde_json::Value;

use super::body::{size_id, size_label, SIZES};

/// The criterion groups of `filter/core/benches/core.rs`, with what each measures.
pub const GROUPS: [(&str, &str); 4] = [
    ("scan_object", "parse + validate (`json::scan_object`)"),
    ("token_estimate", "input-token estimate (`estimate::input_tokens`)"),
    (
        "route_chat",
        "full `route` of a chat body: parse, validate, extract, hash",
    ),
    ("body_patch_apply", "`BodyPatch::apply` (the `model` rewrite)"),
];

/// A markdown table of MiB/s per group and size, or `None` when criterion has not run.
pub fn criterion_table(criterion_dir: &Path) -> Option<String> {
    let mut rows = Vec::new();
    for (group, what) in GROUPS {
        let cells: Vec<String> = SIZES
            .iter()
            .map(|&size| {
                median_ns(&criterion_dir.join(group).join(size_id(size)).join("new/estimates.json"))
                    .map_or("–".into(), |ns| {
                        format!("{:.0}", size as f64 / ns * 1e9 / (1 << 20) as f64)
                    })
            })
            .collect();
        if cells.iter().any(|c| c != "–") {
            rows.push(format!("| {what} | {} |", cells.join(" | ")));
        }
    }
    if rows.is_empty() {
        return None;
    }
    let head: Vec<String> = SIZES.iter().map(|&s| size_label(s)).collect();
    let rule = vec!["---:"; SIZES.len()].join(" | ");
    let mut table = format!(
        "| MiB/s (median) | {} |\n|---| {rule} |\n{}\n",
        head.join(" | "),
        rows.join("\n")
    );
    table.push_str(&response_reads(criterion_dir));
    table.push_str(&messages_reads(criterion_dir));
    Some(table)
}

/// The content key read from `messages` (criterion group `messages_read`): walking the array against reading the
/// scan's message index, side by side in one run, per body size. Empty when the group has not run.
fn messages_reads(criterion_dir: &Path) -> String {
    let group = criterion_dir.join("messages_read");
    let ns = |id: String| median_ns(&group.join(id).join("new/estimates.json"));
    let mut rows = String::new();
    for &size in SIZES.iter() {
        let id = size_id(size);
        if let (Some(walked), Some(indexed)) = (ns(format!("{id}-walked")), ns(format!("{id}-indexed"))) {
            rows.push_str(&format!(
                "| {} | {walked:.0} | {indexed:.0} | {:.1}× |\n",
                size_label(size),
                walked / indexed
            ));
        }
    }
    if rows.is_empty() {
        return rows;
    }
    format!(
        "\n| content key read from `messages`, ns (median) | walking the array | the scan's message index | speed-up |\n\
         |---|---:|---:|---:|\n{rows}"
    )
}

/// The response path's reads (criterion group `response_read`): the whole document parsed against only the members
/// the filter reads, side by side in one run, with their ratio. Empty when the group has not run.
fn response_reads(criterion_dir: &Path) -> String {
    let group = criterion_dir.join("response_read");
    let ns = |id: &str| median_ns(&group.join(id).join("new/estimates.json"));
    let mut rows = String::new();
    for (what, id) in [
        ("usage of a ~300-byte JSON answer", "answer"),
        ("one chat stream delta event", "event"),
    ] {
        if let (Some(whole), Some(kept)) = (ns(&format!("{id}-whole")), ns(&format!("{id}-kept"))) {
            rows.push_str(&format!("| {what} | {whole:.0} | {kept:.0} | {:.2}× |\n", whole / kept));
        }
    }
    if rows.is_empty() {
        return rows;
    }
    format!(
        "\n| response path read, ns (median) | whole document | kept members (`usage::parse_members`) | speed-up |\n\
         |---|---:|---:|---:|\n{rows}"
    )
}

/// The median of a criterion `estimates.json`, in ns.
fn median_ns(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64().filter(|ns| *ns > 0.0)
}

/// The allocation counter's markdown table, if it ran.
pub fn alloc_table(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().filter(|t| !t.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Criterion's `new/estimates.json` for each `(id, median ns)` of `group`.
    fn write_medians(dir: &Path, group: &str, medians: &[(&str, f64)]) {
        for (id, ns) in medians {
            let est = dir.join(group).join(id).join("new");
            std::fs::create_dir_all(&est).unwrap();
            std::fs::write(
                est.join("estimates.json"),
                format!(r#"{{"median":{{"point_estimate":{ns:.1}}}}}"#),
            )
            .unwrap();
        }
    }

    #[test]
    fn reads_criterion_medians_into_mib_per_s() {
        let dir = tempfile::tempdir().unwrap();
        let est = dir.path().join("route_chat/4KiB/new");
        std::fs::create_dir_all(&est).unwrap();
        // 4096 bytes in 4096 ns: 1 byte/ns = 953.67 MiB/s.
        std::fs::write(est.join("estimates.json"), r#"{"median":{"point_estimate":4096.0}}"#).unwrap();
        let table = criterion_table(dir.path()).unwrap();
        assert!(table.contains("| full `route` of a chat body"), "{table}");
        assert!(table.contains("| 954 |"), "{table}");
        assert!(!table.contains("scan_object"));
        assert!(criterion_table(&dir.path().join("none")).is_none());
        assert!(!table.contains("response path read"), "{table}");
        write_medians(
            dir.path(),
            "response_read",
            &[("answer-whole", 3000.0), ("answer-kept", 1000.0)],
        );
        let table = criterion_table(dir.path()).unwrap();
        assert!(
            table.contains("| usage of a ~300-byte JSON answer | 3000 | 1000 | 3.00× |"),
            "{table}"
        );
        assert!(!table.contains("delta event"), "{table}");
        assert!(!table.contains("content key read"), "{table}");
        write_medians(
            dir.path(),
            "messages_read",
            &[("256KiB-walked", 50000.0), ("256KiB-indexed", 200.0)],
        );
        let table = criterion_table(dir.path()).unwrap();
        assert!(table.contains("| 256 KiB | 50000 | 200 | 250.0× |"), "{table}");
    }
}
