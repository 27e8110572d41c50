package mcp

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/api"
)

// RenderResult renders an operation's result as text for clients that read
// only text content: commands as their status line and output, file reads
// as their content, everything else as an indented key: value outline.
func RenderResult(op string, v map[string]any) string {
	var b strings.Builder
	switch op {
	case "exec_command", "write_command_stdin", "read_command_lines", "cancel_command":
		renderCommand(&b, v)
	case "file_read":
		renderFileRead(&b, v)
	case "file_download":
		renderFileDownload(&b, v)
	default:
		outline(&b, v, "")
	}
	return strings.TrimRight(b.String(), "\n")
}

// RenderError renders a failed call: kind and message, each conflicting
// path of a rejected publish, what to do next, then the details.
func RenderError(op string, e *api.Error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s failed: %s: %s\n", op, e.Kind, e.Message)
	if cs, ok := e.Details["conflicts"].([]any); ok && len(cs) > 0 {
		renderConflicts(&b, cs)
		if op == "publish_workspace_session" {
			b.WriteString("Nothing was committed and the session is kept. To fix: destroy_workspace_session, create_workspace_session " +
				"(it starts from the latest published state), re-apply your change there, and publish again.\n")
		}
	}
	if len(e.Details) > 0 {
		b.WriteString("details:\n")
		outline(&b, e.Details, "  ")
	}
	return strings.TrimRight(b.String(), "\n")
}

func renderCommand(b *strings.Builder, v map[string]any) {
	status, _ := v["status"].(string)
	fmt.Fprintf(b, "status: %s", status)
	if code, ok := v["exit_code"].(float64); ok {
		fmt.Fprintf(b, ", exit code %d", int(code))
	}
	if s, ok := v["wall_time_seconds"].(float64); ok {
		fmt.Fprintf(b, ", %.3f s", s)
	}
	start, _ := v["start_offset"].(float64)
	end, _ := v["end_offset"].(float64)
	total, _ := v["total_lines"].(float64)
	fmt.Fprintf(b, ", lines %d-%d of %d\n", int(start), int(end), int(total))
	if out, _ := v["output"].(string); out != "" {
		b.WriteString(out)
		if !strings.HasSuffix(out, "\n") {
			b.WriteString("\n")
		}
	}
	id, _ := v["command_session_id"].(string)
	switch {
	case status == api.StatusRunning:
		fmt.Fprintf(b, "[still running: command_session_id %s; poll with read_command_lines or write_command_stdin]\n", id)
	case v["truncated"] == true || end < total:
		fmt.Fprintf(b, "[output truncated: page it with read_command_lines command_session_id %s]\n", id)
	}
	if v["publish_rejected"] == true {
		fmt.Fprintf(b, "publish rejected (%v): the command's changes were discarded\n", v["publish_reject_class"])
		if cs, ok := v["publish_conflicts"].([]any); ok {
			renderConflicts(b, cs)
		}
	} else if p, ok := v["publish"].(map[string]any); ok {
		if rev, ok := p["revision"].(map[string]any); ok {
			fmt.Fprintf(b, "published: manifest version %v\n", rev["manifest_version"])
		}
	}
}

func renderFileRead(b *strings.Builder, v map[string]any) {
	start, _ := v["start_line"].(float64)
	n, _ := v["num_lines"].(float64)
	total, _ := v["total_lines"].(float64)
	fmt.Fprintf(b, "%v (lines %d-%d of %d)\n", v["path"], int(start), int(start+n)-1, int(total))
	if c, _ := v["content"].(string); c != "" {
		b.WriteString(c)
		if !strings.HasSuffix(c, "\n") {
			b.WriteString("\n")
		}
	}
	if next, ok := v["next_offset"].(float64); ok {
		fmt.Fprintf(b, "[more: file_read offset %d]\n", int(next))
	}
}

// maxTextBase64 is the largest content_base64 a file_download's text
// rendering repeats; past it the bytes are only in structuredContent.
const maxTextBase64 = 64 << 10

