//! Writes GGUF v3 files: key-values and F32/F16 tensors, in the order they were added.
//!
//! The output depends only on what was added (no timestamps, no hash-map order), so the same inputs give a
//! byte-identical file.

use std::path::Path;

use super::{align_up, GgmlType, TensorInfo, Value, ValueType, DEFAULT_ALIGNMENT, MAGIC, VERSION};

/// A GGUF file being built in memory.
#[derive(Debug, Default)]
pub struct Writer {
    kvs: Vec<(String, Value)>,
    tensors: Vec<(TensorInfo, Vec<u8>)>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    /// Sets a key-value; a key set twice keeps its first position and its last value.
    pub fn kv(&mut self, key: &str, value: Value) -> &mut Writer {
        match self.kvs.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.kvs.push((key.to_string(), value)),
        }
        self
    }

    /// Adds an F32 tensor; `dims[0]` is the contiguous dimension.
    pub fn tensor_f32(&mut self, name: &str, dims: &[u64], data: &[f32]) -> Result<&mut Writer, String> {
        let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, dims, GgmlType::F32, data.len(), bytes)
    }

    /// Adds a tensor stored as F16 (rounded to nearest even); `dims[0]` is the contiguous dimension.
    pub fn tensor_f16(&mut self, name: &str, dims: &[u64], data: &[f32]) -> Result<&mut Writer, String> {
        let bytes = data.iter().flat_map(|&x| f32_to_f16(x).to_le_bytes()).collect();
        self.tensor(name, dims, GgmlType::F16, data.len(), bytes)
    }

    fn tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
        len: usize,
        bytes: Vec<u8>,
    ) -> Result<&mut Writer, String> {
        let info = TensorInfo {
            name: name.to_string(),
            dims: dims.to_vec(),
            ggml_type,
            offset: 0,
        };
        if dims.is_empty() || dims.len() > 4 || info.n_elements() != Some(len as u64) {
            return Err(format!("tensor {name}: dims {dims:?} do not hold {len} elements"));
        }
        if self.tensors.iter().any(|(t, _)| t.name == name) {
            return Err(format!("tensor {name} added twice"));
        }
        self.tensors.push((info, bytes));
        Ok(self)
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, String> {
        let align = self.alignment();
        let infos = self.placed_infos(align);
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, VERSION);
        put_u64(&mut out, self.tensors.len() as u64);
        put_u64(&mut out, self.kvs.len() as u64);
        for (key, value) in &self.kvs {
            put_string(&mut out, key);
            put_u32(&mut out, value.value_type() as u32);
            put_payload(&mut out, value).map_err(|e| format!("key {key}: {e}"))?;
        }
        for info in &infos {
            put_tensor_info(&mut out, info);
        }
        for (_, bytes) in &self.tensors {
            pad_to(&mut out, align);
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }

    /// Writes the file to `path` through a temporary file and a rename, so readers never see half a file.
    pub fn write_file(&self, path: &Path) -> Result<u64, String> {
        let bytes = self.to_bytes()?;
        let tmp = path.with_extension("gguf.tmp");
        std::fs::write(&tmp, &bytes).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("renaming to {}: {e}", path.display()))?;
        Ok(bytes.len() as u64)
    }

    fn alignment(&self) -> u64 {
        self.kvs
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .filter(|&a| a > 0)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The tensor infos with their data offsets, each aligned.
    fn placed_infos(&self, align: u64) -> Vec<TensorInfo> {
        let mut offset = 0;
        let mut infos = Vec::with_capacity(self.tensors.len());
        for (info, bytes) in &self.tensors {
            infos.push(TensorInfo { offset, ..info.clone() });
            offset = align_up(offset + bytes.len() as u64, align);
        }
        infos
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn pad_to(out: &mut Vec<u8>, align: u64) {
    out.resize(align_up(out.len() as u64, align) as usize, 0);
}

/// A value without its type code (an array's items carry none either).
fn put_payload(out: &mut Vec<u8>, value: &Value) -> Result<(), String> {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => put_u32(out, *v),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::Str(s) => put_string(out, s),
        Value::Array(elem, items) => put_array(out, *elem, items)?,
        Value::U64(v) => put_u64(out, *v),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
    Ok(())
}

fn put_array(out: &mut Vec<u8>, elem: ValueType, items: &[Value]) -> Result<(), String> {
    put_u32(out, elem as u32);
    put_u64(out, items.len() as u64);
    for item in items {
        if item.value_type() != elem {
            return Err(format!("an array of {elem:?} holds a {:?}", item.value_type()));
        }
        put_payload(out, item)?;
    }
    Ok(())
}

fn put_tensor_info(out: &mut Vec<u8>, info: &TensorInfo) {
    put_string(out, &info.name);
    put_u32(out, info.dims.len() as u32);
    for &d in &info.dims {
        put_u64(out, d);
    }
    put_u32(out, info.ggml_type.0);
    put_u64(out, info.offset);
}

/// IEEE 754 binary16 bits for `x`, rounded to nearest even; overflow gives infinity, NaN stays NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        return sign | subnormal_f16(man | 0x80_0000, e);
    }
    let h = ((e as u32) << 10) | (man >> 13);
    sign | round_half_even(h, man & 0x1fff, 0x1000) as u16
}

/// The binary16 subnormal (or zero, or smallest normal after rounding) for the 24-bit mantissa `m` at exponent `e`.
fn subnormal_f16(m: u32, e: i32) -> u16 {
    if e < -10 {
        return 0;
    }
    let shift = (14 - e) as u32;
    round_half_even(m >> shift, m & ((1 << shift) - 1), 1 << (shift - 1)) as u16
}

fn round_half_even(kept: u32, rest: u32, half: u32) -> u32 {
    if rest > half || (rest == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}
