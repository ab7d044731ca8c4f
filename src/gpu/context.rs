//! The one GPU context: adapter, device, queue, limits, features and the pipeline cache.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

use super::timing::{AtomicCounters, Capture, Captured, Counters};
use super::{shaders, GpuError};

/// How long [`Context::confirm_lost`] waits in the browser for the device-lost callback after a
/// failed readback, in milliseconds (natively the callback comes with a poll: no wait).
#[cfg(target_arch = "wasm32")]
const LOST_CONFIRM_MS: u32 = 10_000;

thread_local! {
    /// Bytes of the buffers created on this thread inside [`Context::tally`], while one runs.
    static TALLY: Cell<Option<u64>> = const { Cell::new(None) };
}

/// What the caller needs from the device.
#[derive(Clone, Debug)]
pub struct ContextOptions {
    /// The largest single storage binding the caller will bind (bytes).
    /// The device is refused with [`GpuError::Limits`] if the adapter offers less.
    pub min_storage_binding: u64,
    /// Prefer a CPU (software) adapter; tests pin lavapipe this way when a real GPU exists.
    pub force_fallback_adapter: bool,
    /// Lowers `maxStorageBufferBindingSize` and `maxBufferSize` to at most this many bytes, to
    /// run as on a device that offers only that much (phones offer 128 MiB). Natively the device
    /// is created with the lowered limits; in the browser WebGPU never goes below its 128 MiB
    /// default, so [`Context::limits`] reports the lowered values and everything that sizes a
    /// buffer or a binding reads them there. `min_storage_binding` is then capped to it too.
    pub max_storage_binding: Option<u64>,
    /// Tune the kernels as for this kind of adapter instead of the one found ([`Context::class`]):
    /// tests run the real-GPU variants on the software GPUs this way, benchmarks compare them.
    pub class: Option<AdapterClass>,
    /// Use the adapter's optional features (`subgroups`, `shader-f16`) where it has them; `false`
    /// runs the variants written for adapters without them (tests, benchmarks).
    pub optional_features: bool,
    /// Whether the matmuls quantize their activations to int8 (llama.cpp's trick, see
    /// `gpu::ops::matmul::MatmulConfig::for_device`); `None` = the default, f32 activations
    /// (int8 is faster on CPU adapters but moves the logits further than llama.cpp's do).
    pub int8_activations: Option<bool>,
    /// The limits the device is created with: the adapter's, or a phone's ([`DeviceLimits`]).
    pub limits: DeviceLimits,
}

/// Which limits a device is created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceLimits {
    /// What the adapter offers.
    Adapter,
    /// What every WebGPU device offers, as phones do: WebGPU's default limits (8 storage buffers
    /// per shader stage, 16 KiB of workgroup storage, 256 invocations per workgroup, 4 bind
    /// groups) with storage bindings and buffers of at most 128 MiB. Natively the device is
    /// created with exactly these, so whatever needs more fails here as it would on a phone.
    Phone,
}

/// A phone's largest storage binding and buffer.
pub const PHONE_MAX_BUFFER: u64 = 128 << 20;

impl Default for DeviceLimits {
    /// The adapter's; in the test suites (feature `testing`) `PAGEDLM_TEST_LIMITS=phone` makes
    /// every default context a phone's (natively read when the test runs, in the browser when
    /// the tests are compiled), so that a whole suite runs as on a phone
    /// (`scripts/test-phone-limits.sh`).
    fn default() -> DeviceLimits {
        #[cfg(feature = "testing")]
        {
            #[cfg(not(target_arch = "wasm32"))]
            let asked = std::env::var("PAGEDLM_TEST_LIMITS").ok();
            #[cfg(target_arch = "wasm32")]
            let asked = option_env!("PAGEDLM_TEST_LIMITS").map(str::to_string);
            if asked.as_deref() == Some("phone") {
                return DeviceLimits::Phone;
            }
        }
        DeviceLimits::Adapter
    }
}

impl DeviceLimits {
    /// Parses `adapter` or `phone` (the CLI's and the package's spelling).
    pub fn parse(name: &str) -> Option<DeviceLimits> {
        match name {
            "adapter" => Some(DeviceLimits::Adapter),
            "phone" => Some(DeviceLimits::Phone),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceLimits::Adapter => "adapter",
            DeviceLimits::Phone => "phone",
        }
    }

