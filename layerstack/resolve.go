package layerstack

import (
	"errors"
	"fmt"
	"io/fs"
)

// Routes of a changed path.
const (
	RouteSource  = "source"  // checked against the head, merged or rejected
	RouteIgnored = "ignored" // gitignored at the base: last writer wins
)

// Outcomes of a resolved path.
const (
	OutcomeClean   = "clean"
	OutcomeMerged  = "merged"
	OutcomeIgnored = "ignored"
)

// planned is one resolved change about to be written.
type planned struct {
	ch      Change
	hash    string // content hash of ch's bytes (writes)
	route   string
	outcome string
}

// resolver checks a change set made on base against head.
type resolver struct {
	base, head stack // newest first
	// fresh are the head layers above the base's newest layer; when head no
	// longer holds that layer (shared=false) every path is compared by
	// fingerprint.
	fresh  stack
	shared bool
	ignore *ignoreOracle
	kinds  map[string]string // head kind cache for ancestor checks
}

func newResolver(base, head []ManifestLayer, baseDirs, headDirs stack) *resolver {
	r := &resolver{base: baseDirs, head: headDirs, ignore: newIgnoreOracle(baseDirs), kinds: map[string]string{}}
	// Squash never folds a lease's newest layer and never changes content,
	// so everything from that layer down is the base's content.
	for i, l := range head {
		if l.ID == base[0].ID {
			r.shared, r.fresh = true, headDirs.slice(0, i)
			break
		}
	}
	return r
}

// touched reports whether the head may differ from the base at p.
func (r *resolver) touched(p string) (bool, error) {
	if !r.shared {
		return true, nil
	}
	for i := 0; i < r.fresh.len(); i++ {
		t, err := layerTouches(r.fresh, i, p)
		if err != nil || t {
			return t, err
		}
	}
	return false, nil
}

// layerTouches reports whether one layer has an entry at p, or cuts p off
// with a whiteout, a non-directory or an opaque directory above it.
func layerTouches(st stack, i int, p string) (bool, error) {
	for _, a := range ancestors(p) {
		le, err := st.stat(i, a)
		if err != nil {
			return false, err
		}
		switch {
		case le.kind == kindAbsent:
			return false, nil
		case le.kind != kindDir || le.opaque:
			return true, nil
		}
	}
	le, err := st.stat(i, p)
	return le.kind != kindAbsent, err
}

// resolve routes and checks every change, returning the plan or the list of
// conflicts. ours holds the frozen content hash of each write by path.
func (r *resolver) resolve(changes []Change, ours map[string]string) ([]planned, []Conflict, error) {
	var plan []planned
	var conflicts []Conflict
	inSet := map[string]ChangeKind{}
	for _, c := range changes {
		inSet[c.Path] = c.Kind
	}
	for _, ch := range changes {
		if ch.Kind == ChangeDir {
			implied, err := r.impliedDir(ch)
			if err != nil {
				return nil, nil, err
			}
			if implied {
				continue
			}
		}
		isDir := ch.Kind == ChangeDir || ch.Kind == ChangeOpaque
		if ch.Kind == ChangeDelete {
			if e, err := lookup(r.base, ch.Path); err == nil && e.Kind == KindDirectory {
				isDir = true
			}
		}
		if r.ignore.ignored(ch.Path, isDir) {
			plan = append(plan, planned{ch: ch, hash: ours[ch.Path], route: RouteIgnored, outcome: OutcomeIgnored})
			continue
		}
		pl, c, err := r.resolveSource(ch, ours[ch.Path])
		if err != nil {
			return nil, nil, fmt.Errorf("resolve %s: %w", ch.Path, err)
		}
		if c == nil {
			c, err = r.checkParents(ch.Path, inSet)
			if err != nil {
				return nil, nil, err
			}
		}
		if c != nil {
			conflicts = append(conflicts, *c)
			continue
		}
		plan = append(plan, pl)
	}
	return plan, conflicts, nil
}

// impliedDir: overlay copies parent directories up when a child changes; a
// directory entry whose mode equals the base's is not a change of its own.
func (r *resolver) impliedDir(ch Change) (bool, error) {
	e, err := lookup(r.base, ch.Path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrSymlinkInPath) {
			return false, nil
		}
		return false, err
	}
	return e.Kind == KindDirectory && e.Mode == ch.Mode, nil
}

