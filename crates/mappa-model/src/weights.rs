//! HuggingFace checkpoints: reading and writing model weights as safetensors
//! under HF tensor names, with the `config.json` beside them.
//!
//! Reading accepts a single `model.safetensors` or shards listed in
//! `model.safetensors.index.json`, with tensors stored as f32, f16 or bf16
//! (converted to f32 on the host, then to the backend's float type). The
//! safetensors header is checked tensor by tensor, so that a truncated file,
//! a missing tensor, an unexpected one or a shape that disagrees with
//! `config.json` is reported by name.
//!
//! Writing produces `config.json` and `model.safetensors` (metadata
//! `format: pt`, as transformers expects), atomically. Saved in f32, a model
//! loads back bit-identically.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use burn::prelude::*;
use serde_json::Value;

use crate::config::TransformerConfig;
use crate::error::{ModelError, Result};
use crate::transformer::{assemble, dense, Dense, Transformer, WeightSource};

/// How tensors are stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageDtype {
    /// 32-bit floats: exact round trips.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16, the usual dtype of Hub checkpoints.
    Bf16,
}

impl StorageDtype {
    fn safetensors_name(self) -> &'static str {
        match self {
            StorageDtype::F32 => "F32",
            StorageDtype::F16 => "F16",
            StorageDtype::Bf16 => "BF16",
        }
    }

    /// The name `config.json` uses (`torch_dtype` / `dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            StorageDtype::F32 => "float32",
            StorageDtype::F16 => "float16",
            StorageDtype::Bf16 => "bfloat16",
        }
    }

    fn from_safetensors_name(name: &str) -> Option<Self> {
        match name {
            "F32" => Some(StorageDtype::F32),
            "F16" => Some(StorageDtype::F16),
            "BF16" => Some(StorageDtype::Bf16),
            _ => None,
        }
    }

    fn size(self) -> usize {
        match self {
            StorageDtype::F32 => 4,
            StorageDtype::F16 | StorageDtype::Bf16 => 2,
        }
    }

    fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            StorageDtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            StorageDtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            StorageDtype::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
        }
    }

    fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            StorageDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            StorageDtype::F16 => values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
                .collect(),
            StorageDtype::Bf16 => values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
                .collect(),
        }
    }
}

/// Where one tensor sits in a safetensors file.
#[derive(Debug, Clone)]
struct TensorEntry {
    file: usize,
    dtype: StorageDtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    range: std::ops::Range<usize>,
}

/// The safetensors files of one checkpoint, memory-mapped, with a checked index of their tensors.
pub struct SafetensorsSet {
    files: Vec<(PathBuf, memmap2::Mmap)>,
    tensors: BTreeMap<String, TensorEntry>,
}