    /// The limits to ask of an adapter offering `adapter`, lowered to `cap` bytes per storage
    /// binding and buffer where given.
    fn request(self, adapter: &wgpu::Limits, cap: Option<u64>) -> wgpu::Limits {
        match self {
            DeviceLimits::Adapter => lowered(adapter.clone(), cap),
            DeviceLimits::Phone => lowered(wgpu::Limits::defaults(), Some(cap.map_or(PHONE_MAX_BUFFER, |c| c.min(PHONE_MAX_BUFFER)))),
        }
    }

    /// The storage-binding cap these limits put on top of `cap`.
    fn binding_cap(self, cap: Option<u64>) -> Option<u64> {
        match self {
            DeviceLimits::Adapter => cap,
            DeviceLimits::Phone => Some(cap.map_or(PHONE_MAX_BUFFER, |c| c.min(PHONE_MAX_BUFFER))),
        }
    }
}

impl Default for ContextOptions {
    fn default() -> Self {
        ContextOptions {
            min_storage_binding: 64 << 20,
            force_fallback_adapter: false,
            max_storage_binding: None,
            class: None,
            optional_features: true,
            int8_activations: None,
            limits: DeviceLimits::default(),
        }
    }
}

/// The kind of adapter the kernels are tuned for ([`Context::class`]): it picks workgroup sizes,
/// tiles and reductions (the README's Kernels on emulated GPUs). Every variant is correct on every adapter; this only
/// chooses which one is expected to be fastest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdapterClass {
    /// A CPU emulation (lavapipe, SwiftShader): few wide invocations, registers over barriers.
    Cpu,
    /// A GPU sharing memory with the CPU (laptops, phones): moderate workgroups.
    Integrated,
    /// A discrete GPU (and any other real GPU): large workgroups, split reductions.
    Discrete,
}

impl AdapterClass {
    /// The class wgpu's device type suggests; unknown and virtual devices count as integrated.
    pub fn of(device_type: wgpu::DeviceType) -> AdapterClass {
        match device_type {
            wgpu::DeviceType::Cpu => AdapterClass::Cpu,
            wgpu::DeviceType::DiscreteGpu => AdapterClass::Discrete,
            _ => AdapterClass::Integrated,
        }
    }

    /// Parses `cpu`, `integrated` or `discrete` (the CLI's and the package's spelling).
    pub fn parse(name: &str) -> Option<AdapterClass> {
        match name {
            "cpu" => Some(AdapterClass::Cpu),
            "integrated" => Some(AdapterClass::Integrated),
            "discrete" => Some(AdapterClass::Discrete),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AdapterClass::Cpu => "cpu",
            AdapterClass::Integrated => "integrated",
            AdapterClass::Discrete => "discrete",
        }
    }
}

/// The optional features requested where the adapter offers them.
const OPTIONAL_FEATURES: wgpu::Features = wgpu::Features::SUBGROUP.union(wgpu::Features::SHADER_F16);

/// Bindings and buffers below this size are refused as a limit: no real device is that small, and
/// a few of pagedlm's fixed-size buffers would not fit.
pub const MIN_STORAGE_BINDING: u64 = 64 << 10;

/// `limits` with the storage-binding and buffer-size limits lowered to `cap` (never raised).
fn lowered(mut limits: wgpu::Limits, cap: Option<u64>) -> wgpu::Limits {
    if let Some(cap) = cap {
        limits.max_storage_buffer_binding_size = limits.max_storage_buffer_binding_size.min(cap);
        limits.max_buffer_size = limits.max_buffer_size.min(cap);
    }
    limits
}

/// Key of the pipeline cache: shader file, entry point, and override constants
/// (sorted by name, values as f64 bits so the key is hashable).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PipelineKey {
    shader: String,
    entry: String,
    constants: Vec<(String, u64)>,
}

/// Owns device, queue, limits and every cache. Every op gets GPU resources through it: buffers,
/// bind groups and submissions go through its methods (never `device`/`queue` directly), so that
/// [`Context::counters`] sees them all.
pub struct Context {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// Features the adapter offers (probed, not all requested: `shader-f16` is never required).
    pub adapter_features: wgpu::Features,
    /// [`ContextOptions::class`], or the adapter's own.
    class: AdapterClass,
    /// [`ContextOptions::int8_activations`].
    pub int8_activations: Option<bool>,
    modules: Mutex<HashMap<String, Arc<wgpu::ShaderModule>>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
    counters: AtomicCounters,
    /// The armed timestamp capture ([`Context::begin_capture`]); a [`super::Recorder`] holds it
    /// while it records and puts it back when it submits.
    capture: Mutex<Option<Capture>>,
    /// Set by the device-lost callback ([`Context::is_lost`]), with its reason and message.
    lost: Arc<AtomicBool>,
    lost_reason: Arc<Mutex<String>>,
    /// Errors the device reported outside any error scope, oldest first ([`Context::take_reported`]).
    reported: Arc<Mutex<Vec<GpuError>>>,
}

