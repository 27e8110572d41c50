package activities

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/internal/apperr"
	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// FormatGit writes the published history as commits on a branch.
const FormatGit = "git"

// Git hand-off limits: one published file is at most maxGitBlobBytes (it
// is streamed from the layer tar into git hash-object).
const maxGitBlobBytes = 1 << 30

// committer of every exported commit.
const (
	gitCommitterName  = "Ephemeral Sandbox"
	gitCommitterEmail = "sandbox@ephemeral-sandbox.invalid"
)

// gitRepo runs git plumbing against one repository, with its own index
// file: the user's working tree, index, HEAD and config are never
// written, and no hook runs.
type gitRepo struct {
	dir   string
	index string // GIT_INDEX_FILE of the export (a temp file)
}

func (g *gitRepo) run(ctx context.Context, env []string, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", g.dir, "-c", "core.hooksPath=/dev/null", "-c", "gc.auto=0"}, args...)...)
	base := []string{}
	for _, e := range os.Environ() {
		// The caller's git environment must not redirect us elsewhere.
		if k, _, _ := strings.Cut(e, "="); !strings.HasPrefix(k, "GIT_") {
			base = append(base, e)
		}
	}
	cmd.Env = append(append(base, "GIT_INDEX_FILE="+g.index, "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"), env...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", &gitError{args: args, err: err, stderr: strings.TrimSpace(errb.String())}
	}
	return strings.TrimRight(out.String(), "\n"), nil
}

type gitError struct {
	args   []string
	err    error
	stderr string
}

func (e *gitError) Error() string {
	return fmt.Sprintf("git %s: %v: %s", strings.Join(e.args, " "), e.err, e.stderr)
}

// ok runs a query whose failure means "no" (rev-parse --verify, merge-base
// --is-ancestor, symbolic-ref -q).
func (g *gitRepo) ok(ctx context.Context, args ...string) (string, bool) {
	out, err := g.run(ctx, nil, nil, args...)
	return out, err == nil
}

// gitEntry is one index entry: mode, object type and id.
type gitEntry struct{ mode, typ, sha string }

// exportGit writes every published layer above the base, oldest first,
// as one commit each on spec.Branch of the repository at repo.
func (a *Activities) exportGit(ctx context.Context, spec workflows.ExportSpec, repo string, streamed *atomic.Int64) (*api.ExportResult, error) {
	if _, err := exec.LookPath("git"); err != nil {
		return nil, apperr.Newf(api.KindOperationFailed, nil, "format git needs the git command on the worker's host: %v", err)
	}
	idx, err := os.CreateTemp("", "eos-git-index-*")
	if err != nil {
		return nil, err
	}
	idx.Close()
	os.Remove(idx.Name()) // git creates it; an empty file is not an index
	g := &gitRepo{dir: repo, index: idx.Name()}
	defer os.Remove(g.index)
	defer os.Remove(g.index + ".lock")

	if out, ok := g.ok(ctx, "rev-parse", "--is-inside-work-tree"); !ok || out != "true" {
		return nil, apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "dest", "dest": repo},
			"%s is not inside a git working tree: format git writes into the repository the sandbox's workspace_root belongs to", repo)
	}
	prefix, err := g.run(ctx, nil, nil, "rev-parse", "--show-prefix")
	if err != nil {
		return nil, err
	}
	branch := spec.Branch
	if strings.HasPrefix(branch, "-") {
		return nil, invalidBranch(branch, "it starts with -")
	}
	if _, err := g.run(ctx, nil, nil, "check-ref-format", "--branch", branch); err != nil {
		return nil, invalidBranch(branch, "git check-ref-format refuses it")
	}
	ref := "refs/heads/" + branch
	if cur, ok := g.ok(ctx, "symbolic-ref", "-q", "HEAD"); ok && cur == ref {
		return nil, apperr.Newf(api.KindOperationConflict, map[string]any{"arg": "branch", "branch": branch},
			"branch %s is checked out in %s; export to another branch (its working tree is never touched)", branch, repo)
	}
	if wl, err := g.run(ctx, nil, nil, "worktree", "list", "--porcelain"); err == nil {
		for _, l := range strings.Split(wl, "\n") {
			if l == "branch "+ref {
				return nil, apperr.Newf(api.KindOperationConflict, map[string]any{"arg": "branch", "branch": branch},
					"branch %s is checked out in a worktree of %s; export to another branch", branch, repo)
			}
		}
	}
	parent, source := "", "workspace_copied_from"
	if spec.GitParent != "" {
		if _, ok := g.ok(ctx, "rev-parse", "-q", "--verify", spec.GitParent+"^{commit}"); ok {
			parent = spec.GitParent
		}
	}
	if parent == "" {
		// Not recorded (not a repository then, or a sandbox older than the
		// record), or gone from the repository since: HEAD now.
		parent, _ = g.ok(ctx, "rev-parse", "-q", "--verify", "HEAD^{commit}")
		source = "HEAD"
	}
	oldTip := ""
	if _, exists := g.ok(ctx, "rev-parse", "-q", "--verify", ref); exists {
		if oldTip, exists = g.ok(ctx, "rev-parse", "-q", "--verify", ref+"^{commit}"); !exists {
			return nil, invalidBranch(branch, "it exists and does not name a commit")
		}
	}

	for attempt := 1; attempt <= exportAttempts; attempt++ {
		m, err := a.readManifest(ctx, spec.SandboxID)
		if err != nil {
			return nil, err
		}
		res, err := a.gitCommits(ctx, spec, g, prefix, parent, m, streamed)
		if errors.Is(err, errStackMoved) {
			continue
		}
		if err != nil {
			return nil, err
		}
		res.ManifestVersion, res.Format, res.LayersExported = m.Version, FormatGit, m.exported()
		res.Branch, res.Parent, res.ParentSource, res.PreviousTip = branch, parent, source, oldTip
		updated := oldTip != res.Tip
		res.Updated = &updated
		if !updated {
			return res, nil
		}
		if oldTip != "" && !spec.Force {
			if _, anc := g.ok(ctx, "merge-base", "--is-ancestor", oldTip, res.Tip); !anc {
				return nil, apperr.Newf(api.KindOperationConflict, map[string]any{"arg": "branch", "branch": branch, "previous_tip": oldTip, "tip": res.Tip},
					"branch %s exists at %s, which is not an ancestor of the exported commits; pass force to move it, or export to a new branch", branch, shortSHA(oldTip))
			}
		}
		// Compare-and-swap: a branch moved by someone else meanwhile is
		// not overwritten.
		if _, err := g.run(ctx, nil, nil, "update-ref", "-m", "ephemeral-sandbox: export of "+spec.SandboxID, ref, res.Tip, oldTip); err != nil {
			if now, ok := g.ok(ctx, "rev-parse", "-q", "--verify", ref+"^{commit}"); ok && now == res.Tip {
				updated = false // a concurrent export of the same history won
				return res, nil
			}
			return nil, apperr.Newf(api.KindOperationConflict, map[string]any{"branch": branch}, "branch %s changed during the export; nothing was moved: %v", branch, err)
		}
		return res, nil
	}
	return nil, fmt.Errorf("git export of sandbox %s: %w %d times in a row; try again", spec.SandboxID, errStackMoved, exportAttempts)
}

