//! Writes every target's seeds into `<dir>/<target>/<name>` (default `fuzz/corpus`).

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os().nth(1).map_or_else(|| PathBuf::from("fuzz/corpus"), PathBuf::from);
    for (target, name, bytes) in timeshard_fuzz::seeds::seeds() {
        let folder = dir.join(target);
        std::fs::create_dir_all(&folder)?;
        std::fs::write(folder.join(name), bytes)?;
    }
    Ok(())
}
