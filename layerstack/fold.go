package layerstack

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"sort"
)

// foldSink receives the net content of a run of layers, in path order,
// parents before children.
type foldSink interface {
	dir(p string, fi fs.FileInfo, opaque bool) error
	file(p, full string, fi fs.FileInfo) error
	symlink(p, target string, fi fs.FileInfo) error
	whiteout(p string) error
}

// folder computes the single layer equivalent to a run of layers (newest
// first). below are the layers under the run: a whiteout that hides nothing
// there is dropped, and a directory cut inside the run becomes opaque.
type folder struct {
	ctx   context.Context
	run   stack
	below stack
	sink  foldSink
}

func (f *folder) fold() error {
	all := make([]int, f.run.len())
	for i := range all {
		all[i] = i
	}
	return f.foldDir("", all, false)
}

type foldCand struct {
	top   layerEntry
	layer int
	chain []int
	cut   bool
	done  bool
}

func (f *folder) foldDir(p string, layers []int, cut bool) error {
	if err := f.ctx.Err(); err != nil {
		return err
	}
	cands := map[string]*foldCand{}
	for _, li := range layers {
		names, err := f.run.list(li, p)
		if err != nil {
			return err
		}
		for _, name := range names {
			c := cands[name]
			if c != nil && c.done {
				continue
			}
			le, err := f.run.stat(li, joinPath(p, name))
			if err != nil {
				return err
			}
			if le.kind == kindAbsent {
				continue
			}
			if c == nil {
				c = &foldCand{top: le, layer: li, done: le.kind != kindDir}
				if le.kind == kindDir {
					c.chain, c.cut, c.done = []int{li}, le.opaque, le.opaque
				}
				cands[name] = c
				continue
			}
			if le.kind != kindDir { // a lower whiteout or file ends the directory
				c.cut, c.done = true, true
				continue
			}
			c.chain = append(c.chain, li)
			if le.opaque {
				c.cut, c.done = true, true
			}
		}
	}
	names := make([]string, 0, len(cands))
	for n := range cands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := cands[n]
		cp := joinPath(p, n)
		full := fullPath(f.run.dirs[c.layer], cp)
		var err error
		switch c.top.kind {
		case kindWhiteout:
			err = f.foldWhiteout(cp, cut)
		case kindFile:
			err = f.sink.file(cp, full, c.top.info)
		case kindSymlink:
			var t string
			if t, err = os.Readlink(full); err == nil {
				err = f.sink.symlink(cp, t, c.top.info)
			}
		case kindDir:
			if err = f.sink.dir(cp, c.top.info, c.cut); err == nil {
				err = f.foldDir(cp, c.chain, cut || c.cut)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// foldWhiteout keeps a whiteout only if something below the run needs hiding.
func (f *folder) foldWhiteout(p string, cut bool) error {
	if cut {
		return nil // an opaque parent already hides everything below
	}
	if _, err := lookup(f.below, p); err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrSymlinkInPath) {
			return nil
		}
		return err
	}
	return f.sink.whiteout(p)
}
