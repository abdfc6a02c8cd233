//! The tracker's state file (`tracker.state_file`): what each client has been refused
//! survives a restart, so a rolling restart in the middle of a retry storm still catches the
//! next retry.
//!
//! Edge. The file is gzip-compressed JSON: a format name, a version, the hash seed the ids in
//! it were made with, the (client, interface) names of the metric label handles it refers
//! to, and every group of the tracker. It is written to a temporary file beside it and
//! renamed over it, so a reader never sees half a file. A file that cannot be read, is
//! corrupt, or has another format or version is reported and ignored (the caller sets an
//! unusable one aside, [`aside_path`]): the process starts with an empty tracker, never fails
//! to start because of it.

use crate::clock::Nanos;
use crate::pipeline::Pipeline;
use crate::tracker::GroupState;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::io::{BufReader, BufWriter};
use std::path::Path;

/// The format name written in every state file.
pub const FORMAT: &str = "refusal-gate/tracker-state";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;

/// Everything a state file holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct State {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The seed of the hash the ids were made with.
    pub seed: u64,
    /// When it was written, Unix milliseconds.
    pub saved_at_unix_ms: u64,
    /// (label handle, client, interface) of every handle the groups use.
    pub labels: Vec<(u32, String, String)>,
    /// The tracker's groups.
    pub groups: Vec<GroupState>,
}

/// Just the header, read first, so that another version is reported as such rather than
/// as a shape the parser does not know.
#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    format: String,
    /// Any JSON value: a number that does not fit is another version, not a corrupt file.
    #[serde(default)]
    version: serde_json::Value,
}

/// Why a state file could not be written or used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Opening, writing, syncing or renaming failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Its JSON does not parse (or could not be written).
    #[error("corrupt: {0}")]
    Corrupt(#[from] serde_json::Error),
    /// Another program's file.
    #[error("not a state file (format {0:?})")]
    Format(String),
    /// Another version of refusal-gate's (as the file writes it).
    #[error("version {0}, this build reads version {VERSION}")]
    Version(String),
}

/// Writes `state` to `path` atomically: to a temporary file of its own beside it (created
/// exclusively, so two writers never share one, whatever `path` is named), synced, renamed
/// over `path`, and the directory synced, so that after a crash the file is either the old
/// one or the new one, whole.
///
/// # Errors
/// [`StateError::Io`] with the path, or [`StateError::Corrupt`] when it cannot be encoded.
pub fn write(path: &Path, state: &State) -> Result<(), StateError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StateError::Io { path, source }
    };
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = path.with_file_name(name);
    let written = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io(&tmp))?;
        encode(file, &tmp, state)?.sync_all().map_err(io(&tmp))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// Writes `state` compressed to `file` (at `path`, for the errors), and gives the file back.
fn encode(file: std::fs::File, path: &Path, state: &State) -> Result<std::fs::File, StateError> {
    let io = |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    };
    // Buffered in front of the compressor too: the encoder's many small writes would each
    // run a deflate call (and clear its output buffer) otherwise — 75% of a large write.
    let gz = GzEncoder::new(BufWriter::new(file), flate2::Compression::fast());
    let mut buffered = BufWriter::with_capacity(1 << 16, gz);
    // A failed write (a full disk) is the file's, not the state's: said as the system said it.
    serde_json::to_writer(&mut buffered, state).map_err(|e| {
        if e.is_io() {
            io(e.into())
        } else {
            StateError::Corrupt(e)
        }
    })?;
    let gz = buffered.into_inner().map_err(|e| io(e.into_error()))?;
    gz.finish()
        .map_err(io)?
        .into_inner()
        .map_err(|e| io(e.into_error()))
}

/// Removes the temporary files of writes to `path` that never finished (a process stopped
/// while writing one); returns how many.
pub fn remove_stale_temporaries(path: &Path) -> usize {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return 0;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with(&prefix) && n.ends_with(".tmp")
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Reads the state file at `path`.
///
/// # Errors
/// Where an unusable state file at `path` is set aside at `unix_seconds`: beside it,
/// `<name>.unusable-<unix_seconds>`, so that the next write does not replace it.
pub fn aside_path(path: &Path, unix_seconds: u64) -> std::path::PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".unusable-{unix_seconds}"));
    path.with_file_name(name)
}

