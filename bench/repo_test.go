package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func looseObjects(t *testing.T, repo string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", repo, "count-objects").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// A git baseline that commits in a worktree leaves the repository as it
// found it: the next scenario's sandbox and container + copy would copy
// those commits' objects with it.
func TestCommitWorktreeLeavesTheRepositoryAsItWas(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if err := ensureRepo(repo, 20, 4096); err != nil {
		t.Fatal(err)
	}
	if got := looseObjects(t, repo); !strings.HasPrefix(got, "0 objects") {
		t.Fatalf("a new repository has loose objects: %s", got)
	}
	for _, c := range []struct {
		name   string
		mk     func(string, string) (func(), error)
		prunes bool
	}{{"GitWorktree", GitWorktree, false}, {"CommitWorktree", CommitWorktree, true}} {
		wt := filepath.Join(dir, "wt")
		rm, err := c.mk(repo, wt)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(wt, "gen.bin"), []byte(strings.Repeat("y", 1<<20)), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sh", "-c", "git add -A && git -c user.name=b -c user.email=b@example.invalid commit -qm gen")
		cmd.Dir = wt
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("commit: %v: %s", err, out)
		}
		rm()
		if _, err := os.Stat(wt); !os.IsNotExist(err) {
			t.Fatalf("worktree %s still there: %v", wt, err)
		}
		if got := looseObjects(t, repo); strings.HasPrefix(got, "0 objects") != c.prunes {
			t.Fatalf("%s: after its removal the repository has %s", c.name, got)
		}
		// ensureRepo prunes what a plain worktree's removal left.
		if err := ensureRepo(repo, 20, 4096); err != nil {
			t.Fatal(err)
		}
		if got := looseObjects(t, repo); !strings.HasPrefix(got, "0 objects") {
			t.Fatalf("%s: ensureRepo left %s", c.name, got)
		}
	}
}
