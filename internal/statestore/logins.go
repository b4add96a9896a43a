package statestore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Service roles (see migrations/0005_roles.sql).
const (
	RoleSubmitter  = "sas_submitter"
	RoleScheduler  = "sas_scheduler"
	RoleSupervisor = "sas_supervisor"
	RoleOperator   = "sas_operator"
	// RoleConsole is the web console's (migrations/0018_console.sql): it
	// reads, and calls the operator functions.
	RoleConsole = "sas_console"
	// RoleAPI is the HTTP API's (migrations/0031_http_api.sql): it
	// submits, reads, calls the operator functions, and runs bulk jobs.
	RoleAPI = "sas_api"
)

// EnsureLogin creates the login user login as a member of role with
// password, or sets the password of an existing one. The role must exist
// (sasctl migrate creates it). The password is sent to the server inside
// the statement (DDL takes no parameters) and is never logged here.
func (s *Store) EnsureLogin(ctx context.Context, login, role, password string) error {
	if password == "" {
		return fmt.Errorf("login %s: empty password", login)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var roleExists, loginExists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1), EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2)`,
			role, login).Scan(&roleExists, &loginExists); err != nil {
			return err
		}
		if !roleExists {
			return fmt.Errorf("role %s does not exist: run sasctl migrate as a user who may create roles", role)
		}
		var stmt string
		verb := "CREATE"
		if loginExists {
			verb = "ALTER"
		}
		if err := tx.QueryRow(ctx, `SELECT format('`+verb+` ROLE %I LOGIN PASSWORD %L', $1::text, $2::text)`, login, password).Scan(&stmt); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s login %s: %w", verb, login, err)
		}
		_, err := tx.Exec(ctx, "GRANT "+pgx.Identifier{role}.Sanitize()+" TO "+pgx.Identifier{login}.Sanitize())
		return err
	})
}
