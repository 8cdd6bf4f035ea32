//! Whether a backend's device can be used on this machine, asked before any
//! work is done: a missing CUDA driver or NVRTC, or no wgpu adapter, is an
//! error that names what was searched and what to install, not a panic in
//! a device thread (cudarc loads CUDA's libraries at run time and panics
//! when it cannot, cubecl-wgpu panics without an adapter; cubecl then fails
//! on its closed channel).

/// A backend's device that cannot be used here, and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DeviceError(pub String);

/// The first of `candidates` the dynamic loader finds.
#[cfg(feature = "cuda")]
fn load_first(candidates: &[String]) -> Option<String> {
    candidates.iter().find_map(|name| {
        // SAFETY: loading the driver's or NVRTC's shared library runs only
        // their initialisers, as cudarc's own loading of them does.
        unsafe { libloading::Library::new(name) }
            .ok()
            .map(|_| name.clone())
    })
}

/// Checks that CUDA can run here: the driver library (`libcuda`) and NVRTC
/// load under one of the names cudarc searches, the driver initialises, and
/// it sees a device. Returns what was found (the libraries, the devices).
#[cfg(feature = "cuda")]
pub fn check_cuda() -> Result<String, DeviceError> {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let mut found = Vec::new();
    for (lib, what, install) in [
        (
            "cuda",
            "the NVIDIA driver's library",
            "install the NVIDIA driver (it brings libcuda.so.1), or add the folder holding it to LD_LIBRARY_PATH",
        ),
        (
            "nvrtc",
            "NVRTC, CUDA's run-time compiler",
            "add the CUDA toolkit's lib64 folder, or PyTorch's site-packages/nvidia/cuda_nvrtc/lib, to LD_LIBRARY_PATH \
             (cudarc looks for these file names only: link one of them to the library you have)",
        ),
    ] {
        let candidates = cudarc::get_lib_name_candidates(lib);
        match load_first(&candidates) {
            Some(name) => found.push(name),
            None => {
                return Err(DeviceError(format!(
                    "backend cuda: {what} could not be loaded; searched for {} (LD_LIBRARY_PATH={path:?}); {install}",
                    candidates.join(", ")
                )))
            }
        }
    }
    let devices = std::panic::catch_unwind(|| -> Result<Vec<String>, String> {
        use cudarc::driver::result::{device, init};
        init().map_err(|e| format!("cuInit failed: {e:?}"))?;
        let count = device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))?;
        (0..count)
            .map(|i| {
                let dev = device::get(i).map_err(|e| format!("device {i}: {e:?}"))?;
                device::get_name(dev).map_err(|e| format!("device {i}'s name: {e:?}"))
            })
            .collect()
    })
    .map_err(|_| {
        DeviceError("backend cuda: the driver panicked while being asked for its devices".into())
    })?
    .map_err(|e| DeviceError(format!("backend cuda: {} loaded, but {e}", found[0])))?;
    if devices.is_empty() {
        return Err(DeviceError(format!(
            "backend cuda: {} loaded, but the driver sees no device",
            found[0]
        )));
    }
    Ok(format!(
        "{} and {} loaded; {} device(s): {}",
        found[0],
        found[1],
        devices.len(),
        devices.join(", ")
    ))
}

/// Checks that wgpu finds an adapter for the graphics API burn's `wgpu`
/// backend asks for here (Metal on macOS, Vulkan elsewhere), as cubecl
/// looks for one. Returns the adapters found.
#[cfg(feature = "wgpu")]
pub fn check_wgpu() -> Result<String, DeviceError> {
    let (backend, name) = if cfg!(target_os = "macos") {
        (wgpu::Backends::METAL, "Metal")
    } else {
        (wgpu::Backends::VULKAN, "Vulkan")
    };
    let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle();
    descriptor.backends = backend;
    let instance = wgpu::Instance::new(descriptor);
    let adapters = block_on(instance.enumerate_adapters(backend));
    if adapters.is_empty() {
        return Err(DeviceError(format!(
            "backend wgpu: no {name} adapter found; install a {name} driver (an NVIDIA or AMD \
             GPU's driver with its Vulkan ICD, or Debian's mesa-vulkan-drivers for a slow CPU \
             one), or run with backend = \"cuda\" or \"cpu\""
        )));
    }
    let names: Vec<String> = adapters
        .iter()
        .map(|a| {
            let info = a.get_info();
            format!("{} ({:?})", info.name, info.device_type)
        })
        .collect();
    Ok(format!(
        "{} {name} adapter(s): {}",
        names.len(),
        names.join(", ")
    ))
}

/// Runs a future that completes without waiting (wgpu's native adapter
/// enumeration) to its end.
#[cfg(feature = "wgpu")]
fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(value) = future.as_mut().poll(&mut context) {
            return value;
        }
        std::thread::yield_now();
    }
}
