//! Hostile inputs for the files mappa-model reads (issue 15): safetensors
//! headers, `config.json`, `tokenizer.json` / `tokenizer_config.json` /
//! `generation_config.json` and chat templates, as random bytes and as
//! mutations of the fixtures. Every case must end in `Ok` or in an error
//! naming the file (and the field where there is one); none may panic, hang
//! or allocate from a size it has not checked.
//!
//! Cases per run (fixed, so that CI runs a bounded number):
//!
//! | property | cases |
//! |---|---|
//! | `safetensors_headers_are_checked_exactly` | 256 |
//! | `safetensors_garbage_is_an_error_naming_the_file` | 256 |
//! | `checkpoint_mutations_load_or_name_a_file` | 32 |
//! | `config_json_mutations_name_the_file_and_field` | 256 |
//! | `tokenizer_file_mutations_load_or_name_the_file` | 64 |
//! | `chat_templates_render_or_fail_without_hanging` | 128 |
//!
//! 992 cases in all, plus plain tests at the end: one per bug found, and one
//! that the fuel given to chat templates leaves room for real use.

use std::fmt::Display;
use std::path::{Path, PathBuf};

use mappa_model::weights::SafetensorsSet;
use mappa_model::{
    ChatMessage, ChatRequest, ChatTemplate, Checkpoint, Cpu, HfTokenizer, Tokenizer,
    TransformerConfig,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// Copies the files of `from` (not recursively) into a new temporary directory.
fn copy_dir(from: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() && path.file_name().unwrap() != "golden.json" {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    dir
}

/// Fails the case unless the error's text names `path`.
fn names(err: &impl Display, path: &Path) -> Result<(), TestCaseError> {
    let msg = err.to_string();
    prop_assert!(
        msg.contains(&path.display().to_string()),
        "error should name {}: {msg}",
        path.display()
    );
    Ok(())
}

/// JSON values a careless or hostile file puts where another type belongs.
fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(null)),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(3)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(4_294_967_296u64)),
        Just(json!(1e308)),
        Just(json!(-0.0)),
        Just(json!(2.5)),
        Just(json!("")),
        Just(json!("\u{0}\u{fffd}é<|im_end|>")),
        Just(json!([])),
        Just(json!({})),
        Just(json!(true)),
        Just(json!([1, "x", null, -2])),
        Just(json!({"content": 5})),
        any::<i64>().prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::from),
    ]
}

