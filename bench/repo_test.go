package bench

import (
	"crypto/rand"
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

// A run interrupted inside a git baseline leaves its worktree registered
// and its commit reachable (even packed, after an automatic gc): the next
// run's ensureRepo removes both, and the worktree's name is free again.
func TestEnsureRepoClearsAnInterruptedBaseline(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if err := ensureRepo(repo, 20, 4096); err != nil {
		t.Fatal(err)
	}
	packKiB := func() string {
		out, err := exec.Command("git", "-C", repo, "count-objects", "-v").Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(l, "size-pack: "); ok {
				return v
			}
		}
		t.Fatalf("no size-pack in %s", out)
		return ""
	}
	before := packKiB()
	wt := filepath.Join(dir, "wt-d-0")
	if _, err := CommitWorktree(repo, wt); err != nil { // its removal never runs
		t.Fatal(err)
	}
	noise := make([]byte, 1<<20)
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wt, "gen.bin"), noise, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"git add -A && git -c user.name=b -c user.email=b@example.invalid commit -qm gen", "git gc -q"} {
		cmd := exec.Command("sh", "-c", c)
		cmd.Dir = wt
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", c, err, out)
		}
	}
	if got := packKiB(); got == before {
		t.Fatalf("the interrupted baseline's commit is not in the pack (%s KiB before and after)", got)
	}
	if err := ensureRepo(repo, 20, 4096); err != nil {
		t.Fatal(err)
	}
	if got := looseObjects(t, repo); !strings.HasPrefix(got, "0 objects") {
		t.Fatalf("ensureRepo left %s", got)
	}
	if got := packKiB(); got != before {
		t.Fatalf("pack is %s KiB after ensureRepo, %s KiB as made", got, before)
	}
	rm, err := CommitWorktree(repo, wt)
	if err != nil {
		t.Fatalf("the leftover worktree's name is still taken: %v", err)
	}
	rm()
}