impl SafetensorsSet {
    /// Opens the weights of the checkpoint directory `dir`: `model.safetensors`,
    /// or the shards named by `model.safetensors.index.json`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            let text = std::fs::read_to_string(&index)
                .map_err(|e| ModelError::io("cannot read", &index, e))?;
            let json: Value = serde_json::from_str(&text)
                .map_err(|e| ModelError::weights(&index, format!("is not valid JSON: {e}")))?;
            let map = json
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| ModelError::weights(&index, "has no `weight_map` object"))?;
            let mut shards = BTreeSet::new();
            let mut expected = BTreeMap::new();
            for (name, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    ModelError::weights(
                        &index,
                        format!("weight_map entry for tensor `{name}` is not a file name"),
                    )
                })?;
                shards.insert(file.to_string());
                expected.insert(name.clone(), file.to_string());
            }
            let paths: Vec<PathBuf> = shards.iter().map(|f| dir.join(f)).collect();
            let set = Self::open_files(&paths)?;
            for (name, file) in &expected {
                match set.tensors.get(name) {
                    Some(entry) if set.files[entry.file].0 == dir.join(file) => {}
                    Some(entry) => {
                        return Err(ModelError::weights(
                            &index,
                            format!(
                                "tensor `{name}` is listed in `{file}` but found in `{}`",
                                set.files[entry.file].0.display()
                            ),
                        ))
                    }
                    None => {
                        return Err(ModelError::weights(
                            dir.join(file),
                            format!(
                                "tensor `{name}` listed in the index is missing from this shard"
                            ),
                        ))
                    }
                }
            }
            Ok(set)
        } else {
            let single = dir.join("model.safetensors");
            if !single.exists() {
                return Err(ModelError::weights(
                    dir,
                    "no model.safetensors or model.safetensors.index.json in this directory",
                ));
            }
            Self::open_files(&[single])
        }
    }

    /// Opens the given safetensors files as one set; a tensor may appear in only one.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self> {
        let mut files = Vec::with_capacity(paths.len());
        let mut tensors = BTreeMap::new();
        for (i, path) in paths.iter().enumerate() {
            let file =
                std::fs::File::open(path).map_err(|e| ModelError::io("cannot open", path, e))?;
            // SAFETY: the map is read-only and lives as long as the set; a file
            // truncated by another process while mapped is outside our contract.
            let mmap = unsafe { memmap2::Mmap::map(&file) }
                .map_err(|e| ModelError::io("cannot map", path, e))?;
            for (name, entry) in parse_header(path, &mmap, i)? {
                if tensors.contains_key(&name) {
                    return Err(ModelError::weights(
                        path,
                        format!("tensor `{name}` appears in more than one file"),
                    ));
                }
                tensors.insert(name, entry);
            }
            files.push((path.clone(), mmap));
        }
        Ok(Self { files, tensors })
    }

    /// Names of all tensors in the set.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The storage dtype of tensor `name`, if present.
    pub fn dtype(&self, name: &str) -> Option<StorageDtype> {
        self.tensors.get(name).map(|e| e.dtype)
    }

    /// Reads tensor `name` as f32, checking its shape against `shape`.
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let entry = self.tensors.get(name).ok_or_else(|| {
            let file = self.files.first().map(|f| f.0.clone()).unwrap_or_default();
            ModelError::weights(file, format!("tensor `{name}` is missing"))
        })?;
        let path = &self.files[entry.file].0;
        if entry.shape != shape {
            return Err(ModelError::weights(
                path,
                format!(
                    "tensor `{name}` has shape {:?}, but config.json implies {shape:?}",
                    entry.shape
                ),
            ));
        }
        let bytes = &self.files[entry.file].1[entry.range.clone()];
        Ok(entry.dtype.decode(bytes))
    }
}

/// The entries of a safetensors header in file order, duplicates kept: a map
/// would silently keep only the last of two tensors with the same name.
struct HeaderEntries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for HeaderEntries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = HeaderEntries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of tensor entries")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<HeaderEntries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(HeaderEntries(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// Parses and checks the header of one safetensors file: every size and
/// offset is checked against the file before anything is allocated from it,
/// and tensors may neither share a name nor overlap.
fn parse_header(path: &Path, bytes: &[u8], file: usize) -> Result<Vec<(String, TensorEntry)>> {
    let err = |msg: String| ModelError::weights(path, msg);
    if bytes.len() < 8 {
        return Err(err(format!(
            "file is {} bytes, too short for a safetensors header",
            bytes.len()
        )));
    }
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let data_start = usize::try_from(header_len)
        .ok()
        .and_then(|len| len.checked_add(8))
        .filter(|end| *end <= bytes.len())
        .ok_or_else(|| {
            err(format!(
                "header claims {header_len} bytes but the file has {}: truncated or not a safetensors file",
                bytes.len()
            ))
        })?;
    let HeaderEntries(header) = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| err(format!("header is not valid safetensors JSON: {e}")))?;
    let data_len = bytes.len() - data_start;
    let mut names = BTreeSet::new();
    let mut out = Vec::with_capacity(header.len());
    for (name, info) in header {
        if !names.insert(name.clone()) {
            return Err(err(format!("tensor `{name}` appears twice in the header")));
        }
        if name == "__metadata__" {
            continue;
        }
        let (dtype, shape, begin, end) = header_entry(&name, &info, data_len).map_err(err)?;
        out.push((
            name,
            TensorEntry {
                file,
                dtype,
                shape,
                range: data_start + begin..data_start + end,
            },
        ));
    }
    check_disjoint(&out).map_err(err)?;
    Ok(out)
}

