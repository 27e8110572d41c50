package telemetry

import (
	"fmt"
	"io"
)

// chunkBytes is how much of a segment one read takes, from its end.
const chunkBytes = 32 << 10

// reverseLines calls fn with every non-empty line of r[0:size], the last one
// first, until fn returns false. Memory stays bounded whatever the segment
// holds: one chunk plus one line of at most maxLine bytes; a longer line
// (which Append never writes, but a damaged file may hold) is skipped and
// counted. The slice passed to fn is only valid during the call.
func reverseLines(r io.ReaderAt, size int64, maxLine int, fn func(line []byte) bool) (skipped int, err error) {
	chunk := make([]byte, chunkBytes)
	carry := make([]byte, 0, maxLine) // the end of a line whose start lies before pos
	scratch := make([]byte, 0, maxLine)
	overlong := false
	emit := func(head []byte) bool {
		if overlong || len(head)+len(carry) > maxLine {
			if len(head)+len(carry) > 0 || overlong {
				skipped++
			}
			return true
		}
		if len(head)+len(carry) == 0 {
			return true
		}
		line := append(append(scratch[:0], head...), carry...)
		return fn(line)
	}
	pos := size
	for pos > 0 {
		n := int64(chunkBytes)
		if pos < n {
			n = pos
		}
		pos -= n
		buf := chunk[:n]
		if _, err := r.ReadAt(buf, pos); err != nil && err != io.EOF {
			return skipped, fmt.Errorf("read at %d: %w", pos, err)
		}
		end := len(buf)
		for i := end - 1; i >= 0; i-- {
			if buf[i] != '\n' {
				continue
			}
			if !emit(buf[i+1 : end]) {
				return skipped, nil
			}
			carry, overlong = carry[:0], false
			end = i
		}
		// buf[:end] continues the line in carry towards its start.
		switch {
		case overlong:
		case end+len(carry) > maxLine:
			overlong, carry = true, carry[:0]
		default:
			scratch = append(append(scratch[:0], buf[:end]...), carry...)
			carry, scratch = scratch, carry
		}
	}
	emit(nil)
	return skipped, nil
}
