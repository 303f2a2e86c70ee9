//! `docs/config.md` against the config types: every field `llmroute validate` accepts is on the page, every field
//! the page names exists, and every value of a field with a fixed set of names is listed in its row.
//!
//! The fields come from the types themselves, never from a hand-kept list: [`Tracer`] is a serde `Deserializer`
//! that answers each struct with all the field names serde asks for (`deserialize_struct` is handed the struct's
//! `FIELDS`), and follows every field into its own type. A field added to a `Raw*` struct is therefore checked
//! the moment it exists.
//!
//! On the page, a field is documented when it is the first cell of a row in the table of its section (`## \`X\``
//! sections hold the fields under `X`; other sections full paths), or when the row of its nearest documented
//! parent names it (the `discovery` row, say, describes `eds_path`). A map's key is written `<name>` on the page
//! (`keys.<name>.requests`) and `*` by the tracer.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use llmroute_core::config::{
    EngineKind, KeyPlacement, LbPolicy, RawConfig, RawRenderOnly, StreamUpstream, RENDER_ONLY_FIELDS,
};
use llmroute_core::Api;
use serde::de::value::{Error, StrDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, SeqAccess};
use serde::de::{VariantAccess, Visitor};
use serde::Deserialize;

const PAGE: &str = "docs/config.md";

fn page() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md")).expect("docs/config.md")
}

// ---------------------------------------------------------------------------------------------------------------
// The fields, from the types

/// Every field path the document accepts that holds a value rather than more fields: `backends[].health.path`,
/// `models[].endpoints`. `[]` marks a list's element, `*` a map's key. The filter's `RawConfig` knows the fields
/// only the renderer reads by name alone; `RawRenderOnly` gives them their shape.
fn accepted_fields() -> BTreeSet<String> {
    let mut fields = fields_of::<RawConfig>();
    fields.retain(|f| !RENDER_ONLY_FIELDS.contains(&f.as_str()));
    fields.extend(fields_of::<RawRenderOnly>());
    fields
}

/// The fields of `T` that hold values, as [`accepted_fields`] finds them.
fn fields_of<T: for<'de> Deserialize<'de>>() -> BTreeSet<String> {
    let found = RefCell::new(BTreeSet::new());
    if let Err(e) = T::deserialize(Tracer {
        path: String::new(),
        found: &found,
    }) {
        panic!("the tracer could not walk {}: {e}", std::any::type_name::<T>());
    }
    found.into_inner()
}

/// A `Deserializer` that gives every struct all of its fields, each a value of the shape its type asks for, and
/// records the path of each field that holds a plain value.
struct Tracer<'f> {
    path: String,
    found: &'f RefCell<BTreeSet<String>>,
}

impl<'f> Tracer<'f> {
    fn at(&self, segment: &str) -> Tracer<'f> {
        let path = match (self.path.is_empty(), segment.starts_with('[')) {
            (true, _) | (false, true) => format!("{}{segment}", self.path),
            (false, false) => format!("{}.{segment}", self.path),
        };
        Tracer {
            path,
            found: self.found,
        }
    }

    /// Records this path as a field holding a value (a list of values is the field itself).
    fn value(&self) {
        let path = self.path.trim_end_matches("[]").to_string();
        self.found.borrow_mut().insert(path);
    }
}

macro_rules! leaf {
    ($($method:ident => $visit:ident($($v:expr)?)),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            self.value();
            visitor.$visit($($v)?)
        })*
    };
}

impl<'de> Deserializer<'de> for Tracer<'_> {
    type Error = Error;

    /// A type that reads more than one shape (`fairness.by`: a name or `{ header: NAME }`) is a field of its own,
    /// offered a string. One that cannot read a string (flattened, or a map only) fails here: teach the tracer
    /// what it should give there.
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.value();
        let path = self.path.clone();
        visitor.visit_str("x").map_err(|e: Error| {
            de::Error::custom(format!(
                "{path}: a type that reads any shape and not a string ({e}); teach the tracer in \
                 filter/core/tests/config_reference.rs what it should give there"
            ))
        })
    }

    leaf! {
        deserialize_bool => visit_bool(false),
        deserialize_i8 => visit_i64(1), deserialize_i16 => visit_i64(1), deserialize_i32 => visit_i64(1),
        deserialize_i64 => visit_i64(1), deserialize_u8 => visit_u64(1), deserialize_u16 => visit_u64(1),
        deserialize_u32 => visit_u64(1), deserialize_u64 => visit_u64(1), deserialize_f32 => visit_f64(1.0),
        deserialize_f64 => visit_f64(1.0), deserialize_char => visit_char('x'), deserialize_str => visit_str("x"),
        deserialize_string => visit_str("x"), deserialize_bytes => visit_bytes(b"x"),
        deserialize_byte_buf => visit_bytes(b"x"), deserialize_unit => visit_unit(),
        deserialize_identifier => visit_str("x"), deserialize_ignored_any => visit_unit(),
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Elements {
            left: 1,
            tracer: self.at("[]"),
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Elements {
            left: len,
            tracer: self.at("[]"),
        })
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_tuple(len, visitor)
    }

    /// A map is traced as a struct with one field, `*`, for any key.
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_struct("", &["*"], visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_map(Fields {
            names: fields.iter().copied(),
            tracer: self,
            current: "",
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.value();
        visitor.visit_enum(FirstVariant {
            name: variants.first().copied().unwrap_or_default(),
            tracer: self,
        })
    }
}

/// A list's elements, each traced at `PATH[]`.
struct Elements<'f> {
    left: usize,
    tracer: Tracer<'f>,
}

