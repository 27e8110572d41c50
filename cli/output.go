package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// isTerminal reports whether w is a character device (a terminal). Tests
// replace it.
var isTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressLine prints progress messages: one line each, or on a terminal a
// single line rewritten in place.
type progressLine struct {
	w     io.Writer
	tty   bool
	shown bool
}

func (p *progressLine) show(msg string) {
	msg = cleanCell(msg, 0)
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", msg)
		p.shown = true
		return
	}
	fmt.Fprintln(p.w, msg)
}

// end finishes the terminal progress line (nil-safe).
func (p *progressLine) end() {
	if p != nil && p.tty && p.shown {
		fmt.Fprintln(p.w)
		p.shown = false
	}
}

// listKeys are the top-level result lists rendered as tables.
var listKeys = []string{"sandboxes", "workspace_sessions", "entries", "matches"}

// listResult finds the table-worthy list of a result object: its key, its
// rows and the other top-level fields.
func listResult(raw []byte) (string, []any, map[string]any, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if dec.Decode(&obj) != nil {
		return "", nil, nil, false
	}
	for _, k := range listKeys {
		rows, ok := obj[k].([]any)
		if !ok {
			continue
		}
		rest := map[string]any{}
		for k2, v := range obj {
			if k2 != k {
				rest[k2] = v
			}
		}
		return k, rows, rest, true
	}
	return "", nil, nil, false
}

// preferredColumns come first, in this order; the others follow sorted.
var preferredColumns = []string{"id", "name", "path", "kind", "state", "status"}

const maxCell = 60

// renderTable prints rows as an aligned table (objects: one column per
// key; other values: a VALUE column), then the other fields as key: value.
func renderTable(w io.Writer, key string, rows []any, rest map[string]any) {
	if len(rows) == 0 {
		fmt.Fprintf(w, "no %s\n", strings.ReplaceAll(key, "_", " "))
	} else {
		seen := map[string]bool{}
		scalar := false
		for _, r := range rows {
			if m, ok := r.(map[string]any); ok {
				for k := range m {
					seen[k] = true
				}
			} else {
				scalar = true
			}
		}
		var cols []string
		for _, k := range preferredColumns {
			if seen[k] {
				cols = append(cols, k)
				delete(seen, k)
			}
		}
		var others []string
		for k := range seen {
			others = append(others, k)
		}
		sort.Strings(others)
		cols = append(cols, others...)
		if scalar {
			cols = append(cols, "")
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		head := make([]string, len(cols))
		for i, c := range cols {
			head[i] = strings.ToUpper(c)
			if c == "" {
				head[i] = "VALUE"
			}
		}
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		for _, r := range rows {
			cells := make([]string, len(cols))
			m, isObj := r.(map[string]any)
			for i, c := range cols {
				switch {
				case c == "" && !isObj:
					cells[i] = cell(r)
				case c != "" && isObj:
					v, ok := m[c]
					if !ok {
						v = nil
					}
					cells[i] = cell(v)
				default:
					cells[i] = ""
				}
			}
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
		_ = tw.Flush()
	}
	keys := make([]string, 0, len(rest))
	for k := range rest {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "%s: %s\n", k, cell(rest[k]))
	}
}

// cell renders one value: strings as is, null as -, others as compact JSON;
// control characters become spaces and long values are cut.
func cell(v any) string {
	var s string
	switch x := v.(type) {
	case nil:
		s = "-"
	case string:
		s = x
	case json.Number:
		s = x.String()
	default:
		b, _ := json.Marshal(x)
		s = string(b)
	}
	return cleanCell(s, maxCell)
}

func cleanCell(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if max > 0 && utf8.RuneCountInString(s) > max {
		s = string([]rune(s)[:max-1]) + "…"
	}
	return s
}
