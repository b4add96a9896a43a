package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"sas/internal/messages"
	"sas/internal/statestore"
)

// apiTokenCreate makes an API token and prints it, the only time it is
// shown.
func (a *app) apiTokenCreate(ctx context.Context, args []string) error {
	fs := a.flags()
	name := fs.String("name", "", "the token's name: who or what uses it (letters, digits, . _ -; never reused)")
	role := fs.String("role", "", "submitter (submit, and read, await and signal its own orders), viewer (read all) or operator (read and act on all)")
	as := fs.String("as", "", "the name to record as its maker beside your database login (default: $USER)")
	out := fs.String("out", "", "write the token to this file (mode 0640: its owner and group) instead of printing it; a file that already holds a token is kept, and nothing is made (a deployment's one-shot job may run again)")
	var namespaces stringList
	fs.Var(&namespaces, "namespace", "a namespace the token acts in (again for several; '*': every one; default: default)")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	if *out != "" {
		if b, err := os.ReadFile(*out); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), "sas_") {
			fmt.Fprintf(a.stderr, "%s holds a token already: kept, none made\n", *out)
			return nil
		}
	}
	if *name == "" {
		return a.usageError(fs, "--name is required")
	}
	if err := statestore.CheckTokenName(*name); err != nil {
		return a.usageError(fs, "--name: %v", err)
	}
	if !slices.Contains(statestore.TokenRoles(), *role) {
		return a.usageError(fs, "--role must be one of %s", strings.Join(statestore.TokenRoles(), ", "))
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	for _, ns := range namespaces {
		if ns != statestore.AllNamespaces {
			if err := statestore.CheckNamespace(ns); err != nil {
				return a.usageError(fs, "--namespace: %v", err)
			}
		}
	}
	tok, secret, err := store.CreateAPITokenIn(ctx, *name, *role, "sasctl:"+claimedName(*as), namespaces)
	if err != nil {
		return err
	}
	if *out != "" {
		if err := os.WriteFile(*out, []byte(secret+"\n"), 0o640); err != nil {
			// The token is made but nobody has it: revoke it.
			_, _ = store.RevokeAPIToken(ctx, tok.Name, "sasctl:"+claimedName(*as))
			return fmt.Errorf("write the token: %w (token %s revoked)", err, tok.Name)
		}
		fmt.Fprintf(a.stderr, "token %s (%s in %s) made and written to %s\n", tok.Name, tok.Role, strings.Join(tok.Namespaces, ", "), *out)
		return nil
	}
	fmt.Fprintf(a.stderr, "token %s (%s in %s) made; it is shown this once: keep it in a secret store\n", tok.Name, tok.Role, strings.Join(tok.Namespaces, ", "))
	fmt.Fprintln(a.stdout, secret)
	return nil
}

func (a *app) apiTokenList(ctx context.Context, args []string) error {
	return listOf(ctx, a, args, (*statestore.Store).APITokens, "NAME\tROLE\tNAMESPACES\tCREATED\tBY\tLAST_USED\tREVOKED",
		func(t statestore.APIToken) []string {
			used, revoked := "–", "–"
			if t.LastUsedAt != nil {
				used = stamp(*t.LastUsedAt)
			}
			if t.RevokedAt != nil {
				revoked = stamp(*t.RevokedAt) + " by " + t.RevokedBy
			}
			return []string{t.Name, t.Role, strings.Join(t.Namespaces, ","), stamp(t.CreatedAt), t.CreatedBy, used, revoked}
		})
}

func (a *app) apiTokenRevoke(ctx context.Context, args []string) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	return a.onNamed(ctx, fs, args, "give the name of one token", func(store *statestore.Store, name string) error {
		tok, err := store.RevokeAPIToken(ctx, name, "sasctl:"+claimedName(*as))
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "token %s revoked at %s by %s: the API refuses it within SAS_API_TOKEN_CACHE\n", tok.Name, stamp(*tok.RevokedAt), tok.RevokedBy)
		return nil
	})
}

// namespacesAdd makes namespaces.
func (a *app) namespacesAdd(ctx context.Context, args []string) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record as its maker beside your database login (default: $USER)")
	names, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return a.usageError(fs, "name at least one namespace")
	}
	for _, n := range names {
		if err := statestore.CheckNamespace(n); err != nil {
			return a.usageError(fs, "%v", err)
		}
	}
	// In every partition of a partitioned deployment.
	stores, closeStores, err := a.everyStore(ctx)
	if err != nil {
		return err
	}
	defer closeStores()
	for _, n := range names {
		for _, ps := range stores {
			if _, err := ps.store.AddNamespace(ctx, n, "sasctl:"+claimedName(*as)); err != nil {
				if ps.name != "" {
					return fmt.Errorf("partition %s: %w", ps.name, err)
				}
				return err
			}
		}
		fmt.Fprintf(a.stdout, "namespace %s added\n", n)
	}
	return nil
}

