//! Every file the crate opens goes through here: reads open non-blocking and check that the file
//! is a regular one (a FIFO in place of a shard would block `open` forever, a device would never
//! end); writes go to a fresh temporary name beside the target (`O_EXCL | O_NOFOLLOW`, so never
//! through a symlink), fsynced, then renamed into place.
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// Names of the temporary files writers create; a later writer removes leftovers of a killed one.
pub const TEMP_PREFIX: &str = ".fetchahead-tmp-";

/// What a non-regular file is, for messages.
pub(crate) fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symlink"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading with `O_NONBLOCK | O_CLOEXEC | extra_flags`, checks with fstat that
/// it is a regular file, then clears O_NONBLOCK. Symlinks are followed (a model directory may
/// link its shards), but what they name must be a regular file.
pub(crate) fn open_regular(path: &Path, extra_flags: libc::c_int) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | extra_flags)
        .open(path)
        .map_err(|e| Error::io(path, "open", e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, "fstat", e))?;
    if !meta.file_type().is_file() {
        return Err(Error::NotRegularFile {
            file: path.to_path_buf(),
            kind: kind_of(meta.file_type()),
        });
    }
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function owns; F_GETFL/F_SETFL take no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(Error::io(
            path,
            "fcntl(clear O_NONBLOCK)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(file)
}

/// `open(flags)` with O_NOATIME added while `noatime_off` is `None`: reads of a table then skip
/// the access-time check each one would make. The kernel allows O_NOATIME only to the file's
/// owner (or CAP_FOWNER); where it refuses, the open is retried without it and the refusal kept
/// in `noatime_off`, so that later opens do not try again.
pub(crate) fn open_noatime<T, E: std::fmt::Display>(
    open: impl Fn(libc::c_int) -> std::result::Result<T, E>,
    noatime_off: &mut Option<String>,
) -> std::result::Result<T, E> {
    if noatime_off.is_some() {
        return open(0);
    }
    match open(libc::O_NOATIME) {
        Ok(f) => Ok(f),
        Err(refused) => {
            let f = open(0)?;
            *noatime_off = Some(format!("O_NOATIME: {refused}"));
            Ok(f)
        }
    }
}

/// [`open_regular`], `None` when there is no such file.
pub(crate) fn open_regular_optional(path: &Path) -> Result<Option<File>> {
    match open_regular(path, 0) {
        Ok(f) => Ok(Some(f)),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The whole of a small regular file (an index, a tune file, a marker), refused past `max`
/// bytes before anything is allocated.
pub(crate) fn read_small(path: &Path, max: u64) -> Result<Vec<u8>> {
    let file = open_regular(path, 0)?;
    read_small_from(path, file, max)
}

/// [`read_small`], `None` when there is no such file.
pub(crate) fn read_small_optional(path: &Path, max: u64) -> Result<Option<Vec<u8>>> {
    match open_regular_optional(path)? {
        Some(file) => read_small_from(path, file, max).map(Some),
        None => Ok(None),
    }
}

fn read_small_from(path: &Path, file: File, max: u64) -> Result<Vec<u8>> {
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "fstat", e))?
        .len();
    if len > max {
        return Err(Error::invalid(
            "file",
            format!(
                "{} is {len} bytes; a file of this kind is at most {max}",
                path.display()
            ),
        ));
    }
    let mut bytes = crate::memory::bytes_with_capacity(len as usize, "reading a file")?;
    // One byte more than allowed shows a file that grew since the fstat.
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, "read", e))?;
    if bytes.len() as u64 > max {
        return Err(Error::invalid(
            "file",
            format!("{} grew past {max} bytes while read", path.display()),
        ));
    }
    Ok(bytes)
}

/// Bytes free to an unprivileged writer on the filesystem holding `path` (or its nearest existing
/// ancestor, when `path` is not there yet).
pub(crate) fn free_bytes(path: &Path) -> Result<u64> {
    let mut at = path;
    let existing = loop {
        match std::fs::symlink_metadata(at) {
            Ok(m) if m.file_type().is_symlink() && std::fs::metadata(at).is_err() => {
                let to =
                    std::fs::read_link(at).map_or_else(|_| "?".into(), |t| t.display().to_string());
                return Err(Error::invalid(
                    "path",
                    format!(
                        "{} is a symlink to {to}, which does not exist: create that directory, \
                         or remove the link",
                        at.display()
                    ),
                ));
            }
            Ok(_) => break at,
            Err(_) => match at.parent() {
                Some(p) if !p.as_os_str().is_empty() => at = p,
                _ => break Path::new("."),
            },
        }
    };
    let c = CString::new(existing.as_os_str().as_bytes())
        .map_err(|_| Error::invalid("path", format!("{} holds a NUL byte", path.display())))?;
    // SAFETY: `st` is plain data, zeroes are a valid value for it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` writable for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(Error::io(
            existing,
            "statvfs",
            std::io::Error::last_os_error(),
        ));
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// A file being written under a temporary name in its target's directory; removed on drop unless
/// [`commit`](Self::commit) renamed it into place.
pub(crate) struct TempFile {
    temp: PathBuf,
    target: PathBuf,
    file: File,
}

