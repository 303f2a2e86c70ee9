//! The layers of the source, checked: no import circles between modules, no module importing its own parent or
//! another ancestor, the contract module a leaf, and the config importing only leaves.
//!
//! A newcomer reads a crate from the bottom up; a circle or an import running back up means a module cannot be
//! read, tested or moved without the ones above it. The check reads the source text: every `crate::…` and
//! `super::…` path outside comments and outside the `#[cfg(test)]` part at the end of a file, resolved to the
//! longest module path it names, between units: the core's top-level modules, and the renderer's modules with
//! each section of `render` on its own (the files inside one unit may use each other).

// Tests may index, do plain arithmetic and unwrap; the code that ships may not.
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file under `src` with its module path (`""` for the crate root, `a::b` for `a/b.rs` or
/// `a/b/mod.rs`). Files named `tests.rs` are test modules and are left out.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "bin") {
                    stack.push(path);
                }
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            match parts.last().map(String::as_str) {
                Some("lib" | "main" | "mod") => {
                    parts.pop();
                }
                Some("tests") => continue,
                _ => {}
            }
            if path.extension().is_some_and(|e| e == "rs") {
                out.insert(parts.join("::"), path);
            }
        }
    }
    out
}

/// The code of a file: everything before its `#[cfg(test)]` part, with `//` comments removed.
fn code(text: &str) -> String {
    let body = text.split("#[cfg(test)]").next().unwrap_or_default();
    body.lines()
        .map(|l| l.split_once("//").map_or(l, |(c, _)| c))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The full paths a `use` or an inline path names, starting right after `crate::` or `super::`: groups
/// (`{a, b::c}`) are expanded, so `render::{admin, json::push}` gives `render::admin` and `render::json::push`.
fn paths_at(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut seg = String::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_ascii_alphanumeric() || c == '_' {
            seg.push(c);
            chars.next();
        } else if c == ':' {
            chars.next();
            if chars.peek() == Some(&':') {
                chars.next();
            }
            seg.push_str("::");
        } else if c == '{' {
            chars.next();
            let mut depth = 1;
            let mut inner = String::new();
            for c in chars.by_ref() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                inner.push(c);
            }
            let mut depth = 0;
            let mut item = String::new();
            for c in inner.chars().chain(std::iter::once(',')) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        let item_text = std::mem::take(&mut item);
                        let item_text = item_text.trim();
                        if !item_text.is_empty() {
                            for p in paths_at(item_text, "") {
                                out.push(format!("{prefix}{seg}{p}"));
                            }
                        }
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            return out;
        } else {
            break;
        }
    }
    out.push(format!("{prefix}{}", seg.trim_end_matches("::")));
    out
}

/// The modules `module`'s code names, each resolved to the longest module path that exists.
fn imports(module: &str, code: &str, known: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let parent: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let at = &bytes[i..];
        let start_ok =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
        if !start_ok || !(at.starts_with(b"crate::") || at.starts_with(b"super::")) {
            i += 1;
            continue;
        }
        // Both prefixes are ASCII, so `i` is a char boundary here.
        let rest = &code[i..];
        let (base, skip): (Vec<&str>, usize) = if rest.starts_with("crate::") {
            (Vec::new(), "crate::".len())
        } else {
            // `super::super::x` climbs twice; the module's own file is `a::b`, whose `super` is `a`.
            let mut up = 0;
            let mut r = rest;
            while let Some(next) = r.strip_prefix("super::") {
                up += 1;
                r = next;
            }
            let keep = parent.len().saturating_sub(up);
            (parent[..keep].to_vec(), rest.len() - r.len())
        };
        for p in paths_at(&rest[skip..], "") {
            let mut full: Vec<&str> = base.clone();
            full.extend(p.split("::").filter(|s| !s.is_empty() && *s != "self"));
            while !full.is_empty() && !known.contains_key(&full.join("::")) {
                full.pop();
            }
            found.insert(full.join("::"));
        }
        i += skip;
    }
    found.remove(module);
    found
}

/// The import graph between units: `unit` maps a module path to the unit it belongs to (its top-level module,
/// say), so the files of one unit may use each other freely and only imports between units are checked.
fn graph(src: &Path, unit: fn(&str) -> String) -> Graph {
    let known = modules(src);
    let mut g = Graph::new();
    for (m, path) in &known {
        let text = std::fs::read_to_string(path).unwrap();
        let from = unit(m);
        let deps = imports(m, &code(&text), &known)
            .iter()
            .map(|d| unit(d))
            .filter(|d| *d != from)
            .collect::<Vec<_>>();
        g.entry(from).or_default().extend(deps);
    }
    g
}