/// Why it cannot be used: unreadable, corrupt, another format, another version.
pub fn read(path: &Path) -> Result<State, StateError> {
    let open = || {
        std::fs::File::open(path)
            .map(|f| BufReader::with_capacity(1 << 16, GzDecoder::new(BufReader::new(f))))
            .map_err(|source| StateError::Io {
                path: path.to_path_buf(),
                source,
            })
    };
    let check = |format: &str, version: &serde_json::Value| {
        if format != FORMAT {
            return Err(StateError::Format(format.to_string()));
        }
        if version.as_u64() != Some(u64::from(VERSION)) {
            return Err(StateError::Version(version.to_string()));
        }
        Ok(())
    };
    // Read once (a million keys are some 135 MB compressed; reading the header first read
    // the whole file twice); only a file that does not parse is read again for its header,
    // to say whose or which version's it is.
    match serde_json::from_reader::<_, State>(open()?) {
        Ok(state) => check(&state.format, &state.version.into()).map(|()| state),
        Err(e) => {
            if let Ok(header) = serde_json::from_reader::<_, Header>(open()?) {
                check(&header.format, &header.version)?;
            }
            Err(StateError::Corrupt(e))
        }
    }
}

/// The state of `pipeline`'s tracker at `now`, for the state file: every group, with the
/// (client, interface) names of the label handles they use.
pub fn snapshot(pipeline: &Pipeline, now: Nanos) -> State {
    let groups = pipeline.tracker().export();
    let handles: BTreeSet<u32> = groups.iter().map(|g| g.labels).collect();
    let labels = handles
        .into_iter()
        .filter_map(|id| {
            let (client, interface) = pipeline.metrics().label_names(id)?;
            Some((id, client.to_string(), interface.to_string()))
        })
        .collect();
    State {
        format: FORMAT.to_owned(),
        version: VERSION,
        seed: pipeline.seed(),
        saved_at_unix_ms: now / 1_000_000,
        labels,
        groups,
    }
}