func oursFingerprint(ch Change, hash string) string {
	switch ch.Kind {
	case ChangeWrite:
		return fmt.Sprintf("file:%04o:%s", ch.Mode.Perm(), hash)
	case ChangeSymlink:
		return "symlink:" + ch.Target
	case ChangeDir, ChangeOpaque:
		return fmt.Sprintf("dir:%04o", ch.Mode.Perm())
	default:
		return fpAbsent
	}
}

func (r *resolver) resolveSource(ch Change, hash string) (planned, *Conflict, error) {
	pl := planned{ch: ch, hash: hash, route: RouteSource, outcome: OutcomeClean}
	t, err := r.touched(ch.Path)
	if err != nil || !t {
		return pl, nil, err
	}
	bfp, be, err := fingerprint(r.base, ch.Path)
	if err != nil {
		return pl, nil, err
	}
	hfp, he, err := fingerprint(r.head, ch.Path)
	if err != nil {
		return pl, nil, err
	}
	replacesDir := be.Kind == KindDirectory && ch.Kind != ChangeDir
	if replacesDir {
		// Deleting or replacing a directory is safe only if nothing below it
		// changed since the base.
		if bfp, err = treeFingerprint(r.base, be); err != nil {
			return pl, nil, err
		}
		if he.Kind == KindDirectory {
			if hfp, err = treeFingerprint(r.head, he); err != nil {
				return pl, nil, err
			}
		}
	}
	if bfp == hfp {
		return pl, nil, nil
	}
	ofp := oursFingerprint(ch, hash)
	conflict := func(kind, msg string) (planned, *Conflict, error) {
		return pl, &Conflict{Path: ch.Path, Reason: ReasonSourceConflict, Kind: kind,
			Base: bfp, Head: hfp, Ours: ofp, Message: msg}, nil
	}
	if ofp == hfp && !replacesDir {
		return pl, nil, nil // both sides made the same change
	}
	switch ch.Kind {
	case ChangeWrite:
		switch {
		case replacesDir:
			return conflict(ConflictDirectory, "the head changed files inside a directory this change replaces with a file")
		case he.Kind == KindFile && (be.Kind == KindFile || bfp == fpAbsent):
			return r.merge(pl, be, he, bfp, hfp, ofp)
		case he.Kind == KindDirectory:
			return conflict(ConflictFileVsDir, "the head has a directory where this change writes a file")
		case he.Kind == KindSymlink:
			return conflict(ConflictSymlink, "the head has a symlink where this change writes a file")
		default:
			return conflict(ConflictModifyDelete, "the head deleted a file this change modifies")
		}
	case ChangeDir:
		switch he.Kind {
		case KindDirectory:
			return pl, nil, nil // both have the directory; ours sets the mode
		case KindFile, KindSymlink:
			return conflict(ConflictFileVsDir, "the head has a "+he.Kind+" where this change makes a directory")
		default:
			return conflict(ConflictModifyDelete, "the head deleted a directory this change modifies")
		}
	case ChangeDelete:
		if hfp == fpAbsent {
			return pl, nil, nil // deleted on both sides
		}
		if replacesDir {
			return conflict(ConflictDirectory, "the head changed files inside a directory this change deletes")
		}
		return conflict(ConflictDeleteModify, "the head changed a path this change deletes")
	case ChangeSymlink:
		if replacesDir {
			return conflict(ConflictDirectory, "the head changed files inside a directory this change replaces with a symlink")
		}
		return conflict(ConflictSymlink, "the head changed a path this change makes a symlink (symlinks are never merged)")
	default: // opaque
		return conflict(ConflictDirectory, "the head changed a directory this change replaces")
	}
}

