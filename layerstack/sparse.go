package layerstack

import (
	"bytes"
	"errors"

	"golang.org/x/sys/unix"
)

// holeBlock is the unit holeWriter leaves unwritten when it is all zeros:
// the block size of the filesystems the store runs on.
const holeBlock = 4096

var zeroBlock [holeBlock]byte

// holeWriter writes a stream into a new, empty file from its start and
// leaves a hole wherever a whole block of zeros would go, as `cp
// --sparse=auto` does: a sparse file (a disk image, a preallocated
// database) stays sparse, and a file of zeros costs no disk and no write.
// What a reader sees is the same bytes. Close writes what is left and sets
// the file's size; it does not close fd.
type holeWriter struct {
	fd      int
	off     int64  // bytes taken from the stream, less the held part
	end     int64  // the end of the last byte written to the file
	part    []byte // the first bytes of the block at off, until it is whole
	written int64  // bytes actually written (the rest are holes)
}

func newHoleWriter(fd int) *holeWriter {
	return &holeWriter{fd: fd, part: make([]byte, 0, holeBlock)}
}

func (w *holeWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(w.part) > 0 {
		k := min(holeBlock-len(w.part), len(p))
		w.part = append(w.part, p[:k]...)
		p = p[k:]
		if len(w.part) < holeBlock {
			return n, nil
		}
		if err := w.blocks(w.part); err != nil {
			return 0, err
		}
		w.part = w.part[:0]
	}
	whole := len(p) / holeBlock * holeBlock
	if err := w.blocks(p[:whole]); err != nil {
		return 0, err
	}
	w.part = append(w.part, p[whole:]...)
	return n, nil
}

// blocks writes b, whole blocks, at off: runs of data in one write each,
// runs of zero blocks skipped.
func (w *holeWriter) blocks(b []byte) error {
	for len(b) > 0 {
		i := 0
		for i < len(b) && bytes.Equal(b[i:i+holeBlock], zeroBlock[:]) {
			i += holeBlock
		}
		w.off += int64(i)
		b = b[i:]
		j := 0
		for j < len(b) && !bytes.Equal(b[j:j+holeBlock], zeroBlock[:]) {
			j += holeBlock
		}
		if err := w.pwrite(b[:j]); err != nil {
			return err
		}
		b = b[j:]
	}
	return nil
}

func (w *holeWriter) pwrite(b []byte) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(w.fd, b, w.off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b, w.off, w.written = b[n:], w.off+int64(n), w.written+int64(n)
		w.end = w.off
	}
	return nil
}

// Close writes the held part of the last block (zeros or not) and, when
// the stream ended in a hole, sets the file's size to the stream's.
func (w *holeWriter) Close() error {
	if err := w.pwrite(w.part); err != nil {
		return err
	}
	w.part = w.part[:0]
	if w.end < w.off {
		return unix.Ftruncate(w.fd, w.off)
	}
	return nil
}

// Size is the stream's length so far (written and holes).
func (w *holeWriter) Size() int64 { return w.off + int64(len(w.part)) }
