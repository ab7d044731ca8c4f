//! What the GPU layer did, counted and timed: always-on counters of the buffers and bind groups
//! it created, the submissions it made and the bytes it read back ([`Counters`]), and GPU
//! timestamps around every dispatch of a captured step ([`Capture`]).
//!
//! The counters are plain relaxed atomics bumped where [`super::Context`] creates, submits and
//! maps, so they cost a few nanoseconds and tell the truth about every step, profiled or not: a
//! caller snapshots them before and after and subtracts ([`Counters::since`]).
//!
//! A capture times a step as it really runs, in one submission: while one is armed, the next
//! [`super::Recorder`] gives every dispatch a compute pass of its own whose `timestamp_writes`
//! bracket it (the one form of timestamp query WebGPU offers without extra features), and
//! [`super::Context::end_capture`] resolves them all and reads them once.

use std::sync::atomic::{AtomicU64, Ordering};

/// The live counters a [`super::Context`] bumps.
#[derive(Default)]
pub(crate) struct AtomicCounters {
    pub buffers: AtomicU64,
    pub buffer_bytes: AtomicU64,
    pub bind_groups: AtomicU64,
    pub submits: AtomicU64,
    pub dispatches: AtomicU64,
    pub readbacks: AtomicU64,
    pub bytes_read_back: AtomicU64,
    pub blocking_readbacks: AtomicU64,
    pub record_submit_ns: AtomicU64,
    pub submit_ns: AtomicU64,
}

impl AtomicCounters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Counters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            buffers_created: get(&self.buffers),
            buffer_bytes_created: get(&self.buffer_bytes),
            bind_groups_created: get(&self.bind_groups),
            submits: get(&self.submits),
            dispatches: get(&self.dispatches),
            readbacks: get(&self.readbacks),
            bytes_read_back: get(&self.bytes_read_back),
            blocking_readbacks: get(&self.blocking_readbacks),
            record_submit_ns: get(&self.record_submit_ns),
            submit_ns: get(&self.submit_ns),
        }
    }
}

/// What a [`super::Context`] has done since it was created; subtract two snapshots
/// ([`Counters::since`]) for what happened between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Buffers created (storage, uniform, staging, query resolve).
    pub buffers_created: u64,
    /// Bytes of those buffers.
    pub buffer_bytes_created: u64,
    pub bind_groups_created: u64,
    /// `queue.submit` calls.
    pub submits: u64,
    /// Dispatches recorded through a [`super::Recorder`].
    pub dispatches: u64,
    /// Buffers mapped and read (counted when read): each is a wait for the GPU to finish the work
    /// before it.
    pub readbacks: u64,
    /// Bytes those maps returned.
    pub bytes_read_back: u64,
    /// Readbacks whose wait found nothing submitted after the work it waited for: the GPU runs
    /// dry while the host waits, reads and records the next step. A decode loop that keeps the
    /// next step in flight has none in steady state.
    pub blocking_readbacks: u64,
    /// Host time from a [`super::Recorder`]'s creation (the start of recording) to its
    /// `queue.submit` returning, summed over recorders, in nanoseconds.
    pub record_submit_ns: u64,
    /// The part of `record_submit_ns` spent inside `queue.submit` (a driver may wait there for
    /// earlier work: lavapipe does while the step before is still running).
    pub submit_ns: u64,
}

impl Counters {
    /// What happened between `earlier` and `self` (both snapshots of one context, `earlier`
    /// first). Saturates at 0, so a difference of differences never panics.
    pub fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            buffers_created: self.buffers_created.saturating_sub(earlier.buffers_created),
            buffer_bytes_created: self.buffer_bytes_created.saturating_sub(earlier.buffer_bytes_created),
            bind_groups_created: self.bind_groups_created.saturating_sub(earlier.bind_groups_created),
            submits: self.submits.saturating_sub(earlier.submits),
            dispatches: self.dispatches.saturating_sub(earlier.dispatches),
            readbacks: self.readbacks.saturating_sub(earlier.readbacks),
            bytes_read_back: self.bytes_read_back.saturating_sub(earlier.bytes_read_back),
            blocking_readbacks: self.blocking_readbacks.saturating_sub(earlier.blocking_readbacks),
            record_submit_ns: self.record_submit_ns.saturating_sub(earlier.record_submit_ns),
            submit_ns: self.submit_ns.saturating_sub(earlier.submit_ns),
        }
    }

    /// [`Counters::record_submit_ns`] in milliseconds.
    pub fn record_submit_ms(&self) -> f64 {
        self.record_submit_ns as f64 / 1e6
    }
}