// merge three-way merges a text file changed on both sides.
func (r *resolver) merge(pl planned, be, he Entry, bfp, hfp, ofp string) (planned, *Conflict, error) {
	ch := pl.ch
	c := &Conflict{Path: ch.Path, Reason: ReasonSourceConflict, Base: bfp, Head: hfp, Ours: ofp}
	// Permission bits: a side that kept the base's bits yields to the other.
	mode := he.Mode
	if be.Kind == KindFile && ch.Mode != be.Mode {
		if he.Mode != be.Mode && he.Mode != ch.Mode {
			c.Kind, c.Message = ConflictMode, fmt.Sprintf("both sides changed the permission bits (head %04o, ours %04o)", he.Mode, ch.Mode)
			return pl, c, nil
		}
		mode = ch.Mode
	} else if be.Kind != KindFile && ch.Mode != he.Mode {
		mode = ch.Mode
	}
	if he.Size > MergeMaxBytes || be.Size > MergeMaxBytes || ch.Size > MergeMaxBytes {
		c.Kind, c.Message = ConflictTooLarge, fmt.Sprintf("file changed on both sides is larger than the %d-byte merge limit", MergeMaxBytes)
		return pl, c, nil
	}
	var base []byte
	if be.Kind == KindFile {
		var err error
		if base, err = readFull(be.full); err != nil {
			return pl, nil, err
		}
	}
	head, err := readFull(he.full)
	if err != nil {
		return pl, nil, err
	}
	ours, err := readChange(ch, MergeMaxBytes)
	if err != nil {
		return pl, nil, err
	}
	if !IsText(base) || !IsText(head) || !IsText(ours) {
		c.Kind, c.Message = ConflictBinary, "a binary file changed on both sides (binary files are never merged)"
		return pl, c, nil
	}
	res := Merge3(base, head, ours)
	if len(res.Conflicts) > 0 {
		c.Kind, c.HunksTotal = ConflictContent, len(res.Conflicts)
		c.Hunks = append([]MergeConflict(nil), res.Conflicts[:min(len(res.Conflicts), MaxConflictHunks)]...)
		c.Message = fmt.Sprintf("%d overlapping edit(s): the head changed the same lines differently", len(res.Conflicts))
		return pl, c, nil
	}
	pl.ch.Data, pl.ch.Source, pl.ch.Mode, pl.ch.Size = res.Merged, "", mode, int64(len(res.Merged))
	pl.hash = hashBytes(res.Merged)
	pl.outcome = OutcomeMerged
	return pl, nil, nil
}

// checkParents refuses a change whose parent directory the head turned into
// a file or symlink (writing below it would silently hide the head's entry).
func (r *resolver) checkParents(p string, inSet map[string]ChangeKind) (*Conflict, error) {
	for _, a := range ancestors(p) {
		if k, ok := inSet[a]; ok && k != ChangeDir {
			return nil, nil // this change set replaces the parent itself
		}
		k, ok := r.kinds[a]
		if !ok {
			t, err := r.touched(a)
			if err != nil {
				return nil, err
			}
			k = KindDirectory
			if t {
				if e, err := lookup(r.head, a); err == nil {
					k = e.Kind
				} else if errors.Is(err, ErrSymlinkInPath) {
					k = KindSymlink
				} else if !errors.Is(err, fs.ErrNotExist) {
					return nil, err
				}
			}
			r.kinds[a] = k
		}
		if k == KindFile || k == KindSymlink {
			return &Conflict{Path: p, Reason: ReasonSourceConflict, Kind: ConflictParent,
				Message: fmt.Sprintf("the head replaced parent directory %s with a %s", a, k)}, nil
		}
	}
	return nil, nil
}

// effective reports whether a planned change alters the head.
func effective(head stack, pl planned) (bool, error) {
	e, err := lookup(head, pl.ch.Path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrSymlinkInPath) {
			return pl.ch.Kind != ChangeDelete, nil
		}
		return false, err
	}
	switch pl.ch.Kind {
	case ChangeWrite:
		if e.Kind != KindFile || e.Size != pl.ch.Size || e.Mode != pl.ch.Mode.Perm() {
			return true, nil
		}
		h, err := hashFile(e.full)
		return h != pl.hash, err
	case ChangeSymlink:
		return e.Kind != KindSymlink || e.Target != pl.ch.Target, nil
	case ChangeDir:
		return e.Kind != KindDirectory || e.Mode != pl.ch.Mode.Perm(), nil
	default:
		return true, nil
	}
}
