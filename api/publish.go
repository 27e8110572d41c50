package api

import "time"

// Typed results of the daemon operations the workflow layer reads: the
// steps of a publish, session create and destroy, the base import, idle
// reaping and squash. The daemon builds them, the workflows decode them
// (a result that does not decode is an error, never a zero value), and the
// gateway hands them to clients. Their JSON is the seed's shape.

// Revision identifies a manifest: version, root hash and depth.
type Revision struct {
	ManifestVersion int64  `json:"manifest_version"`
	RootHash        string `json:"root_hash"`
	LayerCount      int    `json:"layer_count"`
}

// RouteSummary counts a change set's paths by route: checked against the
// head (source) or last-writer-wins (gitignored).
type RouteSummary struct {
	SourceCount  int `json:"source_count"`
	IgnoredCount int `json:"ignored_count"`
}

// ChangeCounts counts a change set's entries by kind.
type ChangeCounts struct {
	Files    int `json:"files"`
	Dirs     int `json:"dirs"`
	Symlinks int `json:"symlinks"`
	Deletes  int `json:"deletes"`
	Opaques  int `json:"opaques"`
}

// Total is the number of entries.
func (c ChangeCounts) Total() int { return c.Files + c.Dirs + c.Symlinks + c.Deletes + c.Opaques }

// PublishSummary is a commit, or for a dry run what it would commit.
type PublishSummary struct {
	NoOp         bool         `json:"no_op"`
	Revision     Revision     `json:"revision"`
	RouteSummary RouteSummary `json:"route_summary"`
	LayerID      string       `json:"layer_id"`
	TxID         string       `json:"txid"`
	MergedPaths  []string     `json:"merged_paths"`
	Counts       ChangeCounts `json:"counts"`
	Bytes        int64        `json:"bytes"`
}

// Fingerprint describes one side of a conflicting path: kind file (digest,
// octal mode, executable), symlink (target), directory (mode or
// tree_digest) or absent.
type Fingerprint struct {
	Kind       string `json:"kind"`
	Digest     string `json:"digest,omitempty"`
	Mode       string `json:"mode,omitempty"`
	Executable *bool  `json:"executable,omitempty"`
	Target     string `json:"target,omitempty"`
	TreeDigest string `json:"tree_digest,omitempty"`
	Raw        string `json:"raw,omitempty"`
}

// LineRange is a run of lines, 1-based.
type LineRange struct {
	Start int `json:"start_line"`
	Count int `json:"line_count"`
}

// ConflictHunk is one region both sides changed differently.
type ConflictHunk struct {
	Base LineRange `json:"base"`
	Head LineRange `json:"head"`
	Ours LineRange `json:"ours"`
}

// Conflict is one path a publish could not resolve.
type Conflict struct {
	Path    string         `json:"path"`
	Reason  string         `json:"reason"`
	Kind    string         `json:"kind"`
	Message string         `json:"message"`
	Base    *Fingerprint   `json:"base"`
	Head    *Fingerprint   `json:"head"`
	Ours    *Fingerprint   `json:"ours"`
	Hunks   []ConflictHunk `json:"hunks,omitempty"`
	// HunksOmitted counts the hunks past those listed (a report is bounded:
	// MaxConflictReportBytes).
	HunksOmitted int `json:"hunks_omitted,omitempty"`
}

// MaxConflictReportBytes bounds the conflicts a rejection lists (paths,
// messages and hunks, about as JSON): it travels back through the sandbox
// workflow, whose payloads Temporal caps at 2 MiB. Rejection.ConflictsOmitted
// and Conflict.HunksOmitted count what did not fit (the first ones are
// listed).
const MaxConflictReportBytes = 1 << 20

// SourceConflict is the seed's detail of a path changed on both sides.
type SourceConflict struct {
	Path     string       `json:"path"`
	Expected *Fingerprint `json:"expected"`
	Actual   *Fingerprint `json:"actual"`
}

// ProtectedDrop is the seed's detail of a path a publish may not touch.
type ProtectedDrop struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// PublishRejection is the seed's single-path summary of a rejection (its
// first conflict).
type PublishRejection struct {
	Path           string          `json:"path"`
	Reason         string          `json:"reason"`
	Message        string          `json:"message"`
	SourceConflict *SourceConflict `json:"source_conflict"`
	ProtectedDrop  *ProtectedDrop  `json:"protected_drop"`
}

