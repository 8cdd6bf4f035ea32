//! The matrix products of a training step, one entry per distinct shape and
//! layout: what `matmul_bench` and `torch_matmul.py` time side by side
//! (`just bench-matmul`).
//!
//! Every linear layer `y = x Wᵀ` (HF's `[out, in]` weight layout) costs three
//! products per training step, each in the layout mappa computes it in:
//! - the forward pass, `x Wᵀ`: `[tokens, in] @ [in, out]`, the right factor
//!   a transposed view of the weight ([`Layout::XWt`]);
//! - the input's gradient, `dy W`: `[tokens, out] @ [out, in]`, both
//!   row-major ([`Layout::XW`]);
//! - the weight's gradient, `dyᵀ x`: `[out, tokens] @ [tokens, in]`, computed
//!   in the weight's own layout, the left factor a transposed view
//!   ([`Layout::XtW`]; `ModelBackend::matmul_rhs_grad`).
//!
//! Attention's own products run in a fused kernel, not through the matrix
//! product, and are not listed.

use mappa_model::TransformerConfig;

/// How a product's factors lie in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[m, k] @ [k, n]` with the right factor a transposed `[n, k]` matrix.
    XWt,
    /// `[m, k] @ [k, n]`, both row-major.
    XW,
    /// `[m, k] @ [k, n]` with the left factor a transposed `[k, m]` matrix.
    XtW,
}

impl Layout {
    /// The name in reports and in the JSON rows (`x@w^T`, `x@w`, `x^T@w`).
    pub fn name(self) -> &'static str {
        match self {
            Layout::XWt => "x@w^T",
            Layout::XW => "x@w",
            Layout::XtW => "x^T@w",
        }
    }
}

/// One product of a training step: `[m, k] @ [k, n]`, `count` times per step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Product {
    /// The layer and pass, e.g. `mlp.gate/up forward`.
    pub name: String,
    /// The factors' layout.
    pub layout: Layout,
    /// Rows of the result.
    pub m: usize,
    /// Terms of each sum.
    pub k: usize,
    /// Columns of the result.
    pub n: usize,
    /// How many times a training step computes it.
    pub count: usize,
}

impl Product {
    /// Floating-point operations of one product (a multiply and an add per term).
    pub fn flop(&self) -> f64 {
        2.0 * (self.m * self.k * self.n) as f64
    }
}

/// The products of one training step of `config` on `tokens` tokens: for each
/// distinct linear layer shape, its forward, input-gradient and
/// weight-gradient products (see the module docs).
pub fn training_step_products(config: &TransformerConfig, tokens: usize) -> Vec<Product> {
    let (hidden, layers) = (config.hidden_size, config.num_layers);
    let q = config.num_heads * config.head_dim;
    let kv = config.num_kv_heads * config.head_dim;
    let linears = [
        ("attn.q", hidden, q, layers),
        ("attn.k/v", hidden, kv, 2 * layers),
        ("attn.o", q, hidden, layers),
        ("mlp.gate/up", hidden, config.intermediate_size, 2 * layers),
        ("mlp.down", config.intermediate_size, hidden, layers),
        ("lm_head", hidden, config.vocab_size, 1),
    ];
    let mut products = Vec::new();
    for (name, inputs, outputs, count) in linears {
        let passes = [
            ("forward", Layout::XWt, tokens, inputs, outputs),
            ("input grad", Layout::XW, tokens, outputs, inputs),
            ("weight grad", Layout::XtW, outputs, tokens, inputs),
        ];
        for (pass, layout, m, k, n) in passes {
            products.push(Product {
                name: format!("{name} {pass}"),
                layout,
                m,
                k,
                n,
                count,
            });
        }
    }
    products
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Size;

    #[test]
    fn a_steps_products_are_six_flop_per_token_and_linear_weight() {
        for size in Size::ALL {
            let config = size.config();
            let tokens = 1024;
            let products = training_step_products(&config, tokens);
            let flop: f64 = products.iter().map(|p| p.flop() * p.count as f64).sum();
            // Every parameter but the norms' is a linear layer's weight (the
            // tied embedding counted once, as the LM head).
            let (hidden, layers) = (config.hidden_size, config.num_layers);
            let norms = hidden * (2 * layers + 1) + 2 * config.head_dim * layers;
            let linear_weights = config.num_params() - norms;
            assert_eq!(
                flop,
                6.0 * (tokens * linear_weights) as f64,
                "{}",
                size.name()
            );
            assert_eq!(products.len(), 18);
        }
    }
}