/// Arbitrary JSON, nested a few levels, with keys a safetensors header or a
/// config file uses.
fn json_value() -> impl Strategy<Value = Value> {
    let key = select(vec![
        "dtype",
        "shape",
        "data_offsets",
        "__metadata__",
        "a",
        "model",
        "vocab",
        "",
    ]);
    let leaf = prop_oneof![hostile_value(), any::<f64>().prop_map(|f| json!(f))];
    leaf.prop_recursive(3, 32, 6, move |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec((key.clone().prop_map(String::from), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Replaces (or, with `None`, removes) the value found by walking `steps`
/// into `v`: each step picks a key or an element; the walk stops at a leaf.
fn mutate_at(v: &mut Value, steps: &[Index], new: Option<Value>) {
    let Some((step, rest)) = steps.split_first() else {
        *v = new.unwrap_or(Value::Null);
        return;
    };
    match v {
        Value::Object(map) if !map.is_empty() => {
            let key = map.keys().nth(step.index(map.len())).unwrap().clone();
            if rest.is_empty() && new.is_none() {
                map.remove(&key);
            } else {
                mutate_at(map.get_mut(&key).unwrap(), rest, new);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let i = step.index(items.len());
            if rest.is_empty() && new.is_none() {
                items.remove(i);
            } else {
                mutate_at(&mut items[i], rest, new);
            }
        }
        leaf => *leaf = new.unwrap_or(Value::Null),
    }
}

/// A change to a file's bytes.
#[derive(Debug, Clone)]
enum ByteEdit {
    /// XOR the byte at a position with a mask.
    Flip(Index, u8),
    /// Cut the file at a position.
    Truncate(Index),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        4 => (any::<Index>(), 1u8..).prop_map(|(i, m)| ByteEdit::Flip(i, m)),
        1 => any::<Index>().prop_map(ByteEdit::Truncate),
    ]
}

/// Applies `edit` within `bytes[..limit]` (the whole file when `limit` is larger).
fn apply(bytes: &mut Vec<u8>, edit: &ByteEdit, limit: usize) {
    let n = bytes.len().min(limit);
    if n == 0 {
        return;
    }
    match edit {
        ByteEdit::Flip(i, mask) => bytes[i.index(n)] ^= mask,
        ByteEdit::Truncate(i) => bytes.truncate(i.index(n)),
    }
}

// ---------------------------------------------------------------- safetensors

/// Where a generated tensor's data is said to lie.
#[derive(Debug, Clone)]
enum Placement {
    /// Right after the previous tensor (a valid layout).
    Next,
    /// Starting this many bytes before the end of the previous one (overlap).
    Back(u64),
    /// At a fixed data offset.
    At(u64),
    /// Arbitrary `[begin, end]`, reversed or out of range as it comes.
    Raw(u64, u64),
}

/// One generated header entry.
#[derive(Debug, Clone)]
struct TensorSpec {
    name: &'static str,
    dtype: &'static str,
    shape: Vec<u64>,
    placement: Placement,
}

fn tensor_spec() -> impl Strategy<Value = TensorSpec> {
    let dim = prop_oneof![
        12 => 0u64..4,
        1 => Just(u64::MAX),
        1 => Just(1u64 << 33),
        1 => any::<u64>(),
    ];
    let placement = prop_oneof![
        8 => Just(Placement::Next),
        1 => (1u64..8).prop_map(Placement::Back),
        1 => (0u64..64).prop_map(Placement::At),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(a, b)| Placement::Raw(a, b)),
    ];
    let dtype = prop_oneof![
        8 => select(vec!["F32", "F16", "BF16"]),
        1 => select(vec!["I64", "f32", "", "F8_E4M3"]),
    ];
    (
        select(vec!["a", "b", "c", "d", "e", "f"]),
        dtype,
        vec(dim, 0..4),
        placement,
    )
        .prop_map(|(name, dtype, shape, placement)| TensorSpec {
            name,
            dtype,
            shape,
            placement,
        })
}

/// How the header's length field is written.
#[derive(Debug, Clone)]
enum HeaderLen {
    Exact,
    Off(i64),
    Any(u64),
}

/// A generated safetensors file and whether a correct reader accepts it.
struct BuiltFile {
    bytes: Vec<u8>,
    valid: bool,
    /// Name and shape of every tensor, for reading them back when valid.
    tensors: Vec<(String, Vec<usize>)>,
}

/// Lays out `specs` as a safetensors file, computing independently of the
/// reader whether the file is valid: known dtypes, sizes that fit, offsets in
/// order and in range, unique names, no two tensors sharing a byte, and an
/// exact header length.
fn build_file(specs: &[TensorSpec], slack: i64, len: &HeaderLen) -> BuiltFile {
    let mut valid = true;
    let mut cursor = 0u64;
    let mut placed = Vec::new();
    for spec in specs {
        let elem = match spec.dtype {
            "F32" => Some(4u64),
            "F16" | "BF16" => Some(2),
            _ => None,
        };
        valid &= elem.is_some();
        // Every partial product must fit: `[u64::MAX, 0]` is refused, so
        // that no later product over the shape can overflow.
        let size = spec
            .shape
            .iter()
            .try_fold(elem.unwrap_or(4), |acc, &d| acc.checked_mul(d));
        valid &= size.is_some();
        let small = size.filter(|s| *s < 1 << 20);
        let (begin, end) = match (&spec.placement, small) {
            (Placement::Raw(a, b), _) => (*a, *b),
            (_, None) => (0, u64::MAX),
            (Placement::Next, Some(s)) => (cursor, cursor + s),
            (Placement::Back(k), Some(s)) => {
                let b = cursor.saturating_sub(*k);
                (b, b + s)
            }
            (Placement::At(p), Some(s)) => (*p, p + s),
        };
        cursor = cursor.max(end.min(1 << 20));
        valid &= begin <= end && Some(end - begin) == size;
        placed.push((spec, begin, end));
    }
    let data_len = (cursor as i64 + slack).max(0) as u64;
    let mut names = std::collections::BTreeSet::new();
    let mut ranges = Vec::new();
    for (spec, begin, end) in &placed {
        valid &= names.insert(spec.name) && *end <= data_len;
        if begin < end {
            ranges.push((*begin, *end));
        }
    }
    ranges.sort();
    valid &= ranges.windows(2).all(|w| w[1].0 >= w[0].1);

    let mut header = String::from(r#"{"__metadata__":{"format":"pt"}"#);
    for (spec, begin, end) in &placed {
        header.push_str(&format!(
            r#","{}":{{"dtype":"{}","shape":{:?},"data_offsets":[{begin},{end}]}}"#,
            spec.name, spec.dtype, spec.shape
        ));
    }
    header.push('}');
    let exact = header.len() as u64;
    let written = match len {
        HeaderLen::Exact => exact,
        HeaderLen::Off(d) => exact.saturating_add_signed(*d),
        HeaderLen::Any(v) => *v,
    };
    valid &= written == exact;
    let mut bytes = written.to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0xAB, data_len as usize));
    let tensors = placed
        .iter()
        .map(|(s, ..)| {
            (
                s.name.to_string(),
                s.shape.iter().map(|&d| d as usize).collect(),
            )
        })
        .collect();
    BuiltFile {
        bytes,
        valid,
        tensors,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The reader accepts exactly the valid files (as an independent check
    /// computes it), reads every tensor of those, and names the file otherwise.
    #[test]
    fn safetensors_headers_are_checked_exactly(
        specs in vec(tensor_spec(), 0..5),
        slack in prop_oneof![4 => Just(0i64), 1 => -8i64..8],
        len in prop_oneof![
            8 => Just(HeaderLen::Exact),
            1 => (-4i64..4).prop_filter("off", |d| *d != 0).prop_map(HeaderLen::Off),
            1 => any::<u64>().prop_map(HeaderLen::Any),
        ],
    ) {
        let built = build_file(&specs, slack, &len);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, &built.bytes).unwrap();
        match SafetensorsSet::open_files(std::slice::from_ref(&path)) {
            Ok(set) => {
                prop_assert!(built.valid, "accepted an invalid file");
                for (name, shape) in &built.tensors {
                    let values = set.read_f32(name, shape).unwrap();
                    prop_assert_eq!(values.len(), shape.iter().product::<usize>());
                }
            }
            Err(e) => {
                prop_assert!(!built.valid, "refused a valid file: {}", e);
                names(&e, &path)?;
            }
        }
    }

    /// Random bytes, and random JSON behind a correct length field, are
    /// errors that name the file (or, rarely, a valid empty set).
    #[test]
    fn safetensors_garbage_is_an_error_naming_the_file(
        bytes in prop_oneof![
            vec(any::<u8>(), 0..64),
            vec(any::<u8>(), 0..256).prop_map(|rest| {
                let mut b = (rest.len() as u64).to_le_bytes().to_vec();
                b.extend(rest);
                b
            }),
            (json_value(), vec(any::<u8>(), 0..32)).prop_map(|(v, data)| {
                let header = v.to_string();
                let mut b = (header.len() as u64).to_le_bytes().to_vec();
                b.extend(header.as_bytes());
                b.extend(data);
                b
            }),
        ],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        if let Err(e) = SafetensorsSet::open_files(std::slice::from_ref(&path)) {
            names(&e, &path)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Byte flips and truncations of a whole checkpoint (a single-file Llama
    /// and a sharded Qwen2 with its index): the safetensors edits land in the
    /// header, where they change names, shapes, offsets and dtypes. Loading
    /// succeeds or names a file of the checkpoint.
    #[test]
    fn checkpoint_mutations_load_or_name_a_file(
        sharded in any::<bool>(),
        file in any::<Index>(),
        edits in vec(byte_edit(), 1..4),
    ) {
        let name = if sharded { "qwen2-tiny" } else { "llama-tiny" };
        let dir = copy_dir(&fixtures().join("models").join(name));
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let target = &files[file.index(files.len())];
        let mut bytes = std::fs::read(target).unwrap();
        let limit = if target.extension().is_some_and(|x| x == "safetensors") {
            8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
        } else {
            usize::MAX
        };
        for edit in &edits {
            apply(&mut bytes, edit, limit);
        }
        std::fs::write(target, &bytes).unwrap();
        if let Err(e) = Checkpoint::<Cpu>::load(dir.path(), &Default::default()) {
            names(&e, dir.path())?;
        }
    }
}

// ---------------------------------------------------------------- config.json

/// The `config.json` fields this crate reads.
const CONFIG_FIELDS: [&str; 23] = [
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "use_sliding_window",
    "layer_types",
    "bos_token_id",
    "eos_token_id",
];

/// One edit of a `config.json`.
#[derive(Debug, Clone)]
enum ConfigEdit {
    /// Set a field to a value.
    Set(&'static str, Value),
    /// Remove a field.
    Remove(&'static str),
    /// Set a key inside a (created if need be) llama3 RoPE table.
    Rope(&'static str, &'static str, Value),
}

fn config_edit() -> impl Strategy<Value = ConfigEdit> {
    let field = select(CONFIG_FIELDS.to_vec());
    let rope_key = select(vec![
        "rope_type",
        "type",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
        "rope_theta",
    ]);
    prop_oneof![
        4 => (field.clone(), hostile_value()).prop_map(|(f, v)| ConfigEdit::Set(f, v)),
        2 => field.prop_map(ConfigEdit::Remove),
        2 => (select(vec!["rope_scaling", "rope_parameters"]), rope_key, hostile_value())
            .prop_map(|(t, k, v)| ConfigEdit::Rope(t, k, v)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Edited fixture configs read or fail naming the file; a single edit
    /// that fails is named in the message (the field, or the RoPE table).
    #[test]
    fn config_json_mutations_name_the_file_and_field(
        family in select(vec!["llama-tiny", "qwen2-tiny", "qwen3-tiny"]),
        edits in vec(config_edit(), 1..4),
        cut in prop::option::weighted(0.1, any::<Index>()),
    ) {
        let text = std::fs::read_to_string(
            fixtures().join("models").join(family).join("config.json"),
        )
        .unwrap();
        let mut json: Value = serde_json::from_str(&text).unwrap();
        for edit in &edits {
            let obj = json.as_object_mut().unwrap();
            match edit {
                ConfigEdit::Set(f, v) => {
                    obj.insert(f.to_string(), v.clone());
                }
                ConfigEdit::Remove(f) => {
                    obj.remove(*f);
                }
                ConfigEdit::Rope(table, key, v) => {
                    let t = obj
                        .entry(table.to_string())
                        .or_insert_with(|| json!({"rope_type": "llama3"}));
                    if !t.is_object() {
                        *t = json!({});
                    }
                    t[*key] = v.clone();
                }
            }
        }
        let mut text = serde_json::to_string_pretty(&json).unwrap();
        if let Some(cut) = &cut {
            // Cut on a character boundary: the file stays UTF-8 text.
            let mut at = cut.index(text.len());
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            text.truncate(at);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, &text).unwrap();
        if let Err(e) = TransformerConfig::from_hf_file(&path) {
            names(&e, &path)?;
            let msg = e.to_string();
            if let ([edit], None) = (edits.as_slice(), &cut) {
                let field = match edit {
                    ConfigEdit::Set(f, _) | ConfigEdit::Remove(f) | ConfigEdit::Rope(f, ..) => f,
                };
                // An edit can also expose a neighbour: a removed `model_type`
                // leaves `architectures` to decide, a removed `head_dim` is derived.
                let neighbours: &[&str] = match *field {
                    "model_type" => &["architectures"],
                    "head_dim" | "num_attention_heads" | "hidden_size" => {
                        &["head_dim", "num_attention_heads", "num_key_value_heads"]
                    }
                    "num_key_value_heads" => &["num_attention_heads"],
                    _ => &[],
                };
                prop_assert!(
                    msg.contains(field) || neighbours.iter().any(|n| msg.contains(n)),
                    "error should name `{}`: {}", field, msg
                );
            }
        }
    }
}

// ---------------------------------------------------------------- tokenizer files

/// Which tokenizer file a case edits, and how.
#[derive(Debug, Clone)]
enum TokenizerEdit {
    /// Replace or remove a value somewhere inside a JSON file.
    Json(&'static str, Vec<Index>, Option<Value>),
    /// Set a top-level field of a JSON file.
    Field(&'static str, &'static str, Value),
    /// Flip or cut the bytes of a file.
    Bytes(&'static str, ByteEdit),
}

const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];

fn tokenizer_edit() -> impl Strategy<Value = TokenizerEdit> {
    let file = select(TOKENIZER_FILES.to_vec());
    let field = select(vec![
        "bos_token",
        "eos_token",
        "pad_token",
        "chat_template",
        "eos_token_id",
        "added_tokens",
        "model",
        "normalizer",
        "pre_tokenizer",
        "decoder",
    ]);
    prop_oneof![
        4 => (file.clone(), vec(any::<Index>(), 1..5), prop::option::weighted(0.7, hostile_value()))
            .prop_map(|(f, path, v)| TokenizerEdit::Json(f, path, v)),
        3 => (file.clone(), field, hostile_value()).prop_map(|(f, k, v)| TokenizerEdit::Field(f, k, v)),
        2 => (file, byte_edit()).prop_map(|(f, e)| TokenizerEdit::Bytes(f, e)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Edited tokenizer files load (and then encode, decode and render their
    /// chat template without panicking) or fail naming a file of the checkpoint.
    #[test]
    fn tokenizer_file_mutations_load_or_name_the_file(edits in vec(tokenizer_edit(), 1..3)) {
        let dir = copy_dir(&fixtures().join("models/qwen3-tiny"));
        for edit in &edits {
            let (file, json_edit) = match edit {
                TokenizerEdit::Json(f, ..) | TokenizerEdit::Field(f, ..) | TokenizerEdit::Bytes(f, _) => (*f, edit),
            };
            let path = dir.path().join(file);
            let mut bytes = std::fs::read(&path).unwrap();
            match json_edit {
                TokenizerEdit::Bytes(_, e) => apply(&mut bytes, e, usize::MAX),
                TokenizerEdit::Json(_, steps, new) => {
                    if let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) {
                        mutate_at(&mut v, steps, new.clone());
                        bytes = v.to_string().into_bytes();
                    }
                }
                TokenizerEdit::Field(_, key, new) => {
                    if let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) {
                        if let Some(obj) = v.as_object_mut() {
                            obj.insert(key.to_string(), new.clone());
                        }
                        bytes = v.to_string().into_bytes();
                    }
                }
            }
            std::fs::write(&path, &bytes).unwrap();
        }
        match HfTokenizer::from_dir(dir.path()) {
            Ok(tok) => {
                if let Ok(ids) = tok.encode("hi <|im_start|>user\nwörld 😀 <think>") {
                    let _ = tok.decode(&ids, true);
                }
                let _ = tok.decode(&[0, 1, u32::MAX], false);
                if tok.chat_template().is_some() {
                    match ChatTemplate::from_tokenizer(&tok) {
                        Ok(t) => {
                            let messages = [ChatMessage::user("hi")];
                            let request = ChatRequest { messages: &messages, ..Default::default() };
                            if let Err(e) = t.render(&request) {
                                names(&e, &dir.path().join("tokenizer_config.json"))?;
                            }
                        }
                        Err(e) => names(&e, &dir.path().join("tokenizer_config.json"))?,
                    }
                }
            }
            // The file at fault may be another than the edited one: a token
            // removed from tokenizer.json leaves tokenizer_config.json naming it.
            Err(e) => names(&e, dir.path())?,
        }
    }
}

// ---------------------------------------------------------------- chat templates

/// Pieces of Jinja, well-formed or not, hostile or not, that a template is made of.
const TEMPLATE_PIECES: [&str; 34] = [
    "{% for m in messages %}",
    "{% endfor %}",
    "{% if add_generation_prompt %}",
    "{% else %}",
    "{% endif %}",
    "{{ m.role }}: {{ m.content }}\n",
    "{{ bos_token }}",
    "{{ messages[0]['content'] | tojson(indent=2) }}",
    "{{ tools | tojson }}",
    "{{ m.content.split('x')[5] }}",
    "{{ m.content.startswith('<') }}",
    "{{ m.tool_calls[0].function.arguments | tojson }}",
    "{{ raise_exception('refused') }}",
    "{{ 1 / 0 }}",
    "{{ strftime_now('%Y') }}",
    "{{ undefined_thing.attr.attr }}",
    "{% for i in range(100000) %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{{ 'x' * 100000000 }}",
    "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% include 'chat' %}",
    "{% extends 'chat' %}",
    "{% import 'chat' as c %}",
    "{{ (2 ** 64) * (2 ** 64) }}",
    "{{ messages | length }}",
    "{{ '%s %s' % (1,) }}",
    "{{ m.content[::-1] }}",
    "{%",
    "}}",
    "{{",
    "{% raw %}",
    "((((((((((((((((((((((((((((((((",
    "x",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Templates made of hostile pieces compile and render, or fail with an
    /// error naming the `chat_template` field; loops, recursion and growing
    /// strings run out of fuel instead of hanging or exhausting memory.
    #[test]
    fn chat_templates_render_or_fail_without_hanging(
        pieces in vec(select(TEMPLATE_PIECES.to_vec()), 0..8),
        contents in vec("\\PC{0,12}", 1..4),
        add_generation_prompt in any::<bool>(),
    ) {
        let source = pieces.concat();
        let messages: Vec<ChatMessage> = contents.iter().map(ChatMessage::user).collect();
        let tools = [json!({"name": "python", "parameters": {}})];
        let start = std::time::Instant::now();
        match ChatTemplate::new(&source, Some("<s>".into()), None) {
            Ok(t) => {
                let request = ChatRequest {
                    messages: &messages,
                    tools: Some(&tools),
                    add_generation_prompt,
                    ..Default::default()
                };
                if let Err(e) = t.render(&request) {
                    prop_assert!(e.to_string().contains("chat_template"), "{}", e);
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("chat_template"), "{}", e),
        }
        prop_assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
    }
}

// ---------------------------------------------------------------- regressions

/// A config whose sizes overflow `usize` products (2^33 heads of 2^32
/// dimensions) used to load and then overflow while building the model.
#[test]
fn overflowing_attention_width_is_refused() {
    let mut v: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("models/llama-tiny/config.json")).unwrap(),
    )
    .unwrap();
    v["num_attention_heads"] = json!(1u64 << 33);
    v["num_key_value_heads"] = json!(1u64 << 33);
    v["head_dim"] = json!(1u64 << 32);
    let err = TransformerConfig::from_hf_json(&v).unwrap_err().to_string();
    assert!(err.contains("num_attention_heads"), "{err}");
}

/// A layer count of 10^12 used to reserve space for that many layers
/// before reading the first tensor (an allocation sized by the file).
#[test]
fn absurd_layer_count_is_refused_before_allocating() {
    let dir = copy_dir(&fixtures().join("models/llama-tiny"));
    let path = dir.path().join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["num_hidden_layers"] = json!(1_000_000_000_000u64);
    std::fs::write(&path, v.to_string()).unwrap();
    let err = Checkpoint::<Cpu>::load(dir.path(), &Default::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("num_hidden_layers") && err.contains("config.json"),
        "{err}"
    );
}

/// A wrong type used to be reported without its field ("invalid type:
/// string, expected usize").
#[test]
fn wrong_types_name_the_field() {
    let mut v: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("models/qwen3-tiny/config.json")).unwrap(),
    )
    .unwrap();
    v["intermediate_size"] = json!("128");
    let err = TransformerConfig::from_hf_json(&v).unwrap_err().to_string();
    assert!(err.contains("intermediate_size"), "{err}");
}

/// Two tensors sharing bytes, and two entries under one name, used to load.
#[test]
fn overlapping_and_duplicate_tensors_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    for (header, expected) in [
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            "overlap",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            "appears twice",
        ),
    ] {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header.as_bytes());
        bytes.extend([0u8; 12]);
        std::fs::write(&path, &bytes).unwrap();
        let err = SafetensorsSet::open_files(std::slice::from_ref(&path))
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains(expected) && err.contains("model.safetensors"),
            "{err}"
        );
    }
}

/// An `eos_token_id` of 2^32 used to wrap to token 0, and a string one was ignored.
#[test]
fn out_of_range_eos_ids_are_refused() {
    for bad in [json!(4_294_967_296u64), json!(["393"]), json!(-1)] {
        let dir = copy_dir(&fixtures().join("models/qwen3-tiny"));
        let path = dir.path().join("generation_config.json");
        std::fs::write(&path, json!({ "eos_token_id": bad }).to_string()).unwrap();
        let err = HfTokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("eos_token_id") && err.contains("generation_config.json"),
            "{err}"
        );
    }
}

/// Nested loops of 10^10 steps, and a string doubled 64 times, used to hang
/// or exhaust memory; they now run out of fuel, and the error names the file.
#[test]
fn runaway_chat_templates_run_out_of_fuel() {
    let dir = copy_dir(&fixtures().join("models/qwen3-tiny"));
    let path = dir.path().join("tokenizer_config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for source in [TEMPLATE_PIECES[17], TEMPLATE_PIECES[19]] {
        v["chat_template"] = json!(source);
        std::fs::write(&path, v.to_string()).unwrap();
        let tok = HfTokenizer::from_dir(dir.path()).unwrap();
        let template = ChatTemplate::from_tokenizer(&tok).unwrap();
        let err = template
            .render(&ChatRequest::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("fuel") && err.contains("tokenizer_config.json"),
            "{err}"
        );
    }
}

/// A BPE `continuing_subword_prefix` longer than a merge's second token made
/// the `tokenizers` crate panic (a length underflow) inside `from_dir`.
#[test]
fn tokenizer_library_panic_is_an_error_naming_the_file() {
    let dir = copy_dir(&fixtures().join("models/qwen3-tiny"));
    let path = dir.path().join("tokenizer.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["model"]["continuing_subword_prefix"] = json!("<|im_end|><|im_end|>");
    std::fs::write(&path, v.to_string()).unwrap();
    let err = HfTokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
}

/// A non-positive `rope_parameters.rope_theta` was reported as top-level `rope_theta`.
#[test]
fn nested_rope_theta_is_named_where_it_is() {
    let mut v: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("models/qwen3-tiny/config.json")).unwrap(),
    )
    .unwrap();
    v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": -0.0});
    let err = TransformerConfig::from_hf_json(&v).unwrap_err().to_string();
    assert!(err.contains("rope_parameters.rope_theta"), "{err}");
}

/// The fuel budget is far above what real use needs: the fixture's Qwen3
/// template renders 256 turns of 4 KB each, with tools, within it.
#[test]
fn long_conversations_render_within_the_fuel() {
    let tok = HfTokenizer::from_dir(&fixtures().join("models/qwen3-tiny")).unwrap();
    let template = ChatTemplate::from_tokenizer(&tok).unwrap();
    let text = "word ".repeat(800);
    let messages: Vec<ChatMessage> = (0..256)
        .map(|i| match i % 2 {
            0 => ChatMessage::user(text.clone()),
            _ => ChatMessage::assistant(format!("<think>{text}</think>{text}")),
        })
        .collect();
    let tools = [json!({"type": "function", "function": {"name": "python", "parameters": {}}})];
    let prompt = template
        .render(&ChatRequest {
            messages: &messages,
            tools: Some(&tools),
            add_generation_prompt: true,
            ..Default::default()
        })
        .unwrap();
    assert!(prompt.len() > 256 * 4000, "{}", prompt.len());
}