/// Where a profile's per-kernel times come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingMethod {
    /// GPU timestamp queries around every dispatch of a step recorded as it runs (one
    /// submission; a compute pass per dispatch).
    Timestamps,
    /// No timestamp queries on this device: every kernel submitted alone and waited for, timed
    /// by the host clock (so each time includes a submit and a readback).
    WallClockPerKernel,
}

impl TimingMethod {
    /// What a person reads in a table.
    pub fn describe(self) -> &'static str {
        match self {
            TimingMethod::Timestamps => "GPU timestamps around each dispatch of one submission",
            TimingMethod::WallClockPerKernel => "the host clock, each kernel submitted and waited for alone",
        }
    }
}

/// One kernel's share of a step: its dispatches and their summed time.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KernelTime {
    pub name: String,
    pub dispatches: u32,
    pub ms: f64,
}

impl KernelTime {
    /// Per-dispatch `(kernel name, ms)` summed by name, slowest first (ties by name).
    pub fn by_name(dispatches: &[(&'static str, f64)]) -> Vec<KernelTime> {
        let mut out: Vec<KernelTime> = Vec::new();
        for &(name, ms) in dispatches {
            match out.iter_mut().find(|k| k.name == name) {
                Some(k) => {
                    k.dispatches += 1;
                    k.ms += ms;
                }
                None => out.push(KernelTime { name: name.to_string(), dispatches: 1, ms }),
            }
        }
        out.sort_by(|a, b| b.ms.total_cmp(&a.ms).then_with(|| a.name.cmp(&b.name)));
        out
    }
}

/// Timestamp queries a query set holds at most (WebGPU's and wgpu's limit).
const QUERIES_PER_SET: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// The query sets and buffers of one capture and the kernels it has seen, in dispatch order.
/// Dispatch `i` writes queries `2i` (its pass's beginning) and `2i + 1` (its end), numbered
/// across the sets, whose resolved values lie at `8 · query` in `resolve`.
pub(crate) struct Capture {
    sets: Vec<wgpu::QuerySet>,
    pub resolve: wgpu::Buffer,
    pub staging: wgpu::Buffer,
    pub names: Vec<&'static str>,
    /// Queries the sets hold together.
    queries: u32,
    /// Dispatches recorded after the sets were full (they run untimed; `end_capture` refuses).
    pub overflow: u32,
}

impl Capture {
    /// Query sets for `max_dispatches` dispatches; the buffers come from the caller (made
    /// through the context, so they are counted).
    pub fn new(device: &wgpu::Device, max_dispatches: u32, resolve: wgpu::Buffer, staging: wgpu::Buffer) -> Capture {
        let queries = max_dispatches * 2;
        let sets = (0..queries.div_ceil(QUERIES_PER_SET))
            .map(|s| {
                device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile.timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: (queries - s * QUERIES_PER_SET).min(QUERIES_PER_SET),
                })
            })
            .collect();
        Capture { sets, resolve, staging, names: Vec::new(), queries, overflow: 0 }
    }

    /// Bytes of resolved timestamps `max_dispatches` dispatches take (the resolve buffer's size).
    pub fn resolve_bytes(max_dispatches: u32) -> u64 {
        max_dispatches as u64 * 2 * wgpu::QUERY_SIZE as u64
    }

