//! GGUF files (llama.cpp's model container) read natively: metadata, tensor
//! infos and tensors dequantised to f32 ([`quant`]), and conversion of a
//! Llama-architecture model with its tokenizer and chat template into a HF
//! checkpoint directory ([`convert`]).
//!
//! The container (ggml's `docs/gguf.md`, versions 2 and 3, little-endian):
//! a header (`GGUF`, version, tensor count, metadata count), metadata
//! key-value pairs, tensor infos (name, dims with the contiguous one first,
//! type, offset into the data section), then the data section at the next
//! multiple of `general.alignment` (default 32). Every count and length in
//! the file is checked against the bytes that remain before anything is
//! allocated, so a truncated or hostile file is an error naming what was
//! being read, never a panic or a huge allocation.

pub mod convert;
pub mod quant;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};
pub use quant::GgmlType;

/// The first four bytes of every GGUF file.
const MAGIC: &[u8; 4] = b"GGUF";
/// Data-section alignment when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays accepted in metadata.
const MAX_ARRAY_DEPTH: usize = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// An unsigned integer of any width (u8, u16, u32, u64).
    Uint(u64),
    /// A signed integer of any width (i8, i16, i32, i64).
    Int(i64),
    /// A float of either width (f32 widened exactly, f64).
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array of values of one type.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    fn type_name(&self) -> &'static str {
        match self {
            MetaValue::Uint(_) => "an unsigned integer",
            MetaValue::Int(_) => "a signed integer",
            MetaValue::Float(_) => "a float",
            MetaValue::Bool(_) => "a boolean",
            MetaValue::String(_) => "a string",
            MetaValue::Array(_) => "an array",
        }
    }
}

/// Where one tensor is in the file and how it is stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in GGUF order: the contiguous one first (the reverse of
    /// the PyTorch shape).
    pub dims: Vec<usize>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Absolute byte range of the data in the file.
    range: std::ops::Range<usize>,
}

impl TensorInfo {
    /// The PyTorch/HF shape: [`Self::dims`] reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }

    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.dims.iter().product()
    }
}

/// An open GGUF file: its metadata and tensor infos, with the data mapped.
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    version: u32,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and checks `path`: header, metadata, tensor infos, and that every
    /// tensor's data lies inside the file.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| ModelError::io("cannot open", path, e))?;
        // SAFETY: the map is read-only and private to this value; a file
        // changed underneath it by another process would give wrong values,
        // not unsoundness in this code, which copies every value it reads.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| ModelError::io("cannot map", path, e))?;
        let (version, metadata, tensors) =
            parse(&map).map_err(|message| ModelError::gguf(path, message))?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
            version,
            metadata,
            tensors,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    /// The tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of `tensor` as stored.
    pub fn raw(&self, tensor: &TensorInfo) -> &[u8] {
        &self.map[tensor.range.clone()]
    }

    /// `tensor` dequantised to f32, in GGUF element order (the row-major
    /// order of [`TensorInfo::shape`]).
    pub fn dequantize(&self, tensor: &TensorInfo) -> Vec<f32> {
        let mut out = Vec::with_capacity(tensor.elements());
        tensor.ggml_type.dequantize(self.raw(tensor), &mut out);
        out
    }

    /// The metadata value `key`, or an error naming it.
    pub fn get(&self, key: &str) -> Result<&MetaValue> {
        self.metadata
            .get(key)
            .ok_or_else(|| self.error(format!("metadata key `{key}` is missing")))
    }

    /// The integer `key` (any width, non-negative).
    pub fn get_uint(&self, key: &str) -> Result<u64> {
        match self.get(key)? {
            MetaValue::Uint(v) => Ok(*v),
            MetaValue::Int(v) if *v >= 0 => Ok(*v as u64),
            other => Err(self.wrong_type(key, "a non-negative integer", other)),
        }
    }

    /// The integer `key` as a `usize`, or `default` when absent.
    pub fn get_usize_or(&self, key: &str, default: usize) -> Result<usize> {
        if !self.metadata.contains_key(key) {
            return Ok(default);
        }
        let v = self.get_uint(key)?;
        usize::try_from(v).map_err(|_| self.error(format!("metadata `{key}` = {v} is too large")))
    }

    /// The number `key` (float or integer).
    pub fn get_float(&self, key: &str) -> Result<f64> {
        match self.get(key)? {
            MetaValue::Float(v) => Ok(*v),
            MetaValue::Uint(v) => Ok(*v as f64),
            MetaValue::Int(v) => Ok(*v as f64),
            other => Err(self.wrong_type(key, "a number", other)),
        }
    }

    /// The string `key`.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.get(key)? {
            MetaValue::String(s) => Ok(s),
            other => Err(self.wrong_type(key, "a string", other)),
        }
    }

    /// The boolean `key`, or `default` when absent.
    pub fn get_bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.metadata.get(key) {
            None => Ok(default),
            Some(MetaValue::Bool(b)) => Ok(*b),
            Some(other) => Err(self.wrong_type(key, "a boolean", other)),
        }
    }

    /// The array `key`.
    pub fn get_array(&self, key: &str) -> Result<&[MetaValue]> {
        match self.get(key)? {
            MetaValue::Array(items) => Ok(items),
            other => Err(self.wrong_type(key, "an array", other)),
        }
    }

    /// The array of strings `key`.
    pub fn get_strings(&self, key: &str) -> Result<Vec<&str>> {
        self.get_array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                MetaValue::String(s) => Ok(s.as_str()),
                other => Err(self.wrong_type(&format!("{key}[{i}]"), "a string", other)),
            })
            .collect()
    }

    /// An error about this file.
    pub(crate) fn error(&self, message: impl Into<String>) -> ModelError {
        ModelError::gguf(&self.path, message)
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &MetaValue) -> ModelError {
        self.error(format!(
            "metadata `{key}` should be {expected}, found {}",
            found.type_name()
        ))
    }
}

