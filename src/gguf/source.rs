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

fn past_end(offset: u64, len: usize, size: u64) -> String {
    format!("bytes {offset}..{} lie past the end of the {size}-byte file", offset.saturating_add(len as u64))
}