    /// The timestamp writes of the next dispatch's pass, or `None` when the sets are full.
    pub fn next_writes(&mut self, name: &'static str) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let query = self.names.len() as u32 * 2;
        let Some(set) = self.sets.get((query / QUERIES_PER_SET) as usize).filter(|_| query < self.queries) else {
            self.overflow += 1;
            return None;
        };
        self.names.push(name);
        let at = query % QUERIES_PER_SET;
        Some(wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: Some(at), end_of_pass_write_index: Some(at + 1) })
    }

    /// Records the resolution of every written query into `resolve` and its copy into `staging`;
    /// returns the bytes to map.
    pub fn resolve_into(&self, encoder: &mut wgpu::CommandEncoder) -> u64 {
        let queries = self.names.len() as u32 * 2;
        for (s, set) in self.sets.iter().enumerate() {
            let first = s as u32 * QUERIES_PER_SET;
            if first >= queries {
                break;
            }
            let count = (queries - first).min(QUERIES_PER_SET);
            // Each set starts at a multiple of 4096 · 8 bytes, so the offset keeps the
            // 256-byte alignment a resolve needs.
            encoder.resolve_query_set(set, 0..count, &self.resolve, first as u64 * wgpu::QUERY_SIZE as u64);
        }
        let bytes = queries as u64 * wgpu::QUERY_SIZE as u64;
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.staging, 0, bytes);
        bytes
    }

    /// The captured dispatches' times from the resolved ticks (`period`: nanoseconds per tick).
    pub fn read(&self, ticks: &[u64], period: f64) -> Captured {
        read_ticks(&self.names, ticks, period)
    }
}

/// The times of dispatches `names` from their resolved begin/end ticks (`2i`, `2i + 1`). A pair
/// whose end reads before its beginning (a driver's clock wrapping) counts as 0.
fn read_ticks(names: &[&'static str], ticks: &[u64], period: f64) -> Captured {
    let ms = |t: u64| t as f64 * period / 1e6;
    let dispatches = names.iter().enumerate().map(|(i, &name)| (name, ms(ticks[2 * i + 1].saturating_sub(ticks[2 * i])))).collect();
    let used = &ticks[..names.len() * 2];
    let first = used.iter().step_by(2).min().copied().unwrap_or(0);
    let last = used.iter().skip(1).step_by(2).max().copied().unwrap_or(0);
    Captured { dispatches, span_ms: ms(last.saturating_sub(first)) }
}

/// What a capture measured ([`super::Context::end_capture`]).
#[derive(Clone, Debug)]
pub struct Captured {
    /// Each captured dispatch's kernel name and GPU time in milliseconds, in dispatch order.
    pub dispatches: Vec<(&'static str, f64)>,
    /// From the first dispatch's beginning to the last one's end (ms): the captured steps' GPU
    /// timeline, gaps between dispatches (and, over several submissions, between them) included.
    pub span_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_times_sum_by_name_slowest_first() {
        let got = KernelTime::by_name(&[("a", 1.0), ("b", 5.0), ("a", 2.5), ("c", 3.5)]);
        let want = [("b", 1, 5.0), ("a", 2, 3.5), ("c", 1, 3.5)];
        assert_eq!(got.len(), want.len());
        for (k, (name, n, ms)) in got.iter().zip(want) {
            assert_eq!((k.name.as_str(), k.dispatches, k.ms), (name, n, ms));
        }
    }

    #[test]
    fn a_capture_reads_each_pair_and_the_span() {
        // Ticks of 2 ns; the third pair's end reads before its beginning.
        let ticks = [500_000u64, 1_500_000, 1_750_000, 2_000_000, 4_500_000, 4_000_000];
        let captured = read_ticks(&["a", "b", "c"], &ticks, 2.0);
        assert_eq!(captured.dispatches, vec![("a", 2.0), ("b", 0.5), ("c", 0.0)]);
        assert_eq!(captured.span_ms, 7.0, "from the first beginning to the latest end");
    }

    #[test]
    fn counters_subtract_field_by_field() {
        let a = Counters { buffers_created: 3, bytes_read_back: 8, record_submit_ns: 10, ..Default::default() };
        let b = Counters { buffers_created: 5, bytes_read_back: 12, record_submit_ns: 2_000_010, submits: 1, ..a };
        let d = b.since(&a);
        assert_eq!((d.buffers_created, d.bytes_read_back, d.submits, d.dispatches), (2, 4, 1, 0));
        assert_eq!(d.record_submit_ms(), 2.0);
    }
}
