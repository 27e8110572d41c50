// Package console holds the operator console's built bundle (dist/, made by
// `make console` from the TypeScript sources beside it); the gateway serves
// it at /. The bundle is committed, so building Go needs no Node.
package console

import (
	"embed"
	"io/fs"
)

//go:embed dist
var dist embed.FS

// Dist is the bundle: index.html and assets/.
var Dist, _ = fs.Sub(dist, "dist")
