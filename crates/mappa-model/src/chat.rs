//! Chat templates: rendering a conversation into the exact prompt text a
//! checkpoint was trained on, from the Jinja template in its
//! `tokenizer_config.json`.
//!
//! Rendering follows HF transformers' `apply_chat_template`: `trim_blocks`
//! and `lstrip_blocks` on, loop controls, Python string methods
//! (`startswith`, `split`, `rstrip`, ...), `raise_exception`, and a `tojson`
//! filter that writes JSON the way Python's `json.dumps(ensure_ascii=False)`
//! does. Qwen-style tool calls and tool turns and `<think>` reasoning blocks
//! are plain data to the template, so they render as HF renders them.
//! `strftime_now` is deliberately not defined, so that templates which would
//! print today's date fall back to their fixed default and prompts stay
//! reproducible.

use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Value as JinjaValue};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{ModelError, Result};
use crate::tokenizer::HfTokenizer;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant's reasoning, for templates that render it (`<think>` blocks in Qwen3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant's tool calls, in the OpenAI format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// Any other field the template may read (`name`, `tool_call_id`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// A message with only a role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
            tool_calls: None,
            extra: Map::new(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// A tool result.
    pub fn tool(content: impl Into<String>) -> Self {
        Self::new("tool", content)
    }
}

/// What to render.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest<'a> {
    /// The conversation so far.
    pub messages: &'a [ChatMessage],
    /// Tool definitions (JSON schema functions), if the agent has tools.
    pub tools: Option<&'a [Value]>,
    /// Whether to open an assistant turn at the end.
    pub add_generation_prompt: bool,
    /// Extra template variables, such as `enable_thinking`.
    pub extra: Map<String, Value>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    sha256: String,
    /// The file the template came from, named by its errors.
    file: Option<PathBuf>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("sha256", &self.sha256)
            .finish()
    }
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are visible to it as variables.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        Self::compile(source, bos_token, eos_token, None)
    }

    /// Compiles `source`, read from `file` when there is one (errors name it).
    fn compile(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
        file: Option<PathBuf>,
    ) -> Result<Self> {
        let error = |what, e| template_error(what, e, file.as_deref());
        let mut env = Environment::new();
        env.set_fuel(Some(mappa_core::TEMPLATE_FUEL));
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| error("configure", e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<JinjaValue, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| error("compile", e))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
            sha256: mappa_core::hash::sha256_hex(source.as_bytes()),
            file,
        })
    }

    /// The template of a HF tokenizer's `tokenizer_config.json`.
    pub fn from_tokenizer(tokenizer: &HfTokenizer) -> Result<Self> {
        let file = tokenizer.path().with_file_name("tokenizer_config.json");
        let source = tokenizer
            .chat_template()
            .ok_or_else(|| ModelError::tokenizer(Some(&file), "has no `chat_template`"))?;
        Self::compile(
            source,
            tokenizer.bos_token().map(str::to_string),
            tokenizer.eos_token().map(str::to_string),
            Some(file),
        )
    }

    /// sha256 of the template source, to record with every rendered prompt.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Renders a conversation into prompt text.
    pub fn render(&self, request: &ChatRequest<'_>) -> Result<String> {
        let mut ctx = request.extra.clone();
        ctx.insert(
            "messages".into(),
            serde_json::to_value(request.messages).expect("messages serialise"),
        );
        if let Some(tools) = request.tools {
            ctx.insert("tools".into(), Value::Array(tools.to_vec()));
        }
        ctx.insert(
            "add_generation_prompt".into(),
            request.add_generation_prompt.into(),
        );
        if let Some(bos) = &self.bos_token {
            ctx.insert("bos_token".into(), bos.clone().into());
        }
        if let Some(eos) = &self.eos_token {
            ctx.insert("eos_token".into(), eos.clone().into());
        }
        let error = |what, e| template_error(what, e, self.file.as_deref());
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| error("load", e))?;
        template
            .render(JinjaValue::from(minijinja::value::Serde(&ctx)))
            .map_err(|e| error("render", e))
    }
}

/// A template error, naming the file the template came from when known.
fn template_error(what: &str, e: JinjaError, file: Option<&Path>) -> ModelError {
    let mut msg = format!("field `chat_template`: cannot {what}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    ModelError::tokenizer(file, msg)
}

/// `tojson` as HF defines it: `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(value: &JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut json = serde_json::to_value(value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    if sort_keys == Some(true) {
        sort_json_keys(&mut json);
    }
    let mut out = String::new();
    write_python_json(&json, indent, 0, &mut out);
    Ok(JinjaValue::from_safe_string(out))
}

fn sort_json_keys(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, mut x) in entries {
                sort_json_keys(&mut x);
                map.insert(k, x);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(sort_json_keys),
        _ => {}
    }
}

/// Writes JSON as Python's `json.dumps` does: `", "` and `": "` separators
/// (`","` between items when indenting), non-ASCII kept, floats in `repr` form.
fn write_python_json(v: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&python_number(n)),
        Value::String(s) => write_python_string(s, out),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_python_string(k, out);
                out.push_str(": ");
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

fn python_number(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        return n.to_string();
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    if f.is_finite() && f == f.trunc() && f.abs() < 1e16 {
        return format!("{f:.1}");
    }
    // Rust prints the shortest round-trip digits like Python's repr; only the
    // exponent differs ("1e-5" vs "1e-05").
    let s = format!("{f:e}");
    let s = if f.abs() >= 1e-4 && f.abs() < 1e16 {
        format!("{f}")
    } else {
        s
    };
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ("-", d),
                None => ("+", exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

fn write_python_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dumps(v: Value, indent: Option<usize>) -> String {
        let mut out = String::new();
        write_python_json(&v, indent, 0, &mut out);
        out
    }

    #[test]
    fn json_like_python() {
        assert_eq!(
            dumps(
                json!({"b": [1, 2.5, "x\"y"], "a": {"c": null, "é": true}}),
                None
            ),
            r#"{"b": [1, 2.5, "x\"y"], "a": {"c": null, "é": true}}"#
        );
        assert_eq!(
            dumps(json!({"a": [1, 2]}), Some(2)),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}"
        );
        assert_eq!(
            dumps(json!([1.0, 1e-5, 1e20, 0.001, -3.25]), None),
            "[1.0, 1e-05, 1e+20, 0.001, -3.25]"
        );
        assert_eq!(dumps(json!("<tag>&'\u{1}"), None), "\"<tag>&'\\u0001\"");
    }

    #[test]
    fn renders_with_python_methods_and_trimming() {
        let source = "{% for m in messages %}{% if m.content.startswith('!') %}{{ m.content.split('!')[1].strip() }}\n{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}{% if tools %}{{ tools[0] | tojson }}{% endif %}";
        let t = ChatTemplate::new(source, None, None).unwrap();
        let messages = [ChatMessage::user("hi"), ChatMessage::assistant("! done ")];
        let tools = [json!({"name": "python", "parameters": {"code": "str"}})];
        let out = t
            .render(&ChatRequest {
                messages: &messages,
                tools: Some(&tools),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            out,
            "user: hi\ndone\n{\"name\": \"python\", \"parameters\": {\"code\": \"str\"}}"
        );
    }

    #[test]
    fn raise_exception_and_bad_templates_are_errors() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", None, None).unwrap();
        let err = t.render(&ChatRequest::default()).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
        let err = ChatTemplate::new("{% if %}", None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot compile"), "{err}");
    }
}
