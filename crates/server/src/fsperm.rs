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
