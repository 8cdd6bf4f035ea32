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
//! bit-reproducible; more workers than that must be on distinct devices,
//! listed in ascending order (the manifest checks it), so that the order of
//! the sum follows from the run id. The result differs from the
//! single-device update only by the grouping of the sum, which is why the
//! run id counts each agent's replicas.
//!
//! The replicas are copied from the policy at every update (the broadcast of
//! the new weights that a data-parallel step needs anyway) and dropped after
//! it; the memory plan counts them as held, which bounds the update's peak.
//!
//! burn keeps one collective per backend type in the process: a lock makes
//! data-parallel steps take turns. Every replica is placed before any worker
//! joins the collective, and a worker that fails tells the others at a
//! barrier before any of them enters the all-reduce, so none waits for a
//! peer that will never come.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Barrier, Mutex};

use burn::collective::{self, CollectiveConfig, PeerId, ReduceOperation};
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{DeviceId, DeviceOps};
use mappa_model::{AutodiffModelBackend, ModelBackend, Transformer};

use crate::LearnerError;

/// One data-parallel step at a time in the process (the collective is a
/// per-backend singleton).
static COLLECTIVE: Mutex<()> = Mutex::new(());

/// The device `index` of the backend whose device 0 is `first` (on a
/// backend with a single device, such as the CPU's, every index is it).
fn device_at<B: AutodiffModelBackend>(first: &B::Device, index: usize) -> B::Device {
    let id = first.id();
    let index_id = u16::try_from(index).unwrap_or(u16::MAX);
    <B::Device as burn::tensor::backend::Device>::from_id(DeviceId {
        type_id: id.type_id,
        index_id,
    })
}

/// The devices `0..count` of a box (`[devices] count`) on the backend whose
/// device 0 is `first`. Each index must name a device of its own, except on
/// a backend with one device ([`ModelBackend::ONE_DEVICE`], the CPU), where
/// every index is that device. (wgpu's default device, for one, maps every
/// index to itself: the plan would count one GPU as several.)
pub fn devices_of_box<B: AutodiffModelBackend>(
    first: &B::Device,
    count: usize,
) -> Result<Vec<B::Device>, LearnerError> {
    let devices: Vec<B::Device> = (0..count).map(|i| device_at::<B>(first, i)).collect();
    let ids: Vec<DeviceId> = devices.iter().map(|d| d.id()).collect();
    check_indexed(&ids, <B as ModelBackend>::ONE_DEVICE).map_err(|i| {
        LearnerError::Config(format!(
            "devices.count = {count}: device index {i} is {:?} on this backend, which does \
                 not give each index a device of its own; declare one device (devices.count = 1) \
                 or choose a backend with indexed devices (CUDA, or wgpu's discrete GPUs)",
            devices[i]
        ))
    })?;
    Ok(devices)
}

/// The first index of `ids` that does not name device `index` of its own
/// (unless the backend has `one_device`).
fn check_indexed(ids: &[DeviceId], one_device: bool) -> Result<(), usize> {
    if one_device {
        return Ok(());
    }
    match ids
        .iter()
        .enumerate()
        .find(|(i, id)| usize::from(id.index_id) != *i || ids[..*i].contains(id))
    {
        Some((i, _)) => Err(i),
        None => Ok(()),
    }
}

