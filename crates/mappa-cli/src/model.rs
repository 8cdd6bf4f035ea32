//! `mappa convert` (a GGUF model into a HF checkpoint directory),
//! `mappa chat` (talk to any checkpoint through its chat template), so that
//! a newcomer can get a real model and see it answer before training it,
//! and `mappa merge-lora` (a LoRA adapter folded into its base, for export).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use mappa_model::gguf::{convert::convert as convert_gguf, GgufFile};
use mappa_model::{
    generate, ChatMessage, ChatRequest, Checkpoint, Cpu, GenerationConfig, SamplingConfig,
    SeedTree, StorageDtype, Tokenizer,
};

/// Arguments of `mappa convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The GGUF file (Llama architecture, byte-level BPE tokenizer).
    pub gguf: PathBuf,
    /// The checkpoint directory to create (must not exist or be empty).
    pub out: PathBuf,
    /// How to store the dequantised weights.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DtypeArg,
}

/// Storage dtypes offered on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DtypeArg {
    /// 32-bit floats (exact).
    F32,
    /// bfloat16 (half the size).
    Bf16,
}

impl From<DtypeArg> for StorageDtype {
    fn from(arg: DtypeArg) -> Self {
        match arg {
            DtypeArg::F32 => StorageDtype::F32,
            DtypeArg::Bf16 => StorageDtype::Bf16,
        }
    }
}

/// Converts a GGUF file and prints what it made.
pub fn convert(args: &ConvertArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    let gguf = GgufFile::open(&args.gguf)?;
    let dtype: StorageDtype = args.dtype.into();
    let done = convert_gguf(&gguf, &args.out, dtype)?;
    let c = &done.config;
    let types: Vec<String> = done
        .stored_types
        .iter()
        .map(|(t, n)| format!("{n} {t}"))
        .collect();
    println!(
        "converted `{}` ({}) to `{}` in {:.1} s",
        args.gguf.display(),
        done.name.as_deref().unwrap_or("unnamed"),
        args.out.display(),
        start.elapsed().as_secs_f64()
    );
    println!(
        "  model: Llama, {:.1}M parameters, {} layers, hidden {}, {} query / {} KV heads, vocab {}{}",
        c.num_params() as f64 / 1e6,
        c.num_layers,
        c.hidden_size,
        c.num_heads,
        c.num_kv_heads,
        c.vocab_size,
        if c.tie_word_embeddings { ", tied embeddings" } else { "" }
    );
    println!(
        "  weights: {} tensors dequantised from {}, stored as {}",
        done.stored_types.values().sum::<usize>(),
        types.join(", "),
        dtype.torch_name()
    );
    println!(
        "  tokenizer: {} tokens (byte-level BPE){}",
        done.vocab_size,
        if done.chat_template {
            ", with its chat template"
        } else {
            ", no chat template"
        }
    );
    Ok(())
}

/// Arguments of `mappa merge-lora`.
#[derive(Debug, Args)]
pub struct MergeLoraArgs {
    /// The base HF checkpoint directory the adapter was trained on.
    pub base: PathBuf,
    /// The adapter directory (PEFT layout: `adapter_config.json`, `adapter_model.safetensors`).
    pub adapter: PathBuf,
    /// The merged checkpoint directory to write (with the base's tokenizer files).
    pub out: PathBuf,
    /// How to store the merged weights.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DtypeArg,
}

/// Folds a LoRA adapter into its base and saves a plain HF checkpoint.
pub fn merge_lora(args: &MergeLoraArgs) -> anyhow::Result<()> {
    let same = |a: &std::path::Path, b: &std::path::Path| match (a.canonicalize(), b.canonicalize())
    {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if same(&args.out, &args.base) {
        bail!(
            "the merged checkpoint would overwrite its base `{}`: choose another output directory",
            args.base.display()
        );
    }
    let device = Default::default();
    let base = Checkpoint::<Cpu>::load(&args.base, &device)
        .with_context(|| format!("loading the base checkpoint `{}`", args.base.display()))?;
    let adapted = mappa_model::lora::load_adapters(base.model, &args.adapter)?;
    let lora = adapted.lora_config().cloned().expect("loaded adapters");
    let merged = Checkpoint {
        model: adapted.merge_adapters(),
        ..base
    };
    merged.save(&args.out, args.dtype.into())?;
    println!(
        "merged the rank-{} adapter `{}` ({}) into `{}`: wrote `{}`",
        lora.rank,
        args.adapter.display(),
        lora.targets.join(", "),
        args.base.display(),
        args.out.display()
    );
    Ok(())
}

/// Arguments of `mappa chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// A HF checkpoint directory (config.json, safetensors, tokenizer.json, a chat template).
    pub model: PathBuf,
    /// One message to answer; without it, chat on standard input (an empty line or end of input stops).
    pub prompt: Option<String>,
    /// A system message (the template's default when absent).
    #[arg(long)]
    pub system: Option<String>,
    /// Most new tokens per reply.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed of the sampling stream (ignored when greedy).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Answers one prompt, or chats interactively, keeping the conversation.
pub fn chat(args: &ChatArgs) -> anyhow::Result<()> {
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        bail!(
            "--temperature must be a finite number >= 0, got {}",
            args.temperature
        );
    }
    let device = Default::default();
    let checkpoint = Checkpoint::<Cpu>::load(&args.model, &device)
        .with_context(|| format!("loading the checkpoint `{}`", args.model.display()))?;
    let template = checkpoint.chat_template.as_ref().with_context(|| {
        format!(
            "`{}` has no chat template (tokenizer_config.json `chat_template`)",
            args.model.display()
        )
    })?;
    let sampling = if args.temperature == 0.0 {
        SamplingConfig::greedy()
    } else {
        SamplingConfig::with_temperature(args.temperature)
    };
    let config = GenerationConfig {
        max_new_tokens: args.max_new_tokens,
        sampling,
        eos_token_ids: checkpoint.tokenizer.eos_token_ids().to_vec(),
        stop_strings: Vec::new(),
    };
    let seeds = SeedTree::new(args.seed);
    let mut messages: Vec<ChatMessage> = args.system.iter().map(ChatMessage::system).collect();
    let reply = |messages: &mut Vec<ChatMessage>, turn: usize| -> anyhow::Result<String> {
        let prompt = template.render(&ChatRequest {
            messages,
            add_generation_prompt: true,
            ..Default::default()
        })?;
        let ids = checkpoint.tokenizer.encode(&prompt)?;
        let mut rng = [seeds.stream(&format!("chat/turn{turn}"))];
        let tokenizer: &dyn Tokenizer = &checkpoint.tokenizer;
        let out = generate(
            &checkpoint.model,
            Some(tokenizer),
            &[ids],
            &mut rng,
            &config,
        )?;
        let text = out.into_iter().next().map(|g| g.text).unwrap_or_default();
        messages.push(ChatMessage::assistant(text.clone()));
        Ok(text)
    };
    if let Some(prompt) = &args.prompt {
        messages.push(ChatMessage::user(prompt.clone()));
        println!("{}", reply(&mut messages, 0)?.trim_end());
        return Ok(());
    }
    eprintln!(
        "chatting with `{}`: type a message and press enter; an empty line or Ctrl-D ends",
        args.model.display()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    for turn in 0.. {
        eprint!("> ");
        std::io::stderr().flush()?;
        let Some(line) = lines.next().transpose()? else {
            break;
        };
        if line.trim().is_empty() {
            break;
        }
        messages.push(ChatMessage::user(line));
        println!("{}", reply(&mut messages, turn)?.trim_end());
    }
    Ok(())
}