/// A little-endian cursor over the file's bytes whose reads fail with a
/// message saying what was being read and where the file ended.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

type Parsed<T> = std::result::Result<T, String>;

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Parsed<&'a [u8]> {
        let remaining = self.bytes.len() - self.pos;
        if n > remaining {
            return Err(format!(
                "truncated: {} needs {n} bytes at offset {}, but the file ends at {}",
                what(),
                self.pos,
                self.bytes.len()
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Parsed<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("length checked"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Parsed<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Parsed<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in what is left of the file at `min_size` bytes per item.
    fn count(&mut self, min_size: usize, what: &dyn Fn() -> String) -> Parsed<usize> {
        let n = self.u64(what)?;
        let remaining = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_size as u64) > remaining {
            return Err(format!(
                "truncated or corrupt: {} is {n}, more than the {remaining} bytes left in the file can hold",
                what()
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Parsed<String> {
        let len = self.count(1, &|| format!("the length of {}", what()))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{} is not valid UTF-8", what()))
    }

    fn value(&mut self, kind: u32, depth: usize, what: &dyn Fn() -> String) -> Parsed<MetaValue> {
        Ok(match kind {
            0 => MetaValue::Uint(u64::from(self.array::<1>(what)?[0])),
            1 => MetaValue::Int(i64::from(self.array::<1>(what)?[0] as i8)),
            2 => MetaValue::Uint(u64::from(u16::from_le_bytes(self.array(what)?))),
            3 => MetaValue::Int(i64::from(i16::from_le_bytes(self.array(what)?))),
            4 => MetaValue::Uint(u64::from(self.u32(what)?)),
            5 => MetaValue::Int(i64::from(i32::from_le_bytes(self.array(what)?))),
            6 => MetaValue::Float(f64::from(f32::from_le_bytes(self.array(what)?))),
            7 => match self.array::<1>(what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(format!(
                        "{} is a boolean with byte {b} (expected 0 or 1)",
                        what()
                    ))
                }
            },
            8 => MetaValue::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "{} nests arrays deeper than {MAX_ARRAY_DEPTH}",
                        what()
                    ));
                }
                let item_kind = self.u32(&|| format!("the item type of {}", what()))?;
                let n = self.count(1, &|| format!("the length of {}", what()))?;
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    items.push(self.value(item_kind, depth + 1, &|| format!("{}[{i}]", what()))?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::Uint(self.u64(what)?),
            11 => MetaValue::Int(i64::from_le_bytes(self.array(what)?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(format!(
                    "{} has value type {other} (GGUF defines 0 to 12)",
                    what()
                ))
            }
        })
    }
}

/// Where a GGUF file's tensor data lies: its start, its alignment, and the
/// file's length.
struct Layout {
    data_start: u64,
    alignment: u64,
    file_len: usize,
}

/// One tensor's info, checked: a type mappa reads, whole blocks, an aligned
/// offset, and bytes inside the file.
fn tensor_info(
    name: String,
    dims: Vec<u64>,
    code: u32,
    offset: u64,
    layout: &Layout,
) -> Parsed<TensorInfo> {
    let Layout {
        data_start,
        alignment,
        file_len,
    } = *layout;
    let ggml_type = GgmlType::from_code(code).ok_or_else(|| {
        format!(
            "tensor `{name}` is stored as {}, which mappa cannot read (it reads {})",
            quant::code_name(code),
            GgmlType::ALL.map(GgmlType::name).join(", ")
        )
    })?;
    let elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("tensor `{name}` has dimensions {dims:?}: empty or overflowing"))?;
    let block = ggml_type.block_elements() as u64;
    if !dims[0].is_multiple_of(block) {
        return Err(format!(
            "tensor `{name}` ({}) has rows of {} elements, not a multiple of its block of {block}",
            ggml_type.name(),
            dims[0]
        ));
    }
    let size = elements / block * ggml_type.block_bytes() as u64;
    if !offset.is_multiple_of(alignment) {
        return Err(format!(
            "tensor `{name}` starts at data offset {offset}, not a multiple of the alignment {alignment}"
        ));
    }
    let start = data_start.checked_add(offset);
    let end = start.and_then(|s| s.checked_add(size));
    let (start, end) = match (start, end) {
        (Some(s), Some(e)) if e <= file_len as u64 => (s as usize, e as usize),
        _ => {
            return Err(format!(
                "truncated: tensor `{name}` ({}, {size} bytes at offset {}) runs past the end of the file ({} bytes)",
                ggml_type.name(),
                data_start.saturating_add(offset),
                file_len
            ))
        }
    };
    let dims = dims.into_iter().map(|d| d as usize).collect();
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        range: start..end,
    })
}

/// Parses the header, metadata and tensor infos of `bytes`, a whole file.
fn parse(bytes: &[u8]) -> Parsed<(u32, BTreeMap<String, MetaValue>, Vec<TensorInfo>)> {
    let mut cur = Cursor { bytes, pos: 0 };
    let magic = cur.array::<4>(&|| "the magic number".into())?;
    if &magic != MAGIC {
        return Err(format!(
            "not a GGUF file: starts with {magic:02x?}, expected the bytes `GGUF`"
        ));
    }
    let version = cur.u32(&|| "the version".into())?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "GGUF version {version} is not supported (versions 2 and 3 are)"
        ));
    }
    // A tensor info takes at least 8 (name) + 4 + 4 + 8 bytes; a KV pair 8 + 4 + 1.
    let tensor_count = cur.count(24, &|| "the tensor count".into())?;
    let kv_count = cur.count(13, &|| "the metadata count".into())?;

    let mut metadata = BTreeMap::new();
    for i in 0..kv_count {
        let key = cur.string(&|| format!("the key of metadata entry {i}"))?;
        let kind = cur.u32(&|| format!("the value type of `{key}`"))?;
        let value = cur.value(kind, 0, &|| format!("metadata `{key}`"))?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(format!("metadata key `{key}` appears twice"));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::Uint(a)) if *a > 0 && a % 8 == 0 => *a,
        Some(other) => {
            return Err(format!(
                "metadata `general.alignment` is {other:?}, expected a positive multiple of 8"
            ))
        }
    };

    let mut infos = Vec::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let name = cur.string(&|| format!("the name of tensor {i}"))?;
        let what = |field: &str| format!("the {field} of tensor `{name}`");
        let n_dims = cur.u32(&|| what("dimension count"))? as usize;
        if !(1..=4).contains(&n_dims) {
            return Err(format!(
                "tensor `{name}` has {n_dims} dimensions (1 to 4 expected)"
            ));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(cur.u64(&|| what("dimensions"))?);
        }
        let code = cur.u32(&|| what("type"))?;
        let offset = cur.u64(&|| what("data offset"))?;
        infos.push((name, dims, code, offset));
    }
    let data_start = (cur.pos as u64).div_ceil(alignment) * alignment;

    let tensors = infos
        .into_iter()
        .map(|(name, dims, code, offset)| {
            let layout = Layout {
                data_start,
                alignment,
                file_len: bytes.len(),
            };
            tensor_info(name, dims, code, offset, &layout)
        })
        .collect::<Parsed<Vec<_>>>()?;
    Ok((version, metadata, tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal GGUF writer for tests: metadata as raw typed values, tensors as raw bytes.
    pub(crate) struct Writer {
        kv: Vec<u8>,
        kv_count: u64,
        infos: Vec<u8>,
        data: Vec<u8>,
        tensor_count: u64,
    }

    impl Writer {
        pub(crate) fn new() -> Self {
            Self {
                kv: Vec::new(),
                kv_count: 0,
                infos: Vec::new(),
                data: Vec::new(),
                tensor_count: 0,
            }
        }

        fn string(out: &mut Vec<u8>, s: &str) {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }

        pub(crate) fn kv_raw(&mut self, key: &str, kind: u32, value: &[u8]) -> &mut Self {
            Self::string(&mut self.kv, key);
            self.kv.extend(kind.to_le_bytes());
            self.kv.extend(value);
            self.kv_count += 1;
            self
        }

        pub(crate) fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
            self.kv_raw(key, 4, &v.to_le_bytes())
        }

        pub(crate) fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
            let mut bytes = Vec::new();
            Self::string(&mut bytes, v);
            self.kv_raw(key, 8, &bytes)
        }

        pub(crate) fn tensor(
            &mut self,
            name: &str,
            dims: &[u64],
            code: u32,
            data: &[u8],
        ) -> &mut Self {
            while !self.data.len().is_multiple_of(32) {
                self.data.push(0);
            }
            Self::string(&mut self.infos, name);
            self.infos.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                self.infos.extend(d.to_le_bytes());
            }
            self.infos.extend(code.to_le_bytes());
            self.infos.extend((self.data.len() as u64).to_le_bytes());
            self.data.extend(data);
            self.tensor_count += 1;
            self
        }

        pub(crate) fn bytes(&self) -> Vec<u8> {
            let mut out = b"GGUF".to_vec();
            out.extend(3u32.to_le_bytes());
            out.extend(self.tensor_count.to_le_bytes());
            out.extend(self.kv_count.to_le_bytes());
            out.extend(&self.kv);
            out.extend(&self.infos);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
            out.extend(&self.data);
            out
        }
    }

    fn open(bytes: &[u8]) -> Result<GgufFile> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        std::fs::write(&path, bytes).unwrap();
        GgufFile::open(&path)
    }

    fn sample() -> Writer {
        let mut w = Writer::new();
        w.kv_str("general.architecture", "llama")
            .kv_u32("llama.block_count", 2);
        let values: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        w.tensor("w", &[3, 2], 0, &values);
        w.tensor("b", &[2], 0, &values[..8]);
        w
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let file = open(&sample().bytes()).unwrap();
        assert_eq!(file.version(), 3);
        assert_eq!(file.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(file.get_uint("llama.block_count").unwrap(), 2);
        let w = file.tensor("w").unwrap();
        assert_eq!(w.shape(), vec![2, 3]);
        assert_eq!(file.dequantize(w), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(file.dequantize(file.tensor("b").unwrap()), vec![1.0, 2.0]);
    }

    #[test]
    fn every_truncation_is_a_clear_error() {
        let bytes = sample().bytes();
        for len in 0..bytes.len() {
            let err = open(&bytes[..len]).unwrap_err().to_string();
            assert!(err.contains("model.gguf"), "{len}: {err}");
            assert!(
                err.contains("truncated")
                    || err.contains("more than the")
                    || err.contains("not a GGUF"),
                "{len}: {err}"
            );
        }
    }

    #[test]
    fn hostile_headers_are_refused_without_allocating() {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(u64::MAX.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
        let err = open(&bytes).unwrap_err().to_string();
        assert!(err.contains("tensor count"), "{err}");

        let mut w = Writer::new();
        let mut huge = Vec::new();
        huge.extend(u64::MAX.to_le_bytes());
        w.kv_raw("general.name", 8, &huge);
        let err = open(&w.bytes()).unwrap_err().to_string();
        assert!(
            err.contains("the length of metadata `general.name`"),
            "{err}"
        );
    }

    #[test]
    fn bad_files_name_what_is_wrong() {
        let err = open(b"PK\x03\x04 not a gguf").unwrap_err().to_string();
        assert!(err.contains("not a GGUF file"), "{err}");

        let mut bytes = sample().bytes();
        bytes[4] = 9;
        assert!(open(&bytes).unwrap_err().to_string().contains("version 9"));

        let mut w = Writer::new();
        w.tensor("odd", &[30], 2, &[0; 18]);
        let err = open(&w.bytes()).unwrap_err().to_string();
        assert!(err.contains("not a multiple of its block of 32"), "{err}");

        let mut w = Writer::new();
        w.tensor("k", &[256], 13, &[0; 176]);
        let err = open(&w.bytes()).unwrap_err().to_string();
        assert!(err.contains("`k` is stored as Q5_K (code 13)"), "{err}");

        let mut w = Writer::new();
        w.kv_raw("flag", 7, &[2]);
        assert!(open(&w.bytes())
            .unwrap_err()
            .to_string()
            .contains("expected 0 or 1"));

        let file = open(&sample().bytes()).unwrap();
        let err = file.get_str("llama.block_count").unwrap_err().to_string();
        assert!(
            err.contains("should be a string, found an unsigned integer"),
            "{err}"
        );
        let err = file.get_uint("nope").unwrap_err().to_string();
        assert!(err.contains("`nope` is missing"), "{err}");
    }
}