func invalidBranch(branch, why string) error {
	return apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "branch", "branch": branch}, "branch %q is not a valid branch name: %s", branch, why)
}

func shortSHA(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// gitCommits builds the commits of manifest m on parent (nothing is
// referenced yet: unreferenced objects are all a failure leaves).
func (a *Activities) gitCommits(ctx context.Context, spec workflows.ExportSpec, g *gitRepo, prefix, parent string, m manifest, streamed *atomic.Int64) (*api.ExportResult, error) {
	entries := map[string]gitEntry{}
	if parent != "" {
		out, err := g.run(ctx, nil, nil, "ls-tree", "-r", "-z", "--full-tree", parent)
		if err != nil {
			return nil, err
		}
		for _, rec := range strings.Split(out, "\x00") {
			meta, p, ok := strings.Cut(rec, "\t")
			if f := strings.Fields(meta); ok && len(f) == 3 {
				entries[p] = gitEntry{mode: f[0], typ: f[1], sha: f[2]}
			}
		}
	}
	res := &api.ExportResult{}
	skipped := map[string]bool{}
	prev := parent
	for i := len(m.Layers) - 2; i >= 0; i-- { // oldest published layer first
		id := m.Layers[i].ID
		meta, n, err := a.applyLayer(ctx, spec, g, prefix, id, m.Version, entries, skipped)
		streamed.Add(n)
		if err != nil {
			return nil, err
		}
		tree, err := g.writeTree(ctx, entries)
		if err != nil {
			return nil, err
		}
		c := gitCommitOf(spec.SandboxID, meta)
		args := []string{"commit-tree", tree}
		if prev != "" {
			args = append(args, "-p", prev)
		}
		t, _ := time.Parse(time.RFC3339Nano, meta.Time)
		date := fmt.Sprintf("%d +0000", t.Unix())
		env := []string{"GIT_AUTHOR_NAME=" + c.authorName, "GIT_AUTHOR_EMAIL=" + c.authorEmail, "GIT_AUTHOR_DATE=" + date,
			"GIT_COMMITTER_NAME=" + gitCommitterName, "GIT_COMMITTER_EMAIL=" + gitCommitterEmail, "GIT_COMMITTER_DATE=" + date}
		sha, err := g.run(ctx, env, strings.NewReader(c.message), args...)
		if err != nil {
			return nil, err
		}
		prev = sha
		res.Commits = append(res.Commits, api.GitCommit{SHA: sha, TxID: meta.TxID, WorkspaceSessionID: c.session, Agent: meta.Agent,
			LayerID: id, Time: t.UTC().Format(time.RFC3339Nano), Subject: c.subject})
	}
	res.Tip = prev
	for p := range skipped {
		res.SkippedPaths = append(res.SkippedPaths, p)
	}
	sort.Strings(res.SkippedPaths)
	if res.Tip == "" {
		return nil, apperr.Newf(api.KindInvalidRequest, map[string]any{"arg": "dest"}, "nothing to export: the sandbox has no published layer and %s has no HEAD commit", g.dir)
	}
	return res, nil
}

type gitCommitText struct {
	authorName, authorEmail, session, subject, message string
}

var emailUnsafe = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// gitCommitOf is a publish's author and message: the agent (else the
// session) authors it; the message names the session, the txid, the layer
// and the sandbox.
func gitCommitOf(sandboxID string, meta api.LayerExportMeta) gitCommitText {
	var c gitCommitText
	who := ""
	switch {
	case strings.HasPrefix(meta.Owner, "workspace_session:"):
		c.session = strings.TrimPrefix(meta.Owner, "workspace_session:")
		who = c.session
		c.subject = "Publish of workspace session " + c.session
	case strings.HasPrefix(meta.Owner, "operation:"):
		who = "sessionless write"
		c.subject = "Sessionless change " + strings.TrimPrefix(meta.Owner, "operation:")
	default:
		who = gitCommitterName
		c.subject = "Layer " + meta.LayerID + " (" + meta.Kind + ")"
	}
	if meta.Kind == "squash" {
		c.subject = "Squashed publishes (layer " + meta.LayerID + ")"
	}
	if meta.Agent != "" {
		who = meta.Agent
	}
	clean := func(s string) string {
		return strings.TrimSpace(strings.Map(func(r rune) rune {
			if r == '<' || r == '>' || r == '\n' || r == '\r' || r == 0 {
				return ' '
			}
			return r
		}, s))
	}
	c.authorName = clean(who)
	if c.authorName == "" {
		c.authorName = gitCommitterName
	}
	local := strings.Trim(emailUnsafe.ReplaceAllString(strings.ToLower(c.authorName), "-"), "-.")
	if local == "" {
		local = "agent"
	}
	c.authorEmail = local + "@ephemeral-sandbox.invalid"
	var b strings.Builder
	if msg := strings.TrimSpace(strings.ReplaceAll(meta.Message, "\x00", "")); msg != "" {
		b.WriteString(msg + "\n\n" + c.subject + ".\n")
		c.subject = strings.SplitN(msg, "\n", 2)[0]
	} else {
		b.WriteString(c.subject + "\n")
	}
	b.WriteString("\nSandbox-Id: " + sandboxID + "\n")
	if c.session != "" {
		b.WriteString("Workspace-Session: " + c.session + "\n")
	}
	if meta.TxID != "" {
		b.WriteString("Publish-Txid: " + meta.TxID + "\n")
	}
	for _, tx := range meta.SquashedTxIDs {
		b.WriteString("Squashed-Publish-Txid: " + tx + "\n")
	}
	b.WriteString("Layer: " + meta.LayerID + "\n")
	c.message = b.String()
	return c
}

// applyLayer streams one layer from the daemon and applies it to entries
// (repository paths, under prefix). Entry names come from the sandbox and
// are untrusted: anything that is not a clean relative path is refused,
// and paths git cannot hold (a .git component, devices) are skipped.
func (a *Activities) applyLayer(ctx context.Context, spec workflows.ExportSpec, g *gitRepo, prefix, layerID string, version int64,
	entries map[string]gitEntry, skipped map[string]bool) (api.LayerExportMeta, int64, error) {
	var meta api.LayerExportMeta
	body, _ := json.Marshal(api.ExportArgs{Format: "tar", LayerID: layerID})
	req, err := a.daemon.Request(ctx, http.MethodPost, spec.SandboxID, spec.Daemon, "/rpc/export_layerstack", body, "")
	if err != nil {
		return meta, 0, activityError(err)
	}
	resp, err := a.daemon.Send(req, spec.SandboxID, "export_layerstack")
	if err != nil {
		if ae := api.AsError(activityError(err)); ae.Kind == api.KindNotFound {
			return meta, 0, errStackMoved // squashed meanwhile
		}
		return meta, 0, activityError(err)
	}
	defer resp.Body.Close()
	raw, err := base64.StdEncoding.DecodeString(resp.Header.Get("X-Layer-Meta"))
	if err == nil {
		err = json.Unmarshal(raw, &meta)
	}
	if err != nil || meta.LayerID != layerID {
		return meta, 0, fmt.Errorf("the daemon's export of layer %s has no valid X-Layer-Meta", layerID)
	}
	var n atomic.Int64
	stream := &exportStream{ctx: ctx, a: a, resp: resp, sandboxID: spec.SandboxID, version: version, n: &n}
	removeUnder := func(p string) {
		for k := range entries {
			if k == p || strings.HasPrefix(k, p+"/") {
				delete(entries, k)
			}
		}
	}
	tr := tar.NewReader(stream)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, errStackMoved) {
				return meta, n.Load(), errStackMoved
			}
			return meta, n.Load(), fmt.Errorf("layer %s: %w", layerID, err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if name == "" || path.IsAbs(name) || path.Clean(name) != name || name == "." || strings.HasPrefix(name, "../") || name == ".." {
			return meta, n.Load(), apperr.Newf(api.KindOperationFailed, map[string]any{"layer_id": layerID, "path": h.Name},
				"export of sandbox %s refused: layer %s holds the path %q, which is not a clean relative path", spec.SandboxID, layerID, h.Name)
		}
		dir, base := path.Split(name)
		dir = strings.TrimSuffix(dir, "/")
		target := name
		if strings.HasPrefix(base, ".wh.") {
			target = dir
			if base != ".wh..wh..opq" {
				target = path.Join(dir, strings.TrimPrefix(base, ".wh."))
			}
		}
		if gitUnsafe(target) {
			if h.Typeflag != tar.TypeDir { // a directory copied up for what is in it
				skipped[target] = true
			}
			continue
		}
		full := prefix + target
		switch {
		case base == ".wh..wh..opq":
			if target == "" {
				removeUnder(strings.TrimSuffix(prefix, "/"))
			} else {
				removeUnder(full)
			}
		case strings.HasPrefix(base, ".wh."):
			removeUnder(full)
		case h.Typeflag == tar.TypeDir:
			if e, ok := entries[full]; ok && e.typ != "tree" {
				delete(entries, full) // a file replaced by a directory
			}
		case h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeSymlink:
			var content io.Reader = io.LimitReader(tr, maxGitBlobBytes)
			mode := "100644"
			if h.Typeflag == tar.TypeSymlink {
				content, mode = strings.NewReader(h.Linkname), "120000"
			} else if h.Size > maxGitBlobBytes {
				return meta, n.Load(), apperr.Newf(api.KindResourceExhausted, map[string]any{"path": target, "size": h.Size, "max": maxGitBlobBytes},
					"%s has %d bytes, more than a git export takes (%d)", target, h.Size, maxGitBlobBytes)
			} else if h.Mode&0o111 != 0 {
				mode = "100755"
			}
			sha, err := g.run(ctx, nil, content, "hash-object", "-w", "--stdin")
			if err != nil {
				return meta, n.Load(), err
			}
			removeUnder(full) // a directory replaced by a file
			entries[full] = gitEntry{mode: mode, typ: "blob", sha: sha}
		default:
			skipped[target] = true
		}
	}
	return meta, n.Load(), nil
}