// Rejection is a conflict report: every conflicting path, the head it was
// checked against, and the seed's summary.
type Rejection struct {
	Conflicts []Conflict `json:"conflicts"`
	// ConflictsOmitted counts the conflicts past those listed.
	ConflictsOmitted int               `json:"conflicts_omitted,omitempty"`
	HeadRevision     Revision          `json:"head_revision"`
	PublishRejection *PublishRejection `json:"publish_rejection,omitempty"`
}

// Details renders a rejection as error details, plus the fields a
// client needs to act on it.
func (r *Rejection) Details(extra map[string]any) map[string]any {
	d := map[string]any{"conflicts": r.Conflicts, "head_revision": r.HeadRevision}
	if r.ConflictsOmitted > 0 {
		d["conflicts_omitted"] = r.ConflictsOmitted
	}
	if r.PublishRejection != nil {
		d["publish_rejection"] = r.PublishRejection
	}
	for k, v := range extra {
		d[k] = v
	}
	return d
}

// PublishStepResult is the answer of publish_prepare and publish_commit:
// Clean false carries the rejection (and nothing was committed), Clean true
// the commit (or, for prepare, the dry run).
type PublishStepResult struct {
	TxID               string          `json:"txid"`
	WorkspaceSessionID string          `json:"workspace_session_id"`
	Clean              bool            `json:"clean"`
	Prepared           bool            `json:"prepared,omitempty"`
	Replayed           bool            `json:"replayed,omitempty"`
	Committed          bool            `json:"committed,omitempty"`
	ChangedPaths       int             `json:"changed_paths,omitempty"`
	Publish            *PublishSummary `json:"publish,omitempty"`
	Stage              string          `json:"stage,omitempty"`
	SessionRetained    bool            `json:"session_retained,omitempty"`
	*Rejection
}

// Rejected reports whether the step found conflicts (nothing was, or will
// be, committed). A commit answer without "clean" (daemons before typed
// results) is not a rejection.
func (r *PublishStepResult) Rejected() bool { return r.Rejection != nil }

// PublishFinalResult is publish_finalize's answer, the result of
// publish_workspace_session.
type PublishFinalResult struct {
	TxID                 string          `json:"txid"`
	WorkspaceSessionID   string          `json:"workspace_session_id"`
	Publish              *PublishSummary `json:"publish"`
	Destroyed            bool            `json:"destroyed"`
	Kept                 bool            `json:"kept,omitempty"`
	EvictedUpperdirBytes *int64          `json:"evicted_upperdir_bytes,omitempty"`
}

// PublishTxResult is publish_workspace_session's answer with exactly_once:
// Clean true is the commit (the finalize result, which the sandbox
// workflow returns as it is), Clean false the rejection (nothing was
// committed and the session is active with its changes).
type PublishTxResult struct {
	PublishFinalResult
	Clean bool `json:"clean"`
	*Rejection
	// Verify: a verified publish's last verification (passed when Clean;
	// else, without conflicts, it failed, or HeadKeptMoving).
	Verify         *VerifyReport `json:"verify,omitempty"`
	HeadKeptMoving bool          `json:"head_kept_moving,omitempty"`
}

// Rejected reports whether the publish was refused by the head.
func (r *PublishTxResult) Rejected() bool { return r.Rejection != nil }

// PublishAbortResult is publish_abort's answer. NotPrepared: nothing of
// the txid was prepared (its prepare failed, was rejected or never ran),
// so the abort changed nothing but refusing a later prepare of it.
type PublishAbortResult struct {
	TxID               string `json:"txid"`
	WorkspaceSessionID string `json:"workspace_session_id"`
	Aborted            bool   `json:"aborted"`
	NotPrepared        bool   `json:"not_prepared,omitempty"`
}

// InitBaseResult is init_base's answer: the imported (or shared) base.
type InitBaseResult struct {
	BaseID             string   `json:"base_id"`
	RootHash           string   `json:"root_hash,omitempty"`
	Revision           Revision `json:"revision"`
	AlreadyInitialized bool     `json:"already_initialized,omitempty"`
	Shared             bool     `json:"shared,omitempty"`
	// Import is the importer's report (counts, skipped entries).
	Import any `json:"import,omitempty"`
}

// SessionDestroyed is destroy_workspace_session's answer.
type SessionDestroyed struct {
	WorkspaceSessionID   string `json:"workspace_session_id"`
	Destroyed            bool   `json:"destroyed"`
	EvictedUpperdirBytes int64  `json:"evicted_upperdir_bytes"`
}

