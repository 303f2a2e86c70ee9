//! Round trips through the writer and reader, the F16 conversion, and the tiny model's shape and determinism.

use super::tiny::{n_vocab, test_rng_weights, TinyLlama};
use super::*;

/// A vocab-only file shaped like llama.cpp's `ggml-vocab-llama-spm.gguf`, with 10 tokens.
fn small_vocab() -> Gguf {
    let tokens = ["<unk>", "<s>", "</s>", "▁a", "▁b", "c", "d", "e", "<0x0A>", "▁hello"];
    let mut w = Writer::new();
    w.kv("general.architecture", Value::Str("llama".into()))
        .kv("tokenizer.ggml.model", Value::Str("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(
                ValueType::Str,
                tokens.iter().map(|t| Value::Str(t.to_string())).collect(),
            ),
        )
        .kv(
            "tokenizer.ggml.scores",
            Value::Array(ValueType::F32, (0..10).map(|i| Value::F32(-(i as f32))).collect()),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, (0..10).map(|i| Value::I32(i % 3)).collect()),
        )
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.unknown_token_id", Value::U32(0));
    Gguf::parse(&w.to_bytes().unwrap()).unwrap()
}

fn small_model(seed: u64) -> TinyLlama {
    TinyLlama {
        embd: 8,
        layers: 2,
        ff: 12,
        heads: 2,
        ctx: 64,
        seed,
        f16: true,
    }
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f32::from(h & 0x3ff);
    match exp {
        0 => sign * man * 2f32.powi(-24),
        31 if man == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1.0 + man / 1024.0) * 2f32.powi(exp - 15),
    }
}

#[test]
fn every_value_type_round_trips() {
    let values = vec![
        Value::U8(7),
        Value::I8(-7),
        Value::U16(65535),
        Value::I16(-300),
        Value::U32(4_000_000_000),
        Value::I32(-5),
        Value::F32(1.5),
        Value::Bool(true),
        Value::Str("héllo".into()),
        Value::Array(ValueType::U64, vec![]),
        Value::Array(
            ValueType::Array,
            vec![Value::Array(ValueType::Str, vec![Value::Str("x".into())])],
        ),
        Value::U64(u64::MAX),
        Value::I64(i64::MIN),
        Value::F64(-0.25),
    ];
    let mut w = Writer::new();
    for (i, v) in values.iter().enumerate() {
        w.kv(&format!("k.{i}"), v.clone());
    }
    let g = Gguf::parse(&w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.version, 3);
    let read: Vec<Value> = g.kvs.iter().map(|(_, v)| v.clone()).collect();
    assert_eq!(read, values);
    assert_eq!(g.kvs[3].0, "k.3");
}

#[test]
fn tensors_round_trip_aligned() {
    let mut w = Writer::new();
    w.kv("general.alignment", Value::U32(64));
    w.tensor_f32("a", &[3], &[1.0, -2.0, 3.5]).unwrap();
    w.tensor_f16("b", &[2, 3], &[0.0, 1.0, -2.0, 0.5, 65504.0, 1e-8])
        .unwrap();
    w.tensor_f32("c", &[1], &[42.0]).unwrap();
    let bytes = w.to_bytes().unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.alignment(), 64);
    let names: Vec<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert!(g.tensors.iter().all(|t| t.offset % 64 == 0));
    assert_eq!((bytes.len() - g.data.len()) % 64, 0, "the data section starts aligned");
    let b = g.tensor("b").unwrap();
    assert_eq!((b.dims.as_slice(), b.ggml_type), ([2u64, 3].as_slice(), GgmlType::F16));
    let a: Vec<f32> = g
        .tensor_bytes("a")
        .unwrap()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(a, [1.0, -2.0, 3.5]);
    let b: Vec<u16> = g
        .tensor_bytes("b")
        .unwrap()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(b, [0x0000, 0x3c00, 0xc000, 0x3800, 0x7bff, 0x0000]);
    assert_eq!(g.tensor_bytes("c").unwrap(), 42f32.to_le_bytes());
}

#[test]
fn writer_refuses_bad_input() {
    let mut w = Writer::new();
    assert!(w.tensor_f32("t", &[2, 2], &[1.0; 3]).is_err());
    w.tensor_f32("t", &[2], &[1.0; 2]).unwrap();
    assert!(w.tensor_f32("t", &[2], &[1.0; 2]).is_err());
    w.kv(
        "mixed",
        Value::Array(ValueType::U32, vec![Value::U32(1), Value::I32(2)]),
    );
    assert!(w.to_bytes().unwrap_err().contains("mixed"));
}