/// One tensor's entry of a safetensors header, checked against the
/// `data_len` bytes after the header: its dtype, shape and byte range.
fn header_entry(
    name: &str,
    info: &Value,
    data_len: usize,
) -> std::result::Result<(StorageDtype, Vec<usize>, usize, usize), String> {
    let dtype_name = match info.get("dtype") {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(format!(
                "tensor `{name}` has dtype {other}, expected a string (F32, F16 or BF16)"
            ))
        }
        None => return Err(format!("tensor `{name}` has no `dtype`")),
    };
    let dtype = StorageDtype::from_safetensors_name(dtype_name).ok_or_else(|| {
        format!("tensor `{name}` has dtype {dtype_name}; supported: F32, F16, BF16")
    })?;
    let shape: Vec<usize> = info
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|dims| {
            dims.iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect()
        })
        .ok_or_else(|| {
            format!("tensor `{name}` has no valid `shape` (a list of non-negative integers)")
        })?;
    let offsets: Vec<usize> = info
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|o| {
                o.iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect()
            })
            .filter(|o: &Vec<usize>| o.len() == 2 && o[0] <= o[1])
            .ok_or_else(|| {
                format!(
                    "tensor `{name}` has no valid `data_offsets` (two integers [begin, end], begin <= end)"
                )
            })?;
    let (begin, end) = (offsets[0], offsets[1]);
    let expected = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("tensor `{name}`: shape {shape:?} overflows"))?;
    if end - begin != expected {
        return Err(format!(
            "tensor `{name}`: {} bytes for shape {shape:?} in {dtype_name}, expected {expected}",
            end - begin
        ));
    }
    if end > data_len {
        return Err(format!(
                "tensor `{name}` needs data bytes {begin}..{end} but the file holds only {data_len}: the file is truncated"
            ));
    }
    Ok((dtype, shape, begin, end))
}

/// Checks that no two tensors share a byte (empty tensors share none).
fn check_disjoint(entries: &[(String, TensorEntry)]) -> std::result::Result<(), String> {
    let mut ranges: Vec<(&str, &std::ops::Range<usize>)> = entries
        .iter()
        .filter(|(_, e)| !e.range.is_empty())
        .map(|(name, e)| (name.as_str(), &e.range))
        .collect();
    ranges.sort_by_key(|(_, r)| (r.start, r.end));
    for pair in ranges.windows(2) {
        let ((a, ra), (b, rb)) = (pair[0], pair[1]);
        if rb.start < ra.end {
            return Err(format!(
                "tensors `{a}` and `{b}` overlap (file bytes {ra:?} and {rb:?})"
            ));
        }
    }
    Ok(())
}

/// HF tensor name of layer `i`'s sub-tensor `rest`.
fn layer_name(i: usize, rest: &str) -> String {
    format!("model.layers.{i}.{rest}")
}

/// Tensors some checkpoints carry that this model recomputes or never uses.
fn is_ignorable(name: &str, config: &TransformerConfig) -> bool {
    name.ends_with("rotary_emb.inv_freq")
        || (config.tie_word_embeddings && name == "lm_head.weight")
}

/// Reads tensors from a set by HF name, recording which were used.
struct Reader<'a, B: Backend> {
    set: &'a SafetensorsSet,
    device: &'a B::Device,
    used: BTreeSet<String>,
}

impl<B: Backend> Reader<'_, B> {
    fn values(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let values = self.set.read_f32(name, shape)?;
        self.used.insert(name.to_string());
        Ok(values)
    }

    fn vector(&mut self, name: &str, n: usize) -> Result<Tensor<B, 1>> {
        let v = self.values(name, &[n])?;
        Ok(Tensor::from_data(TensorData::new(v, [n]), self.device))
    }
}

