//! Sparse streams: what a move sends is the data a volume holds, not its
//! provisioned size. A 4 GiB volume with 10 MiB written sent 4 GiB of
//! zeros, and hashed them first.
//!
//! The stream (`Content-Type: application/x-kumo-extents`, the size in
//! [`SIZE_HEADER`]) is a run of records, `offset` (u64, big-endian),
//! `length` (u32, big-endian, at most [`MAX_RECORD`]) and that many bytes,
//! at increasing offsets that do not overlap and stay below the size;
//! then the end record `(size, 0)` and the SHA-256 (32 bytes) of every
//! byte before it. What no record covers reads as zeros. The sender finds
//! the data with `SEEK_DATA`/`SEEK_HOLE` (where the file cannot say, a
//! block device, it reads it all) and leaves out chunks that are all
//! zeros; the receiver writes each record where it goes into a fresh
//! file or thin LV (which reads as zeros) and keeps the result only if
//! the stream ended properly and its checksum matched.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

use super::StorageError;

/// The stream's media type.
pub const CONTENT_TYPE: &str = "application/x-kumo-extents";
/// The response header with the guest-visible size in bytes.
pub const SIZE_HEADER: &str = "x-kumo-size";
/// The longest record.
pub const MAX_RECORD: usize = 1 << 20;
/// Zero detection granularity: a block this size that is all zeros is
/// not sent.
const BLOCK: usize = 64 << 10;

/// The data regions of `file` below `size`: `(offset, length)`.
fn data_regions(file: &File, size: u64) -> Vec<(u64, u64)> {
    use nix::unistd::{lseek, Whence};
    let whole = vec![(0, size)];
    let mut out = Vec::new();
    let mut pos: u64 = 0;
    while pos < size {
        let Ok(at) = i64::try_from(pos) else {
            return whole;
        };
        let data = match lseek(file, at, Whence::SeekData) {
            Ok(d) => d as u64,
            // No data past `pos`.
            Err(nix::errno::Errno::ENXIO) => break,
            // The file cannot say: all of it is data.
            Err(_) => return whole,
        };
        if data >= size {
            break;
        }
        let hole = match lseek(file, data as i64, Whence::SeekHole) {
            Ok(h) => (h as u64).min(size),
            Err(_) => return whole,
        };
        if hole <= data {
            return whole;
        }
        out.push((data, hole - data));
        pos = hole;
    }
    out
}

/// Hashes and writes.
struct Hashing<'a> {
    out: &'a mut dyn Write,
    hasher: Sha256,
    bytes: u64,
}

impl Hashing<'_> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hasher.update(b);
        self.bytes += b.len() as u64;
        self.out.write_all(b)
    }

    fn record(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(data.len()).map_err(std::io::Error::other)?;
        self.put(&offset.to_be_bytes())?;
        self.put(&len.to_be_bytes())?;
        self.put(data)
    }
}

/// Writes the first `size` bytes of `file` as an extent stream into
/// `out`; answers how many bytes of data it carried.
pub fn send(file: &File, size: u64, out: &mut dyn Write) -> std::io::Result<u64> {
    let mut w = Hashing {
        out,
        hasher: Sha256::new(),
        bytes: 0,
    };
    let mut buf = vec![0u8; MAX_RECORD];
    let mut data = 0u64;
    for (start, len) in data_regions(file, size) {
        let end = start + len;
        let mut pos = start;
        while pos < end {
            let n = usize::try_from((end - pos).min(MAX_RECORD as u64)).unwrap_or(MAX_RECORD);
            file.read_exact_at(&mut buf[..n], pos)?;
            // Runs of blocks that are not all zeros, as records.
            let mut run: Option<usize> = None;
            let mut i = 0;
            while i < n {
                let j = (i + BLOCK).min(n);
                let zero = buf[i..j].iter().all(|b| *b == 0);
                match (zero, run) {
                    (false, None) => run = Some(i),
                    (true, Some(r)) => {
                        w.record(pos + r as u64, &buf[r..i])?;
                        data += (i - r) as u64;
                        run = None;
                    }
                    _ => {}
                }
                i = j;
            }
            if let Some(r) = run {
                w.record(pos + r as u64, &buf[r..n])?;
                data += (n - r) as u64;
            }
            pos += n as u64;
        }
    }
    w.put(&size.to_be_bytes())?;
    w.put(&0u32.to_be_bytes())?;
    let sum = w.hasher.finalize();
    w.out.write_all(&sum)?;
    w.out.flush()?;
    Ok(data)
}

fn invalid(why: impl Into<String>) -> StorageError {
    StorageError::Invalid(why.into())
}

/// Reads exactly `b.len()` bytes; a stream that ends first is cut short.
fn fill(r: &mut dyn Read, b: &mut [u8], h: &mut Sha256, hash: bool) -> Result<(), StorageError> {
    r.read_exact(b).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => invalid("the stream ended before its end record"),
        _ => StorageError::Io {
            what: "receiving the volume".into(),
            source: e,
        },
    })?;
    if hash {
        h.update(&*b);
    }
    Ok(())
}

