//! A runtime directory for the graphics stack. Mesa's Vulkan device-select layer asks Wayland's
//! client library for a display, which prints "error: XDG_RUNTIME_DIR is invalid or not set in
//! the environment." on stderr whenever that variable is unset or not an absolute path, although
//! pagedlm never opens a window. The CLI's stderr carries only its own messages, so in that case
//! the CLI points the variable at a private, empty directory of its own for the run.

use std::path::{Path, PathBuf};

/// The directory the CLI made (removed on drop), or none when the environment had a usable one.
pub struct RuntimeDir(Option<PathBuf>);

impl RuntimeDir {
    /// Leaves a usable XDG_RUNTIME_DIR (an absolute path to a directory) alone; otherwise creates
    /// `$TMPDIR/pagedlm-runtime-<pid>[-n]` with mode 0700 and sets the variable to it. Call it
    /// first in `main`: setting an environment variable is only sound while no other thread runs.
    pub fn ensure() -> RuntimeDir {
        let usable = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).is_some_and(|p| p.is_absolute() && p.is_dir());
        if usable || !cfg!(unix) {
            return RuntimeDir(None);
        }
        let base = std::env::temp_dir().join(format!("pagedlm-runtime-{}", std::process::id()));
        for attempt in 0..100 {
            let dir = if attempt == 0 { base.clone() } else { PathBuf::from(format!("{}-{attempt}", base.display())) };
            if create_private(&dir).is_ok() {
                std::env::set_var("XDG_RUNTIME_DIR", &dir);
                return RuntimeDir(Some(dir));
            }
        }
        // Nothing could be created (a read-only temp dir): the run still works, with the warning.
        RuntimeDir(None)
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            // Only if still empty: nothing of anyone else's is ever removed.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[cfg(unix)]
fn create_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}

#[cfg(not(unix))]
fn create_private(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir(dir)
}
