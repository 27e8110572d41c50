package activities

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"time"
)

// A new sandbox's workspace is read while Docker makes and starts its
// container: CreateContainer begins the tar of the tree into memory (up to
// prefetchMax) and ImportWorkspace, which streams the tar to the started
// daemon, takes it from there instead of reading the tree then. Reading and
// packing a 1k-file tree is tens of milliseconds of CPU that the create
// otherwise spends after the start, with the daemon's writes, on the same
// cores. A tree larger than the buffer is streamed on from the host once
// the import reads; a prefetch nobody takes within prefetchTTL is dropped.
//
// It is an optimisation only: an import that finds none (another worker
// process, a retried attempt, a restart) reads the tree as before, and the
// tar is the one it would have read, taken moments earlier.

// Variables for the tests. At most prefetchSlots prefetches wait at once
// (a burst of creates holds at most prefetchSlots × prefetchMax of memory;
// the others read their tree at import time, as without prefetch).
var (
	prefetchMax   = 32 << 20
	prefetchTTL   = 2 * time.Minute
	prefetchSlots = 8
)

type prefetch struct {
	root string
	w    *workspaceTar
	pr   *io.PipeReader
	werr chan error // the writer's end, once
}

type prefetches struct {
	mu sync.Mutex
	m  map[string]*prefetch // by sandbox id
}

// errPrefetchDropped ends a prefetch nobody took.
var errPrefetchDropped = errors.New("workspace prefetch dropped: no import took it")

// startPrefetch begins packing root for sandboxID's import; a prefetch of
// the sandbox already there is replaced. It returns the prefetch, or nil
// when every slot is taken.
func (a *Activities) startPrefetch(sandboxID, root string) *prefetch {
	pr, pw := io.Pipe()
	p := &prefetch{root: root, w: &workspaceTar{ctx: context.Background(), root: root}, pr: pr, werr: make(chan error, 1)}
	a.pf.mu.Lock()
	if a.pf.m == nil {
		a.pf.m = map[string]*prefetch{}
	}
	old := a.pf.m[sandboxID]
	if old == nil && len(a.pf.m) >= prefetchSlots {
		a.pf.mu.Unlock()
		return nil
	}
	a.pf.m[sandboxID] = p
	a.pf.mu.Unlock()
	if old != nil {
		old.pr.CloseWithError(errPrefetchDropped)
	}
	go func() {
		// It ends when the import has read it all, or when its reader is
		// closed: by the import once the daemon answered, or below.
		out := &prefetchWriter{pw: pw, max: prefetchMax}
		err := p.w.write(out)
		if err == nil {
			err = out.Flush()
		}
		pw.CloseWithError(err)
		p.werr <- err
	}()
	time.AfterFunc(prefetchTTL, func() {
		if a.takePrefetch(sandboxID, root, p) != nil {
			pr.CloseWithError(errPrefetchDropped)
		}
	})
	return p
}

// dropPrefetch ends sandboxID's prefetch of root, if any.
func (a *Activities) dropPrefetch(sandboxID, root string) {
	if p := a.takePrefetch(sandboxID, root, nil); p != nil {
		p.pr.CloseWithError(errPrefetchDropped)
	}
}

// takePrefetch removes and returns sandboxID's prefetch of root (only the
// given one when want is set); nil when there is none.
func (a *Activities) takePrefetch(sandboxID, root string, want *prefetch) *prefetch {
	a.pf.mu.Lock()
	defer a.pf.mu.Unlock()
	p := a.pf.m[sandboxID]
	if p == nil || p.root != root || (want != nil && p != want) {
		return nil
	}
	delete(a.pf.m, sandboxID)
	return p
}

// prefetchWriter keeps the first max bytes of the tar in memory without
// waiting for a reader; past them (or at the end) it hands what it holds to
// the pipe, which waits for the import, and goes on through a small buffer
// (stream's), so a large tree streams instead of moving in big bursts.
type prefetchWriter struct {
	pw      *io.PipeWriter
	max     int
	held    bytes.Buffer
	through *bufio.Writer // after the hand-over
}

func (p *prefetchWriter) Write(b []byte) (int, error) {
	if p.through == nil && p.held.Len()+len(b) <= p.max {
		return p.held.Write(b)
	}
	if p.through == nil {
		if _, err := p.pw.Write(p.held.Bytes()); err != nil {
			return 0, err
		}
		p.held = bytes.Buffer{}
		p.through = bufio.NewWriterSize(p.pw, 256<<10)
	}
	return p.through.Write(b)
}

// Flush hands over what is left (the whole tar of a tree within max).
func (p *prefetchWriter) Flush() error {
	if p.through != nil {
		return p.through.Flush()
	}
	_, err := p.pw.Write(p.held.Bytes())
	p.held = bytes.Buffer{}
	return err
}
