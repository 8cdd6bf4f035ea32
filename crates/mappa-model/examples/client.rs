//! A small client of the plain-Rust model API, depending on mappa-model
//! only: loads a checkpoint directory (config.json and safetensors weights;
//! no tokenizer needed), prints the highest logits at the last position of a
//! prompt and its greedy continuation.
//!
//! Usage: `cargo run -p mappa-model --example client -- DIR [ID ...]`
//! e.g. `cargo run -p mappa-model --example client -- fixtures/models/qwen3-tiny 131 225 28`

use mappa_model::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: client DIR [ID ...]")?;
    let mut prompt: Vec<u32> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if prompt.is_empty() {
        prompt = vec![1, 2, 3];
    }

    let model = Model::load(&dir)?;
    println!(
        "{dir}: {:?}, {} layers, vocabulary of {}",
        model.config().family,
        model.config().num_layers,
        model.vocab_size()
    );

    let logits = model.logits(&prompt)?;
    println!("prompt {prompt:?}: top logits at the last position");
    for (id, logit) in logits.top(logits.positions() - 1, 5) {
        println!("  {id:>6}  {logit:>10.4}");
    }

    let eos = None; // e.g. Some(id) to stop after that id
    let ids = model.greedy(&prompt, 12, eos)?;
    println!("greedy continuation: {ids:?}");
    Ok(())
}
