package layerstack

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"
)

// ErrNotUTF8 refuses an edit of a file that is not UTF-8 text (the seed's
// rule: string replacements are defined on text only).
var ErrNotUTF8 = errors.New("file is not valid UTF-8")

// Edit replaces OldString by NewString in a file: exactly one occurrence
// unless ReplaceAll.
type Edit struct {
	OldString  string `json:"old_string"`
	NewString  string `json:"new_string"`
	ReplaceAll bool   `json:"replace_all,omitempty"`
}

// EditError says which edit failed and why.
type EditError struct {
	Index   int    `json:"index"`
	Reason  string `json:"reason"` // empty_old_string, not_found, not_unique, no_change
	Matches int    `json:"matches,omitempty"`
}

func (e *EditError) Error() string {
	switch e.Reason {
	case "not_found":
		return fmt.Sprintf("edit %d: old_string not found in file", e.Index)
	case "not_unique":
		return fmt.Sprintf("edit %d: old_string matches %d times; add context to make it unique or set replace_all", e.Index, e.Matches)
	case "empty_old_string":
		return fmt.Sprintf("edit %d: old_string is empty", e.Index)
	default:
		return fmt.Sprintf("edit %d: old_string and new_string are identical", e.Index)
	}
}

// MaxEditBytes is the largest file an edit applies to (the seed's limit),
// and the largest file it may leave: a replace_all with a longer
// new_string must not turn a small request into an unbounded write.
const MaxEditBytes = 4 << 20

// EditTooLargeError refuses an edit whose result would exceed Max bytes;
// Size is what the result would have had (math.MaxInt64 when beyond
// counting). Nothing is replaced.
type EditTooLargeError struct {
	Index     int
	Size, Max int64
}

func (e *EditTooLargeError) Error() string {
	return fmt.Sprintf("edit %d: the result would have %d bytes, more than the limit of %d", e.Index, e.Size, e.Max)
}

// editedSize is the length of size bytes after n replacements of oldLen
// bytes by newLen, saturating at math.MaxInt64 instead of overflowing.
func editedSize(size, n, oldLen, newLen int) int64 {
	grow := int64(newLen) - int64(oldLen)
	if grow > 0 && int64(n) > (math.MaxInt64-int64(size))/grow {
		return math.MaxInt64
	}
	return int64(size) + int64(n)*grow
}

// ApplyEdits applies edits in order, each to the result of the previous one.
// It refuses, before replacing anything, an edit that would grow the
// content beyond MaxEditBytes.
func ApplyEdits(content []byte, edits []Edit) ([]byte, int, error) {
	if !utf8.Valid(content) {
		return nil, 0, ErrNotUTF8
	}
	total := 0
	for i, e := range edits {
		if e.OldString == "" {
			return nil, 0, &EditError{Index: i, Reason: "empty_old_string"}
		}
		if e.OldString == e.NewString {
			return nil, 0, &EditError{Index: i, Reason: "no_change"}
		}
		n := bytes.Count(content, []byte(e.OldString))
		switch {
		case n == 0:
			return nil, 0, &EditError{Index: i, Reason: "not_found"}
		case n > 1 && !e.ReplaceAll:
			return nil, 0, &EditError{Index: i, Reason: "not_unique", Matches: n}
		}
		if size := editedSize(len(content), n, len(e.OldString), len(e.NewString)); size > MaxEditBytes {
			return nil, 0, &EditTooLargeError{Index: i, Size: size, Max: MaxEditBytes}
		}
		content = bytes.ReplaceAll(content, []byte(e.OldString), []byte(e.NewString))
		total += n
	}
	return content, total, nil
}