impl<'de> SeqAccess<'de> for Elements<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let element = Tracer {
            path: self.tracer.path.clone(),
            found: self.tracer.found,
        };
        seed.deserialize(element).map(Some)
    }
}

/// A struct's fields (or a map's one key, `*`), each traced at `PATH.NAME`.
struct Fields<'f> {
    names: std::iter::Copied<std::slice::Iter<'static, &'static str>>,
    tracer: Tracer<'f>,
    current: &'static str,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        let Some(name) = self.names.next() else { return Ok(None) };
        self.current = name;
        let key: StrDeserializer<'_, Error> = name.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(self.tracer.at(self.current))
    }
}

/// An enum's first variant; a variant with data is traced at the enum's own path.
struct FirstVariant<'f> {
    name: &'static str,
    tracer: Tracer<'f>,
}

impl<'de, 'f> EnumAccess<'de> for FirstVariant<'f> {
    type Error = Error;
    type Variant = Tracer<'f>;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Tracer<'f>), Error> {
        let name: StrDeserializer<'_, Error> = self.name.into_deserializer();
        Ok((seed.deserialize(name)?, self.tracer))
    }
}

impl<'de> VariantAccess<'de> for Tracer<'_> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_tuple(len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value, Error> {
        self.deserialize_struct("", fields, visitor)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The fields, from the page

/// The rows of the page's field tables: full field path to the row's text.
fn documented_rows(page: &str) -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    let mut prefix = String::new();
    for line in page.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            prefix = backticked(heading).into_iter().next().unwrap_or_default();
            continue;
        }
        let Some(row) = line.strip_prefix('|') else { continue };
        let first_cell = cells(row).into_iter().next().unwrap_or_default();
        for name in backticked(&first_cell).iter().map(|n| any_key(n)) {
            let path = match (prefix.is_empty(), name.starts_with('[')) {
                (true, _) | (false, true) => format!("{prefix}{name}"),
                (false, false) => format!("{prefix}.{name}"),
            };
            rows.insert(path, line.to_string());
        }
    }
    rows
}

/// A row's name with each `<placeholder>` segment (a map's key, such as `keys.<name>.requests`) written `*`, as
/// the tracer writes it.
fn any_key(name: &str) -> String {
    let mut out = String::new();
    let mut rest = name;
    while let Some((before, after)) = rest.split_once('<') {
        out.push_str(before);
        out.push('*');
        rest = after.split_once('>').map_or("", |(_, tail)| tail);
    }
    out.push_str(rest);
    out
}

/// A table row's cells, split on `|` but not on `\|`.
fn cells(row: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut chars = row.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                cells.last_mut().unwrap().push('|');
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    cells
}

/// The `code spans` in a piece of text.
fn backticked(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The path's parent: `a.b[].c` gives `a.b[]`, `a.b[]` gives `a.b`... as far as `a`, then `None`.
fn parent(path: &str) -> Option<&str> {
    path.strip_suffix("[]")
        .or_else(|| path.rsplit_once('.').map(|(p, _)| p))
}

/// True when `text` holds `word` with no name character on either side.
fn names_word(text: &str, word: &str) -> bool {
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(name_char) && !after.is_some_and(name_char)
    })
}

/// Why `field` is not documented in `rows`, or `None` when it is.
fn missing(field: &str, rows: &BTreeMap<String, String>) -> Option<String> {
    if rows.contains_key(field) {
        return None;
    }
    let name = field.rsplit(['.', '*']).next().unwrap_or(field);
    let mut up = parent(field);
    while let Some(p) = up {
        if let Some(row) = rows.get(p) {
            return (!names_word(row, name)).then(|| {
                format!(
                    "`{field}`: its parent's row (`{p}`) does not name `{name}`; add a row for it, or name it there"
                )
            });
        }
        up = parent(p);
    }
    Some(match field.split_once('.') {
        None => format!("`{field}`: no row; add `{field}` to the table under `## Top level`"),
        Some((section, rest)) => format!(
            "`{field}`: no row; add `{rest}` to the table under the heading `{section}`, or `{field}` to the one \
             under `## Top level`"
        ),
    })
}

