//! A recorded-once unit of GPU work and the recorder that batches them into one submission.

use std::sync::Arc;

use super::timing::Capture;
use super::Context;

/// One dispatch: pipeline, bind group (group 0) and workgroup count. Built by a launcher in
/// [`super::ops`] after its shape contract has been checked; recorded any number of times.
pub struct Kernel {
    pub name: &'static str,
    pub pipeline: Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub workgroups: [u32; 3],
    /// Uniform buffers the kernel owns (kept alive with it; rewritable through the queue).
    pub params: Option<wgpu::Buffer>,
    /// When set, the workgroup count is read on the GPU from this buffer at this byte offset
    /// (three u32, written by an earlier kernel) and `workgroups` is only its largest value.
    pub indirect: Option<(wgpu::Buffer, u64)>,
}

impl Kernel {
    /// Builds a kernel, binding `resources` to bindings 0, 1, 2, ... of group 0 in order.
    pub fn new(
        ctx: &Context,
        name: &'static str,
        pipeline: Arc<wgpu::ComputePipeline>,
        resources: &[wgpu::BindingResource<'_>],
        workgroups: [u32; 3],
        params: Option<wgpu::Buffer>,
    ) -> Kernel {
        let bindings: Vec<(u32, wgpu::BindingResource<'_>)> = resources.iter().enumerate().map(|(i, r)| (i as u32, r.clone())).collect();
        let mut kernel = Kernel::with_bindings(ctx, name, pipeline, &bindings, workgroups);
        kernel.params = params;
        kernel
    }

    /// Builds a kernel binding each `(binding, resource)` of group 0: for an entry point that
    /// uses only some of its module's bindings (the "auto" layout holds only those it uses).
    pub fn with_bindings(
        ctx: &Context,
        name: &'static str,
        pipeline: Arc<wgpu::ComputePipeline>,
        bindings: &[(u32, wgpu::BindingResource<'_>)],
        workgroups: [u32; 3],
    ) -> Kernel {
        let layout = pipeline.get_bind_group_layout(0);
        let entries: Vec<wgpu::BindGroupEntry<'_>> =
            bindings.iter().map(|(binding, r)| wgpu::BindGroupEntry { binding: *binding, resource: r.clone() }).collect();
        let bind_group = ctx.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(name), layout: &layout, entries: &entries });
        Kernel { name, pipeline, bind_group, workgroups, params: None, indirect: None }
    }

    /// Keeps `params` alive with the kernel (a uniform the kernel reads).
    pub fn owning(mut self, params: wgpu::Buffer) -> Kernel {
        self.params = Some(params);
        self
    }

    /// Records this dispatch into an open compute pass.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        match &self.indirect {
            Some((buffer, offset)) => pass.dispatch_workgroups_indirect(buffer, *offset),
            None => pass.dispatch_workgroups(self.workgroups[0], self.workgroups[1], self.workgroups[2]),
        }
    }
}

/// Splits a linear workgroup count over x and y so that no dimension exceeds the device limit
/// (65,535 on most devices). Kernels recover the linear index as `wg.x + wg.y * num_workgroups.x`.
pub fn split_workgroups(ctx: &Context, count: u32) -> [u32; 3] {
    split_count(ctx.limits.max_compute_workgroups_per_dimension, count)
}

/// [`split_workgroups`] for a per-dimension limit `max_per_dim`, for launchers that resize their
/// dispatches per step without the context at hand.
pub(crate) fn split_count(max_per_dim: u32, count: u32) -> [u32; 3] {
    let max = max_per_dim.max(1);
    if count <= max {
        [count.max(1), 1, 1]
    } else {
        let y = count.div_ceil(max);
        [count.div_ceil(y), y, 1]
    }
}

/// Collects the dispatches and copies of one step into a single command buffer and submission.
///
/// While a timestamp capture is armed ([`Context::begin_capture`]) the recorder holds it and
/// gives every dispatch a compute pass of its own with a timestamp at its beginning and end; the
/// step is otherwise recorded and submitted exactly as without. [`Recorder::submit`] counts the
/// dispatches and the host time from [`Recorder::new`] to `queue.submit` returning.
pub struct Recorder<'a> {
    ctx: &'a Context,
    encoder: wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
    dispatches: usize,
    capture: Option<Capture>,
    started_ms: f64,
}

impl<'a> Recorder<'a> {
    pub fn new(ctx: &'a Context, label: &str) -> Recorder<'a> {
        let started_ms = crate::time::now_ms();
        let encoder = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        Recorder { ctx, encoder, pass: None, dispatches: 0, capture: ctx.take_capture(), started_ms }
    }

    /// Records a kernel; consecutive kernels share one compute pass (WebGPU orders storage
    /// writes between dispatches of a pass), unless a capture times each in a pass of its own.
    pub fn dispatch(&mut self, kernel: &Kernel) {
        if let Some(capture) = self.capture.as_mut() {
            self.pass = None;
            let timestamp_writes = capture.next_writes(kernel.name);
            let mut pass = self.encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(kernel.name), timestamp_writes });
            kernel.record(&mut pass);
        } else {
            if self.pass.is_none() {
                let pass = self.encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("step"), timestamp_writes: None }).forget_lifetime();
                self.pass = Some(pass);
            }
            if let Some(pass) = self.pass.as_mut() {
                kernel.record(pass);
            }
        }
        self.dispatches += 1;
    }

    /// Records kernels in order, e.g. the `Vec<Kernel>` of a launcher that needs several dispatches.
    pub fn dispatch_all(&mut self, kernels: &[Kernel]) {
        for kernel in kernels {
            self.dispatch(kernel);
        }
    }

    /// Records a buffer-to-buffer copy (closes the open compute pass first).
    pub fn copy(&mut self, src: &wgpu::Buffer, src_offset: u64, dst: &wgpu::Buffer, dst_offset: u64, size: u64) {
        self.pass = None;
        self.encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size);
    }

    /// Dispatches recorded so far.
    pub fn dispatch_count(&self) -> usize {
        self.dispatches
    }

    /// Finishes the command buffer and submits it; hands a held capture back to the context.
    pub fn submit(mut self) -> wgpu::SubmissionIndex {
        self.pass = None;
        let commands = self.encoder.finish();
        let submitting = crate::time::now_ms();
        let index = self.ctx.submit(Some(commands));
        let now = crate::time::now_ms();
        let ns = |ms: f64| (ms * 1e6).max(0.0) as u64;
        self.ctx.count_recording(self.dispatches as u64, ns(now - self.started_ms), ns(now - submitting));
        if let Some(capture) = self.capture.take() {
            self.ctx.return_capture(capture);
        }
        index
    }
}
