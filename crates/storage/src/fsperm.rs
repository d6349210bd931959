//! Private files and directories: the data directory holds password keys
//! (the database) and the TLS private key, so what Starling creates there
//! is readable by its own user only, whatever the umask.

use std::path::Path;

/// Creates `dir` and missing parents with mode 0700 (on Unix). An existing
/// directory keeps its mode: the operator may have chosen it.
pub fn create_private_dir_all(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// Creates an empty file with mode 0600 (on Unix) unless it exists (an
/// existing file keeps its mode).
pub fn create_private_file(path: &Path) -> std::io::Result<()> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    match o.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn private_dir_created_0700_with_parents() {
        let base =
            std::env::temp_dir().join(format!("starling-perm-{}", starling_proto::random_id(8)));
        let dir = base.join("a/b");
        create_private_dir_all(&dir).unwrap();
        for d in [&base, &dir] {
            let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
        create_private_dir_all(&dir).unwrap();
        let _ = std::fs::remove_dir_all(base);
    }
}