// ArchivedSession is a reaped idle session whose unpublished changes were
// kept on the state volume.
type ArchivedSession struct {
	ID       string    `json:"workspace_session_id"`
	Agent    string    `json:"agent,omitempty"`
	Path     string    `json:"path"`
	Archived time.Time `json:"archived_at"`
	Bytes    int64     `json:"bytes"`
	// FilesChanged counts the unpublished changes kept: files, symlinks
	// and deletions in the session's upper dir.
	FilesChanged int `json:"files_changed"`
	// Restorable is false for an archive without a valid session record
	// (a session dir a daemon could not read at boot): its files are kept
	// but restore_workspace_session cannot bring it back.
	Restorable bool `json:"restorable"`
	// ArchivedBy is the request id of the archive_idle_sessions call that
	// archived it, so a retried call reports the same sessions.
	ArchivedBy string `json:"archived_by,omitempty"`
}

// RestoreSessionResult is restore_workspace_session's answer.
type RestoreSessionResult struct {
	WorkspaceSessionID string `json:"workspace_session_id"`
	State              string `json:"state"`
	Agent              string `json:"agent,omitempty"`
	NetworkProfile     string `json:"network_profile"`
	FilesChanged       int    `json:"files_changed"`
	// Rebased is true when the session's base layers were no longer
	// leased (an archive made before leases were kept): it was restored
	// over the current head, so a publish compares its changes with the
	// head, not with what it started from.
	Rebased bool `json:"rebased"`
}

// ArchiveResult is archive_idle_sessions' answer.
type ArchiveResult struct {
	Archived []ArchivedSession `json:"archived"`
}

// RefreshResult is refresh_workspace_session's answer.
type RefreshResult struct {
	WorkspaceSessionID string   `json:"workspace_session_id"`
	UpToDate           bool     `json:"up_to_date"`
	Revision           Revision `json:"revision"`
	MergedPaths        []string `json:"merged_paths"`
	ChangedPaths       int      `json:"changed_paths"`
}

// ExportResult is export_changes' answer. The counts present depend on the
// format: dir (files, symlinks, deletes, opaque clears, unchanged skips),
// tar and tar-zst (files, symlinks, whiteouts), patch (files changed).
type ExportResult struct {
	Format                string   `json:"format"`
	ManifestVersion       int64    `json:"manifest_version"`
	LayersExported        []string `json:"layers_exported"`
	BytesWritten          int64    `json:"bytes_written"`
	FilesWritten          *int     `json:"files_written,omitempty"`
	SymlinksWritten       *int     `json:"symlinks_written,omitempty"`
	DeletesApplied        *int     `json:"deletes_applied,omitempty"`
	OpaqueClears          *int     `json:"opaque_clears,omitempty"`
	SkippedUnchanged      *int     `json:"skipped_unchanged,omitempty"`
	WhiteoutsEmitted      *int     `json:"whiteouts_emitted,omitempty"`
	FilesChanged          *int     `json:"files_changed,omitempty"`
	LiveWorkspaceSessions []string `json:"live_workspace_sessions,omitempty"` // ids of the sessions alive at export (the seed's list)
	// Format git: the branch written, its commits (one per published
	// layer, oldest first), where they start and what the branch was.
	Branch       string      `json:"branch,omitempty"`
	Parent       string      `json:"parent,omitempty"`        // the commit the first one builds on ("" = a root commit)
	ParentSource string      `json:"parent_source,omitempty"` // workspace_copied_from (HEAD when the sandbox was created) or HEAD (at export)
	PreviousTip  string      `json:"previous_tip,omitempty"`  // the branch before ("" = it was created)
	Tip          string      `json:"tip,omitempty"`
	Updated      *bool       `json:"updated,omitempty"` // false: the branch already held exactly these commits
	Commits      []GitCommit `json:"commits,omitempty"`
	SkippedPaths []string    `json:"skipped_paths,omitempty"` // published paths git cannot hold (.git components, devices)
}

// GitCommit is one commit of a git export: one published layer.
type GitCommit struct {
	SHA                string `json:"sha"`
	TxID               string `json:"txid,omitempty"`
	WorkspaceSessionID string `json:"workspace_session_id,omitempty"`
	Agent              string `json:"agent,omitempty"`
	LayerID            string `json:"layer_id"`
	Time               string `json:"time"`
	Subject            string `json:"subject"`
}

// RecoverResult is recover_workspace_session's answer: the publishes it
// settled, and the session's state before and after (active, or destroyed
// when finalizing a committed publish ended it).
type RecoverResult struct {
	WorkspaceSessionID string   `json:"workspace_session_id"`
	PreviousState      string   `json:"previous_state,omitempty"`
	State              string   `json:"state"`
	AbortedTxIDs       []string `json:"aborted_txids"`
	FinalizedTxIDs     []string `json:"finalized_txids"`
	Destroyed          bool     `json:"destroyed"`
}
