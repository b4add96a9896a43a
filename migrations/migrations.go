// Package migrations holds the state store's schema as ordered SQL files,
// embedded so that `sasctl migrate` needs nothing but its own binary.
//
// Files are named NNNN_description.sql and applied in order of NNNN; an
// applied file must never be edited, only followed by a new one.
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
