package layerstack

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ephemeral-sandbox/sandbox/internal/atomicfile"
)

// ManifestSchemaVersion is the only manifest schema this code reads.
const ManifestSchemaVersion = 1

// Manifest lists the layers of the published head, newest first; the last
// one is the base. It is the single commit point of the store: a layer is
// published exactly when the manifest that names it is renamed into place.
type Manifest struct {
	SchemaVersion int             `json:"schema_version"`
	Version       int64           `json:"version"`
	Layers        []ManifestLayer `json:"layers"`
}

// ManifestLayer names one layer and where it lives, relative to the store root.
type ManifestLayer struct {
	ID   string `json:"layer_id"`
	Path string `json:"path"`
	TxID string `json:"txid,omitempty"`
}

// Revision identifies a manifest the way the seed's publish result does.
type Revision struct {
	ManifestVersion int64  `json:"manifest_version"`
	RootHash        string `json:"root_hash"`
	LayerCount      int    `json:"layer_count"`
}

// Revision returns the manifest's identity triple.
func (m *Manifest) Revision() Revision {
	return Revision{ManifestVersion: m.Version, RootHash: m.RootHash(), LayerCount: len(m.Layers)}
}

// RootHash is the sha256 of the canonical JSON of the layer list.
func (m *Manifest) RootHash() string {
	ids := make([]string, len(m.Layers))
	for i, l := range m.Layers {
		ids[i] = l.ID
	}
	b, _ := json.Marshal(ids)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Head returns the newest layer.
func (m *Manifest) Head() ManifestLayer { return m.Layers[0] }

// Base returns the base layer.
func (m *Manifest) Base() ManifestLayer { return m.Layers[len(m.Layers)-1] }

func (m *Manifest) clone() *Manifest {
	c := *m
	c.Layers = append([]ManifestLayer(nil), m.Layers...)
	return &c
}

// ErrNoManifest means the store has not been initialised with a base.
var ErrNoManifest = errors.New("layer stack has no manifest (no base imported yet)")

func readManifest(root string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(root, "manifest.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoManifest
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("parse manifest: %w", err)
	}
	if m.SchemaVersion != ManifestSchemaVersion {
		return nil, fmt.Errorf("manifest schema_version %d is not supported (want %d)", m.SchemaVersion, ManifestSchemaVersion)
	}
	if m.Version < 1 || len(m.Layers) == 0 {
		return nil, fmt.Errorf("manifest version %d with %d layers is not valid", m.Version, len(m.Layers))
	}
	return &m, nil
}

func writeManifest(root string, m *Manifest) error {
	b, err := manifestBytes(m)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(root, "manifest.json"), b, 0o644)
}
