//! The copy of a JSON answer kept for its usage: bounded, and never read once a chunk is missing from it.

use llmroute_core::stream::usage::MAX_USAGE_DOC;
use llmroute_core::stream::{JsonCopy, Usage};

/// An answer whose usage sits before a long string; the string's own bytes come in the middle chunk.
const HEAD: &str = r#"{"usage":{"prompt_tokens":5,"completion_tokens":1},"pad":""#;
const TAIL: &str = r#""}"#;

fn copy_of(chunks: &[&[u8]]) -> Usage {
    let mut copy = JsonCopy::new();
    for c in chunks {
        copy.push(c.len(), |n| Some(c.get(..n).unwrap_or_default().to_vec()));
    }
    copy.finish()
}

const FIVE_AND_ONE: Usage = Usage {
    prompt_tokens: Some(5),
    cached_tokens: None,
    completion_tokens: Some(1),
};

#[test]
fn a_whole_answer_in_chunks_gives_its_usage() {
    let middle = vec![b'x'; 1000];
    assert_eq!(copy_of(&[HEAD.as_bytes(), &middle, TAIL.as_bytes()]), FIVE_AND_ONE);
    // At the bound exactly, still read.
    let middle = vec![b'x'; MAX_USAGE_DOC - HEAD.len() - TAIL.len()];
    assert_eq!(copy_of(&[HEAD.as_bytes(), &middle, TAIL.as_bytes()]), FIVE_AND_ONE);
}

#[test]
fn a_chunk_over_the_bound_stops_the_copy_so_no_spliced_document_is_read() {
    // Without the middle chunk, the head and the tail would make `{"usage":{...},"pad":""}`, a valid document.
    let middle = vec![b'x'; MAX_USAGE_DOC];
    assert_eq!(copy_of(&[HEAD.as_bytes(), &middle, TAIL.as_bytes()]), Usage::default());
    // One byte over the bound is enough.
    let middle = vec![b'x'; MAX_USAGE_DOC - HEAD.len() - TAIL.len() + 1];
    assert_eq!(copy_of(&[HEAD.as_bytes(), &middle, TAIL.as_bytes()]), Usage::default());
}

#[test]
fn a_chunk_the_host_could_not_hand_over_stops_the_copy() {
    let mut copy = JsonCopy::new();
    copy.push(HEAD.len(), |_| Some(HEAD.as_bytes().to_vec()));
    copy.push(10, |_| None);
    copy.push(TAIL.len(), |_| Some(TAIL.as_bytes().to_vec()));
    assert_eq!(copy.finish(), Usage::default());
}

#[test]
fn once_stopped_no_chunk_is_read_again() {
    let mut copy = JsonCopy::new();
    copy.push(MAX_USAGE_DOC + 1, |_| panic!("a chunk over the bound is not read"));
    copy.push(TAIL.len(), |_| panic!("nothing is read after a gap"));
    assert_eq!(copy.finish(), Usage::default());
}

#[test]
fn a_host_handing_over_more_than_asked_cannot_grow_the_copy_past_its_bound() {
    let mut copy = JsonCopy::new();
    copy.push(1, |_| Some(vec![b' '; MAX_USAGE_DOC + 1]));
    copy.push(1, |_| panic!("nothing is read after a gap"));
    assert_eq!(copy.finish(), Usage::default());
}