/// The core's units: its top-level modules.
fn core_unit(m: &str) -> String {
    m.split("::").next().unwrap_or_default().to_string()
}

/// The renderer's units: its top-level modules, and each section of `render` (`render::cluster`,
/// `render::istio`, ...) on its own, below `render` itself, which assembles them.
fn renderer_unit(m: &str) -> String {
    let parts: Vec<&str> = m.split("::").collect();
    let depth = if parts.first() == Some(&"render") { 2 } else { 1 };
    parts[..depth.min(parts.len())].join("::")
}

fn is_ancestor(a: &str, of: &str) -> bool {
    a.is_empty() || of.starts_with(&format!("{a}::"))
}

/// Imports from a module to one of its ancestors: the parent depends on its children, never the reverse.
fn upward(g: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (m, deps) in g {
        for d in deps {
            if is_ancestor(d, m) {
                out.push(format!("{m} -> {}", if d.is_empty() { "crate root" } else { d }));
            }
        }
    }
    out
}

/// The strongly connected components with more than one module (Tarjan's algorithm).
fn circles(g: &Graph) -> Vec<Vec<String>> {
    struct State<'g> {
        g: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            // A parent naming its child is how a module declares its parts, not a dependency to order.
            if is_ancestor(v, w) {
                continue;
            }
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn src(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn assert_layered(g: &Graph) {
    assert!(g.len() > 5, "too few modules found: {:?}", g.keys());
    assert_eq!(circles(g), Vec::<Vec<String>>::new(), "import circles");
    assert_eq!(
        upward(g),
        Vec::<String>::new(),
        "imports running back up to an ancestor"
    );
}

#[test]
fn the_core_has_no_circles_and_no_imports_back_up() {
    assert_layered(&graph(&src("src"), core_unit));
}

#[test]
fn the_renderer_has_no_circles_and_no_imports_back_up() {
    assert_layered(&graph(&src("../../envoy/src"), renderer_unit));
}

#[test]
fn the_contract_is_a_leaf() {
    let g = graph(&src("src"), core_unit);
    assert_eq!(g["envoy_contract"], BTreeSet::new());
}

/// The modules below the config: names and small rules that the config, and everything above it, share.
const BELOW_CONFIG: [&str; 5] = ["api_kind", "auth", "envoy_contract", "headers", "text"];

/// The config is plain data with its validation, at the bottom of the core: all it reads, directly or through
/// another module, is in [`BELOW_CONFIG`], so anything above may read the config and nothing the config reads can
/// read it back.
#[test]
fn the_config_sits_at_the_bottom() {
    let g = graph(&src("src"), core_unit);
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&String> = g["config"].iter().collect();
    while let Some(m) = todo.pop() {
        if seen.insert(m.clone()) {
            todo.extend(g.get(m).into_iter().flatten());
        }
    }
    let above: Vec<&String> = seen.iter().filter(|m| !BELOW_CONFIG.contains(&m.as_str())).collect();
    assert_eq!(
        above,
        Vec::<&String>::new(),
        "the config reads modules that are not below it"
    );
    assert!(seen.contains("envoy_contract"), "{seen:?}");
}

/// The checker itself: a circle, an import back up and a grouped import are all seen.
#[test]
fn the_checker_finds_circles_and_imports_back_up() {
    let dir = std::env::temp_dir().join(format!("llmroute-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\n").unwrap();
    std::fs::write(dir.join("a.rs"), "pub mod inner;\nuse crate::{b::X, c};\n").unwrap();
    std::fs::write(
        dir.join("a/inner.rs"),
        "use super::super::c; // crate::b in a comment\nuse super::Y;\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("b.rs"),
        "pub struct X;\n#[cfg(test)]\nmod t { use crate::c; }\n",
    )
    .unwrap();
    std::fs::write(dir.join("c.rs"), "use crate::a::Z;\n").unwrap();
    let g = graph(&dir, |m| m.to_string());
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(g["a"], ["b", "c"].iter().map(|s| s.to_string()).collect());
    assert_eq!(g["a::inner"], ["a", "c"].iter().map(|s| s.to_string()).collect());
    assert_eq!(g["b"], BTreeSet::new());
    assert_eq!(circles(&g), vec![vec!["a".to_string(), "c".to_string()]]);
    assert_eq!(upward(&g), vec!["a::inner -> a".to_string()]);
}
