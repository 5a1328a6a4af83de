//! Checks on a library file before any of its code runs: who may write it, and whether its
//! bytes are the ones the config pins.

use std::path::Path;

/// Why `path` must not be loaded because group or others can write it or its directory, or
/// `None` when neither can. A directory with the sticky bit (like `/tmp`) does not count:
/// there only a file's owner can replace it. What cannot be inspected is left to the loader,
/// which reports it.
#[cfg(unix)]
pub fn writable_problem(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    const FIX: &str = "or set allow_writable_libraries = true";
    let file = path.canonicalize().ok()?;
    let mode = std::fs::metadata(&file).ok()?.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Some(format!(
            "it is writable by {} (mode {mode:04o}), so it could be changed under switchyard; \
             chmod go-w it, {FIX}",
            writers(mode)
        ));
    }
    let dir = file.parent()?;
    let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Some(format!(
            "its directory {} is writable by {} (mode {mode:04o}), so the file could be \
             replaced; chmod go-w {}, {FIX}",
            dir.display(),
            writers(mode),
            dir.display()
        ));
    }
    None
}

#[cfg(not(unix))]
pub fn writable_problem(_path: &Path) -> Option<String> {
    None
}

#[cfg(unix)]
fn writers(mode: u32) -> &'static str {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "group and others",
        (true, false) => "group",
        _ => "others",
    }
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest
        .as_ref()
        .iter()
        .fold(String::with_capacity(64), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// Compares the library's bytes with the pinned digest (hex, either case).
pub fn check_sha256(bytes: &[u8], expected: &str) -> Result<(), String> {
    let actual = sha256_hex(bytes);
    if actual.eq_ignore_ascii_case(expected) {
        return Ok(());
    }
    Err(format!(
        "its SHA-256 is {actual}, but the config pins sha256 = \"{}\"; if this file is the \
         build you mean to run, pin its digest (sha256sum FILE), else restore the pinned build",
        expected.to_ascii_lowercase()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_inputs() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
