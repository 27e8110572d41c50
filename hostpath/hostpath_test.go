package hostpath

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPolicy(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	root := filepath.Join(base, "root")
	state := filepath.Join(root, "state")
	ws := filepath.Join(root, "ws")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{state, ws, outside} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	require.NoError(t, os.Symlink(ws, filepath.Join(root, "link")))
	require.NoError(t, os.WriteFile(filepath.Join(root, "file"), nil, 0o644))
	p, err := New([]string{root}, state)
	require.NoError(t, err)

	for _, tc := range []struct {
		name, path, rule string
		dest, dir        bool
	}{
		{name: "workspace", path: ws},
		{name: "workspace trailing slash", path: ws + "/"},
		{name: "relative", path: "ws", rule: RuleAbsolute},
		{name: "dotdot", path: ws + "/../ws", rule: RuleAbsolute},
		{name: "slash", path: "/", rule: RuleSystem},
		{name: "etc", path: "/etc", rule: RuleSystem},
		{name: "below proc", path: "/proc/self", rule: RuleSystem},
		{name: "symlink", path: filepath.Join(root, "link"), rule: RuleSymlink},
		{name: "below a symlink", path: filepath.Join(root, "link", "x"), rule: RuleSymlink},
		{name: "state dir", path: state, rule: RuleProtected},
		{name: "above the state dir", path: root, rule: RuleProtected},
		{name: "outside the roots", path: outside, rule: RuleRoots},
		{name: "missing workspace", path: filepath.Join(ws, "nope"), rule: RuleMissing},
		{name: "file as workspace", path: filepath.Join(root, "file"), rule: RuleKind},
		{name: "dest missing", path: filepath.Join(ws, "new", "dir"), dest: true, dir: true},
		{name: "dest file missing", path: filepath.Join(ws, "out.tar"), dest: true},
		{name: "dest dir is a file", path: filepath.Join(root, "file"), dest: true, dir: true, rule: RuleKind},
		{name: "dest slash", path: "/", dest: true, dir: true, rule: RuleSystem},
		{name: "dest etc", path: "/etc/x", dest: true, rule: RuleSystem},
		{name: "dest symlink", path: filepath.Join(root, "link"), dest: true, dir: true, rule: RuleSymlink},
		{name: "dest outside", path: filepath.Join(outside, "x"), dest: true, dir: true, rule: RuleRoots},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.dest {
				_, err = p.Dest("dest", tc.path, tc.dir)
			} else {
				_, err = p.Workspace("workspace_root", tc.path)
			}
			if tc.rule == "" {
				require.NoError(t, err)
				return
			}
			var he *Error
			require.True(t, errors.As(err, &he), "want a refusal, got %v", err)
			require.Equal(t, tc.rule, he.Rule, he.Error())
		})
	}
}

func TestNewRefusesSlashAndRelativeRoots(t *testing.T) {
	_, err := New([]string{"/"})
	require.Error(t, err)
	_, err = New([]string{"rel"})
	require.Error(t, err)
	p, err := New(nil)
	require.NoError(t, err)
	_, err = p.Workspace("workspace_root", t.TempDir())
	var he *Error
	require.ErrorAs(t, err, &he)
	require.Equal(t, RuleRoots, he.Rule)
}