/// Every problem between the types' fields and the page's rows, one line each.
fn problems(fields: &BTreeSet<String>, page: &str) -> Vec<String> {
    let rows = documented_rows(page);
    let mut found: Vec<String> = fields.iter().filter_map(|f| missing(f, &rows)).collect();
    for row in rows.keys() {
        let exists = fields.iter().any(|f| {
            f == row
                || f.strip_prefix(row.as_str())
                    .is_some_and(|rest| rest.starts_with(['.', '[']))
        });
        if !exists {
            found.push(format!("`{row}`: a row for a field the config does not accept"));
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------------------------
// Tests

#[test]
fn the_tracer_finds_fields_at_every_depth() {
    let fields = accepted_fields();
    for f in [
        "version",
        "limits.max_heap_bytes",
        "backends[].endpoints",
        "backends[].health.interval_ms",
        "backends[].discovery.etcd.tls.ca_file",
        "models[].routes[].priority",
        "models[].limits.requests",
        "auth.keys_env",
        "affinity.placement_store.etcd.tls.key_file",
    ] {
        assert!(fields.contains(f), "{f} not found in {fields:#?}");
    }
    assert!(
        !fields.contains("backends") && !fields.contains("backends[].health"),
        "only fields that hold values: {fields:#?}"
    );
}

#[test]
fn a_maps_key_is_a_placeholder_on_the_page() {
    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Budgets {
        keys: std::collections::BTreeMap<String, Budget>,
        owners: Vec<String>,
    }
    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Budget {
        requests: Option<String>,
        kind: Option<StreamUpstreamLike>,
    }
    #[derive(Deserialize)]
    #[allow(dead_code)]
    enum StreamUpstreamLike {
        AsSent,
        Always,
    }
    let fields = fields_of::<Budgets>();
    assert_eq!(
        fields.iter().map(String::as_str).collect::<Vec<_>>(),
        ["keys.*.kind", "keys.*.requests", "owners"]
    );
    let page = "## Top level\n\n| `owners` | |\n\n## `keys`\n\n| `<name>.requests`, `<name>.kind` | |\n";
    assert_eq!(problems(&fields, page), Vec::<String>::new());
    let found = problems(&fields, "| `owners` | |\n| `keys.<name>.requests` | |\n");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with("`keys.*.kind`: no row"), "{found:#?}");
}

#[test]
fn config_md_documents_every_field_the_config_accepts_and_no_other() {
    let problems = problems(&accepted_fields(), &page());
    assert!(
        problems.is_empty(),
        "{PAGE} and the config types (filter/core/src/config/raw.rs and its modules) disagree:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_check_names_a_field_whose_row_is_gone_and_a_row_whose_field_is_gone() {
    let page = page();
    let row = page
        .lines()
        .find(|l| l.starts_with("| `max_context` |"))
        .expect("the backends table has a max_context row");
    let without = page.replace(&format!("{row}\n"), "");
    let found = problems(&accepted_fields(), &without);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with("`backends[].max_context`: no row"), "{found:#?}");

    let renamed = page.replace("| `max_context` |", "| `max_contxt` |");
    let found = problems(&accepted_fields(), &renamed);
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("`backends[].max_contxt`: a row for a field the config does not accept")),
        "{found:#?}"
    );

    let discovery = page
        .lines()
        .find(|l| l.starts_with("| `discovery` |"))
        .expect("the backends table has a discovery row");
    let found = problems(
        &accepted_fields(),
        &page.replace(discovery, "| `discovery` | none | | both | |"),
    );
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("`backends[].discovery.eds_path`: its parent's row")),
        "{found:#?}"
    );
}

/// The row of `field` on the page.
fn row(field: &str) -> String {
    documented_rows(&page())
        .remove(field)
        .unwrap_or_else(|| panic!("{PAGE} has no row for `{field}`"))
}

#[test]
fn config_md_lists_every_value_of_fields_with_a_fixed_set() {
    let fields: [(&str, &str); 7] = [
        ("models[].endpoints", Api::NAMES),
        ("backends[].kind", EngineKind::NAMES),
        ("backends[].lb", LbPolicy::NAMES),
        ("models[].stream_upstream", StreamUpstream::NAMES),
        ("affinity.placement", KeyPlacement::NAMES),
        ("models[].affinity.placement", KeyPlacement::NAMES),
        ("global_limits.failure_mode", "allow, deny"),
    ];
    let mut absent = Vec::new();
    for (field, names) in fields {
        let row = row(field);
        for value in names.split(", ") {
            if !row.contains(&format!("`{value}`")) {
                absent.push(format!("`{field}`: the value `{value}`"));
            }
        }
    }
    assert!(absent.is_empty(), "{PAGE} does not list:\n  {}", absent.join("\n  "));
}

/// The top-level fields whose every row on the page says `render` are exactly those the filter's document leaves
/// out: the renderer reads them alone, and the filter refuses them.
#[test]
fn config_md_says_render_alone_reads_exactly_the_fields_the_filter_leaves_out() {
    let mut read_by: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, row) in documented_rows(&page()) {
        let top = path.split(['.', '[']).next().unwrap_or_default().to_string();
        let who = cells(row.strip_prefix('|').unwrap_or(&row))
            .get(3)
            .map(|c| c.trim().to_string());
        read_by.entry(top).or_default().extend(who);
    }
    let render_alone: BTreeSet<&str> = read_by
        .iter()
        .filter(|(_, who)| who.iter().all(|w| w == "render"))
        .map(|(top, _)| top.as_str())
        .collect();
    assert_eq!(render_alone, RENDER_ONLY_FIELDS.into_iter().collect::<BTreeSet<_>>());
}
