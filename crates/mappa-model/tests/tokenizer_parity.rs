//! Parity with HF tokenizers and `apply_chat_template` on the fixture
//! tokenizer, which carries the real Qwen3 chat template.

mod common;

use common::fixtures;
use mappa_model::chat::{ChatMessage, ChatRequest, ChatTemplate};
use mappa_model::{HfTokenizer, Tokenizer};
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Deserialize)]
struct EncodeCase {
    text: String,
    ids: Vec<u32>,
    decoded: String,
}

#[derive(Deserialize)]
struct ChatCase {
    name: String,
    messages: Vec<ChatMessage>,
    tools: Option<Vec<Value>>,
    add_generation_prompt: bool,
    enable_thinking: Option<bool>,
    rendered: String,
}

#[derive(Deserialize)]
struct Golden {
    encode: Vec<EncodeCase>,
    chat: Vec<ChatCase>,
}

fn golden() -> Golden {
    let path = fixtures().join("tokenizer/golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn tokenizer() -> HfTokenizer {
    HfTokenizer::from_dir(&fixtures().join("tokenizer")).unwrap()
}

#[test]
fn encode_and_decode_match_hf() {
    let tok = tokenizer();
    for case in golden().encode {
        assert_eq!(
            tok.encode(&case.text).unwrap(),
            case.ids,
            "encoding {:?}",
            case.text
        );
        assert_eq!(
            tok.decode(&case.ids, false).unwrap(),
            case.decoded,
            "decoding {:?}",
            case.text
        );
    }
}

#[test]
fn special_tokens_come_from_the_files() {
    let tok = tokenizer();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(tok.eos_token_ids(), &[im_end]);
    assert_eq!(tok.pad_token_id(), tok.token_id("<|endoftext|>"));
    assert_eq!(tok.vocab_size(), 400);
    // A checkpoint directory adds the EOS ids of its generation_config.json.
    assert!(mappa_model::TransformerConfig::from_hf_file(
        &common::model_dir("qwen3-tiny").join("config.json")
    )
    .unwrap()
    .eos_token_ids
    .contains(&im_end));
}

#[test]
fn chat_template_renders_like_hf() {
    let tok = tokenizer();
    let template = ChatTemplate::from_tokenizer(&tok).unwrap();
    for case in golden().chat {
        let mut extra = Map::new();
        if let Some(t) = case.enable_thinking {
            extra.insert("enable_thinking".into(), t.into());
        }
        let request = ChatRequest {
            messages: &case.messages,
            tools: case.tools.as_deref(),
            add_generation_prompt: case.add_generation_prompt,
            extra,
        };
        let rendered = template
            .render(&request)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(rendered, case.rendered, "case {}", case.name);
    }
}
