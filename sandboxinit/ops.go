package sandboxinit

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemeral-sandbox/sandbox/api"
	"github.com/ephemeral-sandbox/sandbox/layerstack"
	"github.com/ephemeral-sandbox/sandbox/sandboxinit/observe"
)

// operations is the daemon's RPC table. Names follow the seed's catalog;
// the ones the workflow layer drives (init_base, publish with a txid,
// squash_layerstack, export_layerstack) are internal: the gateway refuses
// them at its public doors.
func (d *Daemon) operations() map[string]handler {
	return map[string]handler{
		"create_workspace_session": op(func(ctx context.Context, rid string, a api.CreateSessionArgs) (any, error) {
			create := func(ctx context.Context, a api.CreateSessionArgs) (*session, error) {
				return d.createSession(ctx, a, false)
			}
			if a.From != "" {
				create = d.forkSession
			}
			a.RequestID = rid
			s, err := d.createOnce(ctx, rid, func() (*session, error) { return create(ctx, a) })
			if err != nil {
				return nil, err
			}
			return d.info(s), nil
		}),
		"list_workspace_sessions": op(func(ctx context.Context, rid string, _ struct{}) (any, error) {
			return map[string]any{"workspace_sessions": d.listSessions(), "archived_sessions": d.listArchived()}, nil
		}),
		"archive_idle_sessions": op(func(ctx context.Context, rid string, a ArchiveIdleArgs) (any, error) {
			return d.archiveIdle(ctx, rid, a)
		}),
		"list_archived_sessions": op(func(ctx context.Context, rid string, _ struct{}) (any, error) {
			return map[string]any{"archived_sessions": d.listArchived()}, nil
		}),
		"restore_workspace_session": op(func(ctx context.Context, rid string, a api.SessionArgs) (any, error) {
			return d.restoreArchived(ctx, rid, a)
		}),
		"destroy_workspace_session": op(func(ctx context.Context, rid string, a api.DestroySessionArgs) (any, error) {
			return d.destroySession(ctx, a)
		}),
		"publish_workspace_session": op(func(ctx context.Context, rid string, a api.PublishArgs) (any, error) {
			if a.ExactlyOnce {
				return d.publishTx(ctx, a)
			}
			return d.publishSession(ctx, a)
		}),
		"refresh_workspace_session": op(func(ctx context.Context, rid string, a api.SessionArgs) (any, error) { return d.refreshSession(ctx, a) }),
		"recover_workspace_session": op(func(ctx context.Context, rid string, a api.SessionArgs) (any, error) { return d.recoverSession(ctx, a) }),
		"diff_workspace_session":    op(func(ctx context.Context, rid string, a api.SessionArgs) (any, error) { return d.diffSession(ctx, a) }),
		"publish_prepare": op(func(ctx context.Context, rid string, a api.PublishStepArgs) (any, error) {
			return d.publishPrepare(ctx, a)
		}),
		"publish_commit": op(func(ctx context.Context, rid string, a api.PublishStepArgs) (any, error) {
			return d.publishCommit(ctx, a)
		}),
		"publish_finalize": op(func(ctx context.Context, rid string, a api.PublishStepArgs) (any, error) {
			return d.publishFinalize(ctx, a)
		}),
		"publish_abort": op(func(ctx context.Context, rid string, a api.PublishStepArgs) (any, error) {
			return d.publishAbort(ctx, a)
		}),
		"check_publish": op(func(ctx context.Context, rid string, a api.SessionArgs) (any, error) { return d.checkPublish(ctx, a) }),

		"exec_command": op(func(ctx context.Context, rid string, a api.ExecCommandArgs) (any, error) {
			out, err := d.exec(ctx, a)
			return out, execSessionGone(a.WorkspaceSessionID, err)
		}),
		"write_command_stdin": op(func(ctx context.Context, rid string, a api.WriteCommandStdinArgs) (any, error) {
			return d.cmds.WriteStdin(ctx, a)
		}),
		"read_command_lines": op(func(ctx context.Context, rid string, a api.ReadCommandLinesArgs) (any, error) {
			return d.cmds.Read(ctx, a)
		}),
		"cancel_command": op(func(ctx context.Context, rid string, a api.CancelCommandArgs) (any, error) {
			return d.cmds.Cancel(ctx, a)
		}),
		"resize_command": op(func(ctx context.Context, rid string, a api.ResizeCommandArgs) (any, error) {
			return map[string]any{"command_session_id": a.CommandSessionID, "resized": true}, d.cmds.Resize(a)
		}),

		"file_read": op(func(ctx context.Context, rid string, a api.FileReadArgs) (any, error) { return d.fileRead(a) }),
		"file_write": op(func(ctx context.Context, rid string, a api.FileWriteArgs) (any, error) {
			return d.fileWrite(ctx, rid, a)
		}),
		"file_edit": op(func(ctx context.Context, rid string, a api.FileEditArgs) (any, error) { return d.fileEdit(ctx, rid, a) }),
		"file_upload": op(func(ctx context.Context, rid string, a api.FileUploadArgs) (any, error) {
			return d.fileUpload(ctx, rid, a)
		}),
		"file_download": op(func(ctx context.Context, rid string, a api.FileDownloadArgs) (any, error) { return d.fileDownload(a) }),
		"file_list":     op(func(ctx context.Context, rid string, a api.FileListArgs) (any, error) { return d.fileList(a) }),
		"file_delete": op(func(ctx context.Context, rid string, a api.FileDeleteArgs) (any, error) {
			return d.fileDelete(ctx, rid, a)
		}),
		"file_move":   op(func(ctx context.Context, rid string, a api.FileMoveArgs) (any, error) { return d.fileMove(ctx, rid, a) }),
		"file_search": op(func(ctx context.Context, rid string, a api.FileSearchArgs) (any, error) { return d.fileSearch(ctx, a) }),
		"file_blame": op(func(ctx context.Context, rid string, a struct {
			Path string `json:"path"`
		}) (any, error) {
			return d.fileBlame(a.Path)
		}),

		"init_base": op(func(ctx context.Context, rid string, a api.InitBaseArgs) (any, error) { return d.initBase(ctx, a) }),
		"squash_layerstack": op(func(ctx context.Context, rid string, _ struct{}) (any, error) {
			ctx, sp := d.span(ctx, "layerstack.squash", nil)
			res, err := d.store.Squash(ctx)
			if res != nil {
				sp.Set("squashed_blocks", len(res.SquashedBlocks))
			}
			sp.End(err)
			return res, err
		}),
		"export_layerstack": op(func(ctx context.Context, rid string, a api.ExportArgs) (any, error) {
			if a.LayerID != "" {
				return d.layerExport(ctx, a)
			}
			return &exportStream{d: d, format: a.Format, ctx: context.WithoutCancel(ctx)}, nil
		}),
	}
}

