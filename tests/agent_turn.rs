//! One agent turn end to end, on a fixture checkpoint with the real Qwen3
//! chat template: render the conversation, tokenize, sample a completion
//! with a KV cache (EOS from the tokenizer files, a stop string), recompute
//! its log-probs by teacher forcing as the trainer will, then save the
//! checkpoint and check the saved agent behaves identically.

use mappa_core::SeedTree;
use mappa_model::backend::Cpu;
use mappa_model::{
    completion_logprobs, generate, ChatMessage, ChatRequest, Checkpoint, GenerationConfig,
    SamplingConfig, StorageDtype, Tokenizer,
};

fn turn(ckpt: &Checkpoint<Cpu>, seed: u64) -> (Vec<u32>, mappa_model::Generation) {
    let messages = [
        ChatMessage::system("You are the Problem Solver."),
        ChatMessage::user(
            "What is 2+2? Please reason step by step, and put your final answer within \\boxed{}.",
        ),
    ];
    let prompt = ckpt
        .chat_template
        .as_ref()
        .expect("fixture has a chat template")
        .render(&ChatRequest {
            messages: &messages,
            add_generation_prompt: true,
            ..Default::default()
        })
        .unwrap();
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    let ids = ckpt.tokenizer.encode(&prompt).unwrap();
    let config = GenerationConfig {
        max_new_tokens: 24,
        sampling: SamplingConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        },
        eos_token_ids: ckpt.tokenizer.eos_token_ids().to_vec(),
        stop_strings: vec!["```output".into()],
    };
    let mut rngs = [SeedTree::new(seed).stream("sampler/solver")];
    let generation = generate(
        &ckpt.model,
        Some(&ckpt.tokenizer),
        std::slice::from_ref(&ids),
        &mut rngs,
        &config,
    )
    .unwrap()
    .remove(0);
    (ids, generation)
}

#[test]
fn agent_turn_round_trip() {
    let device = Default::default();
    let ckpt = Checkpoint::<Cpu>::load(&mappa_tests::fixtures().join("models/qwen3-tiny"), &device)
        .unwrap();
    let (prompt, generation) = turn(&ckpt, 42);
    assert!(!generation.token_ids.is_empty());
    assert_eq!(generation.token_ids.len(), generation.logprobs.len());
    assert_eq!(
        generation.text,
        ckpt.tokenizer.decode(&generation.token_ids, true).unwrap()
    );

    // The trainer's teacher-forced log-probs agree with the sampler's.
    let tf = completion_logprobs(&ckpt.model, &[(&prompt, &generation.token_ids)], 1.0)
        .unwrap()
        .to_vecs();
    for (a, b) in tf[0].iter().zip(&generation.logprobs) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }

    // Same seed, same completion; the saved agent is the same agent.
    assert_eq!(turn(&ckpt, 42).1, generation);
    let dir = tempfile::tempdir().unwrap();
    ckpt.save(dir.path(), StorageDtype::F32).unwrap();
    let reloaded = Checkpoint::<Cpu>::load(dir.path(), &device).unwrap();
    assert_eq!(turn(&reloaded, 42).1, generation);
    assert_ne!(turn(&ckpt, 43).1.token_ids, generation.token_ids);
}
