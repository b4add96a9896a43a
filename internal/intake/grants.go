package intake

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"sas/internal/messages"
	"sas/internal/statestore"
)

// NamespaceHeader is the header of a submit or a signal over the broker
// that names its namespace.
const NamespaceHeader = "sas-namespace"

// Reasons of a message its namespace refuses.
const (
	// ReasonNamespaceRefused: its publisher may not act in the namespace
	// it names (SAS_SUBMITTER_NAMESPACES).
	ReasonNamespaceRefused = "namespace_refused"
	// ReasonUnknownNamespace: the namespace it names does not exist.
	ReasonUnknownNamespace = "unknown_namespace"
)

// BrokerGrants are the namespaces each broker login may submit to and
// signal in (SAS_SUBMITTER_NAMESPACES: LOGIN=NAMESPACE,…; '*' every one).
// The login is a message's user-id, which RabbitMQ refuses unless it is
// the publisher's own.
type BrokerGrants map[string][]string

// ParseBrokerGrants reads SAS_SUBMITTER_NAMESPACES.
func ParseBrokerGrants(text string) (BrokerGrants, error) {
	grants := BrokerGrants{}
	for _, pair := range strings.Split(text, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		login, ns, ok := strings.Cut(pair, "=")
		login, ns = strings.TrimSpace(login), strings.TrimSpace(ns)
		if !ok || login == "" {
			return nil, fmt.Errorf("SAS_SUBMITTER_NAMESPACES: %q is not LOGIN=NAMESPACE", pair)
		}
		if ns != statestore.AllNamespaces {
			if err := messages.CheckNamespace(ns); err != nil {
				return nil, fmt.Errorf("SAS_SUBMITTER_NAMESPACES: %q: %w", pair, err)
			}
		}
		grants[login] = append(grants[login], ns)
	}
	return grants, nil
}

// Resolve is the namespace a message over the broker acts in: the one
// its header names, when the login that published it (userID) was
// granted it and it exists (exists asks); default when it names none.
// A refusal returns its reason and detail; err is a failed read of the
// namespaces (try again).
func (g BrokerGrants) Resolve(ctx context.Context, headers map[string]any, userID, what string, exists func(context.Context, string) (bool, error)) (ns, reason, detail string, err error) {
	v, named := headers[NamespaceHeader]
	if !named {
		return statestore.DefaultNamespace, "", "", nil
	}
	ns, _ = v.(string)
	if err := messages.CheckNamespace(ns); err != nil {
		return "", messages.ReasonInvalidValue, NamespaceHeader + ": " + err.Error(), nil
	}
	granted := g[userID]
	if userID == "" || !slices.Contains(granted, ns) && !slices.Contains(granted, statestore.AllNamespaces) {
		return "", ReasonNamespaceRefused, fmt.Sprintf("login %q may not %s namespace %s (set the message's user-id to the login; SAS_SUBMITTER_NAMESPACES grants it)",
			messages.BoundText(userID, 100), what, ns), nil
	}
	if ns == statestore.DefaultNamespace {
		return ns, "", "", nil
	}
	known, err := exists(ctx, ns)
	if err != nil {
		return "", "", "", err
	}
	if !known {
		return "", ReasonUnknownNamespace, fmt.Sprintf("there is no namespace %s (sasctl namespaces add)", ns), nil
	}
	return ns, "", "", nil
}
