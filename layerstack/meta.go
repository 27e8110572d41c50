package layerstack

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// LayerKind says how a layer came to be.
type LayerKind string

const (
	LayerBase    LayerKind = "base"
	LayerPublish LayerKind = "publish"
	LayerAmend   LayerKind = "amend"
	LayerSquash  LayerKind = "squash"
)

// Counts tallies the entries of a layer or change set.
type Counts struct {
	Files    int `json:"files"`
	Dirs     int `json:"dirs"`
	Symlinks int `json:"symlinks"`
	Deletes  int `json:"deletes"`
	Opaques  int `json:"opaques"`
}

// LayerMeta is the sidecar of one layer, written before the manifest that
// publishes the layer, so a committed layer always has its metadata.
type LayerMeta struct {
	ID            string    `json:"layer_id"`
	Kind          LayerKind `json:"kind"`
	ParentVersion int64     `json:"parent_manifest_version"`
	TxID          string    `json:"txid,omitempty"`
	// Owner is workspace_session:<id>, operation:<request_id>, or "original" for a base.
	Owner   string         `json:"owner,omitempty"`
	Agent   string         `json:"agent,omitempty"`
	Message string         `json:"message,omitempty"`
	Time    time.Time      `json:"time"`
	Digest  string         `json:"digest"`
	Counts  Counts         `json:"counts"`
	Bytes   int64          `json:"bytes"`
	Paths   []PathOutcome  `json:"paths,omitempty"`
	Replace []string       `json:"replaces,omitempty"`
	Result  *PublishResult `json:"result,omitempty"`
	// Blame holds the line owners of every text file this layer wrote.
	Blame map[string][]BlameRange `json:"blame,omitempty"`
}

// PathOutcome records what a commit did to one path.
type PathOutcome struct {
	Path    string `json:"path"`
	Change  string `json:"change"`  // write, delete, symlink, dir, opaque_dir
	Outcome string `json:"outcome"` // clean, merged, ignored
}

func (s *Store) metaPath(id string) string { return filepath.Join(s.root, dirMeta, id+".json") }

func (s *Store) writeMeta(m *LayerMeta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(s.metaPath(m.ID), b, 0o644); err != nil {
		return fmt.Errorf("write metadata of %s: %w", m.ID, err)
	}
	s.mu.Lock()
	s.metas[m.ID] = m
	s.mu.Unlock()
	return nil
}

// meta returns the metadata of a layer (cached; layers are immutable).
func (s *Store) meta(id string) (*LayerMeta, error) {
	s.mu.Lock()
	m := s.metas[id]
	s.mu.Unlock()
	if m != nil {
		return m, nil
	}
	var lm LayerMeta
	if err := readJSON(s.metaPath(id), &lm); err != nil {
		return nil, fmt.Errorf("metadata of layer %s: %w", id, err)
	}
	s.mu.Lock()
	s.metas[id] = &lm
	s.mu.Unlock()
	return &lm, nil
}

// LayerMeta returns the metadata of a layer of the head or of a lease.
func (s *Store) LayerMeta(id string) (*LayerMeta, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.meta(id)
}

func txKey(txid string) string {
	sum := sha256.Sum256([]byte(txid))
	return hex.EncodeToString(sum[:16])
}

func (s *Store) readTx(txid string) (*PublishResult, error) {
	var r PublishResult
	if err := readJSON(filepath.Join(s.root, dirTxns, txKey(txid)+".json"), &r); err != nil {
		return nil, err
	}
	if r.TxID != txid {
		return nil, fmt.Errorf("transaction record collision for %q", txid)
	}
	return &r, nil
}

func (s *Store) writeTx(r *PublishResult) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(s.root, dirTxns, txKey(r.TxID)+".json"), b, 0o644)
}

// AuditRecord is one line of the audit log: who published what, when.
type AuditRecord struct {
	Time            time.Time     `json:"time"`
	TxID            string        `json:"txid"`
	LayerID         string        `json:"layer_id"`
	Kind            LayerKind     `json:"kind"`
	Owner           string        `json:"owner"`
	Agent           string        `json:"agent,omitempty"`
	Message         string        `json:"message,omitempty"`
	ManifestVersion int64         `json:"manifest_version"`
	Paths           []PathOutcome `json:"paths"`
}

// appendAudit is best-effort: the layer metadata is the durable record and
// recovery re-appends a lost line (readers dedupe by txid).
func (s *Store) appendAudit(m *LayerMeta) {
	rec := AuditRecord{Time: m.Time, TxID: m.TxID, LayerID: m.ID, Kind: m.Kind, Owner: m.Owner,
		Agent: m.Agent, Message: m.Message, ManifestVersion: m.ParentVersion + 1, Paths: m.Paths}
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(s.root, fileAudit), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.log.Warn("audit append failed", "err", err)
		return
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		s.log.Warn("audit append failed", "err", err)
	}
}

// History returns the audit log, oldest first, at most limit records from
// the end (limit <= 0: all), one record per transaction.
func (s *Store) History(limit int) ([]AuditRecord, error) {
	b, err := os.ReadFile(filepath.Join(s.root, fileAudit))
	if isNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []AuditRecord
	seen := map[string]bool{}
	for _, line := range splitLines(b) {
		var r AuditRecord
		if json.Unmarshal(line, &r) != nil || seen[r.TxID] {
			continue
		}
		seen[r.TxID] = true
		out = append(out, r)
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out, nil
}
