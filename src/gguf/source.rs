//! Where a GGUF file's bytes come from: a buffer in memory, a file on disk, or (in the browser)
//! a `Blob`, an OPFS file or an `ArrayBuffer` read on demand through JS. The reader asks for the
//! header's bytes first, then for each tensor's (or a part of one) as the loader places it, so a
//! model never has to be whole in memory.

/// A file read by ranges.
pub trait ReadAt {
    /// The file's length in bytes.
    fn size(&self) -> u64;

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`. A range past the end or a
    /// failed read is an error saying why (the file changed, the read was refused, ...).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String>;

    /// The bytes at `offset..offset + len` without a copy, where the source holds them in memory.
    fn borrow(&self, _offset: u64, _len: u64) -> Option<&[u8]> {
        None
    }

    /// How many of the file's first bytes can be read: all of them, except for a [`Prefix`].
    fn available(&self) -> u64 {
        self.size()
    }
}

impl ReadAt for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let bytes = self.borrow(offset, buf.len() as u64).ok_or_else(|| past_end(offset, buf.len(), self.len() as u64))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }

    fn borrow(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        self.get(start..end)
    }
}

/// The first bytes of a file of `size` bytes, standing for the file where only its header is
/// needed (a memory estimate before a download): reads past them fail.
pub struct Prefix<'a> {
    pub bytes: &'a [u8],
    pub size: u64,
}

impl ReadAt for Prefix<'_> {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        self.bytes
            .read_at(offset, buf)
            .map_err(|_| format!("bytes {offset}..{} are past the {} bytes of the file's start at hand", offset + buf.len() as u64, self.bytes.len()))
    }

    fn borrow(&self, offset: u64, len: u64) -> Option<&[u8]> {
        self.bytes.borrow(offset, len)
    }

    fn available(&self) -> u64 {
        self.bytes.len() as u64
    }
}

/// A file on disk, read with positioned reads (no seek state, so `&self` suffices).
#[cfg(unix)]
pub struct DiskFile {
    file: std::fs::File,
    size: u64,
}

#[cfg(unix)]
impl DiskFile {
    pub fn open(path: &std::path::Path) -> std::io::Result<DiskFile> {
        let file = std::fs::File::open(path)?;
        let size = file.metadata()?.len();
        Ok(DiskFile { file, size })
    }
}

#[cfg(unix)]
impl ReadAt for DiskFile {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > self.size) {
            return Err(past_end(offset, buf.len(), self.size));
        }
        self.file.read_exact_at(buf, offset).map_err(|e| format!("reading bytes {offset}..{}: {e}", offset + buf.len() as u64))
    }
}

/// A source whose reads cost a call each (a browser's `FileReaderSync`, a JS callback) read
/// ahead: a small read (a norm's weights, a fingerprint's 1 KiB samples) is served from a window
/// of [`ReadAhead::WINDOW`] bytes read at once, so loading a model of a few hundred tensors
/// makes a few dozen calls instead of a thousand. Large reads go straight to the source.
pub struct ReadAhead<R> {
    source: R,
    /// The window's file offset and bytes.
    window: std::cell::RefCell<(u64, Vec<u8>)>,
}

impl<R: ReadAt> ReadAhead<R> {
    /// Bytes read at once for a small read.
    pub const WINDOW: usize = 16 << 20;
    /// Reads up to this size are served from the window.
    pub const SMALL: usize = 4 << 20;

    pub fn new(source: R) -> ReadAhead<R> {
        ReadAhead { source, window: std::cell::RefCell::new((0, Vec::new())) }
    }

    /// The source read through.
    pub fn inner(&self) -> &R {
        &self.source
    }
}

impl<R: ReadAt> ReadAt for ReadAhead<R> {
    fn size(&self) -> u64 {
        self.source.size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        if buf.len() > Self::SMALL {
            return self.source.read_at(offset, buf);
        }
        let mut window = self.window.borrow_mut();
        let (start, bytes) = &mut *window;
        let end = offset.checked_add(buf.len() as u64).ok_or_else(|| past_end(offset, buf.len(), self.size()))?;
        if offset < *start || end > *start + bytes.len() as u64 {
            let len = (Self::WINDOW as u64).min(self.size().saturating_sub(offset)).max(buf.len() as u64);
            bytes.resize(len as usize, 0);
            self.source.read_at(offset, bytes)?;
            *start = offset;
        }
        let from = (offset - *start) as usize;
        buf.copy_from_slice(&bytes[from..from + buf.len()]);
        Ok(())
    }

    fn available(&self) -> u64 {
        self.source.available()
    }
}

fn past_end(offset: u64, len: usize, size: u64) -> String {
    format!("bytes {offset}..{} lie past the end of the {size}-byte file", offset.saturating_add(len as u64))
}
