// Package docs embeds Dojo's operator and agent documentation so the server
// can serve it at /docs without files on disk.
package docs

import "embed"

// Files holds every Markdown page in this folder.
//
//go:embed *.md
var Files embed.FS
