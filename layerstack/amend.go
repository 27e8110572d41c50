package layerstack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
)

// AmendRequest is a sessionless write: either the whole new Content of Path
// or Edits applied to the head's version of it.
type AmendRequest struct {
	TxID    string
	Path    string
	Content []byte
	Edits   []Edit
	// Mode applies to a new file (default 0644); an existing file keeps its
	// permission bits, the exec bit included.
	Mode    fs.FileMode
	Owner   string // operation:<request_id>
	Agent   string
	Message string
}

// AmendResult is the outcome of an Amend.
type AmendResult struct {
	PublishResult
	Created      bool  `json:"created"`
	Replacements int   `json:"replacements"`
	EditsApplied int   `json:"edits_applied"`
	BytesWritten int64 `json:"bytes_written"`
}

// Amend commits a one-file layer against the locked head: there is no base
// to conflict with, so it always lands (or is a no-op when nothing changes).
func (s *Store) Amend(ctx context.Context, req AmendRequest) (*AmendResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if req.TxID == "" {
		return nil, fmt.Errorf("%w: txid is required", ErrBadRequest)
	}
	p, err := CleanPath(req.Path)
	if err != nil {
		return nil, err
	}
	if err := CheckPublishable(p); err != nil {
		return nil, err
	}
	if r, err := s.readTx(req.TxID); err == nil {
		r.Replayed = true
		return &AmendResult{PublishResult: *r}, nil
	}
	head, err := s.lockedHead()
	if err != nil {
		return nil, err
	}
	defer s.commitMu.Unlock()
	res := &AmendResult{}
	content, mode, err := s.amendContent(p, req, res)
	if err != nil {
		return nil, err
	}
	pr := PublishRequest{TxID: req.TxID, Owner: req.Owner, Agent: req.Agent, Message: req.Message,
		Changes: &ChangeSet{Changes: []Change{{Path: p, Kind: ChangeWrite, Mode: mode, Data: content}}}}
	res.BytesWritten = int64(len(content))
	pres, err := s.commitOnHead(ctx, head, pr, true)
	if err != nil {
		return nil, err
	}
	res.PublishResult = *pres
	return res, nil
}

// CommitOnHead commits a change set as one layer against the locked head:
// last writer wins, nothing can conflict. It serves sessionless deletes and
// moves (a move is a delete plus a write).
func (s *Store) CommitOnHead(ctx context.Context, req PublishRequest) (*PublishResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if req.TxID == "" {
		return nil, fmt.Errorf("%w: txid is required", ErrBadRequest)
	}
	if r, err := s.readTx(req.TxID); err == nil {
		r.Replayed = true
		return r, nil
	}
	head, err := s.lockedHead()
	if err != nil {
		return nil, err
	}
	defer s.commitMu.Unlock()
	return s.commitOnHead(ctx, head, req, false)
}

// commitOnHead runs with commitMu held. rewriteBelowHead commits a write
// identical to the head's file unless that file is in the newest layer (the
// seed's rule for sessionless writes: only a repeat at the head is a no-op).
func (s *Store) commitOnHead(ctx context.Context, head *Manifest, pr PublishRequest, rewriteBelowHead bool) (*PublishResult, error) {
	tx, err := s.newTxn(ctx, pr)
	if err != nil {
		return nil, err
	}
	defer tx.cleanup()
	tx.rewriteBelowHead = rewriteBelowHead
	s.gcMu.RLock()
	plan, sum, err := tx.plan(head.Layers, head)
	if err != nil {
		s.gcMu.RUnlock()
		return nil, err
	}
	if len(plan) == 0 {
		s.gcMu.RUnlock()
		res := pr.result(head)
		res.NoOp, res.RouteSummary = true, sum
		return res, s.writeTx(res)
	}
	id := newID("L", head.Version+1)
	stage := filepath.Join(tx.dir, "layer")
	meta, syncPaths, err := s.buildLayer(ctx, stage, head, plan, pr, id, LayerAmend)
	s.gcMu.RUnlock()
	if err != nil {
		return nil, err
	}
	pres := tx.result(plan, head, id)
	pres.RouteSummary = sum
	pres.Counts, pres.Bytes = meta.Counts, meta.Bytes
	if err := s.commit(stage, head, meta, syncPaths, pres, pr); err != nil {
		return nil, err
	}
	s.maybeAutoSquash()
	return pres, nil
}

func (s *Store) amendContent(p string, req AmendRequest, res *AmendResult) ([]byte, fs.FileMode, error) {
	v := s.Head()
	e, err := v.Stat(p)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, err
	}
	if exists && e.Kind != KindFile {
		return nil, 0, &NotFileError{Path: p, Kind: e.Kind}
	}
	for _, a := range ancestors(p) {
		ae, err := v.Stat(a)
		if err == nil && ae.Kind != KindDirectory {
			return nil, 0, &NotFileError{Path: p, Kind: ae.Kind, Parent: a}
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, 0, err
		}
	}
	mode := req.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	if exists {
		mode = e.Mode
	}
	res.Created = !exists
	if req.Edits == nil {
		if req.Content == nil {
			req.Content = []byte{}
		}
		return req.Content, mode, nil
	}
	if !exists {
		return nil, 0, fmt.Errorf("%s: %w", p, fs.ErrNotExist)
	}
	if e.Size > MaxEditBytes {
		return nil, 0, &TooLargeError{Path: p, Size: e.Size, Max: MaxEditBytes}
	}
	old, _, err := v.ReadFile(p, MaxEditBytes)
	if err != nil {
		return nil, 0, err
	}
	out, n, err := ApplyEdits(old, req.Edits)
	if err != nil {
		return nil, 0, err
	}
	res.Replacements, res.EditsApplied = n, len(req.Edits)
	return out, mode, nil
}

// belowHead: the head's version of p comes from a layer under the newest.
func belowHead(head stack, p string) bool {
	e, err := lookup(head, p)
	return err == nil && e.Layer != 0 // the stack lists the newest layer first
}