// namespacesList lists the namespaces.
func (a *app) namespacesList(ctx context.Context, args []string) error {
	return listOf(ctx, a, args, (*statestore.Store).Namespaces, "NAME\tCREATED\tBY\tQUOTAS\tQUOTAS_BY",
		func(n statestore.Namespace) []string {
			return []string{n.Name, stamp(n.CreatedAt), n.CreatedBy, cmp.Or(quotasText(n.Quotas), "–"), cmp.Or(n.QuotasBy, "–")}
		})
}

// namespacesQuota sets a namespace's quotas.
func (a *app) namespacesQuota(ctx context.Context, args []string) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	none := fs.Bool("none", false, "no quotas")
	var q statestore.Quotas
	var unused bool
	fs.Func("in-flight", "orders in flight (not ended) at most", countFlag(&q.MaxInFlight, &unused))
	fs.Func("rate", "orders submitted a second at most, e.g. 20/s, 600/m", rateFlag(&q.MaxSubmitRate, &unused))
	fs.Func("burst", "orders submitted at once above the rate (default: the rate a second, rounded up)", countFlag(&q.MaxSubmitBurst, &unused))
	fs.Func("payload-bytes", fmt.Sprintf("bytes of one order's payload at most (1 to %d)", messages.MaxBodyBytes), func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > messages.MaxBodyBytes {
			return fmt.Errorf("%q: a whole number of bytes from 1 to %d", v, messages.MaxBodyBytes)
		}
		q.MaxPayloadBytes = &n
		return nil
	})
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "give one namespace, e.g. sasctl namespaces quota team-a --in-flight 1000 --rate 50/s")
	}
	if unused {
		return a.usageError(fs, "leave out a quota for none (or --none for no quotas at all)")
	}
	if *none == q.Any() {
		return a.usageError(fs, "say the quotas (--in-flight, --rate, --burst, --payload-bytes; the ones left out are none), or --none")
	}
	if q.MaxSubmitBurst != nil && q.MaxSubmitRate == nil {
		return a.usageError(fs, "--burst is above a rate: give --rate too")
	}
	if rest[0] == statestore.DefaultNamespace {
		return a.usageError(fs, "the default namespace has no quotas: every order that names no namespace is in it")
	}
	// Each partition holds its orders to its share of the quotas.
	stores, closeStores, err := a.everyStore(ctx)
	if err != nil {
		return err
	}
	defer closeStores()
	for _, ps := range stores {
		if err := ps.store.SetNamespaceQuotas(ctx, rest[0], q.Share(len(stores)), "sasctl:"+claimedName(*as)); err != nil {
			if ps.name != "" {
				return fmt.Errorf("partition %s: %w", ps.name, err)
			}
			return err
		}
	}
	fmt.Fprintf(a.stdout, "namespace %s: %s (the API holds every replica to it within 5 s)\n", rest[0], cmp.Or(quotasText(q), "no quotas"))
	return nil
}

// quotasText is a namespace's quotas in a line ("" for none).
func quotasText(q statestore.Quotas) string {
	var parts []string
	if q.MaxInFlight != nil {
		parts = append(parts, fmt.Sprintf("in flight %d", *q.MaxInFlight))
	}
	if q.MaxSubmitRate != nil {
		parts = append(parts, "rate "+strconv.FormatFloat(*q.MaxSubmitRate, 'g', 6, 64)+"/s")
	}
	if q.MaxSubmitBurst != nil {
		parts = append(parts, fmt.Sprintf("burst %d", *q.MaxSubmitBurst))
	}
	if q.MaxPayloadBytes != nil {
		parts = append(parts, fmt.Sprintf("payload %d bytes", *q.MaxPayloadBytes))
	}
	return strings.Join(parts, ", ")
}

// listOf runs a list command that takes no arguments but --json: it
// reads the rows from the store and prints them as JSON, or as a table
// under header (tab-separated names) with a row's cells from row.
func listOf[T any](ctx context.Context, a *app, args []string, read func(*statestore.Store, context.Context) ([]T, error),
	header string, row func(T) []string) error {
	fs := a.flags()
	asJSON := fs.Bool("json", false, "print JSON")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	rows, err := read(store, ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return a.printJSON(rows)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(row(r), "\t"))
	}
	return tw.Flush()
}
