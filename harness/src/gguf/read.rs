//! Parses a whole GGUF file held in memory: header, key-values, tensor infos, and the data section.
//!
//! Every length read from the file is checked against the bytes left before anything is allocated, so a truncated
//! or corrupt file gives an error, never a panic or a huge allocation.

use std::path::Path;

use super::{align_up, GgmlType, TensorInfo, Value, ValueType, DEFAULT_ALIGNMENT, MAGIC};

/// A parsed GGUF file.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub version: u32,
    /// Key-values in file order.
    pub kvs: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    /// The data section: from the aligned end of the tensor infos to the end of the file.
    pub data: Vec<u8>,
}

impl Gguf {
    pub fn read_file(path: &Path) -> Result<Gguf, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        Gguf::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(bytes: &[u8]) -> Result<Gguf, String> {
        let mut r = Cursor { bytes, pos: 0 };
        if r.take(4)? != MAGIC {
            return Err("not a GGUF file (bad magic)".into());
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(format!("unsupported GGUF version {version}"));
        }
        let n_tensors = r.count(8)?;
        let n_kvs = r.count(8)?;
        let kvs = (0..n_kvs)
            .map(|_| Ok((r.string()?, r.value()?)))
            .collect::<Result<Vec<_>, String>>()?;
        let tensors = (0..n_tensors)
            .map(|_| r.tensor_info())
            .collect::<Result<Vec<_>, String>>()?;
        let mut gguf = Gguf {
            version,
            kvs,
            tensors,
            data: Vec::new(),
        };
        let start = align_up(r.pos as u64, gguf.alignment()) as usize;
        gguf.data = bytes.get(start..).unwrap_or_default().to_vec();
        gguf.check_tensor_bounds()?;
        Ok(gguf)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kvs.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        self.get("general.alignment")
            .and_then(Value::as_u64)
            .filter(|&a| a > 0)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of an F32/F16 tensor.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        let t = self.tensor(name)?;
        let start = usize::try_from(t.offset).ok()?;
        let len = usize::try_from(t.n_bytes()?).ok()?;
        self.data.get(start..start.checked_add(len)?)
    }

    fn check_tensor_bounds(&self) -> Result<(), String> {
        for t in &self.tensors {
            let end = t.n_bytes().and_then(|n| n.checked_add(t.offset));
            if end.is_some_and(|end| end > self.data.len() as u64) {
                return Err(format!("tensor {} runs past the end of the file", t.name));
            }
        }
        Ok(())
    }
}

/// A bounds-checked little-endian reader.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("truncated at byte {} (wanted {n} more)", self.pos))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A `u64` count of items that each take at least `min_item_bytes`; refuses counts the file cannot hold.
    fn count(&mut self, min_item_bytes: usize) -> Result<usize, String> {
        let n = self.u64()?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_item_bytes as u64) > left {
            return Err(format!("count {n} at byte {} exceeds the file", self.pos - 8));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String, String> {
        let n = self.count(1)?;
        let at = self.pos;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| format!("string at byte {at} is not UTF-8"))
    }

    fn value_type(&mut self) -> Result<ValueType, String> {
        let code = self.u32()?;
        ValueType::from_code(code).ok_or_else(|| format!("unknown value type {code} at byte {}", self.pos - 4))
    }

    fn value(&mut self) -> Result<Value, String> {
        let t = self.value_type()?;
        self.value_of(t)
    }

    fn value_of(&mut self, t: ValueType) -> Result<Value, String> {
        Ok(match t {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array()?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array()?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array()?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array()?)),
            ValueType::Bool => Value::Bool(self.array::<1>()?[0] != 0),
            ValueType::Str => Value::Str(self.string()?),
            ValueType::Array => self.array_value()?,
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array()?)),
        })
    }

    fn array_value(&mut self) -> Result<Value, String> {
        let elem = self.value_type()?;
        let n = self.count(1)?;
        let items = (0..n).map(|_| self.value_of(elem)).collect::<Result<Vec<_>, _>>()?;
        Ok(Value::Array(elem, items))
    }

    fn tensor_info(&mut self) -> Result<TensorInfo, String> {
        let name = self.string()?;
        let n_dims = self.u32()?;
        if n_dims > 4 {
            return Err(format!("tensor {name} has {n_dims} dims (at most 4)"));
        }
        let dims = (0..n_dims).map(|_| self.u64()).collect::<Result<Vec<_>, _>>()?;
        let ggml_type = GgmlType(self.u32()?);
        let offset = self.u64()?;
        Ok(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        })
    }
}