/// What a device's callbacks report, kept for the context.
struct Watch {
    lost: Arc<AtomicBool>,
    lost_reason: Arc<Mutex<String>>,
    reported: Arc<Mutex<Vec<GpuError>>>,
}

impl Watch {
    /// Hooks `device`'s lost callback and its handler of errors outside error scopes.
    fn device(device: &wgpu::Device) -> Watch {
        let lost = Arc::new(AtomicBool::new(false));
        let lost_reason = Arc::new(Mutex::new(String::new()));
        let (flag, reason) = (lost.clone(), lost_reason.clone());
        device.set_device_lost_callback(move |why, message| {
            *reason.lock().unwrap_or_else(|p| p.into_inner()) = format!("{why:?}: {message}");
            flag.store(true, Ordering::Relaxed);
        });
        // wgpu's own handler panics natively on the first device error (an allocation the device
        // refuses among them); this one keeps it for the engine, which fails the work it hit.
        let reported: Arc<Mutex<Vec<GpuError>>> = Arc::default();
        let errors = reported.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let error = match e {
                wgpu::Error::OutOfMemory { .. } => GpuError::OutOfMemory(e.to_string()),
                _ => GpuError::Reported(e.to_string()),
            };
            let mut errors = errors.lock().unwrap_or_else(|p| p.into_inner());
            // A burst after one failure repeats it; the first few say what went wrong.
            if errors.len() < 8 {
                errors.push(error);
            }
        }));
        Watch { lost, lost_reason, reported }
    }
}

