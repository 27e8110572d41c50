package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"time"

	"github.com/google/pprof/profile"

	"github.com/ephemeral-sandbox/sandbox/daemonclient"
)

// startLocalProfile profiles this process's CPU into path until stop.
func startLocalProfile(path string) (stop func()) {
	f, err := os.Create(path)
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}

// daemonProfileWindow is the length of one CPU profile asked of the
// daemon; consecutive windows are merged, the one cut short by stop is lost.
const daemonProfileWindow = 5 * time.Second

// daemonDebug is the URL of the sandbox daemon's /debug/pprof/<what> and
// the token it asks for.
func (s *Stack) daemonDebug(ctx context.Context, sandboxID, what string) (url, token string, err error) {
	rec, err := s.Call(ctx, "inspect_sandbox", "", map[string]any{"sandbox_id": sandboxID})
	if err != nil {
		return "", "", err
	}
	d, _ := rec["daemon"].(map[string]any)
	return fmt.Sprintf("http://%v:%v/debug/pprof/%s", d["host"], d["port"], what), daemonclient.Token(s.secret, sandboxID), nil
}

// daemonProfile profiles the sandbox daemon's CPU (its /debug/pprof, behind
// the sandbox token) until stop, and writes the merged profile to path.
func (s *Stack) daemonProfile(ctx context.Context, sandboxID, path string) (stop func()) {
	url, token, err := s.daemonDebug(ctx, sandboxID, fmt.Sprintf("profile?seconds=%d", int(daemonProfileWindow.Seconds())))
	if err != nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan []*profile.Profile, 1)
	go func() {
		var ps []*profile.Profile
		defer func() { done <- ps }()
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				return
			}
			if p, err := profile.Parse(bytes.NewReader(b)); err == nil {
				ps = append(ps, p)
			}
		}
	}()
	return func() {
		cancel()
		ps := <-done
		if len(ps) == 0 {
			return
		}
		merged, err := profile.Merge(ps)
		if err != nil {
			return
		}
		if f, err := os.Create(path); err == nil {
			_ = merged.Write(f)
			f.Close()
		}
	}
}

// daemonTrace records the sandbox daemon's execution trace (its
// /debug/pprof/trace) for dur, starting after: where its goroutines waited
// to run (sched), on locks and channels (sync) and in system calls
// (syscall), which a CPU profile does not show. Each becomes a profile
// (`go tool trace -pprof`) next to the others, path + "-<kind>.pprof";
// the raw trace (megabytes) is not kept. wait returns once they are written.
func (s *Stack) daemonTrace(ctx context.Context, sandboxID, path string, after, dur time.Duration) (wait func()) {
	url, token, err := s.daemonDebug(ctx, sandboxID, fmt.Sprintf("trace?seconds=%d", int(dur.Seconds())))
	if err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			return
		case <-time.After(after):
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		raw := path + ".trace"
		f, err := os.Create(raw)
		if err != nil {
			return
		}
		_, err = io.Copy(f, resp.Body)
		f.Close()
		defer os.Remove(raw)
		if err != nil || resp.StatusCode != http.StatusOK {
			return
		}
		for _, kind := range []string{"sched", "sync", "syscall"} {
			out, err := exec.CommandContext(ctx, "go", "tool", "trace", "-pprof="+kind, raw).Output()
			if err == nil && len(out) > 0 {
				_ = os.WriteFile(path+"-"+kind+".pprof", out, 0o644)
			}
		}
	}()
	return func() { <-done }
}

// cpuParts profiles this process's CPU only while resumed (the timed part
// of a scenario, not its setup), and writes the parts merged.
type cpuParts struct {
	parts []*bytes.Buffer
	cur   *bytes.Buffer
}

func (c *cpuParts) resume() {
	if c == nil || c.cur != nil {
		return
	}
	buf := new(bytes.Buffer)
	if pprof.StartCPUProfile(buf) == nil {
		c.cur = buf
	}
}

func (c *cpuParts) pause() {
	if c == nil || c.cur == nil {
		return
	}
	pprof.StopCPUProfile()
	c.parts, c.cur = append(c.parts, c.cur), nil
}

// write merges the parts into path.
func (c *cpuParts) write(path string) error {
	c.pause()
	var ps []*profile.Profile
	for _, b := range c.parts {
		if p, err := profile.Parse(b); err == nil {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return fmt.Errorf("no profile")
	}
	merged, err := profile.Merge(ps)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return merged.Write(f)
}
