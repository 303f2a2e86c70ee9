//! The glue's stat names map to the families each configuration defines: a labelled name finds its family and
//! label values; a name of no family is kept in the process only.

use llmroute_core::envoy_contract::metrics::{self as names, labelled};

use crate::metrics::{family_of, FAMILIES};

#[test]
fn every_family_is_defined_once() {
    let mut keys: Vec<String> = FAMILIES
        .iter()
        .map(|(m, _, l)| [*m].iter().chain(l.iter()).copied().collect::<Vec<_>>().join(";"))
        .collect();
    keys.sort();
    let before = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), before);
}

#[test]
fn a_labelled_stat_finds_its_family_and_values() {
    let name = labelled(
        names::REQUESTS,
        &[
            ("alias", "chat"),
            ("backend", "llama-a"),
            ("api", "chat"),
            ("code_class", "2xx"),
            ("affinity_source", "system"),
        ],
    );
    let (family, values) = family_of(&name).unwrap();
    assert_eq!(
        family,
        "llmroute_requests_total;alias;backend;api;code_class;affinity_source"
    );
    assert_eq!(values, ["chat", "llama-a", "chat", "2xx", "system"]);
    assert!(FAMILIES.iter().any(|(m, _, l)| *m == names::REQUESTS && l.len() == 5));
    let (family, values) = family_of(names::OVERFLOW).unwrap();
    assert_eq!((family.as_str(), values.len()), ("llmroute_overflow_total", 0));
    assert!(family_of("llmroute_x;label_without_value").is_none());
}
