// Package migrations holds the state store's schema as ordered SQL files,
// embedded so that `sasctl migrate` needs nothing but its own binary.
//
// Files are named NNNN_description.sql and applied in order of NNNN; an
// applied file must never be edited, only followed by a new one. They
// change the schema only (tables, columns, indexes, triggers, roles,
// grants): the current text of every database function is in
// internal/statestore/sql/*.sql (a file a topic), which statestore.Migrate applies
// after them. The functions some files define were the texts of their
// day; the file's text replaces them.
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