// gitHeadOf is the commit HEAD names in the repository dir is in, or ""
// (not a work tree, no commit yet, no git). Read-only: it takes no lock.
func gitHeadOf(ctx context.Context, dir string) string {
	if _, err := exec.LookPath("git"); err != nil {
		return ""
	}
	g := &gitRepo{dir: dir, index: os.DevNull}
	if out, ok := g.ok(ctx, "rev-parse", "--is-inside-work-tree"); !ok || out != "true" {
		return ""
	}
	head, _ := g.ok(ctx, "-c", "core.optionalLocks=false", "rev-parse", "-q", "--verify", "HEAD^{commit}")
	return head
}

// gitUnsafe: a path git refuses or that would reach into a repository's
// own metadata (.git in any component, in any case).
func gitUnsafe(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if strings.EqualFold(c, ".git") {
			return true
		}
	}
	return false
}

// writeTree writes entries as a tree through the export's own index file.
func (g *gitRepo) writeTree(ctx context.Context, entries map[string]gitEntry) (string, error) {
	if _, err := g.run(ctx, nil, nil, "read-tree", "--empty"); err != nil {
		return "", err
	}
	var b bytes.Buffer
	for p, e := range entries {
		fmt.Fprintf(&b, "%s %s %s\t%s\x00", e.mode, e.typ, e.sha, p)
	}
	if _, err := g.run(ctx, nil, &b, "update-index", "-z", "--index-info"); err != nil {
		return "", err
	}
	return g.run(ctx, nil, nil, "write-tree")
}
