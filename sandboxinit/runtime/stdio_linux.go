package runtime

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// stdio plumbs a process's standard streams: the files the process gets
// (child), the ends we keep, and the goroutines copying between them.
type stdio struct {
	child       procIO
	childEnds   []*os.File // closed once the process has them
	ourEnds     []*os.File // read ends closed after draining
	stdinW      io.WriteCloser
	copies      sync.WaitGroup
	closeOnExit []io.Closer
}

func newStdio(ps ProcSpec, needFiles bool) (_ *stdio, retErr error) {
	s := &stdio{child: procIO{tty: ps.TTY, rows: ps.Rows, cols: ps.Cols}}
	defer func() {
		if retErr != nil {
			s.abort()
		}
	}()
	if ps.TTY {
		return s, nil // the pty is attached after start
	}
	// stdin
	switch in := ps.Stdin.(type) {
	case *os.File:
		s.child.stdin = in
	case nil:
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
		s.child.stdin, s.childEnds = r, append(s.childEnds, r)
		s.stdinW = w
		s.closeOnExit = append(s.closeOnExit, w)
	default:
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
		s.child.stdin, s.childEnds = r, append(s.childEnds, r)
		s.closeOnExit = append(s.closeOnExit, w)
		// Not waited for: a reader that never ends must not block Wait.
		go func() {
			_, _ = io.Copy(w, in)
			_ = w.Close()
		}()
	}
	// stdout and stderr; one pipe when both are the same writer keeps order.
	var err error
	if s.child.stdout, err = s.output(ps.Stdout); err != nil {
		return nil, err
	}
	if ps.Stderr != nil && ps.Stderr == ps.Stdout {
		s.child.stderr = s.child.stdout
	} else if s.child.stderr, err = s.output(ps.Stderr); err != nil {
		return nil, err
	}
	if needFiles {
		for _, f := range []**os.File{&s.child.stdin, &s.child.stdout, &s.child.stderr} {
			if *f == nil {
				if *f, err = os.OpenFile(os.DevNull, os.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
					return nil, err
				}
				s.childEnds = append(s.childEnds, *f)
			}
		}
	}
	return s, nil
}

func (s *stdio) output(w io.Writer) (*os.File, error) {
	switch out := w.(type) {
	case nil:
		return nil, nil
	case *os.File:
		return out, nil
	}
	r, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("output pipe: %w", err)
	}
	s.childEnds = append(s.childEnds, pw)
	s.ourEnds = append(s.ourEnds, r)
	s.copies.Add(1)
	go func() {
		defer s.copies.Done()
		_, _ = io.Copy(w, r)
	}()
	return pw, nil
}

// attachPTY copies between the pty master and the caller's streams; it
// returns the caller's stdin writer when ps.Stdin is nil.
func (s *stdio) attachPTY(master *os.File, ps ProcSpec) io.WriteCloser {
	out := ps.Stdout
	if out == nil {
		out = io.Discard // the process blocks when nobody drains the pty
	}
	s.copies.Add(1)
	go func() {
		defer s.copies.Done()
		_, _ = io.Copy(out, master) // ends with EIO once every slave fd is closed
	}()
	if ps.Stdin == nil {
		return ptyInput{master}
	}
	go func() { _, _ = io.Copy(master, ps.Stdin) }()
	return nil
}

// ptyInput writes to a terminal; Close sends end-of-file (^D) rather than
// closing the master, which would hang the session's side up.
type ptyInput struct{ f *os.File }

func (p ptyInput) Write(b []byte) (int, error) { return p.f.Write(b) }
func (p ptyInput) Close() error {
	_, err := p.f.Write([]byte{4})
	return err
}

// started closes our copies of the ends the process now holds, so that EOF
// arrives when the process (and its children) close theirs.
func (s *stdio) started() {
	for _, f := range s.childEnds {
		_ = f.Close()
	}
	s.childEnds = nil
}

// finish waits up to delay for the output copies, then closes our ends.
func (s *stdio) finish(delay time.Duration) {
	done := make(chan struct{})
	go func() {
		s.copies.Wait()
		close(done)
	}()
	t := time.NewTimer(delay)
	select {
	case <-done:
	case <-t.C:
	}
	t.Stop()
	for _, f := range s.ourEnds {
		_ = f.Close()
	}
	for _, c := range s.closeOnExit {
		_ = c.Close()
	}
}

// abort releases everything when the process never started.
func (s *stdio) abort() {
	s.started()
	for _, f := range s.ourEnds {
		_ = f.Close()
	}
	for _, c := range s.closeOnExit {
		_ = c.Close()
	}
}