// observabilityOps are the read-only views (seed-contract §0.3 shapes),
// health and the audit log. The server runs them under a quiet context:
// they record nothing, do not count as activity and touch no session, so
// reading them changes nothing.
func (d *Daemon) observabilityOps() map[string]handler {
	return map[string]handler{
		"health": op(func(ctx context.Context, rid string, _ observe.ScopeArgs) (any, error) {
			return map[string]any{"status": "ok", "daemon_pid": os.Getpid(), "observability_dropped": d.obs.Store.Dropped()}, nil
		}),
		"layerstack_history": op(func(ctx context.Context, rid string, a struct {
			Limit int `json:"limit,omitempty"`
		}) (any, error) {
			h, err := d.store.History(a.Limit)
			if h == nil {
				h = []layerstack.AuditRecord{}
			}
			return map[string]any{"publishes": h}, err
		}),
		"snapshot": op(func(ctx context.Context, rid string, a observe.ScopeArgs) (any, error) { return d.obs.Snapshot(a), nil }),
		"trace":    op(func(ctx context.Context, rid string, a observe.TraceArgs) (any, error) { return d.obs.TraceView(a) }),
		"events":   op(func(ctx context.Context, rid string, a observe.EventsArgs) (any, error) { return d.obs.EventsView(a) }),
		"resources": op(func(ctx context.Context, rid string, a observe.WindowArgs) (any, error) {
			return d.obs.ResourcesView(a), nil
		}),
		"cgroup": op(func(ctx context.Context, rid string, a observe.CgroupArgs) (any, error) { return d.obs.CgroupView(a) }),
		"topology": op(func(ctx context.Context, rid string, _ observe.ScopeArgs) (any, error) {
			return d.obs.TopologyView(), nil
		}),
		"daemon": op(func(ctx context.Context, rid string, _ observe.ScopeArgs) (any, error) {
			v := d.obs.DaemonView()
			if dm, ok := v["daemon"].(map[string]any); ok {
				dm["background_lane"] = d.lane.stats() // lane.go: depth, waits, refusals
			}
			return v, nil
		}),
		"layerstack": op(func(ctx context.Context, rid string, a observe.LayerstackArgs) (any, error) {
			return d.obs.LayerstackView(a)
		}),
		"publish_history": op(func(ctx context.Context, rid string, a observe.PublishHistoryArgs) (any, error) {
			return d.obs.PublishHistory(a)
		}),
	}
}

