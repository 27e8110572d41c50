package sandboxinit

import (
	"context"

	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/observe"
)

// Publish history: every publish path reports its outcome to recordPublish,
// which appends it to the bounded publish stream (observe.RecordPublish);
// the publish_history view reads it back.

// Publish sources.
const (
	SourceSession     = "session"
	SourceImplicit    = "implicit"    // exec_command without a session
	SourceSessionless = "sessionless" // file operations without a session
)

// publishOutcome is what a publish path reports to recordPublish.
type publishOutcome = observe.PublishOutcome

func (d *Daemon) recordPublish(ctx context.Context, o publishOutcome) { d.obs.RecordPublish(ctx, o) }

func sourceOf(s *session) string {
	if s.rec.Implicit {
		return SourceImplicit
	}
	return SourceSession
}

// sessionless runs the one-layer commit of a file operation without a
// session (commit) as a layerstack.publish span with a publish record.
func (d *Daemon) sessionless(ctx context.Context, txid, owner string, paths []string, commit func(ctx context.Context) (*layerstack.PublishResult, error)) error {
	ctx, sp := d.span(ctx, "layerstack.publish", map[string]any{"txid": txid, "paths": observe.CapList(paths)})
	res, err := commit(ctx)
	if res != nil {
		sp.Set("layer_id", res.LayerID)
	}
	sp.End(err)
	d.recordPublish(ctx, publishOutcome{TxID: txid, Owner: owner, Source: SourceSessionless, Paths: paths, Result: res, Err: err})
	return err
}
