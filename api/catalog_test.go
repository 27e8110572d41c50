package api

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestCatalogWellFormed(t *testing.T) {
	seen := map[string]bool{}
	types := map[string]bool{TypeString: true, TypeInt: true, TypeBool: true, TypeObject: true, TypeArray: true, TypeStringOrList: true}
	for _, o := range Catalog() {
		if seen[o.Name] {
			t.Errorf("duplicate op %s", o.Name)
		}
		seen[o.Name] = true
		if o.Summary == "" || o.Description == "" {
			t.Errorf("%s: missing summary or description", o.Name)
		}
		switch o.Scope {
		case ScopeSystem, ScopeSandbox, ScopeEither:
		default:
			t.Errorf("%s: bad scope %q", o.Name, o.Scope)
		}
		if o.Internal {
			if o.Group != GroupInternal {
				t.Errorf("%s: internal op in group %s", o.Name, o.Group)
			}
			continue
		}
		switch o.Group {
		case GroupManagement, GroupRuntime, GroupObservability:
		default:
			t.Errorf("%s: bad group %q", o.Name, o.Group)
		}
		if len(o.Result) == 0 {
			t.Errorf("%s: no result schema", o.Name)
		}
		positional, argNames := 0, map[string]bool{}
		for _, a := range o.Args {
			if !types[a.Type] {
				t.Errorf("%s.%s: bad type %q", o.Name, a.Name, a.Type)
			}
			if a.Description == "" {
				t.Errorf("%s.%s: no description", o.Name, a.Name)
			}
			if argNames[a.Name] {
				t.Errorf("%s.%s: duplicate arg", o.Name, a.Name)
			}
			argNames[a.Name] = true
			if a.Positional {
				positional++
			}
			if (a.Min != nil || a.Max != nil) && a.Type != TypeInt {
				t.Errorf("%s.%s: limits on a non-int", o.Name, a.Name)
			}
			if a.Default != nil {
				if err := a.check(o.Name, a.Default); err != nil {
					t.Errorf("%s.%s: default invalid: %v", o.Name, a.Name, err)
				}
			}
		}
		if positional > 1 {
			t.Errorf("%s: %d positional args", o.Name, positional)
		}
	}
	for _, name := range []string{"create_sandbox", "list_sandboxes", "inspect_sandbox", "destroy_sandbox", "list_docker_images",
		"list_workspace_directories", "squash_layerstacks", "export_changes", "exec_command", "write_command_stdin",
		"read_command_lines", "cancel_command", "file_read", "file_write", "file_edit", "file_blame", "file_list",
		"file_delete", "file_move", "file_search", "create_workspace_session", "destroy_workspace_session",
		"publish_workspace_session", "refresh_workspace_session", "list_workspace_sessions", "diff_workspace_session",
		"check_publish", "snapshot", "trace", "events", "layerstack", "cgroup", "resources", "topology", "daemon"} {
		if _, err := ResolvePublic(name); err != nil {
			t.Errorf("public op %s: %v", name, err)
		}
	}
	for _, name := range []string{"init_base", "publish_prepare", "publish_commit", "publish_finalize", "publish_abort",
		"squash_layerstack", "export_layerstack", "archive_idle_sessions"} {
		o, ok := LookupOp(name)
		if !ok || !o.Internal {
			t.Errorf("%s must be declared internal", name)
		}
		if _, err := ResolvePublic(name); err == nil || err.Kind != KindInvalidRequest {
			t.Errorf("%s must be refused, got %v", name, err)
		}
	}
	if _, err := ResolvePublic("nope"); err == nil || err.Kind != KindUnknownOp {
		t.Errorf("unknown op: %v", err)
	}
	if o, _ := LookupOp("publish_workspace_session"); func() bool { _, ok := o.Arg("keep"); return !ok }() {
		t.Error("publish_workspace_session lacks keep")
	}
}

