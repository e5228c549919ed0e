//! Named network namespaces made the way `ip netns add` makes them (a
//! fresh namespace bind-mounted on `/run/netns/NAME`): simulated hosts on
//! one machine each get one, so each has a kernel network of its own.

use std::path::PathBuf;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

fn path_of(name: &str) -> std::io::Result<PathBuf> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not a namespace name"),
        ));
    }
    Ok(PathBuf::from("/run/netns").join(name))
}

/// Creates `/run/netns/NAME` unless it is there. Needs root.
pub fn create(name: &str) -> std::io::Result<()> {
    let path = path_of(name)?;
    if path.exists() {
        return Ok(());
    }
    std::fs::create_dir_all("/run/netns")?;
    std::fs::File::create(&path)?;
    // unshare() moves only the calling thread: do it on a thread of its own.
    let made = std::thread::scope(|s| {
        s.spawn(|| -> nix::Result<()> {
            unshare(CloneFlags::CLONE_NEWNET)?;
            mount(
                Some("/proc/thread-self/ns/net"),
                &path,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
        })
        .join()
        .unwrap_or(Err(nix::Error::EINVAL))
    });
    if let Err(e) = made {
        let _ = std::fs::remove_file(&path);
        return Err(std::io::Error::from(e));
    }
    Ok(())
}

/// Removes a namespace made by [`create`] (or `ip netns add`).
pub fn delete(name: &str) -> std::io::Result<()> {
    let path = path_of(name)?;
    let _ = umount2(&path, MntFlags::MNT_DETACH);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Runs `f` on a thread of its own inside namespace `name` (a thread's
/// network namespace is its own; sockets it opens stay in that namespace).
/// Simulated fleets serve their stand-in guests this way.
pub fn spawn_in(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let file = std::fs::File::open(path_of(name)?)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let entered = nix::sched::setns(&file, CloneFlags::CLONE_NEWNET);
        let ok = entered.is_ok();
        let _ = tx.send(entered);
        if ok {
            f();
        }
    });
    match rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(std::io::Error::from(e)),
        Err(_) => Err(std::io::Error::other("the namespace's thread ended")),
    }
}
