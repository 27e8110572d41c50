package layerstack

import (
	"errors"
	"fmt"
	"strings"
)

// Rejection reasons (the seed's names where the seed has one).
const (
	ReasonSourceConflict = "source_conflict"
	ReasonSpecialFile    = DropSpecialFile
)

// Conflict kinds: why a path's change could not be resolved.
const (
	ConflictContent      = "content"        // overlapping text edits
	ConflictBinary       = "binary"         // both sides changed a non-text file
	ConflictTooLarge     = "too_large"      // a side is over MergeMaxBytes
	ConflictSymlink      = "symlink"        // a symlink changed on both sides
	ConflictFileVsDir    = "file_vs_dir"    // one side has a file where the other has a directory
	ConflictDeleteModify = "delete_modify"  // we delete what the head changed
	ConflictModifyDelete = "modify_delete"  // we change what the head deleted
	ConflictDirectory    = "directory"      // we replace a directory whose contents the head changed
	ConflictMode         = "mode"           // both sides changed the permission bits differently
	ConflictParent       = "parent_changed" // the head replaced a parent directory with a non-directory
	ConflictProtected    = "protected"
	ConflictInvalid      = "invalid"
	ConflictDropped      = "dropped"
)

// Conflict is the per-path report of a rejected publish.
type Conflict struct {
	Path    string `json:"path"`
	Reason  string `json:"reason"`
	Kind    string `json:"kind"`
	Base    string `json:"base_fingerprint,omitempty"`
	Head    string `json:"head_fingerprint,omitempty"`
	Ours    string `json:"ours_fingerprint,omitempty"`
	Message string `json:"message"`
	// Hunks are the conflicting line ranges of each side (text conflicts),
	// the first MaxConflictHunks of HunksTotal.
	Hunks      []MergeConflict `json:"hunks,omitempty"`
	HunksTotal int             `json:"hunks_total,omitempty"`
}

// MaxConflictHunks is the most hunks a conflict keeps: two sides that
// changed every other line of a large file differ in millions of places,
// and the report is for reading.
const MaxConflictHunks = 1000

// ConflictError rejects a publish (or refresh) as a whole: nothing was
// committed. It lists every path that could not be resolved.
type ConflictError struct {
	Conflicts []Conflict `json:"conflicts"`
	Head      Revision   `json:"head"`
}

// ErrConflict matches every *ConflictError with errors.Is.
var ErrConflict = errors.New("publish rejected")

func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

func (e *ConflictError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "publish rejected: %d path(s) conflict", len(e.Conflicts))
	for i, c := range e.Conflicts {
		if i == 5 {
			fmt.Fprintf(&b, "; and %d more", len(e.Conflicts)-5)
			break
		}
		fmt.Fprintf(&b, "; %s: %s (%s)", c.Path, c.Kind, c.Reason)
	}
	return b.String()
}

// Reason is the reason of the first conflict: the seed's single rejection class.
func (e *ConflictError) Reason() string {
	if len(e.Conflicts) == 0 {
		return ReasonSourceConflict
	}
	return e.Conflicts[0].Reason
}
