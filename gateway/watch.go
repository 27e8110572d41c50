package gateway

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/converter"

	"github.com/ephemeral-sandbox/sandbox/workflows"
)

// watchPoll is how often a lifecycle call with progress looks at its
// sandbox workflow. One DescribeWorkflowExecution (and a query of a
// running publish) per poll, only while such a call waits.
const watchPoll = 100 * time.Millisecond

// watch reports, until stop is called, what the sandbox's workflow is doing
// for one lifecycle call: the activities it runs (with the bytes an export
// streamed, from their heartbeats) and the step of the session's running
// PublishWorkflow child. match selects the children and activities that
// belong to the call; each distinct message is reported once.
func (b *TemporalBackend) watch(ctx context.Context, sandboxID string, match func(kind, name string) bool, progress func(string)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(watchPoll)
		defer t.Stop()
		last := ""
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			msg := b.describeProgress(ctx, sandboxID, match)
			if msg != "" && msg != last && ctx.Err() == nil {
				progress(msg)
				last = msg
			}
		}
	}()
	return func() { cancel(); <-done }
}

func (b *TemporalBackend) describeProgress(ctx context.Context, sandboxID string, match func(kind, name string) bool) string {
	d, err := b.Client.DescribeWorkflowExecution(ctx, workflows.SandboxWorkflowID(sandboxID), "")
	if err != nil {
		return ""
	}
	var parts []string
	for _, c := range d.GetPendingChildren() {
		if c.GetWorkflowTypeName() != workflows.PublishWorkflowName || !match("child", c.GetWorkflowId()) {
			continue
		}
		v, err := b.Client.QueryWorkflow(ctx, c.GetWorkflowId(), "", workflows.QueryPublishProgress)
		if err != nil {
			parts = append(parts, c.GetWorkflowId()+": starting")
			continue
		}
		var p workflows.PublishProgress
		if v.Get(&p) == nil {
			parts = append(parts, c.GetWorkflowId()+": "+describeStep(p))
		}
	}
	dc := converter.GetDefaultDataConverter()
	for _, a := range d.GetPendingActivities() {
		name := a.GetActivityType().GetName()
		if !match("activity", name) {
			continue
		}
		s := name
		if a.GetAttempt() > 1 {
			s += fmt.Sprintf(" (attempt %d)", a.GetAttempt())
		}
		var hb map[string]any
		if p := a.GetHeartbeatDetails(); p != nil && dc.FromPayloads(p, &hb) == nil {
			if n, ok := hb["bytes"].(float64); ok {
				s += fmt.Sprintf(": %s streamed", humanBytes(int64(n)))
			}
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func describeStep(p workflows.PublishProgress) string {
	switch p.Step {
	case "publish_prepare":
		return "capturing the session's changes and checking them against the head"
	case "publish_commit":
		return fmt.Sprintf("committing %d changed path(s) as one layer", p.Changes)
	case "publish_finalize":
		return "finalizing the session"
	case "publish_abort":
		return "rejected: giving the session back"
	}
	return p.Step
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