/// Checks that `devices` can run one agent's update data-parallel: at
/// least two, the first being the policy's, and distinct beyond two (see
/// the module docs).
pub fn check_devices<B: AutodiffModelBackend>(
    agent: &str,
    policy_device: &B::Device,
    devices: &[B::Device],
) -> Result<(), LearnerError> {
    if devices.len() < 2 {
        return Err(LearnerError::Config(format!(
            "agent {agent}: data-parallel updates need at least two devices, got {}",
            devices.len()
        )));
    }
    if &devices[0] != policy_device {
        return Err(LearnerError::Config(format!(
            "agent {agent}: the first data-parallel device ({:?}) must hold the policy ({policy_device:?})",
            devices[0]
        )));
    }
    let ids: Vec<DeviceId> = devices.iter().map(|d| d.id()).collect();
    if devices.len() > 2 && ids.windows(2).any(|pair| pair[0] >= pair[1]) {
        return Err(LearnerError::Config(format!(
            "agent {agent}: {} data-parallel replicas on {devices:?}; more than two replicas \
             must be on distinct devices in ascending order, or the order of the gradient sum \
             (and so the bits) would not follow from the run id",
            devices.len()
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
) -> Result<(GradientsParams, Vec<S>), LearnerError>
where
    B: AutodiffModelBackend,
    C: Sync,
    S: Send,
    F: Fn(&Transformer<B>, &C) -> Result<(GradientsParams, S), LearnerError> + Sync,
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
    let results = run_workers(policy, &devices[..workers], chunks, &gradients)?;
    merge(results, chunks.len())
}

/// Run one worker per device of `devices` (at least two) over `chunks`,
/// each on its own replica of `policy`; each worker's result in device
/// order. Holds the process's turn at the collective throughout.
fn run_workers<B, C, S, F>(
    policy: &Transformer<B>,
    devices: &[B::Device],
    chunks: &[C],
    gradients: &F,
) -> Result<Vec<WorkerResult<S>>, LearnerError>
where
    B: AutodiffModelBackend,
    C: Sync,
    S: Send,
    F: Fn(&Transformer<B>, &C) -> Result<(GradientsParams, S), LearnerError> + Sync,
{
    let workers = devices.len();
    let _turn = COLLECTIVE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Every replica before any worker joins the collective: a replica that
    // cannot be placed (a device the machine lacks, memory) fails the step
    // here, instead of leaving registered peers waiting for it.
    let replicas: Vec<Transformer<B>> = catch_unwind(AssertUnwindSafe(|| {
        devices
            .iter()
            .map(|device| policy.clone().fork(device))
            .collect()
    }))
    .map_err(|payload| {
        LearnerError::DataParallel(format!(
            "placing the policy's replicas on {devices:?} failed: {}",
            panic_message(payload.as_ref())
        ))
    })?;
    collective::reset_collective::<B::InnerBackend>();
    let barrier = Barrier::new(workers);
    let failed = Mutex::new(false);
    let config = CollectiveConfig::default().with_num_devices(workers);
    // Each worker: its output, none when it stood down because another failed.
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = replicas
            .iter()
            .enumerate()
            .map(|(w, replica)| {
                let (barrier, failed, config, gradients) = (&barrier, &failed, &config, &gradients);
                let device = devices[w].clone();
                scope.spawn(move || {
                    let shared = Shared {
                        barrier,
                        failed,
                        config,
                        workers,
                    };
                    work::<B, C, S, F>(w, replica, device, chunks, gradients, &shared)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(w, handle)| {
                handle.join().unwrap_or_else(|payload| {
                    Err(LearnerError::DataParallel(format!(
                        "worker {w} panicked outside its gradients: {}",
                        panic_message(payload.as_ref())
                    )))
                })
            })
            .collect()
    });
    Ok(results)
}

/// The gradients summed by the collective (worker 0's copy) and every
/// chunk's side result in chunk order; the first worker's error if any
/// failed.
fn merge<S>(
    results: Vec<WorkerResult<S>>,
    chunks: usize,
) -> Result<(GradientsParams, Vec<S>), LearnerError> {
    let mut main = None;
    let mut sides = Vec::with_capacity(chunks);
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
        LearnerError::DataParallel("a worker stood down but none reported a failure".into())
    })?;
    Ok((grads, sides.into_iter().map(|(_, s)| s).collect()))
}

/// A worker's summed gradients and its chunks' side results, by chunk index.
type WorkerOutput<S> = (GradientsParams, Vec<(usize, S)>);

/// A worker's output, none when it stood down because another failed.
type WorkerResult<S> = Result<Option<WorkerOutput<S>>, LearnerError>;

/// What every worker of one data-parallel step shares.
struct Shared<'a> {
    barrier: &'a Barrier,
    failed: &'a Mutex<bool>,
    config: &'a CollectiveConfig,
    workers: usize,
}

/// Worker `w` of a data-parallel step: joins the collective, computes the
/// gradients of its chunks (every `workers`-th from `w`) on `replica`, waits
/// for the others, and sums the gradients over the collective unless one of
/// them failed (then it stands down: `None`).
fn work<B, C, S, F>(
    w: usize,
    replica: &Transformer<B>,
    device: B::Device,
    chunks: &[C],
    gradients: &F,
    shared: &Shared<'_>,
) -> WorkerResult<S>
where
    B: AutodiffModelBackend,
    F: Fn(&Transformer<B>, &C) -> Result<(GradientsParams, S), LearnerError>,
{
    let Shared {
        barrier,
        failed,
        config,
        workers,
    } = *shared;
    let peer = PeerId::from(w as u32);
    // Registration waits for every peer; it fails only on a
    // configuration all of them share, so all fail alike.
    collective::register::<B::InnerBackend>(peer, device.clone(), config.clone())
        .map_err(|e| collective_error("register", e))?;
    let local = catch_unwind(AssertUnwindSafe(|| {
        let mut accumulator = GradientsAccumulator::<Transformer<B>>::new();
        let mut sides = Vec::new();
        for (i, chunk) in chunks.iter().enumerate().skip(w).step_by(workers) {
            let (grads, side) = gradients(replica, chunk)?;
            accumulator.accumulate(replica, grads);
            sides.push((i, side));
        }
        Ok((accumulator.grads(), sides))
    }))
    .unwrap_or_else(|payload| {
        Err(LearnerError::DataParallel(format!(
            "worker {w} (device {device:?}) panicked: {}",
            panic_message(payload.as_ref())
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
    let finished = collective::finish_collective::<B::InnerBackend>(peer)
        .map_err(|e| collective_error("finish", e));
    // The worker's own failure comes first; leaving the
    // collective can only fail a worker that had succeeded.
    out.and_then(|out| finished.map(|()| out))
}

fn collective_error(what: &str, e: collective::CollectiveError) -> LearnerError {
    LearnerError::DataParallel(format!("{what}: burn's collective failed: {e:?}"))
}

/// The message a panic carried (`panic!` with a literal or a format).
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(index_id: u16) -> DeviceId {
        DeviceId {
            type_id: 0,
            index_id,
        }
    }

    #[test]
    fn indices_must_name_devices_of_their_own() {
        assert_eq!(check_indexed(&[id(0), id(1), id(2)], false), Ok(()));
        // wgpu's default device: every index maps to the same id.
        assert_eq!(check_indexed(&[id(0), id(0)], false), Err(1));
        assert_eq!(check_indexed(&[id(0), id(2)], false), Err(1));
        // The CPU backend's one device stands for every index.
        assert_eq!(check_indexed(&[id(0), id(0), id(0)], true), Ok(()));
    }

    #[test]
    fn panic_messages_are_kept() {
        let literal = catch_unwind(|| panic!("out of memory")).unwrap_err();
        assert_eq!(panic_message(literal.as_ref()), "out of memory");
        let formatted = catch_unwind(|| panic!("device {} missing", 3)).unwrap_err();
        assert_eq!(panic_message(formatted.as_ref()), "device 3 missing");
    }
}