impl TempFile {
    /// Creates `DIR/.fetchahead-tmp-PID-N-NAME` for `target` = `DIR/NAME`: `O_CREAT | O_EXCL |
    /// O_NOFOLLOW`, so that it is a new file of ours, never a link into someone else's.
    pub(crate) fn create(target: &Path) -> Result<Self> {
        let name = target
            .file_name()
            .ok_or_else(|| Error::invalid("path", format!("{} names no file", target.display())))?;
        // A counter keeps two temporary files for one target (a manifest's two states) apart.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut temp_name =
            std::ffi::OsString::from(format!("{TEMP_PREFIX}{}-{n}-", std::process::id()));
        temp_name.push(name);
        let temp = target.with_file_name(temp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temp)
            // The target is what the user asked for; the temporary name would only puzzle.
            .map_err(|e| Error::io(target, "create", e))?;
        Ok(TempFile {
            temp,
            target: target.to_path_buf(),
            file,
        })
    }

    /// The name the file gets when committed: the one to name in an error.
    pub(crate) fn target(&self) -> &Path {
        &self.target
    }

    pub(crate) fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Syncs and renames the file into place (replacing what is at the target: the caller has
    /// checked that it is ours, or absent, or that the user forced it).
    pub(crate) fn commit(mut self) -> Result<PathBuf> {
        self.file
            .sync_all()
            .map_err(|e| Error::io(&self.target, "fsync", e))?;
        std::fs::rename(&self.temp, &self.target)
            .map_err(|e| Error::io(&self.target, "rename into place", e))?;
        self.temp = PathBuf::new();
        Ok(std::mem::take(&mut self.target))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Writes `bytes` to `target` through a temporary file, fsynced and renamed into place.
pub(crate) fn write_replacing(target: &Path, bytes: &[u8]) -> Result<()> {
    let mut temp = TempFile::create(target)?;
    temp.file()
        .write_all(bytes)
        .map_err(|e| Error::io(target, "write", e))?;
    temp.commit()?;
    sync_dir(target.parent().unwrap_or(Path::new(".")));
    Ok(())
}

/// Makes renames in `dir` durable; best effort (some filesystems refuse fsync on a directory).
pub(crate) fn sync_dir(dir: &Path) {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the kernel refuses O_NOATIME (a file someone else owns), the open goes on without
    /// it, says why, and later opens do not ask again.
    #[test]
    fn a_refused_noatime_falls_back_once_and_says_why() {
        let tried = std::cell::RefCell::new(Vec::new());
        let open = |flags: libc::c_int| {
            tried.borrow_mut().push(flags);
            if flags & libc::O_NOATIME != 0 {
                Err(std::io::Error::from_raw_os_error(libc::EPERM))
            } else {
                Ok(flags)
            }
        };
        let mut off = None;
        assert_eq!(open_noatime(open, &mut off).unwrap(), 0);
        let why = off.clone().expect("the refusal is kept");
        assert!(
            why.starts_with("O_NOATIME: ") && why.contains("not permitted"),
            "{why}"
        );
        assert_eq!(open_noatime(open, &mut off).unwrap(), 0);
        assert_eq!(*tried.borrow(), [libc::O_NOATIME, 0, 0]);
        // An error without O_NOATIME too is the open's own, and nothing is recorded.
        let mut off = None;
        let fails = |_| Err::<i32, _>(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            open_noatime(fails, &mut off).unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        assert!(off.is_none());
    }

    /// Issue 21, item 16: a temporary file that cannot be created is reported under the name the
    /// user asked for, never the hidden temporary one.
    #[test]
    fn a_failed_create_names_the_target_not_the_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("absent").join("model.safetensors");
        let msg = TempFile::create(&target).err().unwrap().to_string();
        assert!(
            msg.starts_with(&format!("{}: create failed", target.display()))
                && !msg.contains(TEMP_PREFIX),
            "{msg}"
        );
    }

    /// The owner (this test's own file) gets O_NOATIME.
    #[test]
    fn the_owner_opens_with_noatime() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, b"x").unwrap();
        let mut off = None;
        let f = open_noatime(|flags| open_regular(&p, flags), &mut off).unwrap();
        assert!(off.is_none(), "{off:?}");
        // SAFETY: fcntl F_GETFL on an open descriptor.
        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
        assert_ne!(flags & libc::O_NOATIME, 0);
    }
}