func renderFileDownload(b *strings.Builder, v map[string]any) {
	size, _ := v["size"].(float64)
	fmt.Fprintf(b, "%v: %d bytes, sha256 %v, executable %v\n", v["path"], int64(size), v["sha256"], v["executable"])
	c, _ := v["content_base64"].(string)
	if len(c) <= maxTextBase64 {
		b.WriteString("content_base64: " + c + "\n")
		return
	}
	fmt.Fprintf(b, "[content_base64 (%d characters) is in the result's structuredContent]\n", len(c))
}

// renderConflicts lists each conflicting path with the line ranges of each
// side (base, the head others published, ours).
func renderConflicts(b *strings.Builder, cs []any) {
	fmt.Fprintf(b, "%d conflicting path(s):\n", len(cs))
	for _, c := range cs {
		m, _ := c.(map[string]any)
		fmt.Fprintf(b, "- %v: %v", m["path"], m["kind"])
		if msg, _ := m["message"].(string); msg != "" {
			fmt.Fprintf(b, " (%s)", msg)
		}
		b.WriteString("\n")
		hunks, _ := m["hunks"].([]any)
		for _, h := range hunks {
			hm, _ := h.(map[string]any)
			fmt.Fprintf(b, "    base %s, others published %s, yours %s\n", lineRange(hm["base"]), lineRange(hm["head"]), lineRange(hm["ours"]))
		}
	}
}

func lineRange(v any) string {
	m, _ := v.(map[string]any)
	start, _ := m["start_line"].(float64)
	n, _ := m["line_count"].(float64)
	switch {
	case n == 0:
		return fmt.Sprintf("insertion before line %d", int(start))
	case n == 1:
		return fmt.Sprintf("line %d", int(start))
	}
	return fmt.Sprintf("lines %d-%d", int(start), int(start+n)-1)
}

// outline writes v as an indented outline: "key: value" for scalars,
// nested maps and lists indented below their key, multi-line strings as
// blocks.
func outline(b *strings.Builder, v any, indent string) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if len(keys) == 0 {
			b.WriteString(indent + "{}\n")
		}
		for _, k := range keys {
			outlineEntry(b, indent, k+":", x[k])
		}
	case []any:
		if len(x) == 0 {
			b.WriteString(indent + "[]\n")
		}
		for _, e := range x {
			outlineEntry(b, indent, "-", e)
		}
	default:
		b.WriteString(indent + scalar(v) + "\n")
	}
}

func outlineEntry(b *strings.Builder, indent, label string, v any) {
	switch x := v.(type) {
	case map[string]any, []any:
		if inline, ok := inlineList(x); ok {
			b.WriteString(indent + label + " " + inline + "\n")
			return
		}
		b.WriteString(indent + label + "\n")
		outline(b, x, indent+"  ")
	case string:
		if strings.Contains(x, "\n") {
			b.WriteString(indent + label + " |\n")
			for _, l := range strings.Split(strings.TrimRight(x, "\n"), "\n") {
				b.WriteString(indent + "  " + l + "\n")
			}
			return
		}
		b.WriteString(indent + label + " " + scalar(x) + "\n")
	default:
		b.WriteString(indent + label + " " + scalar(v) + "\n")
	}
}

// inlineList renders a short list of scalars, or an empty container, on
// one line.
func inlineList(v any) (string, bool) {
	switch x := v.(type) {
	case map[string]any:
		return "{}", len(x) == 0
	case []any:
		parts := make([]string, 0, len(x))
		n := 0
		for _, e := range x {
			switch e.(type) {
			case map[string]any, []any:
				return "", false
			}
			s := scalar(e)
			n += len(s)
			parts = append(parts, s)
		}
		return "[" + strings.Join(parts, ", ") + "]", n <= 120
	}
	return "", false
}

func scalar(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		if x == "" {
			return `""`
		}
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	}
	b, _ := json.Marshal(v)
	return string(b)
}
