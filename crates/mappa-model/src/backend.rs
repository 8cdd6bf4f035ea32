//! The concrete backends this crate can be built with, named in one place.
//!
//! Library code never names a backend; binaries, benches and tests pick one
//! of these aliases at the edge.

/// The default CPU backend: burn's pure-Rust `flex` backend (chosen over
/// `ndarray` by measurement; docs/experiments/speed.md).
pub type Cpu = burn::backend::Flex;

/// [`Cpu`] with automatic differentiation, for training.
pub type CpuAutodiff = burn::backend::Autodiff<Cpu>;

/// burn's legacy `ndarray` CPU backend, kept for comparison benches.
#[cfg(feature = "ndarray")]
pub type NdArray = burn::backend::NdArray;

/// The wgpu backend (Vulkan, Metal, DX12): the fallback GPU backend.
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::Wgpu;

/// The CUDA backend: the primary GPU backend.
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Cuda;

/// burn's LibTorch backend (PyTorch's own kernels, on the CPU or a CUDA
/// device), measured against `flex` by `just bench-tch`.
#[cfg(feature = "tch")]
pub type LibTorch = burn::backend::LibTorch;
