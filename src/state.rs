//! The tracker's state file (`tracker.state_file`): what each client has been refused
//! survives a restart, so a rolling restart in the middle of a retry storm still catches the
//! next retry.
//!
//! Edge. The file is gzip-compressed JSON: a format name, a version, the hash seed the ids in
//! it were made with, the (client, interface) names of the metric label handles it refers
//! to, and every group of the tracker. It is written to a temporary file beside it and
//! renamed over it, so a reader never sees half a file. A file that cannot be read, is
//! corrupt, or has another format or version is reported and ignored: the process starts
//! with an empty tracker, never fails to start because of it.

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
    #[serde(default)]
    version: u32,
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
    /// Another version of refusal-gate's.
    #[error("version {0}, this build reads version {VERSION}")]
    Version(u32),
}

/// Writes `state` to `path` atomically (a temporary file beside it, then a rename).
///
/// # Errors
/// [`StateError::Io`] with the path, or [`StateError::Corrupt`] when it cannot be encoded.
pub fn write(path: &Path, state: &State) -> Result<(), StateError> {
    let tmp = path.with_extension("tmp");
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StateError::Io { path, source }
    };
    let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    let mut gz = GzEncoder::new(BufWriter::new(file), flate2::Compression::fast());
    serde_json::to_writer(&mut gz, state)?;
    let file = gz
        .finish()
        .map_err(io(&tmp))?
        .into_inner()
        .map_err(|e| io(&tmp)(e.into_error()))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Reads the state file at `path`.
///
/// # Errors
/// Why it cannot be used: unreadable, corrupt, another format, another version.
pub fn read(path: &Path) -> Result<State, StateError> {
    let open = || {
        std::fs::File::open(path)
            .map(|f| GzDecoder::new(BufReader::new(f)))
            .map_err(|source| StateError::Io {
                path: path.to_path_buf(),
                source,
            })
    };
    let header: Header = serde_json::from_reader(open()?)?;
    if header.format != FORMAT {
        return Err(StateError::Format(header.format));
    }
    if header.version != VERSION {
        return Err(StateError::Version(header.version));
    }
    Ok(serde_json::from_reader(open()?)?)
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