impl Context {
    /// Finds an adapter (Vulkan natively, `navigator.gpu` on the web) and creates the device,
    /// requesting the limits the adapter offers (lowered where `options` says so).
    pub async fn new(options: ContextOptions) -> Result<Context, GpuError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle().with_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: options.force_fallback_adapter,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                GpuError::NoAdapter(format!(
                    "{e}. Natively pagedlm needs a Vulkan driver (on Debian: apt-get install mesa-vulkan-drivers); \
                     in Chromium, WebGPU must be enabled (headless: --enable-unsafe-webgpu)"
                ))
            })?;
        let info = adapter.get_info();
        let adapter_limits = adapter.limits();
        let adapter_features = adapter.features();
        if let Some(cap) = options.max_storage_binding.filter(|&cap| cap < MIN_STORAGE_BINDING) {
            return Err(GpuError::Limits(format!(
                "a storage-binding limit of {cap} bytes was asked for; the least pagedlm runs with is {MIN_STORAGE_BINDING}"
            )));
        }
        let cap = options.limits.binding_cap(options.max_storage_binding);
        let need = options.min_storage_binding.min(cap.unwrap_or(u64::MAX));
        if (adapter_limits.max_storage_buffer_binding_size as u64) < need {
            return Err(GpuError::Limits(format!("maxStorageBufferBindingSize is {} bytes, {} needed", adapter_limits.max_storage_buffer_binding_size, need)));
        }
        if adapter_limits.max_compute_invocations_per_workgroup < 64 {
            return Err(GpuError::Limits(format!("maxComputeInvocationsPerWorkgroup is {}, 64 needed", adapter_limits.max_compute_invocations_per_workgroup)));
        }
        // Timestamp queries only where offered (profiles fall back to the host clock without); the
        // optional features the kernels have variants for, where offered; none is required.
        let mut required_features = adapter_features & wgpu::Features::TIMESTAMP_QUERY;
        if options.optional_features {
            required_features |= adapter_features & OPTIONAL_FEATURES;
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("pagedlm"),
                required_features,
                required_limits: options.limits.request(&adapter_limits, options.max_storage_binding),
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| GpuError::Device(e.to_string()))?;
        let limits = lowered(device.limits(), cap);
        let class = options.class.unwrap_or(AdapterClass::of(info.device_type));
        let Watch { lost, lost_reason, reported } = Watch::device(&device);
        Ok(Context {
            class,
            device,
            queue,
            info,
            limits,
            adapter_features,
            int8_activations: options.int8_activations,
            modules: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
            counters: AtomicCounters::default(),
            capture: Mutex::new(None),
            lost,
            lost_reason,
            reported,
        })
    }

    /// The first error the device reported since the last call (an allocation it refused, a
    /// validation error: the work it hit computed nothing), clearing them all. Natively the
    /// device reports during the call that failed; in the browser some event-loop turns later.
    pub fn take_reported(&self) -> Option<GpuError> {
        let mut errors = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        let first = (!errors.is_empty()).then(|| errors.remove(0));
        errors.clear();
        first
    }

    /// True once the device is lost (or destroyed): nothing submitted to it runs any more, and
    /// [`Context::shared`] hands out a new context instead of this one.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// After a failure a lost device would explain (a readback that failed): whether the device
    /// is lost, waiting for its lost callback. Natively it comes with a poll. In the browser it
    /// comes when the GPU process has handled the loss, which can be seconds after the failed
    /// map it caused while that process still runs earlier work (a prefill chunk on SwiftShader):
    /// up to `LOST_CONFIRM_MS` are waited. A readback fails without a lost device only after a
    /// validation error, a bug, so the wait costs nothing in a healthy engine.
    pub async fn confirm_lost(&self) -> bool {
        #[cfg(not(target_arch = "wasm32"))]
        let _ = self.device.poll(wgpu::PollType::Poll);
        #[cfg(target_arch = "wasm32")]
        for _ in 0..LOST_CONFIRM_MS / 10 {
            if self.is_lost() {
                break;
            }
            crate::time::sleep_ms(10).await;
        }
        self.is_lost()
    }

    /// Why the device was lost, as its lost callback said (`None` while it is not).
    pub fn lost_reason(&self) -> Option<String> {
        self.is_lost().then(|| self.lost_reason.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// A one-line description of the adapter, e.g. "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu)".
    pub fn adapter_name(&self) -> String {
        format!("{} ({:?}, {:?})", self.info.name, self.info.backend, self.info.device_type)
    }

    /// True when the "GPU" is a CPU emulation (lavapipe, SwiftShader): kernels choose
    /// register-heavy, barrier-free variants there (see the README's Kernels on emulated GPUs).
    pub fn is_cpu(&self) -> bool {
        self.class == AdapterClass::Cpu
    }

    /// True when the adapter itself is a CPU emulation (its device type, whatever class the
    /// kernels were asked to be tuned for): what `backend: "auto"` leaves for the CPU backend.
    pub fn is_cpu_adapter(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The kind of adapter the kernels are tuned for: the adapter's own, or the one
    /// [`ContextOptions::class`] asked for.
    pub fn class(&self) -> AdapterClass {
        self.class
    }

    /// True when shaders may use subgroup operations (`enable subgroups;`) and every subgroup has
    /// at least `lanes` invocations (lavapipe: 8; wgpu does not expose subgroups in browsers yet).
    pub fn has_subgroups(&self, lanes: u32) -> bool {
        self.device.features().contains(wgpu::Features::SUBGROUP) && self.info.subgroup_min_size >= lanes
    }

    /// True when shaders may compute in f16 (`enable f16;`). Never required: SwiftShader has no
    /// `shader-f16`, so every kernel has an f32 form.
    pub fn has_f16(&self) -> bool {
        self.device.features().contains(wgpu::Features::SHADER_F16)
    }

    /// The variant choices a profile or benchmark line reports: class and optional features used.
    pub fn variant_name(&self) -> String {
        let mut name = self.class.name().to_string();
        if self.device.features().contains(wgpu::Features::SUBGROUP) {
            name += &format!("+subgroups({}-{})", self.info.subgroup_min_size, self.info.subgroup_max_size);
        }
        if self.has_f16() {
            name += "+f16";
        }
        if self.int8_activations == Some(true) {
            name += "+int8-activations";
        }
        name
    }

    fn module(&self, shader: &str) -> Result<Arc<wgpu::ShaderModule>, GpuError> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(shader) {
            return Ok(m.clone());
        }
        let src = shaders::source(shader).ok_or_else(|| GpuError::UnknownShader(shader.to_string()))?;
        let module =
            Arc::new(self.device.create_shader_module(wgpu::ShaderModuleDescriptor { label: Some(shader), source: wgpu::ShaderSource::Wgsl(src.into()) }));
        modules.insert(shader.to_string(), module.clone());
        Ok(module)
    }

    /// The compute pipeline for `shader`'s `entry` with the given override constants,
    /// compiled once and cached. Its layout is derived from the shader ("auto"), so a
    /// shader must use every binding it declares.
    pub fn pipeline(&self, shader: &str, entry: &str, constants: &[(&str, f64)]) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        let mut sorted: Vec<(String, u64)> = constants.iter().map(|(k, v)| (k.to_string(), v.to_bits())).collect();
        sorted.sort();
        let key = PipelineKey { shader: shader.to_string(), entry: entry.to_string(), constants: sorted };
        if let Some(p) = self.pipelines.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(p.clone());
        }
        let module = self.module(shader)?;
        let pipeline = Arc::new(self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&format!("{shader}::{entry}")),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions { constants, ..Default::default() },
            cache: None,
        }));
        self.pipelines.lock().unwrap_or_else(|e| e.into_inner()).insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// Number of distinct pipelines compiled so far.
    pub fn pipeline_count(&self) -> usize {
        self.pipelines.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// What this context has created, submitted and read back so far (see [`Counters`]).
    pub fn counters(&self) -> Counters {
        self.counters.snapshot()
    }

    /// Creates a buffer (every buffer of the crate is made here or by the helpers below, so it is
    /// counted).
    pub fn create_buffer(&self, desc: &wgpu::BufferDescriptor<'_>) -> wgpu::Buffer {
        self.count_buffer(desc.size);
        self.device.create_buffer(desc)
    }

    fn count_buffer(&self, size: u64) {
        AtomicCounters::add(&self.counters.buffers, 1);
        AtomicCounters::add(&self.counters.buffer_bytes, size);
        TALLY.with(|t| t.set(t.get().map(|bytes| bytes + size)));
    }

    /// Runs `f` and returns what it returned with the bytes of the buffers it created (on this
    /// thread, through any context): what an object built by `f` holds on the device. Nests (an
    /// inner tally's bytes count in the outer one too).
    pub fn tally<T>(f: impl FnOnce() -> T) -> (T, u64) {
        let outer = TALLY.with(|t| t.replace(Some(0)));
        let result = f();
        let bytes = TALLY.with(|t| t.get()).unwrap_or(0);
        TALLY.with(|t| t.set(outer.map(|o| o + bytes)));
        (result, bytes)
    }

    /// A buffer holding `contents` with `usage`.
    fn buffer_init(&self, label: &str, contents: &[u8], usage: wgpu::BufferUsages) -> wgpu::Buffer {
        self.count_buffer(contents.len() as u64);
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor { label: Some(label), contents, usage })
    }

    /// A MAP_READ buffer of `size` bytes that copies land in, for [`Context::map_staging_range`].
    pub fn staging(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Creates a bind group (counted).
    pub fn create_bind_group(&self, desc: &wgpu::BindGroupDescriptor<'_>) -> wgpu::BindGroup {
        AtomicCounters::add(&self.counters.bind_groups, 1);
        self.device.create_bind_group(desc)
    }

    /// Submits command buffers (counted).
    pub fn submit<I: IntoIterator<Item = wgpu::CommandBuffer>>(&self, command_buffers: I) -> wgpu::SubmissionIndex {
        // Counted before the submit, so a map started after it sees its serial.
        AtomicCounters::add(&self.counters.submits, 1);
        self.queue.submit(command_buffers)
    }

    /// Counts what a [`super::Recorder`] recorded: its dispatches and its host time (ns) from
    /// the start of recording to `queue.submit` returning.
    pub(crate) fn count_recording(&self, dispatches: u64, record_submit_ns: u64, submit_ns: u64) {
        AtomicCounters::add(&self.counters.submit_ns, submit_ns);
        AtomicCounters::add(&self.counters.dispatches, dispatches);
        AtomicCounters::add(&self.counters.record_submit_ns, record_submit_ns);
    }

    /// A storage buffer initialised with `data` (readable and writable by kernels, copyable both ways).
    pub fn storage_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        // wgpu requires buffer sizes to be multiples of 4 for copies; pad.
        let mut padded;
        let bytes = if data.len() % 4 != 0 || data.is_empty() {
            padded = data.to_vec();
            padded.resize(data.len().div_ceil(4).max(1) * 4, 0);
            &padded[..]
        } else {
            data
        };
        self.buffer_init(label, bytes, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST)
    }

    /// A zero-filled storage buffer of `size` bytes (rounded up to 4).
    /// Submits nothing, so that the queue takes the `write_buffer`s made since the last
    /// submission, and natively waits for it: their staging memory is freed then (a load writes
    /// gigabytes; on the web the browser copies each write as it is made).
    pub fn flush_writes(&self) {
        self.queue.submit(std::iter::empty());
        let _ = self.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None });
    }

    pub fn storage_zeroed(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.div_ceil(4).max(1) * 4,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// A kernel's parameters: a read-only storage buffer holding `data` (declared
    /// `var<storage, read> params` in the shader), rewritable with `queue.write_buffer`. Not a
    /// uniform buffer: lavapipe (Mesa 22) specializes a shader on the uniform values that steer
    /// its control flow and compiles it again whenever they differ from the last dispatch's, which
    /// layers of different shapes sharing a pipeline (and a kv_len that grows every step) would
    /// pay on every dispatch.
    pub fn params_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut padded = data.to_vec();
        padded.resize(data.len().div_ceil(16).max(1) * 16, 0);
        self.buffer_init(label, &padded, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST)
    }

    /// A uniform buffer holding `data` (a `#[repr(C)]` Pod struct padded to 16 bytes by the caller
    /// or by this function), writable later with `queue.write_buffer`.
    pub fn uniform_init(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut padded = data.to_vec();
        padded.resize(data.len().div_ceil(16).max(1) * 16, 0);
        self.buffer_init(label, &padded, wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST)
    }

    /// Copies `size` bytes at `offset` of `buffer` to the CPU. Submits a copy and waits through
    /// `map_async`, which works natively (the device is polled) and on the web (the browser's
    /// event loop completes the map). Recorded work submitted before is complete when this returns.
    pub async fn read_bytes(&self, buffer: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>, GpuError> {
        if offset % 4 != 0 || size % 4 != 0 || offset + size > buffer.size() {
            return Err(GpuError::Readback(format!(
                "range {offset}..{} of a {}-byte buffer is out of bounds or not 4-byte aligned",
                offset + size,
                buffer.size()
            )));
        }
        if size == 0 {
            return Ok(Vec::new());
        }
        let staging = self.staging("readback", size);
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
        self.submit(Some(encoder.finish()));
        self.map_staging(&staging).await
    }

    /// Maps an already-filled MAP_READ buffer and returns its contents.
    pub async fn map_staging(&self, staging: &wgpu::Buffer) -> Result<Vec<u8>, GpuError> {
        self.map_staging_range(staging, staging.size()).await
    }

    /// Maps the first `size` bytes of a filled MAP_READ buffer and returns them (counted as one
    /// readback of `size` bytes).
    pub async fn map_staging_range(&self, staging: &wgpu::Buffer, size: u64) -> Result<Vec<u8>, GpuError> {
        self.map_after(staging, size, None).bytes(self).await
    }

    /// Starts mapping the first `size` bytes of a MAP_READ buffer that submission `index` fills
    /// (`None`: the work submitted so far), without waiting: the GPU may run on through later
    /// submissions while the caller does other work, and [`Mapping::bytes`] waits for `index`
    /// alone.
    pub fn map_after(&self, staging: &wgpu::Buffer, size: u64, index: Option<wgpu::SubmissionIndex>) -> Mapping {
        // The submits so far: a later one means the GPU has work queued behind this map's.
        let submitted = self.counters.submits.load(std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.slice(..size).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        Mapping { staging: staging.clone(), size, index, submitted, rx }
    }

    // ---- Timestamp captures (see `profile`) ----------------------------------------------

    /// Whether the device has timestamp queries (`timestamp-query`), so steps can be captured.
    pub fn has_timestamps(&self) -> bool {
        self.device.features().contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// Arms a capture of the next steps' dispatches, at most `max_dispatches` of them: every
    /// [`super::Recorder`] until [`Context::end_capture`] times each dispatch with a pair of GPU
    /// timestamps. The query sets and buffers are made now, so the captured steps create nothing
    /// more. Refused without timestamp queries or while a capture is armed.
    pub fn begin_capture(&self, max_dispatches: u32) -> Result<(), GpuError> {
        if !self.has_timestamps() {
            return Err(GpuError::Timestamps(format!("{} offers no timestamp queries", self.adapter_name())));
        }
        let mut slot = self.capture.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Err(GpuError::Timestamps("a capture is already armed".into()));
        }
        let bytes = Capture::resolve_bytes(max_dispatches.max(1));
        let resolve = self.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile.resolve"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let staging = self.staging("profile.staging", bytes);
        *slot = Some(Capture::new(&self.device, max_dispatches.max(1), resolve, staging));
        Ok(())
    }

    /// The armed capture, for a recorder to fill ([`Context::return_capture`] gives it back).
    pub(crate) fn take_capture(&self) -> Option<Capture> {
        self.capture.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(crate) fn return_capture(&self, capture: Capture) {
        *self.capture.lock().unwrap_or_else(|e| e.into_inner()) = Some(capture);
    }

    /// Ends the armed capture: resolves its timestamps, reads them (one readback) and returns
    /// each captured dispatch's kernel name and GPU time, in dispatch order, and their span.
    /// Refused when no capture is armed, when a recorder that took it was never submitted, or
    /// when more dispatches ran than it was armed for.
    pub async fn end_capture(&self) -> Result<Captured, GpuError> {
        let capture =
            self.take_capture().ok_or_else(|| GpuError::Timestamps("no capture is armed (or a recorder holding it was dropped unsubmitted)".into()))?;
        if capture.overflow > 0 {
            return Err(GpuError::Timestamps(format!("{} dispatches ran past the {} the capture was armed for", capture.overflow, capture.names.len())));
        }
        if capture.names.is_empty() {
            return Ok(Captured { dispatches: Vec::new(), span_ms: 0.0 });
        }
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("profile.resolve") });
        let bytes = capture.resolve_into(&mut encoder);
        self.submit(Some(encoder.finish()));
        let data = self.map_staging_range(&capture.staging, bytes).await?;
        // A Vec<u8> need not be 8-byte aligned: read the u64s byte-wise.
        let ticks: Vec<u64> = data.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))).collect();
        Ok(capture.read(&ticks, self.queue.get_timestamp_period() as f64))
    }

    /// Reads `len` f32 values starting at element `start`.
    pub async fn read_f32(&self, buffer: &wgpu::Buffer, start: u64, len: u64) -> Result<Vec<f32>, GpuError> {
        let bytes = self.read_bytes(buffer, start * 4, len * 4).await?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }

    /// Reads `len` u32 values starting at element `start`.
    pub async fn read_u32(&self, buffer: &wgpu::Buffer, start: u64, len: u64) -> Result<Vec<u32>, GpuError> {
        let bytes = self.read_bytes(buffer, start * 4, len * 4).await?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }
}