impl<B: Backend> WeightSource<B> for Reader<'_, B> {
    /// A HF linear layer: `prefix.weight` (`[out, in]`) and `prefix.bias`.
    fn linear(&mut self, prefix: &str, d_in: usize, d_out: usize, bias: bool) -> Result<Dense<B>> {
        let w = self.values(&format!("{prefix}.weight"), &[d_out, d_in])?;
        let w = Tensor::from_data(TensorData::new(w, [d_out, d_in]), self.device);
        let b = if bias {
            Some(self.vector(&format!("{prefix}.bias"), d_out)?)
        } else {
            None
        };
        Ok(dense(w, b))
    }

    fn norm(&mut self, name: &str, n: usize) -> Result<Tensor<B, 1>> {
        self.vector(&format!("{name}.weight"), n)
    }

    fn embedding(&mut self, name: &str, vocab: usize, hidden: usize) -> Result<Tensor<B, 2>> {
        let v = self.values(&format!("{name}.weight"), &[vocab, hidden])?;
        Ok(Tensor::from_data(
            TensorData::new(v, [vocab, hidden]),
            self.device,
        ))
    }
}

/// Builds a model from a set of safetensors files.
pub fn load_from_set<B: Backend>(
    config: TransformerConfig,
    set: &SafetensorsSet,
    device: &B::Device,
) -> Result<Transformer<B>> {
    let mut reader = Reader::<B> {
        set,
        device,
        used: BTreeSet::new(),
    };
    let model = assemble(config, &mut reader)?;
    let c = model.config();
    if let Some(extra) = set
        .names()
        .find(|n| !reader.used.contains(*n) && !is_ignorable(n, c))
    {
        let file = &set.files[set.tensors[extra].file].0;
        return Err(ModelError::weights(
            file,
            format!(
                "unexpected tensor `{extra}`: config.json describes a model without it (wrong family or bias settings?)"
            ),
        ));
    }
    Ok(model)
}

/// Loads `config.json` and the safetensors weights of the HF checkpoint directory `dir`.
pub fn load_transformer<B: Backend>(dir: &Path, device: &B::Device) -> Result<Transformer<B>> {
    let config = TransformerConfig::from_hf_file(&dir.join("config.json"))?;
    let set = SafetensorsSet::open_dir(dir)?;
    load_from_set(config, &set, device)
}

/// A named tensor as host f32 values: (name, shape, row-major values).
pub(crate) fn host<B: Backend, const D: usize>(
    name: String,
    t: Tensor<B, D>,
) -> (String, Vec<usize>, Vec<f32>) {
    let shape = t.dims().to_vec();
    let values = t
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 data");
    (name, shape, values)
}

/// The model's tensors under HF names, in HF layout, as host f32 values.
pub fn hf_tensors<B: Backend>(model: &Transformer<B>) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    fn dense<B: Backend>(
        out: &mut Vec<(String, Vec<usize>, Vec<f32>)>,
        prefix: String,
        d: &Dense<B>,
    ) {
        out.push(host(format!("{prefix}.weight"), d.weight.val()));
        if let Some(b) = &d.bias {
            out.push(host(format!("{prefix}.bias"), b.val()));
        }
    }
    let mut out = vec![host(
        "model.embed_tokens.weight".into(),
        model.embed_tokens.weight.val(),
    )];
    for (i, layer) in model.layers.iter().enumerate() {
        let a = &layer.self_attn;
        for (name, d) in [
            ("q_proj", &a.q_proj),
            ("k_proj", &a.k_proj),
            ("v_proj", &a.v_proj),
            ("o_proj", &a.o_proj),
        ] {
            dense(&mut out, layer_name(i, &format!("self_attn.{name}")), d);
        }
        if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
            out.push(host(
                layer_name(i, "self_attn.q_norm.weight"),
                qn.gamma.val(),
            ));
            out.push(host(
                layer_name(i, "self_attn.k_norm.weight"),
                kn.gamma.val(),
            ));
        }
        let m = &layer.mlp;
        for (name, d) in [
            ("gate_proj", &m.gate_proj),
            ("up_proj", &m.up_proj),
            ("down_proj", &m.down_proj),
        ] {
            dense(&mut out, layer_name(i, &format!("mlp.{name}")), d);
        }
        out.push(host(
            layer_name(i, "input_layernorm.weight"),
            layer.input_layernorm.gamma.val(),
        ));
        out.push(host(
            layer_name(i, "post_attention_layernorm.weight"),
            layer.post_attention_layernorm.gamma.val(),
        ));
    }
    out.push(host("model.norm.weight".into(), model.norm.gamma.val()));
    if let Some(head) = &model.lm_head {
        dense(&mut out, "lm_head".into(), head);
    }
    out
}