/// Writes an extent stream of a `size`-byte volume into `out` (fresh: it
/// reads as zeros) and checks it; answers the bytes of data written.
/// Nothing past the end record is read.
pub fn receive(reader: &mut dyn Read, out: &File, size: u64) -> Result<u64, StorageError> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; MAX_RECORD];
    let mut next = 0u64;
    let mut data = 0u64;
    loop {
        let mut head = [0u8; 12];
        fill(reader, &mut head, &mut h, true)?;
        let mut o = [0u8; 8];
        o.copy_from_slice(&head[..8]);
        let offset = u64::from_be_bytes(o);
        let mut l = [0u8; 4];
        l.copy_from_slice(&head[8..]);
        let len = u32::from_be_bytes(l) as usize;
        if len == 0 {
            if offset != size {
                return Err(invalid(format!(
                    "the stream ends at {offset} bytes for a volume of {size}"
                )));
            }
            break;
        }
        if len > MAX_RECORD {
            return Err(invalid(format!("a record of {len} bytes")));
        }
        let end = offset.saturating_add(len as u64);
        if offset < next || end > size {
            return Err(invalid(format!(
                "a record at {offset}..{end} out of order or past the {size} bytes announced"
            )));
        }
        fill(reader, &mut buf[..len], &mut h, true)?;
        out.write_all_at(&buf[..len], offset)
            .map_err(StorageError::io("writing the volume"))?;
        next = end;
        data += len as u64;
    }
    let expected = h.finalize();
    let mut got = [0u8; 32];
    fill(reader, &mut got, &mut Sha256::new(), false)?;
    if got[..] != expected[..] {
        return Err(StorageError::Checksum {
            expected: hex::encode(expected),
            actual: hex::encode(got),
        });
    }
    out.sync_all()
        .map_err(StorageError::io("syncing the volume"))?;
    Ok(data)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn sparse(dir: &std::path::Path, size: u64, writes: &[(u64, &[u8])]) -> File {
        let path = dir.join(format!("f-{}", uuid::Uuid::new_v4()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap();
        f.set_len(size).unwrap();
        for (at, b) in writes {
            f.write_all_at(b, *at).unwrap();
        }
        f
    }

    fn read_all(f: &File, size: u64) -> Vec<u8> {
        let mut v = vec![0u8; size as usize];
        f.read_exact_at(&mut v, 0).unwrap();
        v
    }

    #[test]
    fn only_data_travels_and_comes_back_where_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 << 20;
        let a = vec![0x5au8; 3 * BLOCK + 17];
        // Zeros in the middle of written data are left out too.
        let mut b = vec![0xa5u8; 4 * BLOCK];
        b[BLOCK..2 * BLOCK].fill(0);
        let src = sparse(
            dir.path(),
            size,
            &[
                (5 << 20, &a),
                ((40 << 20) + 100, &b),
                (size - 10, &[1u8; 10]),
            ],
        );
        let mut wire = Vec::new();
        let data = send(&src, size, &mut wire).unwrap();
        let written = (a.len() + 3 * BLOCK + 10) as u64;
        // Whole blocks around what was written, never the zeros between.
        assert!(
            data >= written && data < written + 6 * BLOCK as u64,
            "{data}"
        );
        assert!(wire.len() < (data as usize) + 4096, "{}", wire.len());
        let dst = sparse(dir.path(), size, &[]);
        assert_eq!(receive(&mut &wire[..], &dst, size).unwrap(), data);
        assert_eq!(read_all(&dst, size), read_all(&src, size));

        // A stream cut short, changed, or past its size is refused.
        let cut = &wire[..wire.len() - 40];
        assert!(receive(&mut &cut[..], &sparse(dir.path(), size, &[]), size).is_err());
        let mut bad = wire.clone();
        bad[20] ^= 1;
        let e = receive(&mut &bad[..], &sparse(dir.path(), size, &[]), size).unwrap_err();
        assert!(matches!(e, StorageError::Checksum { .. }), "{e}");
        let e = receive(&mut &wire[..], &sparse(dir.path(), size / 2, &[]), size / 2).unwrap_err();
        assert!(matches!(e, StorageError::Invalid(_)), "{e}");
    }

    #[test]
    fn an_empty_volume_is_its_end_record() {
        let dir = tempfile::tempdir().unwrap();
        let src = sparse(dir.path(), 1 << 30, &[]);
        let mut wire = Vec::new();
        assert_eq!(send(&src, 1 << 30, &mut wire).unwrap(), 0);
        assert_eq!(wire.len(), 12 + 32);
        let dst = sparse(dir.path(), 1 << 30, &[]);
        assert_eq!(receive(&mut &wire[..], &dst, 1 << 30).unwrap(), 0);
    }
}