/// A map in flight ([`Context::map_after`]).
pub struct Mapping {
    staging: wgpu::Buffer,
    size: u64,
    index: Option<wgpu::SubmissionIndex>,
    /// The context's submit count when the map was started.
    submitted: u64,
    rx: futures_channel::oneshot::Receiver<Result<(), wgpu::BufferAsyncError>>,
}

impl Mapping {
    /// Waits until the buffer is mapped (natively by polling the device until the submission is
    /// done; on the web the browser's event loop completes the map) and returns its bytes; the
    /// buffer is unmapped again, ready to be filled by a later step.
    pub async fn bytes(self, ctx: &Context) -> Result<Vec<u8>, GpuError> {
        // Counted when read, so a step's counters hold the readbacks whose tokens it reports.
        let counters = &ctx.counters;
        AtomicCounters::add(&counters.readbacks, 1);
        AtomicCounters::add(&counters.bytes_read_back, self.size);
        if counters.submits.load(std::sync::atomic::Ordering::Relaxed) == self.submitted {
            AtomicCounters::add(&counters.blocking_readbacks, 1);
        }
        #[cfg(not(target_arch = "wasm32"))]
        ctx.device.poll(wgpu::PollType::Wait { submission_index: self.index.clone(), timeout: None }).map_err(|e| GpuError::Readback(e.to_string()))?;
        #[cfg(target_arch = "wasm32")]
        let _ = (ctx, &self.index);
        self.rx.await.map_err(|_| GpuError::Readback("the map callback was dropped".into()))?.map_err(|e| GpuError::Readback(e.to_string()))?;
        let slice = self.staging.slice(..self.size);
        let data = slice.get_mapped_range().map_err(|e| GpuError::Readback(e.to_string()))?.to_vec();
        self.staging.unmap();
        Ok(data)
    }
}