/// Serialises the model's weights as one safetensors file (bytes).
pub fn to_safetensors_bytes<B: Backend>(
    model: &Transformer<B>,
    dtype: StorageDtype,
) -> Result<Vec<u8>> {
    tensors_to_safetensors_bytes(hf_tensors(model), dtype)
}

/// Serialises named tensors (HF name, shape, row-major values) as one
/// safetensors file (bytes) stored as `dtype`, with the `format: pt`
/// metadata transformers expects.
pub fn tensors_to_safetensors_bytes(
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
    dtype: StorageDtype,
) -> Result<Vec<u8>> {
    struct Raw {
        dtype: safetensors::Dtype,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    }
    impl safetensors::View for &Raw {
        fn dtype(&self) -> safetensors::Dtype {
            self.dtype
        }
        fn shape(&self) -> &[usize] {
            &self.shape
        }
        fn data(&self) -> std::borrow::Cow<'_, [u8]> {
            std::borrow::Cow::Borrowed(&self.bytes)
        }
        fn data_len(&self) -> usize {
            self.bytes.len()
        }
    }
    let st_dtype = match dtype {
        StorageDtype::F32 => safetensors::Dtype::F32,
        StorageDtype::F16 => safetensors::Dtype::F16,
        StorageDtype::Bf16 => safetensors::Dtype::BF16,
    };
    debug_assert_eq!(dtype.safetensors_name(), format!("{st_dtype:?}"));
    let raws: Vec<(String, Raw)> = tensors
        .into_iter()
        .map(|(name, shape, values)| {
            let bytes = dtype.encode(&values);
            (
                name,
                Raw {
                    dtype: st_dtype,
                    shape,
                    bytes,
                },
            )
        })
        .collect();
    let metadata = Some(std::collections::HashMap::from([(
        "format".to_string(),
        "pt".to_string(),
    )]));
    safetensors::serialize(raws.iter().map(|(n, r)| (n.as_str(), r)), metadata).map_err(|e| {
        ModelError::weights(
            PathBuf::from("model.safetensors"),
            format!("cannot serialise: {e}"),
        )
    })
}

