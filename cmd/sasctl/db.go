package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"sas/internal/statestore"
)

// dbUsers creates (or updates) a login user per service, as a member of its
// role, for every SAS_DB_PASSWORD_<SERVICE> variable set; or, with
// --operator, the login of one person in the operator role.
func (a *app) dbUsers(ctx context.Context, args []string) error {
	fs := a.flags()
	suffix := fs.String("login-suffix", "_login", "a service's login is named after its role plus this suffix")
	operatorLogin := fs.String("operator", "", "create or update this person's login in role sas_operator, the password read from the first line of standard input")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if *operatorLogin != "" {
		fmt.Fprintf(a.stderr, "password for %s (one line): ", *operatorLogin)
		line, err := bufio.NewReader(a.stdin).ReadString('\n')
		if err != nil && line == "" {
			return fmt.Errorf("read the password from standard input: %w", err)
		}
		fmt.Fprintln(a.stderr)
		pw := strings.TrimRight(line, "\r\n")
		if pw == "" {
			return fmt.Errorf("an empty password: give it on the first line of standard input")
		}
		store, closeStore, err := a.store(ctx)
		if err != nil {
			return err
		}
		defer closeStore()
		if err := store.EnsureLogin(ctx, *operatorLogin, statestore.RoleOperator, pw); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "login %s in role %s: connect with SAS_DATABASE_URL naming user %s and the password in SAS_DATABASE_PASSWORD\n",
			*operatorLogin, statestore.RoleOperator, *operatorLogin)
		return nil
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	done := 0
	for _, role := range []string{statestore.RoleSubmitter, statestore.RoleScheduler, statestore.RoleSupervisor, statestore.RoleOperator, statestore.RoleConsole, statestore.RoleAPI} {
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
		return fmt.Errorf("no SAS_DB_PASSWORD_SUBMITTER, _SCHEDULER, _SUPERVISOR, _OPERATOR, _CONSOLE or _API is set")
	}
	return nil
}
