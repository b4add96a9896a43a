package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"sas/internal/statestore"
)

// dbUsers creates (or updates) a login user per service, as a member of its
// role, for every SAS_DB_PASSWORD_<SERVICE> variable set.
func (a *app) dbUsers(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "users" {
		fmt.Fprintf(a.stderr, "sasctl db: the command is \"db users\"\n\n%s", usage)
		return errUsage
	}
	fs := a.flags("db users")
	suffix := fs.String("login-suffix", "_login", "a login is named after its role plus this suffix")
	if err := a.parse(fs, args[1:]); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	done := 0
	for _, role := range []string{statestore.RoleSubmitter, statestore.RoleScheduler, statestore.RoleSupervisor, statestore.RoleOperator} {
		service := strings.TrimPrefix(role, "sas_")
		pw := os.Getenv("SAS_DB_PASSWORD_" + strings.ToUpper(service))
		if pw == "" {
			continue
		}
		login := role + *suffix
		if err := store.EnsureLogin(ctx, login, role, pw); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "login %s in role %s\n", login, role)
		done++
	}
	if done == 0 {
		return fmt.Errorf("no SAS_DB_PASSWORD_SUBMITTER, _SCHEDULER, _SUPERVISOR or _OPERATOR is set")
	}
	return nil
}
