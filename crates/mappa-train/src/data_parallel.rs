//! Data-parallel gradients: one agent's micro-batches spread over several
//! devices, each holding a replica of the policy, their gradients summed by
//! burn's collective all-reduce (`burn::collective`, burn's own distributed
//! training support) and handed back on the agent's main device, where the
//! optimiser steps.
//!
//! Micro-batch `i` goes to worker `i mod n`, which sums its micro-batches'
//! gradients in order; the all-reduce then adds the workers' sums in device
//! order (burn's tree strategy). With two workers the order cannot matter
//! (floating-point addition is commutative), so even two workers on one
//! device (the CPU backend's only device, as the tests use it) are
//! bit-reproducible; more workers than that must be on distinct devices.
//! The result differs from the single-device update only by the grouping
//! of the sum, which is why the run id counts each agent's replicas.
//!
//! burn keeps one collective per backend type in the process: a lock makes
//! data-parallel steps take turns, and a worker that fails tells the others
//! before any of them enters the all-reduce, so none waits for it forever.

use std::sync::{Barrier, Mutex};

use burn::collective::{self, CollectiveConfig, PeerId, ReduceOperation};
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{DeviceId, DeviceOps};
use mappa_model::{AutodiffModelBackend, Transformer};

use crate::TrainError;

/// One data-parallel step at a time in the process (the collective is a
/// per-backend singleton).
static COLLECTIVE: Mutex<()> = Mutex::new(());

/// The device `index` of the backend whose device 0 is `first` (on a
/// backend with a single device, such as the CPU's, every index is it).
pub fn device_at<B: AutodiffModelBackend>(first: &B::Device, index: usize) -> B::Device {
    let id = first.id();
    let index_id = u16::try_from(index).unwrap_or(u16::MAX);
    <B::Device as burn::tensor::backend::Device>::from_id(DeviceId {
        type_id: id.type_id,
        index_id,
    })
}

/// Checks that `devices` can run one agent's update data-parallel: at
/// least two, the first being the policy's, and distinct beyond two (see
/// the module docs).
pub fn check_devices<B: AutodiffModelBackend>(
    agent: &str,
    policy_device: &B::Device,
    devices: &[B::Device],
) -> Result<(), TrainError> {
    if devices.len() < 2 {
        return Err(TrainError::Config(format!(
            "agent {agent}: data-parallel updates need at least two devices, got {}",
            devices.len()
        )));
    }
    if &devices[0] != policy_device {
        return Err(TrainError::Config(format!(
            "agent {agent}: the first data-parallel device ({:?}) must hold the policy ({policy_device:?})",
            devices[0]
        )));
    }
    let mut ids: Vec<DeviceId> = devices.iter().map(|d| d.id()).collect();
    ids.sort();
    ids.dedup();
    if devices.len() > 2 && ids.len() < devices.len() {
        return Err(TrainError::Config(format!(
            "agent {agent}: {} data-parallel replicas share {} device(s); more than two replicas \
             must be on distinct devices, or the order of the gradient sum (and so the bits) \
             would vary between runs",
            devices.len(),
            ids.len()
        )));
    }
    Ok(())
}

/// The gradients of `chunks` (micro-batches, summed), computed on
/// `devices` in parallel and returned on `devices[0]`, with each chunk's
/// side result in chunk order. `gradients` computes one micro-batch on a
/// replica. Uses `min(devices, chunks)` workers; one worker computes in
/// place, without threads or the collective.
pub fn parallel_gradients<B, C, S, F>(
    policy: &Transformer<B>,
    devices: &[B::Device],
    chunks: &[C],
    gradients: F,
) -> Result<(GradientsParams, Vec<S>), TrainError>
where
    B: AutodiffModelBackend,
    C: Sync,
    S: Send,
    F: Fn(&Transformer<B>, &C) -> Result<(GradientsParams, S), TrainError> + Sync,
{
    let workers = devices.len().min(chunks.len()).max(1);
    if workers == 1 {
        let mut accumulator = GradientsAccumulator::<Transformer<B>>::new();
        let mut sides = Vec::with_capacity(chunks.len());
        for chunk in chunks {
            let (grads, side) = gradients(policy, chunk)?;
            accumulator.accumulate(policy, grads);
            sides.push(side);
        }
        return Ok((accumulator.grads(), sides));
    }
    let _turn = COLLECTIVE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    collective::reset_collective::<B::InnerBackend>();
    let barrier = Barrier::new(workers);
    let failed = Mutex::new(false);
    let config = CollectiveConfig::default().with_num_devices(workers);
    // Each worker: its output, none when it stood down because another failed.
    let results: Vec<Result<Option<WorkerOutput<S>>, TrainError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let replica = policy.clone().fork(&devices[w]);
                let (barrier, failed, config, gradients) = (&barrier, &failed, &config, &gradients);
                scope.spawn(move || {
                    let peer = PeerId::from(w as u32);
                    collective::register::<B::InnerBackend>(
                        peer,
                        devices[w].clone(),
                        config.clone(),
                    )
                    .map_err(|e| collective_error("register", e))?;
                    let local = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let mut accumulator = GradientsAccumulator::<Transformer<B>>::new();
                        let mut sides = Vec::new();
                        for (i, chunk) in chunks.iter().enumerate().skip(w).step_by(workers) {
                            let (grads, side) = gradients(&replica, chunk)?;
                            accumulator.accumulate(&replica, grads);
                            sides.push((i, side));
                        }
                        Ok((accumulator.grads(), sides))
                    }))
                    .unwrap_or_else(|_| {
                        Err(TrainError::Config(format!(
                            "data-parallel worker {w} panicked"
                        )))
                    });
                    if local.is_err() {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) = true;
                    }
                    barrier.wait();
                    let everyone_ok = !*failed.lock().unwrap_or_else(|p| p.into_inner());
                    let out = match local {
                        Ok((grads, sides)) if everyone_ok => grads
                            .all_reduce::<B::InnerBackend>(peer, ReduceOperation::Sum)
                            .map(|grads| Some((grads, sides)))
                            .map_err(|e| collective_error("all-reduce", e)),
                        Ok(_) => Ok(None),
                        Err(e) => Err(e),
                    };
                    collective::finish_collective::<B::InnerBackend>(peer)
                        .map_err(|e| collective_error("finish", e))?;
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(TrainError::Config("a data-parallel worker panicked".into()))
                })
            })
            .collect()
    });
    let mut main = None;
    let mut sides = Vec::with_capacity(chunks.len());
    for (w, result) in results.into_iter().enumerate() {
        // A worker that stood down (`None`) did so because one of these failed.
        if let Some((grads, worker_sides)) = result? {
            if w == 0 {
                main = Some(grads);
            }
            sides.extend(worker_sides);
        }
    }
    sides.sort_by_key(|(i, _)| *i);
    let grads = main.ok_or_else(|| {
        TrainError::Config("data-parallel: a worker failed without an error".into())
    })?;
    Ok((grads, sides.into_iter().map(|(_, s)| s).collect()))
}

/// A worker's summed gradients and its chunks' side results, by chunk index.
type WorkerOutput<S> = (GradientsParams, Vec<(usize, S)>);

fn collective_error(what: &str, e: collective::CollectiveError) -> TrainError {
    TrainError::Config(format!(
        "data-parallel {what}: burn's collective failed: {e:?}"
    ))
}