func TestValidate(t *testing.T) {
	op, _ := LookupOp("read_command_lines")
	cases := []struct {
		args map[string]any
		ok   bool
		arg  string
	}{
		{map[string]any{"command_session_id": "c1"}, true, ""},
		{map[string]any{"command_session_id": "c1", "limit": float64(1000), "start_offset": json.Number("3")}, true, ""},
		{map[string]any{}, false, "command_session_id"},
		{map[string]any{"command_session_id": ""}, false, "command_session_id"},
		{map[string]any{"command_session_id": 5}, false, "command_session_id"},
		{map[string]any{"command_session_id": "c1", "limit": float64(1001)}, false, "limit"},
		{map[string]any{"command_session_id": "c1", "limit": float64(0)}, false, "limit"},
		{map[string]any{"command_session_id": "c1", "limit": 1.5}, false, "limit"},
		{map[string]any{"command_session_id": "c1", "limit": "10"}, false, "limit"},
		{map[string]any{"command_session_id": "c1", "bogus": true}, false, "bogus"},
	}
	for i, c := range cases {
		err := op.Validate(c.args)
		if c.ok != (err == nil) {
			t.Errorf("case %d: ok=%v err=%v", i, c.ok, err)
			continue
		}
		if err != nil {
			if err.Kind != KindInvalidRequest || err.Details["arg"] != c.arg {
				t.Errorf("case %d: %+v", i, err)
			}
		}
	}
	fe, _ := LookupOp("file_edit")
	if err := fe.Validate(map[string]any{"path": "a", "edits": "x"}); err == nil {
		t.Error("edits must be an array")
	}
	if err := fe.Validate(map[string]any{"path": "a", "edits": []any{map[string]any{"old_string": "a", "new_string": "b"}}}); err != nil {
		t.Error(err)
	}
	ex, _ := LookupOp("export_changes")
	if err := ex.Validate(map[string]any{"sandbox_id": "x", "dest": "/d", "format": "zip"}); err == nil {
		t.Error("enum not enforced")
	}
	if err := ex.Validate(map[string]any{"sandbox_id": "x", "dest": "/d", "format": "tar", "tty": true}); err == nil {
		t.Error("unknown arg accepted")
	}
}

// IntArg reads an integer however a door decoded it.
func TestIntArg(t *testing.T) {
	args := map[string]any{"http": json.Number("7"), "mcp": float64(8), "go": 9, "half": 1.5, "big": json.Number("1e400"), "text": "10"}
	for name, want := range map[string]int64{"http": 7, "mcp": 8, "go": 9} {
		n, ok := IntArg(args, name)
		if !ok || n != want {
			t.Errorf("%s: %d, %v", name, n, ok)
		}
	}
	for _, name := range []string{"half", "big", "text", "absent"} {
		if n, ok := IntArg(args, name); ok {
			t.Errorf("%s read as %d", name, n)
		}
	}
}

func TestScopeAndRouting(t *testing.T) {
	ex, _ := LookupOp("exec_command")
	if ex.CheckScope(ScopeSystem, "") == nil || ex.CheckScope(ScopeSandbox, "") == nil || ex.CheckScope(ScopeSandbox, "eos-1") != nil {
		t.Error("exec_command scope")
	}
	cs, _ := LookupOp("create_sandbox")
	if cs.CheckScope(ScopeSandbox, "eos-1") == nil || cs.CheckScope(ScopeSystem, "") != nil || !cs.IsLifecycle(nil) {
		t.Error("create_sandbox scope/routing")
	}
	sn, _ := LookupOp("snapshot")
	if sn.CheckScope(ScopeSystem, "") != nil || sn.CheckScope(ScopeSandbox, "eos-1") != nil {
		t.Error("snapshot scope")
	}
	fw, _ := LookupOp("file_write")
	if !fw.IsLifecycle(map[string]any{"path": "a"}) || fw.IsLifecycle(map[string]any{"workspace_session_id": "ws"}) {
		t.Error("file_write routing")
	}
	if ex.IsLifecycle(nil) {
		t.Error("exec_command is runtime")
	}
}

func TestOpenAPI(t *testing.T) {
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Errorf("openapi %q", doc.OpenAPI)
	}
	pub := PublicOps("")
	if len(doc.Paths) != len(pub)+1 { // and the raw-bytes route of file_upload / file_download
		t.Errorf("%d paths for %d public ops", len(doc.Paths), len(pub))
	}
	for _, o := range pub {
		if o.RawHTTP != "" {
			if _, ok := doc.Paths[FilesPath][strings.ToLower(o.RawHTTP)]; !ok {
				t.Errorf("no %s %s for %s", o.RawHTTP, FilesPath, o.Name)
			}
		}
	}
	for _, o := range pub {
		if _, ok := doc.Paths["/v1/ops/"+o.Name]["post"]; !ok {
			t.Errorf("no path for %s", o.Name)
		}
	}
	if _, ok := doc.Paths["/v1/ops/init_base"]; ok {
		t.Error("internal op in openapi")
	}
	// Every op's answers, refusals too, declare the headers the gateway sets.
	for _, o := range pub {
		post, _ := doc.Paths["/v1/ops/"+o.Name]["post"].(map[string]any)
		responses, _ := post["responses"].(map[string]any)
		for _, code := range []string{"200", "default"} {
			r, _ := responses[code].(map[string]any)
			h, _ := r["headers"].(map[string]any)
			if h[ServerTimingHeader] == nil || h["X-Request-Id"] == nil {
				t.Errorf("%s %s: headers %v", o.Name, code, h)
			}
		}
	}
}