/// Gives `pipeline` (hashing with the seed `state` was written with: see
/// [`Pipeline::with_seed`]) the tracker state read from a state file; returns how many keys
/// it took.
pub fn restore(pipeline: &Pipeline, state: State) -> usize {
    let names: HashMap<u32, (String, String)> = state
        .labels
        .into_iter()
        .map(|(id, c, i)| (id, (c, i)))
        .collect();
    let metrics = pipeline.metrics();
    let taken = pipeline
        .tracker()
        .import(state.groups, |old| match names.get(&old) {
            Some((c, i)) => metrics.labels(pipeline.id(c.as_str()), c, pipeline.id(i.as_str()), i),
            None => metrics.labels(0, "unknown_service", 0, "unknown"),
        });
    metrics.set_tracker_keys(pipeline.tracker().keys());
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(seed: u64) -> State {
        State {
            format: FORMAT.to_owned(),
            version: VERSION,
            seed,
            saved_at_unix_ms: 0,
            labels: vec![(1, "c".into(), "i".into())],
            groups: Vec::new(),
        }
    }

    #[test]
    fn names_cut_to_their_label_are_the_same_pairs_when_read_back() {
        use crate::pipeline::Encoding;
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message;
        let config = crate::config::Config::default();
        let send = |p: &Pipeline, client: &str, at: u64| {
            let url = format!("http://{}.test/x", "h".repeat(150));
            let body = ExportTraceServiceRequest {
                resource_spans: vec![crate::otlp::fixtures::get_on(client, &url, at, at)],
            }
            .encode_to_vec();
            p.handle(crate::otlp::Transport::Http, &body, Encoding::Protobuf, at)
                .expect("accepted");
            p.settle(true, at + 1);
        };
        let long = |last: char| format!("{}{last}", "c".repeat(100_000));
        let pipeline = Pipeline::from_config(&config);
        send(&pipeline, &long('a'), 1);
        send(&pipeline, &long('b'), 2);
        let restored = Pipeline::from_config(&config);
        restore(&restored, snapshot(&pipeline, 3));
        // The client and its interface, both cut, are keyed as they were: no third pair.
        send(&restored, &long('a'), 10);
        let pairs = restored.metrics().fleet();
        assert_eq!(pairs.len(), 2, "{pairs:?}");
    }

    #[test]
    fn a_file_is_read_as_its_header_says_whether_or_not_the_rest_parses() {
        let dir = std::env::temp_dir().join(format!("rg-state-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let path = dir.join("state.json.gz");
        let gzipped = |json: &str| {
            let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut gz, json.as_bytes()).expect("compressed");
            gz.finish().expect("compressed")
        };
        let read_back = |bytes: Vec<u8>| {
            std::fs::write(&path, bytes).expect("written");
            read(&path)
        };
        write(&path, &state(7)).expect("written");
        assert_eq!(read(&path).expect("this version's").seed, 7);
        let whole = |format: &str, version: u32| {
            let mut s = state(1);
            s.format = format.to_owned();
            s.version = version;
            serde_json::to_string(&s).expect("encoded")
        };
        let said = |r: Result<State, StateError>| r.expect_err("refused").to_string();
        assert_eq!(
            said(read_back(gzipped(&whole("other", VERSION)))),
            "not a state file (format \"other\")"
        );
        assert_eq!(
            said(read_back(gzipped(&whole(FORMAT, 2)))),
            "version 2, this build reads version 1"
        );
        let other_shape = format!(r#"{{"format":"{FORMAT}","version":3,"keys":{{}}}}"#);
        assert_eq!(
            said(read_back(gzipped(&other_shape))),
            "version 3, this build reads version 1",
            "a file of another shape is named by its header"
        );
        // A version number that does not fit this build's is another version, not corruption.
        for version in ["18446744073709551616", "-1", "1.5", "\"2\""] {
            let odd = format!(r#"{{"format":"{FORMAT}","version":{version},"keys":{{}}}}"#);
            let said = said(read_back(gzipped(&odd)));
            assert!(
                said.starts_with("version ") && said.ends_with(", this build reads version 1"),
                "{version}: {said}"
            );
        }
        let same_version = format!(r#"{{"format":"{FORMAT}","version":1,"keys":{{}}}}"#);
        assert!(said(read_back(gzipped(&same_version))).starts_with("corrupt: "));
        assert!(said(read_back(b"not gzip".to_vec())).starts_with("corrupt: "));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_full_disk_is_said_as_the_system_says_it_not_as_a_corrupt_state() {
        // Every write to /dev/full fails with ENOSPC; enough labels, and random enough, that
        // the encoder writes before it finishes.
        let mut big = state(1);
        let mut x = 1u64;
        let mut noise = || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            format!("{x:016x}")
        };
        big.labels = (0..100_000).map(|n| (n, noise(), noise())).collect();
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full opens");
        let error = encode(full, Path::new("/dev/full"), &big).expect_err("the disk is full");
        assert!(matches!(error, StateError::Io { .. }), "{error:?}");
        let said = error.to_string();
        assert!(
            said.starts_with("/dev/full: No space left on device"),
            "{said}"
        );
    }

    #[test]
    fn concurrent_writers_never_share_a_temporary_file_even_for_a_tmp_name() {
        let dir = std::env::temp_dir().join(format!("rg-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        // Named like a temporary file itself: a write must not go to it in place.
        let path = dir.join("state.tmp");
        let writers: Vec<_> = (0..8u64)
            .map(|seed| {
                let path = path.clone();
                std::thread::spawn(move || write(&path, &state(seed)))
            })
            .collect();
        for w in writers {
            w.join().expect("joined").expect("written");
        }
        let read = read(&path).expect("whole");
        assert!(read.seed < 8);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("readable")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("state.tmp")]);
        // An unfinished write's temporary file is cleaned up before the next start.
        std::fs::write(dir.join("state.tmp.77.0.tmp"), b"half").expect("written");
        assert_eq!(remove_stale_temporaries(&path), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