#[test]
fn reader_refuses_corrupt_files() {
    let mut w = Writer::new();
    w.kv("s", Value::Str("abc".into()));
    w.tensor_f32("t", &[4], &[0.0; 4]).unwrap();
    let bytes = w.to_bytes().unwrap();
    assert!(Gguf::parse(b"GGML\x03\0\0\0").unwrap_err().contains("magic"));
    for cut in [3, 10, 30, bytes.len() - 1] {
        assert!(Gguf::parse(&bytes[..cut]).is_err(), "a file cut at {cut} bytes parsed");
    }
    let mut huge = bytes.clone();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(Gguf::parse(&huge).unwrap_err().contains("exceeds"));
}

#[test]
fn f16_conversion_matches_ieee() {
    let cases = [
        (1.0, 0x3c00),
        (-2.0, 0xc000),
        (0.1, 0x2e66),
        (65504.0, 0x7bff),
        (65520.0, 0x7c00),
        (f32::INFINITY, 0x7c00),
        (2f32.powi(-14), 0x0400),
        (2f32.powi(-24), 0x0001),
        (2f32.powi(-25), 0x0000),
        (3.0 * 2f32.powi(-26), 0x0001),
        (-0.0, 0x8000),
    ];
    for (x, h) in cases {
        assert_eq!(f32_to_f16(x), h, "{x}");
    }
    assert_eq!(f32_to_f16(f32::NAN) & 0x7c00, 0x7c00);
    for h in (0..=u16::MAX).filter(|h| h & 0x7c00 != 0x7c00) {
        assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#06x}");
    }
}

#[test]
fn tiny_model_has_llama_shape_and_tokenizer() {
    let vocab = small_vocab();
    let p = small_model(42);
    let g = Gguf::parse(&p.build(&vocab).unwrap().to_bytes().unwrap()).unwrap();
    assert_eq!(g.get("general.architecture").and_then(Value::as_str), Some("llama"));
    for key in [
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
    ] {
        assert_eq!(g.get(key), vocab.get(key), "{key}");
    }
    assert!(g
        .get("tokenizer.chat_template")
        .and_then(Value::as_str)
        .unwrap()
        .contains("<|im_start|>"));
    assert_eq!(g.get("llama.vocab_size").and_then(Value::as_u64), Some(10));
    assert_eq!(g.get("llama.rope.dimension_count").and_then(Value::as_u64), Some(4));
    let dims = |n: &str| g.tensor(n).unwrap().dims.clone();
    assert_eq!(dims("token_embd.weight"), [8, 10]);
    assert_eq!(dims("blk.1.attn_q.weight"), [8, 8]);
    assert_eq!(dims("blk.1.ffn_gate.weight"), [8, 12]);
    assert_eq!(dims("blk.1.ffn_down.weight"), [12, 8]);
    assert_eq!(g.tensors.len(), 2 + 2 * 9);
    assert!(g.tensor("output.weight").is_none(), "the output is tied to token_embd");
    let norm = g.tensor_bytes("blk.0.attn_norm.weight").unwrap();
    assert_eq!(norm, [1f32.to_le_bytes(); 8].concat());
    let params: u64 = g.tensors.iter().map(|t| t.n_elements().unwrap()).sum();
    assert_eq!(params, p.n_params(n_vocab(&vocab).unwrap()));
}

#[test]
fn same_seed_gives_identical_bytes() {
    let vocab = small_vocab();
    let a = small_model(42).build(&vocab).unwrap().to_bytes().unwrap();
    let b = small_model(42).build(&vocab).unwrap().to_bytes().unwrap();
    let c = small_model(43).build(&vocab).unwrap().to_bytes().unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.len(), c.len());
}

#[test]
fn weights_are_small_centred_and_seeded() {
    let w = test_rng_weights(7, 100_000);
    let mean = w.iter().sum::<f32>() / w.len() as f32;
    let std = (w.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / w.len() as f32).sqrt();
    assert!(mean.abs() < 1e-3, "mean {mean}");
    assert!((std - 0.02).abs() < 1e-3, "std {std}");
    assert!(w.iter().all(|x| x.abs() < 0.035));
    assert_eq!(test_rng_weights(7, 5), w[..5]);
}

#[test]
fn bad_shapes_are_refused() {
    let vocab = small_vocab();
    let odd_heads = TinyLlama {
        heads: 3,
        ..small_model(1)
    };
    assert!(odd_heads.build(&vocab).is_err());
    let empty = Gguf::parse(&Writer::new().to_bytes().unwrap()).unwrap();
    assert!(small_model(1)
        .build(&empty)
        .unwrap_err()
        .contains("tokenizer.ggml.tokens"));
}