func (d *Daemon) initBase(ctx context.Context, a api.InitBaseArgs) (any, error) {
	if m, err := d.store.Manifest(); err == nil {
		return &api.InitBaseResult{BaseID: m.Base().ID, Revision: revisionJSON(m.Revision()), AlreadyInitialized: true}, nil
	}
	if a.BaseID != "" {
		// A shared base another sandbox already imported (mounted at base/).
		info, err := layerstack.ReadBaseInfo(filepath.Join(d.store.Root(), "base"), a.BaseID)
		if err != nil {
			return nil, api.Errorf(api.KindOperationFailed, nil, "shared base: %v", err)
		}
		m, err := d.initStore(ctx, info)
		if err != nil {
			return nil, err
		}
		return &api.InitBaseResult{BaseID: info.ID, RootHash: info.RootHash, Revision: revisionJSON(m.Revision()), Shared: true}, nil
	}
	if a.SourceDir == "" || !filepath.IsAbs(a.SourceDir) {
		return nil, api.Errorf(api.KindInvalidRequest, nil, "source_dir must be an absolute path inside the sandbox")
	}
	info, rep, err := layerstack.ImportDir(ctx, a.SourceDir, filepath.Join(d.store.Root(), "base"), layerstack.ImportOptions{All: a.All, Link: a.Remove})
	if err != nil {
		return nil, api.Errorf(api.KindOperationFailed, nil, "import base: %v", err)
	}
	m, err := d.initStore(ctx, info)
	if err != nil {
		return nil, err
	}
	if a.Remove {
		_ = os.RemoveAll(a.SourceDir)
	}
	return &api.InitBaseResult{BaseID: info.ID, RootHash: info.RootHash, Revision: revisionJSON(m.Revision()), Import: rep}, nil
}

type exportStream struct {
	d      *Daemon
	format string
	ctx    context.Context // the request's trace, for the export span
}

func (e *exportStream) stream(w http.ResponseWriter) {
	f := layerstack.ExportFormat(strings.ReplaceAll(e.format, "_", "-"))
	if f == "" {
		f = layerstack.ExportTar
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Trailer", "X-Export-Error")
	w.WriteHeader(http.StatusOK)
	ctx, sp := e.d.span(e.ctx, "layerstack.export", map[string]any{"format": string(f)})
	res, err := e.d.store.Export(ctx, w, f)
	if res != nil {
		sp.Set("bytes", res.Bytes)
	}
	sp.End(err)
	if err != nil {
		w.Header().Set("X-Export-Error", err.Error())
	}
}

// execSessionGone: the seed answers a command in a workspace session that
// is gone (finalized, destroyed, never created) with operation_failed
// "workspace session not found: <id>"; file operations keep not_found.
func execSessionGone(id string, err error) error {
	var ae *api.Error
	if id == "" || !errors.As(err, &ae) || ae.Kind != api.KindNotFound || !strings.Contains(ae.Message, "workspace session not found") {
		return err
	}
	return api.Errorf(api.KindOperationFailed, ae.Details, "workspace session not found: %s", id)
}