/// Saves the model as a HF checkpoint directory: `config.json` and
/// `model.safetensors`, each written atomically. Tokenizer files, when the
/// caller has them, are copied separately ([`crate::Checkpoint::save`]).
pub fn save_transformer<B: Backend>(
    model: &Transformer<B>,
    dir: &Path,
    dtype: StorageDtype,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io("cannot create", dir, e))?;
    let bytes = to_safetensors_bytes(model, dtype)?;
    let weights = dir.join("model.safetensors");
    mappa_core::fs::write_atomic(&weights, &bytes)?;
    // A previous sharded save would shadow the new single file.
    let stale_index = dir.join("model.safetensors.index.json");
    if stale_index.exists() {
        std::fs::remove_file(&stale_index)
            .map_err(|e| ModelError::io("cannot remove", &stale_index, e))?;
    }
    let config = model.config().to_hf_json(dtype.torch_name());
    let text = serde_json::to_string_pretty(&config).expect("config serialises");
    mappa_core::fs::write_atomic(&dir.join("config.json"), text.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::TestBackend;

    fn tiny(family: Family, tied: bool) -> TransformerConfig {
        TransformerConfig::for_family(family, 40, 16, 24, 2, 4, 2, 8).with_tie_word_embeddings(tied)
    }

    #[test]
    fn save_load_round_trip_is_bit_identical() {
        let device = Default::default();
        for (family, tied) in [
            (Family::Qwen3, true),
            (Family::Qwen2, false),
            (Family::Llama, false),
        ] {
            let model = tiny(family, tied).init::<TestBackend>(3, &device);
            let dir = tempfile::tempdir().unwrap();
            save_transformer(&model, dir.path(), StorageDtype::F32).unwrap();
            let loaded = load_transformer::<TestBackend>(dir.path(), &device).unwrap();
            assert_eq!(loaded.config(), model.config());
            assert_eq!(hf_tensors(&loaded), hf_tensors(&model), "{family:?}");
            // Saving again gives the same bytes.
            let again = tempfile::tempdir().unwrap();
            save_transformer(&loaded, again.path(), StorageDtype::F32).unwrap();
            let read = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
            assert_eq!(read(dir.path()), read(again.path()));
        }
    }

    #[test]
    fn bf16_save_rounds_once_then_is_stable() {
        let device = Default::default();
        let model = tiny(Family::Llama, false).init::<TestBackend>(4, &device);
        let dir = tempfile::tempdir().unwrap();
        save_transformer(&model, dir.path(), StorageDtype::Bf16).unwrap();
        let loaded = load_transformer::<TestBackend>(dir.path(), &device).unwrap();
        for ((name, _, a), (_, _, b)) in hf_tensors(&model).iter().zip(hf_tensors(&loaded)) {
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(half::bf16::from_f32(*x).to_f32(), *y, "{name}");
            }
        }
        let again = tempfile::tempdir().unwrap();
        save_transformer(&loaded, again.path(), StorageDtype::Bf16).unwrap();
        let read = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
        assert_eq!(read(dir.path()), read(again.path()));
    }

    fn saved(family: Family) -> tempfile::TempDir {
        let model = tiny(family, false).init::<TestBackend>(3, &Default::default());
        let dir = tempfile::tempdir().unwrap();
        save_transformer(&model, dir.path(), StorageDtype::F32).unwrap();
        dir
    }

    fn load_err(dir: &Path) -> String {
        load_transformer::<TestBackend>(dir, &Default::default())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn truncated_file_names_a_tensor() {
        let dir = saved(Family::Llama);
        let path = dir.path().join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
        let err = load_err(dir.path());
        assert!(
            err.contains("truncated") && err.contains("tensor `"),
            "{err}"
        );
        std::fs::write(&path, &bytes[..20]).unwrap();
        let err = load_err(dir.path());
        assert!(
            err.contains("model.safetensors") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn corrupted_header_is_reported() {
        let dir = saved(Family::Llama);
        let path = dir.path().join("model.safetensors");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8] = b'#'; // the opening brace of the JSON header
        std::fs::write(&path, &bytes).unwrap();
        let err = load_err(dir.path());
        assert!(err.contains("header is not valid"), "{err}");
    }

    #[test]
    fn missing_and_misshapen_tensors_are_named() {
        let dir = saved(Family::Qwen2);
        // Claim a bigger vocabulary than the weights have.
        let cfg_path = dir.path().join("config.json");
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["vocab_size"] = 41.into();
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let err = load_err(dir.path());
        assert!(
            err.contains("model.embed_tokens.weight") && err.contains("[40, 16]"),
            "{err}"
        );
        // One more layer than stored: the first tensor of layer 2 is missing.
        cfg["vocab_size"] = 40.into();
        cfg["num_hidden_layers"] = 3.into();
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let err = load_err(dir.path());
        assert!(
            err.contains("model.layers.2.self_attn.q_proj.weight") && err.contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn unexpected_tensor_is_named() {
        let dir = saved(Family::Qwen2);
        // Declare the checkpoint a Llama: the q/k/v biases are then unexpected.
        let cfg_path = dir.path().join("config.json");
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["model_type"] = "llama".into();
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let err = load_err(dir.path());
        assert!(
            err.contains("unexpected tensor") && err.contains("bias"),
            "{err}"
        );
    }
}
