//! `POST /v1/embeddings` (OpenAI embeddings, as llama.cpp serves them).
//!
//! `input` is a string, a list of strings, a list of token ids, or a list of token-id lists; each entry gets
//! one vector of [`DIMENSIONS`] floats. A vector is a pure function of its entry's text (unit length), so a
//! test can compare two answers. `encoding_format: "base64"` (the openai SDK's default) sends each vector as
//! its little-endian `f32` bytes in base64 instead of a JSON array. Embeddings never stream and never touch the
//! prefix cache.

use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_64;

use super::{prompt_parts, Answer};

/// Floats per vector.
pub const DIMENSIONS: usize = 8;

/// The entries of `input`; `Err` is the message of a 400.
pub fn inputs(request: &Value) -> Result<Vec<String>, String> {
    let input = request.get("input").ok_or("\"input\" is required")?;
    let parts = prompt_parts(input).ok_or("\"input\" must be a string, a list of strings, or token ids")?;
    if parts.is_empty() {
        return Err("\"input\" must not be empty".to_string());
    }
    Ok(parts)
}

/// The vector of one entry: eight bytes of its hash mapped to [-1, 1], scaled to unit length.
pub fn vector(text: &str) -> [f32; DIMENSIONS] {
    let bytes = xxh3_64(text.as_bytes()).to_le_bytes();
    let raw = bytes.map(|byte| f32::from(byte) / 127.5 - 1.0);
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    raw.map(|x| x / norm)
}

/// A vector as the request asked for it: a JSON array, or base64 of its little-endian bytes.
fn encoded(vector: &[f32], base64: bool) -> Value {
    if !base64 {
        return json!(vector);
    }
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    Value::String(base64_encode(&bytes))
}

/// Non-streamed embeddings body: one `embedding` object per input entry.
pub fn body(answer: &Answer, request: &Value) -> Value {
    let base64 = request.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let data: Vec<Value> = inputs(request)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(
            |(index, text)| json!({"object": "embedding", "index": index, "embedding": encoded(&vector(text), base64)}),
        )
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": answer.model,
        "usage": {"prompt_tokens": answer.prompt_tokens, "total_tokens": answer.prompt_tokens}
    })
}

/// Standard base64 (RFC 4648) with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let word = group
            .iter()
            .enumerate()
            .fold(0u32, |word, (i, byte)| word | u32::from(*byte) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                let sextet = (word >> (18 - 6 * i)) & 0x3f;
                out.push(char::from(ALPHABET[sextet as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::testing::answer;
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in cases {
            assert_eq!(base64_encode(plain.as_bytes()), encoded, "{plain:?}");
        }
        assert_eq!(base64_encode(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn inputs_take_every_form_and_refuse_bad_ones() {
        assert_eq!(inputs(&json!({"input": "a"})).unwrap(), ["a"]);
        assert_eq!(inputs(&json!({"input": ["a", "b"]})).unwrap(), ["a", "b"]);
        assert_eq!(inputs(&json!({"input": [1, 2]})).unwrap(), ["1 2"]);
        assert_eq!(inputs(&json!({"input": [[1], [2, 3]]})).unwrap(), ["1", "2 3"]);
        assert!(inputs(&json!({})).unwrap_err().contains("required"));
        assert!(inputs(&json!({"input": []})).unwrap_err().contains("empty"));
        assert!(inputs(&json!({"input": 5})).is_err());
        assert!(inputs(&json!({"input": ["a", {"b": 1}]})).is_err());
    }

    #[test]
    fn vectors_are_unit_length_and_stable() {
        let a = vector("hello");
        let norm: f32 = a.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(a, vector("hello"));
        assert_ne!(a, vector("world"));
    }

    #[test]
    fn body_lists_one_vector_per_input_in_either_encoding() {
        let request = json!({"input": ["x", "y"]});
        let floats = body(&answer(), &request);
        assert_eq!(floats["object"], "list");
        assert_eq!(floats["model"], "m");
        assert_eq!(floats["usage"], json!({"prompt_tokens": 40, "total_tokens": 40}));
        let data = floats["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(data[1]["object"], "embedding");
        assert_eq!(data[1]["index"], 1);
        let first: Vec<f32> = data[0]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(first, vector("x"));

        let base64 = body(&answer(), &json!({"input": "x", "encoding_format": "base64"}));
        let text = base64["data"][0]["embedding"].as_str().unwrap();
        let bytes: Vec<u8> = vector("x").iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(text, base64_encode(&bytes));
        assert_eq!(text.len(), 44);
    }
}
