//! A small GGUF v3 reader and writer, and a tiny random-weight llama model built with them.
//!
//! Why: the real-engine tests and benches need a llama.cpp model, and no model hub is reachable here. The llama.cpp
//! tree ships a vocab-only GGUF holding the real Llama SPM tokenizer; [`tiny`] copies its tokenizer fields and adds
//! random llama weights, so `llama-server` loads it, tokenizes real text, keeps a real prompt cache and generates
//! real (junk) tokens. Writing it in Rust keeps the project free of Python's `gguf`/numpy.
//!
//! The format (little endian): `"GGUF"`, version `u32` (3), tensor count `u64`, key-value count `u64`; the
//! key-values (`string` key, `u32` type, value); the tensor infos (`string` name, `u32` n_dims, `u64` dims with the
//! contiguous dimension first, `u32` ggml type, `u64` offset into the data section); padding to
//! `general.alignment` (default 32); the tensor data, each tensor aligned. Strings are a `u64` length and UTF-8 bytes.
//!
//! Only what this project needs is supported: every key-value type, and F32/F16 tensor data.

mod read;
pub mod tiny;
mod write;

pub use read::Gguf;
pub use write::{f32_to_f16, Writer};

/// `"GGUF"` as the file's first four bytes.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The only version written; the reader accepts 2 and 3 (same layout).
pub const VERSION: u32 = 3;
/// The data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A GGUF metadata value type, with its on-disk code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    Str = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_code(code: u32) -> Option<ValueType> {
        use ValueType::*;
        const ALL: [ValueType; 13] = [U8, I8, U16, I16, U32, I32, F32, Bool, Str, Array, U64, I64, F64];
        ALL.get(code as usize).copied()
    }
}

/// A GGUF metadata value. An array keeps its element type, so an empty array round-trips.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::Str(_) => ValueType::Str,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as an unsigned integer, whatever its integer width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, items) => Some(items),
            _ => None,
        }
    }
}

/// A ggml tensor element type. Only F32 and F16 have known sizes here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType(pub u32);

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);

    /// Bytes per element, for the types this module can read and write.
    pub fn element_size(self) -> Option<u64> {
        match self {
            GgmlType::F32 => Some(4),
            GgmlType::F16 => Some(2),
            _ => None,
        }
    }
}

/// One tensor's description: `dims[0]` is the contiguous (innermost) dimension; `offset` is relative to the start
/// of the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub offset: u64,
}

impl TensorInfo {
    /// The element count; `None` if it overflows.
    pub fn n_elements(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }

    /// The data size in bytes, for F32/F16 tensors.
    pub fn n_bytes(&self) -> Option<u64> {
        self.ggml_type.element_size()?.checked_mul(self.n_elements()?)
    }
}

/// Rounds `n` up to a multiple of `align`.
fn align_up(n: u64, align: u64) -> u64 {
    n.div_ceil(align) * align
}

#[cfg(test)]
mod tests;
