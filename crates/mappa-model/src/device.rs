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

/// What CUDA offers here: the libraries loaded, the driver's version and
/// each device's name and memory.
#[cfg(feature = "cuda")]
#[derive(Debug, Clone)]
pub struct CudaInventory {
    /// The driver library's file name, as loaded.
    pub driver_library: String,
    /// NVRTC's file name, as loaded.
    pub nvrtc_library: String,
    /// The driver's CUDA version (`cuDriverGetVersion`: 1000 major + 10 minor).
    pub driver_version: i32,
    /// Each device's name and total memory in bytes.
    pub devices: Vec<(String, u64)>,
}

/// Checks that CUDA can run here: the driver library (`libcuda`) and NVRTC
/// load under one of the names cudarc searches, the driver initialises, and
/// it sees a device. Returns what was found (the libraries, the devices).
#[cfg(feature = "cuda")]
pub fn check_cuda() -> Result<String, DeviceError> {
    let found = cuda_inventory()?;
    let devices: Vec<&str> = found
        .devices
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    Ok(format!(
        "{} and {} loaded; {} device(s): {}",
        found.driver_library,
        found.nvrtc_library,
        devices.len(),
        devices.join(", ")
    ))
}

/// What [`check_cuda`] checks, as found.
#[cfg(feature = "cuda")]
pub fn cuda_inventory() -> Result<CudaInventory, DeviceError> {
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
    let (driver_version, devices) = std::panic::catch_unwind(cuda_devices)
        .map_err(|_| {
            DeviceError(
                "backend cuda: the driver panicked while being asked for its devices".into(),
            )
        })?
        .map_err(|e| DeviceError(format!("backend cuda: {} loaded, but {e}", found[0])))?;
    if devices.is_empty() {
        return Err(DeviceError(format!(
            "backend cuda: {} loaded, but the driver sees no device",
            found[0]
        )));
    }
    Ok(CudaInventory {
        driver_library: found[0].clone(),
        nvrtc_library: found[1].clone(),
        driver_version,
        devices,
    })
}

/// The driver's version and its devices' names and memory.
#[cfg(feature = "cuda")]
fn cuda_devices() -> Result<(i32, Vec<(String, u64)>), String> {
    use cudarc::driver::result::{device, init};
    init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    let mut version = 0;
    // SAFETY: cuDriverGetVersion writes one int to the pointer it is given.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| format!("cuDriverGetVersion failed: {e:?}"))?;
    let count = device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))?;
    let devices = (0..count)
        .map(|i| {
            let dev = device::get(i).map_err(|e| format!("device {i}: {e:?}"))?;
            let name = device::get_name(dev).map_err(|e| format!("device {i}'s name: {e:?}"))?;
            // SAFETY: `dev` is a device handle the driver just returned.
            let memory = unsafe { device::total_mem(dev) }
                .map_err(|e| format!("device {i}'s memory: {e:?}"))?;
            Ok((name, memory as u64))
        })
        .collect::<Result<_, String>>()?;
    Ok((version, devices))
}

/// Bytes in use on CUDA device `ordinal`: its total memory less what the
/// driver reports free (`cuMemGetInfo` in the device's primary context,
/// the one cubecl computes in).
#[cfg(feature = "cuda")]
pub fn cuda_memory_in_use(ordinal: usize) -> Result<u64, DeviceError> {
    let context = cudarc::driver::CudaContext::new(ordinal)
        .map_err(|e| DeviceError(format!("CUDA device {ordinal}: {e:?}")))?;
    let (free, total) = context
        .mem_get_info()
        .map_err(|e| DeviceError(format!("CUDA device {ordinal}'s memory: {e:?}")))?;
    Ok((total - free) as u64)
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
