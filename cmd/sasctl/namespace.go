package main

import (
	"context"
	"flag"
	"fmt"

	"sas/internal/statestore"
)

// A command's --namespace keeps it to one namespace: the orders, alerts
// and dead letters of another are not found, as ones that do not exist,
// and nothing of theirs is changed. sasctl logs in to the database, which
// sees every namespace: the flag is an operator's own care (working for
// one team), not a bound set by someone else; the API's tokens and the
// console's users are held to their namespaces by the servers.

// namespaceFlag adds --namespace to fs.
func namespaceFlag(fs *flag.FlagSet) *string {
	return fs.String("namespace", "", "only in this namespace (sasctl namespaces list): another's is not found and nothing of it changes")
}

// namespaceOf checks the --namespace given and returns it as a filter:
// nil for every namespace.
func (a *app) namespaceOf(fs *flag.FlagSet, ns string) ([]string, error) {
	if ns == "" {
		return nil, nil
	}
	if err := statestore.CheckNamespace(ns); err != nil {
		return nil, a.usageError(fs, "--namespace: %v", err)
	}
	return []string{ns}, nil
}

// orderIn answers that order id does not exist when it is in none of
// namespaces (nil: every namespace).
func orderIn(ctx context.Context, store *statestore.Store, id string, namespaces []string) error {
	if namespaces == nil {
		return nil
	}
	own, found, err := store.OwnerOf(ctx, id)
	if err != nil {
		return err
	}
	for _, ns := range namespaces {
		if found && own.Namespace == ns {
			return nil
		}
	}
	return fmt.Errorf("order %s: %w", id, statestore.ErrNotFound)
}
